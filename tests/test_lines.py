"""Release lines are data: a new line is one module, and the aspects read nothing else.

A synthetic second line, built here the way a new ``lines/<release>.py`` would be, is picked by the
gate when the installed versions say so; its seams, op handles and metadata binds are what the
overlay then uses. The installer removes only its own layers.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest
import wrapt

from ascend_graph_patch import activation, gate, state
from ascend_graph_patch.aspects import ASPECTS, groups
from ascend_graph_patch.core.kinds import FIA, MLA
from ascend_graph_patch.lines import LINES
from ascend_graph_patch.lines.v0_23 import LINE as V0_23
from tests.overlay_support import assert_bitwise, overlay_arm
from torch_npu_sim.workload import bitwise_equal

SYNTHETIC_VERSION = "9.9.9"


@pytest.fixture
def seams() -> Any:
    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    yield importlib.import_module("vllm_ascend.attention.attention_v1")
    activation.disable()


def synthetic_line(**layout_changes: Any) -> Any:
    """What a new line module would hold: versions, and its FIA layout (changed as asked)."""
    fia = dataclasses.replace(V0_23.layouts[FIA], **layout_changes)
    return dataclasses.replace(
        V0_23,
        name="synthetic",
        vllm_ascend_versions=frozenset({SYNTHETIC_VERSION}),
        layouts={**V0_23.layouts, FIA: fia},
    )


@pytest.fixture
def installed_as_synthetic(monkeypatch: pytest.MonkeyPatch):
    """Make the host report vllm-ascend 9.9.9 and list a line for it next to 0.23."""

    def use(line: Any) -> None:
        real = gate.installed_version
        monkeypatch.setattr(
            gate, "installed_version", lambda d: SYNTHETIC_VERSION if "ascend" in d else real(d)
        )
        monkeypatch.setattr(gate, "LINES", (*LINES, line))

    return use


def test_every_aspect_names_a_seam_of_the_line() -> None:
    """A line has each aspect's seam or declares it absent, with why; each layout's capture
    seam is one it has."""
    for line in LINES:
        for aspect in ASPECTS:
            assert aspect.seam in line.seams or line.absent.get(aspect.seam), (line.name, aspect)
        for layout in line.layouts.values():
            assert layout.capture_seam in line.seams
        assert set(groups(line)) == {a.group for a in ASPECTS if line.has(a.seam)}


def without_mla(line: Any) -> Any:
    """A release without MLA (say an older line): its seams declared absent, no MLA layout."""
    mla = {key for key in line.seams if key.startswith("mla.")}
    return dataclasses.replace(
        line,
        seams={k: v for k, v in line.seams.items() if k not in mla},
        absent=dict.fromkeys(mla, "this release has no MLA backend"),
        layouts={k: v for k, v in line.layouts.items() if k != MLA},
        fingerprints={k: v for k, v in line.fingerprints.items() if k != "mla"},
    )


def test_a_line_may_declare_a_seam_absent(seams, installed_as_synthetic) -> None:
    """The MLA aspects are left out on a release without MLA: no ``mla`` group to wait for, the
    v1 group installs as before, and stock's FIA graphs are still owned."""
    line = without_mla(synthetic_line())
    assert "mla" not in groups(line) and "mla" in groups(V0_23)
    installed_as_synthetic(line)
    arm = overlay_arm("dense_gqa", "on", steps=4)
    assert arm.snapshot["gate"]["v1"]["verdict"] == "supported"
    assert "mla" not in arm.snapshot["gate"]
    assert {"attention.mla", "replay.mla"}.isdisjoint(arm.snapshot["aspects_installed"])
    assert "replay.update" in arm.snapshot["aspects_installed"]
    assert arm.counters["updates.owned"] == 4


def test_a_seam_neither_present_nor_declared_absent_is_an_error() -> None:
    """Negative control for the test above: leaving a seam out without saying so is a line bug,
    caught where the line is read (not silently skipped)."""
    line = without_mla(V0_23)
    silent = dataclasses.replace(line, absent={})
    with pytest.raises(KeyError, match="mla.forward_decode"):
        groups(silent)
    assert "mla" not in groups(line)


def test_a_graph_holding_an_impl_left_to_stock_is_refused_with_the_lines_reason(
    seams, installed_as_synthetic
) -> None:
    """A line names impl classes whose graphs it leaves to stock (context-parallel, SFA, DSA):
    here, on a synthetic line, the backend's own impl. Every graph is then refused with that
    reason, visible in ``status``, and stock updates them: tokens equal stock's."""
    from ascend_graph_patch.lines.base import LeftToStock

    stock = overlay_arm("dense_gqa", "off", steps=6)
    reason = "synthetic: this impl's graphs are stock's"
    left = LeftToStock(
        V0_23.seams["attention.full_graph_fia"].module, "AscendAttentionBackendImpl", reason
    )
    installed_as_synthetic(dataclasses.replace(synthetic_line(), left_to_stock=(left,)))
    arm = overlay_arm("dense_gqa", "on", steps=6)
    assert arm.refused and set(arm.refused.values()) == {reason}
    assert reason in set(arm.snapshot["graphs_refused"].values())
    assert arm.snapshot["graphs_owned"] == 0 and "updates.owned" not in arm.counters
    assert arm.counters["updates.stock.unowned"] == 6
    assert_bitwise(arm, stock)


def test_the_release_leaves_context_parallel_sfa_and_dsa_to_stock_by_name() -> None:
    """What 0.23 leaves to stock, resolvable classes each (a rename on the release would make
    the refusal silent: the class would no longer be found)."""
    import importlib

    names = {entry.qualname for entry in V0_23.left_to_stock}
    assert names == {"AscendMlaCPImpl", "AscendAttentionCPImpl", "AscendSFAImpl", "AscendDSAImpl"}
    importlib.import_module("vllm_ascend.ops")
    for entry in V0_23.left_to_stock:
        module = importlib.import_module(entry.module)
        assert isinstance(getattr(module, entry.qualname), type), entry


def test_the_gate_derives_its_checks_from_the_aspect_table() -> None:
    checks = gate.checks(V0_23, "v1")
    v1_seams = {V0_23.seams[a.seam].qualname for a in ASPECTS if a.group == "v1"}
    assert {c.qualname for c in checks} >= v1_seams
    update = next(c for c in checks if c.qualname.endswith("update_graph_params"))
    assert update.kind == "signature" and update.expect == V0_23.update_params


def test_a_new_line_is_picked_by_version_and_its_op_handle_is_the_one_relaunched(
    seams, installed_as_synthetic, monkeypatch
) -> None:
    import torch_npu

    stock = overlay_arm("dense_gqa", "off", steps=12)
    relaunched: list[int] = []
    real_out = torch_npu.npu_fused_infer_attention_score.out

    def spy(*args: Any, **kwargs: Any) -> Any:
        relaunched.append(1)
        return real_out(*args, **kwargs)

    # the synthetic release relaunches FIA through another handle: only the line says so
    monkeypatch.setattr(torch_npu, "agp_synthetic_fia", spy, raising=False)
    installed_as_synthetic(synthetic_line(op="agp_synthetic_fia"))
    arm = overlay_arm("dense_gqa", "on", steps=12)
    assert arm.snapshot["gate"]["v1"]["verdict"] == "supported"
    assert "line synthetic" in arm.snapshot["gate"]["v1"]["reason"]
    assert_bitwise(arm, stock)
    assert arm.counters["updates.owned"] == 12
    assert len(relaunched) == arm.counters["tasks.updated"] == 12 * 4


def test_a_new_line_decides_which_metadata_attribute_feeds_a_relaunch(
    seams, installed_as_synthetic
) -> None:
    """Negative control for the test above: bind the KV lengths from the wrong attribute (the
    query ends) and the overlay's output must leave stock's."""
    stock = overlay_arm("dense_gqa", "off", steps=12)
    wrong = (
        ("actual_seq_lengths", "actual_seq_lengths_q"),
        ("actual_seq_lengths_kv", "actual_seq_lengths_q"),
    )
    installed_as_synthetic(synthetic_line(binds=wrong))
    arm = overlay_arm("dense_gqa", "on", steps=12)
    assert arm.counters["updates.owned"] == 12
    assert not bitwise_equal(arm.run, stock.run)[0]


def test_a_seam_missing_on_the_new_line_is_a_clean_refusal(
    seams, installed_as_synthetic, capfd
) -> None:
    line = synthetic_line()
    moved = dataclasses.replace(line.seams["attention.full_graph_pa"], qualname="Gone.full_graph")
    seams_moved = {**line.seams, "attention.full_graph_pa": moved}
    installed_as_synthetic(dataclasses.replace(line, seams=seams_moved))
    activation.enable("on")
    assert state.STATE.gate["v1"]["verdict"] == "refused"
    assert "Gone.full_graph" in state.STATE.gate["v1"]["reason"]
    # nothing of the refused group is installed (the v2 group may be, if an earlier test in this
    # process loaded the v2 runner's modules: it has its own seams and its own gate verdict)
    v1 = {a.name for a in ASPECTS if a.group == "v1"}
    assert not v1 & set(activation.installed())
    assert "not installed (v1)" in capfd.readouterr().err


# --- the installer removes only its own layers --------------------------------------------------


def test_disable_star_installs_nothing(seams, monkeypatch, capfd) -> None:
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_DISABLE", "*")
    activation.enable("on")
    assert state.STATE.gate["v1"]["verdict"] == "supported"
    assert activation.installed() == []


def test_unknown_aspect_names_in_disable_are_named(seams, monkeypatch, capfd) -> None:
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_DISABLE", "replay.update,attention.paa")
    activation.enable("on")
    installed = activation.installed()
    assert "replay.update" not in installed and "attention.pa" in installed
    err = capfd.readouterr().err
    assert err.count("no aspect named attention.paa") == 1


def test_a_wrapper_installed_on_top_of_ours_survives_disable(seams) -> None:
    impl = seams.AscendAttentionBackendImpl
    original = impl.__dict__["update_graph_params"]
    seen: list[int] = []

    def theirs(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        seen.append(1)
        return wrapped(*args, **kwargs)

    activation.enable("on")
    ours = impl.__dict__["update_graph_params"]
    assert ours is not original
    wrapt.wrap_function_wrapper(impl, "update_graph_params", theirs)
    top = impl.__dict__["update_graph_params"]
    activation.disable()
    assert impl.__dict__["update_graph_params"] is top  # their layer is still there ...
    assert top.__wrapped__ is ours  # ... over ours, which is now inert
    assert "replay.update" not in activation.installed()
    # enabling again revives our layer in place: no second layer of ours
    activation.enable("on")
    assert impl.__dict__["update_graph_params"] is top and top.__wrapped__ is ours
    assert "replay.update" in activation.installed()
    activation.disable()
    # the test's own cleanup: take their layer off, then ours (outermost again) comes off
    setattr(impl, "update_graph_params", ours)
    activation.enable("on")
    activation.disable()
    assert impl.__dict__["update_graph_params"] is original
    assert seen == []  # nothing called the update meanwhile


def test_an_inert_layer_changes_nothing(seams) -> None:
    """Beneath a third-party wrapper after disable, our layer passes straight through."""
    impl = seams.AscendAttentionBackendImpl
    original = impl.__dict__["update_graph_params"]
    stock = overlay_arm("paged_attention", "off", steps=8)
    activation.enable("on")
    ours = impl.__dict__["update_graph_params"]
    wrapt.wrap_function_wrapper(impl, "update_graph_params", lambda w, i, a, k: w(*a, **k))
    activation.disable()
    try:
        arm = overlay_arm("paged_attention", "off", steps=8)
        assert_bitwise(arm, stock)
        assert arm.counters == {}
    finally:
        setattr(impl, "update_graph_params", ours)
        activation.enable("on")
        activation.disable()
    assert impl.__dict__["update_graph_params"] is original
