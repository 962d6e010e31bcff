"""v1 MTP / Eagle merged draft graphs: the overlay against stock and eager, on the real proposer.

Each arm builds a fresh draft engine with the same seed, so the same batches, weights and KV
history reach stock and overlay; eager runs first in each step and leaves the KV caches as it found
them. Draft tasks must be keyed by (metadata key, step): one task per layer per step, all distinct.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from tests.overlay_support import OverlayArm, assert_bitwise, overlay_arm
from torch_npu_sim.harness import scenarios
from torch_npu_sim.harness.scenarios import DRAFT_SCENARIOS
from torch_npu_sim.harness.spec import DraftScenario, LayerSpec, draft_layer

STEPS = 16
TOL = 1e-4


@pytest.fixture
def overlay() -> Iterator[Callable[[str], None]]:
    """Enable the overlay in-process (after the vllm_ascend imports), always disabled after."""
    import importlib

    from ascend_graph_patch import activation

    for name in (
        "vllm_ascend.ops",
        "vllm_ascend.attention.attention_v1",
        "vllm_ascend.compilation.acl_graph",
    ):
        importlib.import_module(name)

    def on(mode: str) -> None:
        activation.enable(mode)
        from ascend_graph_patch import state

        assert state.STATE.gate["v1"]["verdict"] == "supported", state.STATE.gate

    yield on
    activation.disable()


def run_draft_arm(
    name: str | DraftScenario, steps: int = STEPS, *, tamper: Callable[[], None] | None = None
) -> OverlayArm:
    """Capture every size, optionally tamper with the owned graphs, then propose `steps` times
    (each compared with eager), with the overlay as the test set it."""
    return overlay_arm(
        name,
        None,
        steps,
        seed=1234,
        eager=True,
        before_steps=(lambda workload: tamper()) if tamper is not None else None,
    )


def draft_keys(arm: OverlayArm) -> list[list[tuple]]:
    """Task keys per owned draft graph."""
    return [keys for (role, _), keys in arm.keys.items() if role == "draft"]


#: Every catalogued draft scenario where stock is recorded right (read from the catalogue, so a
#: scenario added there is checked here, and a wrong record fails below).
STOCK_RIGHT = [name for name, sc in DRAFT_SCENARIOS.items() if sc.stock == "ok"]


def test_every_draft_scenario_is_recorded_right_or_wrong() -> None:
    assert "mtp_k1" in STOCK_RIGHT and "mla_mtp_k2" in STOCK_RIGHT
    others = [sc.stock for name, sc in DRAFT_SCENARIOS.items() if name not in STOCK_RIGHT]
    assert all(stock.startswith("wrong: ") for stock in others), others


@pytest.mark.parametrize("name", STOCK_RIGHT)
def test_overlay_equals_stock_equals_eager(name: str, overlay: Callable[[str], None]) -> None:
    sc = DRAFT_SCENARIOS[name]
    stock = run_draft_arm(name)
    assert stock.max_eager_error < TOL  # stock is right here: the reference for bitwise equality
    overlay("on")
    ours = run_draft_arm(name)
    assert_bitwise(ours, stock)
    assert ours.max_eager_error < TOL
    k, layers = sc.num_speculative_tokens, len(sc.layers)
    # every draft step of every layer is one task, keyed by (kind, layer, step)
    assert len(draft_keys(ours)) == len(sc.capture_sizes)
    for keys in draft_keys(ours):
        assert len(keys) == len(set(keys)) == k * layers
        assert sorted({step for *_, step in keys}) == list(range(k))
    assert ours.counters["updates.owned"] == STEPS
    assert ours.counters["tasks.updated"] == STEPS * k * layers
    assert not any(c.startswith(("fallback", "errors")) for c in ours.counters)


def test_draft_engines_in_sequence_each_own_their_graphs(overlay: Callable[[str], None]) -> None:
    """One process, several draft engines in turn (the A/B worker, the soak): a closed engine's
    graphs die at close, without waiting for a gc pass, so the next engine's graphs of the same
    (role, descriptor) are owned. gc stays off so that only reference counting can free them."""
    overlay("on")
    gc.disable()
    try:
        arms = [run_draft_arm(name, steps=2) for name in ("mtp_k1", "mtp_k2", "mtp_k1")]
    finally:
        gc.enable()
    owned = [arm.counters.get("updates.owned", 0) for arm in arms]
    assert owned == [2, 4, 6], "counters are cumulative: every arm owned its two updates"
    assert [len(draft_keys(arm)) for arm in arms] == [2, 2, 2]  # only the live engine's graphs


@pytest.mark.parametrize(
    "name",
    ["mtp_k1", "mtp_k4", "mtp_2layers_k3", "eagle_2layers_k2", "mtp_non_causal", "mla_mtp_k2"],
)
def test_verify_has_no_mismatch_where_stock_is_right(
    name: str, overlay: Callable[[str], None]
) -> None:
    sc = DRAFT_SCENARIOS[name]
    overlay("verify")
    arm = run_draft_arm(name, steps=8)
    assert arm.run.ok, arm.error
    assert arm.counters["verify.updates"] == 8
    assert arm.counters["verify.tasks"] == 8 * sc.num_speculative_tokens * len(sc.layers)
    assert arm.counters.get("verify.mismatches", 0) == 0


def test_non_causal_steps_follow_stock(overlay: Callable[[str], None]) -> None:
    """Non-causal steps relaunch with sparse_mode 0, as stock does: bitwise equal to stock.

    Stock itself differs from eager here: eager's non-causal FIA passes no mask, the captured
    graph task keeps the causal split-fuse mask under sparse_mode 0 (applied top-left). The overlay
    reproduces stock on purpose (owning the update must not change what the kernel computes).
    """
    from ascend_graph_patch.core.providers import GraphWorkspaceProvider

    stock = run_draft_arm("mtp_non_causal", steps=8)
    overlay("on")
    seen: list[int] = []
    original = GraphWorkspaceProvider.values

    def spy(self: GraphWorkspaceProvider, metadata):  # noqa: ANN001
        values = original(self, metadata)
        seen.append(values["sparse_mode"])
        return values

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GraphWorkspaceProvider, "values", spy)
        ours = run_draft_arm("mtp_non_causal", steps=8)
    assert_bitwise(ours, stock)
    assert 0 in seen and 3 in seen  # step 0 causal (3), steps 1-2 non-causal (0)
    assert stock.max_eager_error > 0.1  # the stock graph-vs-eager gap described above
    assert DRAFT_SCENARIOS["mtp_non_causal"].stock.startswith("wrong: ")  # recorded as such


@pytest.mark.parametrize("mode", [None, "on"])
def test_skipping_the_draft_update_is_stale(
    mode: str | None, overlay: Callable[[str], None]
) -> None:
    """Negative control: the merged draft graph replayed without its update reads the lengths
    and tables of the last update, and must differ from eager (stock and overlay alike); without
    even the events recorded, the simulator must report the blocked replay. Either way the next
    updated proposes are right again."""
    if mode is not None:
        overlay(mode)
    from torch_npu_sim import SimulatorError

    extra, stale = random.Random(7), []

    def without_update(workload: Any, index: int, batch: Any, out: Any) -> None:
        if index == 1:  # after two updated proposes: events recorded, no update
            extra_batch = workload.next_batch(extra)
            eager = workload.run(extra_batch, graph=False).values
            missed = workload.run_without_update(extra_batch).values
            stale.append((missed - eager).abs().max().item())
        if index == 2:  # events not recorded either: the replay never runs (a hang on hardware)
            with pytest.raises(SimulatorError, match="blocked"):
                workload.run_without_update(workload.next_batch(extra), record=False)
            stale.append(-1.0)

    arm = overlay_arm("mtp_2layers_k3", None, 5, seed=1234, eager=True, on_step=without_update)
    assert arm.run.ok and arm.run.steps == 5, arm.error
    assert len(stale) == 2 and stale[0] > 1e-2, f"no update, yet equal to eager ({stale})"
    assert arm.max_eager_error < TOL  # the updated steps around them stay right


#: Draft layers in two KV-cache groups, each step's dict listing both groups' layers with each
#: group's own metadata object: a shape no proposer of vllm-ascend 0.23.0.post1 passes (the
#: generic proposer refuses two draft groups at start-up; Step3.5 MTP passes one dict per group:
#: the engine tests' step3p5 cases). Formerly the catalogue's ``mtp_two_kv_groups``.
UNREAL_TWO_GROUP_DRAFT = DraftScenario(
    "unreal_two_group_draft",
    (
        LayerSpec(draft_layer(0)),
        LayerSpec(draft_layer(1), sliding_window=64),
        LayerSpec(draft_layer(2)),
    ),
    num_speculative_tokens=3,
)


def test_unknown_draft_metadata_shape_goes_to_stock(overlay: Callable[[str], None]) -> None:
    """A step's dict holding two metadata objects is not a shape the overlay understands: every
    draft graph is refused at capture, with the reason, and the proposes take stock's path."""
    stock = run_draft_arm(UNREAL_TWO_GROUP_DRAFT, steps=4)
    overlay("on")
    ours = run_draft_arm(UNREAL_TWO_GROUP_DRAFT, steps=4)
    assert_bitwise(ours, stock)
    assert not draft_keys(ours)
    reasons = [why for (role, _), why in ours.refused.items() if role == "draft"]
    assert len(reasons) == len(UNREAL_TWO_GROUP_DRAFT.capture_sizes)
    assert all("draft metadata shape not understood" in why for why in reasons), reasons
    assert "2 metadata objects" in reasons[0]
    assert ours.counters.get("updates.owned", 0) == 0


def _swap(field_name: str, i: int, j: int) -> Callable[[], None]:
    """Swap one binding between two tasks of every owned draft graph (a deliberate bug)."""

    def tamper() -> None:
        from ascend_graph_patch.core.registry import REGISTRY

        for graph in REGISTRY.graphs():
            a, b = graph.tasks[i], graph.tasks[j]
            assert getattr(a, field_name) != getattr(b, field_name)
            va, vb = getattr(a, field_name), getattr(b, field_name)
            setattr(a, field_name, vb)
            setattr(b, field_name, va)

    return tamper


@pytest.mark.parametrize(
    ("field_name", "i", "j"),
    [("step", 0, -1)],  # tasks: (60, s0), (61, s0), (60, s1), (61, s1), (60, s2), (61, s2)
)
def test_wrong_binding_is_caught(
    field_name: str, i: int, j: int, overlay: Callable[[str], None]
) -> None:
    """A task bound to another step's metadata. (A wrong KV-group binding needs a multi-group
    draft: the engine tests' step3p5 control covers it on the real Step3.5 proposer.)"""
    from ascend_graph_patch import activation

    name = "mtp_2layers_k3"  # stock right: 0 mismatches untampered
    overlay("verify")
    checked = run_draft_arm(name, steps=4, tamper=_swap(field_name, i, j))
    assert checked.counters["verify.mismatches"] >= 4 * 2  # both swapped tasks, every update
    activation.disable()
    overlay("on")
    wrong = run_draft_arm(name, steps=4, tamper=_swap(field_name, i, j))
    assert wrong.max_eager_error > 1e-2, "the eager comparison must see the wrong binding"


@pytest.mark.parametrize("mode", [None, "on"])
def test_update_waiting_on_its_own_replay_is_a_deadlock(
    mode: str | None, overlay: Callable[[str], None]
) -> None:
    """Broken ordering on purpose: the update stream waits on the stream holding the replay.

    The simulator reports it as a deadlock (hardware would hang). Stock raises it into the
    caller; so does the overlay (a runtime failure part way through an update cannot go to
    stock), counting it and warning once.
    """
    from ascend_graph_patch import state
    from torch_npu_sim.runtime import SimulatorError

    if mode is not None:
        overlay(mode)
    engine: Any = scenarios.build("mtp_k2")
    try:
        engine.capture()
        batch = engine.next_batch(random.Random(5))
        with engine.open_step(batch) as step:
            fc, padded, per_step = step.forward_context, step.num_tokens, step.draft_metadatas
            engine.replay(step)  # blocked at the first event
            engine.update_stream.wait_stream(torch.npu.current_stream())
            with pytest.raises(SimulatorError, match="(?i)deadlock"):
                engine.proposer._update_full_graph_params(fc, padded, per_step)
                torch.npu.synchronize()
            if mode is not None:  # a runtime failure part way: raised, as stock raises it
                assert state.STATE.counters["faults.apply"] == 1
                assert "fault:apply:SimulatorError" in state.STATE.warned
    finally:
        engine.close()


def _shapes() -> dict[str, tuple[list[dict], int, str]]:
    """name -> (draft_attn_metadatas, index of the current entry, key being captured)."""
    m0, m1 = object(), object()
    return {
        # the generic proposer: every draft layer, one object per step
        "generic": ([{"a": m0, "b": m0}, {"a": m1, "b": m1}], 1, "b"),
        # Step3.5 MTP: one dict per KV-cache group, the layer's own group current at its step
        "per_kv_group": ([{"a": m0}, {"b": m1}], 1, "b"),
        # refused: the current step's dict does not list the layer
        "key_absent": ([{"a": m0}, {"b": m1}], 0, "b"),
        # refused: two groups' objects in one step's dict (no proposer of the line does this)
        "two_objects": ([{"a": m0, "b": m1}, {"a": m0, "b": m1}], 1, "a"),
    }


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("generic", 1),
        ("per_kv_group", 1),
        ("key_absent", "does not list 'b'"),
        ("two_objects", "holds 2 metadata objects"),
    ],
)
def test_draft_step_follows_the_proposers_shapes(
    shape: str, expected: int | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At capture a draft task's step is the entry the proposer made current; the entry must
    list the task's key with one metadata object, or the graph is refused (and goes to stock).
    Which shapes the proposers pass is the line's rule (``Line.draft_step``)."""
    from types import SimpleNamespace

    from ascend_graph_patch.aspects import attention
    from ascend_graph_patch.aspects import scope as shared
    from ascend_graph_patch.core.graph import CaptureRefused
    from ascend_graph_patch.core.kinds import DRAFT, TARGET
    from ascend_graph_patch.lines.v0_23 import LINE

    per_step, current, key = _shapes()[shape]
    context = SimpleNamespace(draft_attn_metadatas=per_step, attn_metadata=per_step[current])
    monkeypatch.setattr(attention, "get_forward_context", lambda: context)
    monkeypatch.setattr(shared, "ACTIVE", shared.Active(line=LINE, mode="on"))
    assert attention._draft_step(TARGET, key) == 0
    if isinstance(expected, int):
        assert attention._draft_step(DRAFT, key) == expected
        return
    with pytest.raises(CaptureRefused, match="draft metadata shape not understood") as refused:
        attention._draft_step(DRAFT, key)
    assert expected in str(refused.value)
    context.attn_metadata = {"a": object()}  # not one of the entries: no step to bind
    with pytest.raises(CaptureRefused, match="not recoverable"):
        attention._draft_step(DRAFT, key)
