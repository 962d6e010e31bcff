"""No silently stale graph (``ascend_graph_patch/aspects/stale.py``), on the real vllm-ascend code.

A FULL graph whose capture ran attention outside its graph path holds no task for it: every
replay reuses the capture's sequence lengths. vllm-ascend 0.23.0.post1 does that to every graph
when ``VLLM_USE_V2_MODEL_RUNNER`` is set (v1 fallback: attention reads the capture flag where the
v1 wrapper never sets it). The harness engines run that real code with the variable set during
their capture: the overlay raises one error naming the layers and the cause (FIA, MLA decode, a
merged draft); told ``replay`` it refuses the graphs and replays stock's wrong values (the negative
control). Where attention takes its graph path (every other harness test, v2's graphs included,
which set the same variable) nothing changes. The real engine: ``tests/test_engine.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ascend_graph_patch import fail_fast, settings
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.aspects import stale
from tests.overlay_support import overlay_arm

V2_VAR = "VLLM_USE_V2_MODEL_RUNNER"
STEPS = 3


@pytest.fixture
def v2_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable set, as a user following newer vLLM's documentation would set it."""
    monkeypatch.setenv(V2_VAR, "1")
    monkeypatch.delenv(settings.ENV_STALE_GRAPH, raising=False)
    monkeypatch.setattr(fail_fast, "LAST", None)


def _stale_error(arm: Any) -> str:
    assert arm.run.error_type == "StaleGraph", arm.run.error
    assert arm.run.steps == 0 and not arm.outputs  # never a replay
    return arm.run.error


@pytest.mark.parametrize(
    ("workload", "role", "layer"),
    [
        ("dense_gqa", "target", "model.layers.0.self_attn.attn"),
        ("paged_attention", "target", "model.layers.0.self_attn.attn"),
        ("mla", "target", "model.layers.0.self_attn.attn"),
        ("mtp_k2", "draft", None),
    ],
)
@pytest.mark.usefixtures("v2_variable")
def test_a_stale_capture_raises_naming_layers_and_cause(
    workload: str, role: str, layer: str | None
) -> None:
    """FIA, PA, MLA decode (noted even when it skips its graph path) and a merged draft: the
    first graph captured raises, with the graph, the layers, the cause and the way out."""
    arm = overlay_arm(workload, "on", STEPS)
    error = _stale_error(arm)
    assert f"the {role} FULL graph of size" in error, error
    assert "without taking their graph path" in error
    if layer is not None:
        assert layer in error, error
    assert f"{V2_VAR} is set" in error and f"Unset {V2_VAR}" in error
    assert f"{settings.ENV_STALE_GRAPH}=replay keeps stock's behaviour" in error
    assert arm.counters.get("graphs.stale") == 1 and not arm.counters.get("graphs.owned")
    fault = arm.snapshot["fault"]
    assert fault["type"] == "StaleGraph" and fault["role"] == role, fault
    assert fault["action"] == "raised into the engine", fault


@pytest.mark.usefixtures("v2_variable")
def test_every_mode_refuses_a_stale_graph() -> None:
    """Observe and verify capture through the same aspects: a stale graph is never silent."""
    for mode in ("observe", "verify"):
        _stale_error(overlay_arm("dense_gqa", mode, STEPS))


@pytest.mark.usefixtures("v2_variable")
def test_switched_to_replay_the_graphs_replay_stocks_wrong_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control: ``ASCEND_GRAPH_PATCH_STALE_GRAPH=replay`` keeps stock's behaviour:
    each graph is refused with the stale reason, the steps run, and the values are stock's,
    far from eager's (the graph replays the capture's lengths)."""
    stock = overlay_arm("dense_gqa", "off", STEPS, eager=True)
    monkeypatch.setenv(settings.ENV_STALE_GRAPH, "replay")
    arm = overlay_arm("dense_gqa", "on", STEPS, eager=True)
    assert arm.error is None and stock.error is None, (arm.error, stock.error)
    assert arm.run.max_eager_error > 1e-2 and stock.run.max_eager_error > 1e-2
    assert all(
        (a.values == b.values).all() for a, b in zip(arm.outputs, stock.outputs, strict=True)
    )
    assert arm.refused and all("is stale" in why for why in arm.refused.values()), arm.refused
    assert arm.counters.get("graphs.stale") == len(arm.refused)
    assert arm.counters.get("updates.stock.unowned") == STEPS
    assert arm.snapshot["stale_graph"] == "replay" and arm.snapshot["fault"] is None


def test_without_the_variable_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same workloads, the variable unset: owned, updated, no stale graph counted."""
    monkeypatch.delenv(V2_VAR, raising=False)
    for workload in ("dense_gqa", "mla", "mtp_k2"):
        arm = overlay_arm(workload, "on", STEPS, eager=True)
        assert arm.error is None, arm.error
        assert arm.counters.get("graphs.owned") and arm.counters.get("updates.owned") == STEPS
        assert "graphs.stale" not in arm.counters and not arm.refused


# --- the rule itself, on a scope -------------------------------------------------------------


def _scope(calls: list[tuple], grown: dict[int, int], ran: list[Any]) -> shared.CaptureScope:
    """A capture scope whose target GraphParams grew by ``grown`` (size -> task groups)."""
    params = SimpleNamespace(handles={n: [object()] * k for n, k in grown.items()})
    scope = shared.CaptureScope(
        owner=None,
        graph=SimpleNamespace(role="target", descriptor=None),  # type: ignore[arg-type]
        graph_params=(params, None, None),
        handles_before=0,
        lengths_before=[{}, {}, {}],
        calls=calls,
    )
    scope.ran = {id(impl): impl for impl in ran}
    return scope


def test_an_impl_is_stale_when_it_ran_without_a_task_group_of_this_capture() -> None:
    fia, pa, mla, other = object(), object(), object(), object()
    graph_path = [("fia", fia, 4, None), ("pa", pa, 4, None)]
    assert stale.stale_impls(_scope(graph_path, {4: 2}, [fia, pa])) == []
    # a forward that ran and made no capture call: stale
    assert stale.stale_impls(_scope(graph_path, {4: 2}, [fia, pa, other])) == [other]
    # MLA decode is noted on either path: captured only where its size's lists grew
    assert stale.stale_impls(_scope([("mla", mla, 4, None)], {}, [])) == [mla]
    assert stale.stale_impls(_scope([("mla", mla, 4, None)], {4: 1}, [])) == []
    # nothing of ours ran (a graph of linear-attention layers only): nothing to say
    assert stale.stale_impls(_scope([], {}, [])) == []


def test_a_capture_its_notes_do_not_account_for_is_not_judged() -> None:
    """Task groups no noted call explains (an op the overlay does not register, its aspect
    disabled): an impl without a note may own one, so the ownership rules decide (stock)."""
    fia, other = object(), object()
    assert stale.stale_impls(_scope([("fia", fia, 4, None)], {4: 2}, [fia, other])) == []
    assert stale.stale_impls(_scope([], {2: 1}, [other])) == []


def test_the_notes_are_consumed_once() -> None:
    """A v2 graph's scope is closed twice (at the graph context's exit, then by the manager):
    the second close, with this capture's notes gone, must not call it stale."""
    other = object()
    scope = _scope([], {}, [other])
    assert stale.stale_impls(scope) == [other]
    assert stale.stale_impls(scope) == []


@pytest.mark.parametrize(
    ("raw", "policy"), [(None, "fail"), ("", "fail"), ("fail", "fail"), (" Replay ", "replay")]
)
def test_the_switch_reads_its_values(raw: str | None, policy: str) -> None:
    environ = {} if raw is None else {settings.ENV_STALE_GRAPH: raw}
    assert settings.stale_graph(environ) == policy
    assert settings.problems(environ) == []


def test_an_unknown_switch_value_fails_and_says_so() -> None:
    """A typo never lets a stale graph replay: it reads as ``fail``, with one line."""
    environ = {settings.ENV_STALE_GRAPH: "allow"}
    assert settings.stale_graph(environ) == "fail"
    (problem,) = settings.problems(environ)
    assert settings.ENV_STALE_GRAPH in problem and "replay" in problem


def test_every_forward_that_decides_the_graph_path_is_noted() -> None:
    """Each attention forward of the release that reads the capture flag itself (the base impl's
    and the INT8-KV subclass's, which never calls the base's) carries the note: a layer whose
    forward is not noted could run outside its graph path unseen. Read from the release's source,
    not a list."""
    import inspect

    from ascend_graph_patch.aspects import ASPECTS
    from ascend_graph_patch.lines.v0_23 import LINE as V0_23

    noted = {
        V0_23.seams[a.seam].qualname for a in ASPECTS if a.wrapper.endswith("stale:attention_ran")
    }
    import importlib

    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    module = importlib.import_module(V0_23.seams["attention.forward"].module)
    deciding = set()  # the forward each class that reads the flag runs (its own or inherited)
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == module.__name__ and "_EXTRA_CTX.capturing" in inspect.getsource(cls):
            owner = next(k for k in cls.__mro__ if "forward" in k.__dict__)
            deciding.add(f"{owner.__qualname__}.forward")
    assert len(deciding) >= 2, deciding
    assert deciding <= noted, deciding - noted
