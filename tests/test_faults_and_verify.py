"""Faults degrade to stock (counted, warned once, correct output, no hang); verify catches lies."""

from __future__ import annotations

import dataclasses

import pytest

from ascend_graph_patch.aspects import attention, replay, verify
from ascend_graph_patch.core.kinds import FIA, FIA_V2, MLA, PA
from ascend_graph_patch.core.providers import GraphWorkspaceProvider, LengthsWorkspaceProvider
from ascend_graph_patch.lines.v0_23 import LINE, MLAProvider
from tests.overlay_support import assert_bitwise, overlay_arm

STEPS = 30


@pytest.fixture
def stock_dense():
    return overlay_arm("dense_gqa", "off", steps=STEPS)


def test_resolution_fault_falls_back_to_stock_for_that_step(stock_dense, mocker, capfd):
    """A bug of ours now and then (the provider raising): stock, on intact metadata, takes
    those steps."""
    original = GraphWorkspaceProvider.values
    calls = {"n": 0}

    def flaky(self, metadata):
        calls["n"] += 1
        if calls["n"] % 7 == 0:
            raise RuntimeError("provider bug")
        return original(self, metadata)

    mocker.patch.object(GraphWorkspaceProvider, "values", flaky)
    arm = overlay_arm("dense_gqa", "on", steps=STEPS)
    assert arm.error is None
    assert_bitwise(arm, stock_dense)
    fallbacks = arm.counters["fallback.resolution"]
    assert 0 < fallbacks < STEPS
    assert arm.counters["updates.owned"] == STEPS - fallbacks
    assert capfd.readouterr().err.count("the stock update took this step") == 1  # warned once


def test_provider_exception_falls_back(stock_dense, mocker) -> None:
    mocker.patch.object(GraphWorkspaceProvider, "values", side_effect=KeyError("seq_lens_list"))
    arm = overlay_arm("dense_gqa", "on", steps=STEPS)
    assert_bitwise(arm, stock_dense)
    assert arm.counters["fallback.resolution"] == STEPS
    assert "updates.owned" not in arm.counters


@pytest.mark.parametrize("where", ["_bucket_key", "build_task"])  # at each call; at the end
def test_capture_side_fault_leaves_the_graph_to_stock(stock_dense, mocker, where) -> None:
    mocker.patch.object(attention, where, side_effect=RuntimeError("capture bug"))
    arm = overlay_arm("dense_gqa", "on", steps=STEPS)
    assert arm.error is None
    assert_bitwise(arm, stock_dense)
    assert arm.counters["graphs.refused"] >= 1 and "graphs.owned" not in arm.counters
    assert arm.counters["updates.stock.unowned"] == STEPS
    assert all("capture bug" in why for why in arm.snapshot["graphs_refused"].values())


def test_error_inside_the_replay_aspect_never_reaches_the_engine(
    stock_dense, mocker, capfd
) -> None:
    mocker.patch.object(replay, "_plan", side_effect=RuntimeError("replay bug"))
    arm = overlay_arm("dense_gqa", "on", steps=STEPS)
    assert arm.error is None
    assert_bitwise(arm, stock_dense)
    assert arm.counters["errors.replay.update"] == STEPS
    err = capfd.readouterr().err
    assert err.count("internal error in aspect replay.update") == 1


def test_task_groups_the_overlay_did_not_register_leave_the_graph_to_stock(monkeypatch) -> None:
    """Stand-in for MLA / CP / SFA task groups: the PA aspect disabled, PA goes unregistered."""
    stock = overlay_arm("paged_attention", "off", steps=STEPS)
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_DISABLE", "attention.pa")
    arm = overlay_arm("paged_attention", "on", steps=STEPS)
    assert_bitwise(arm, stock)
    assert "attention.pa" not in arm.snapshot["aspects_installed"]
    assert arm.counters["graphs.refused"] >= 1  # every graph holding a PA task group
    assert arm.counters["updates.stock.unowned"] > 0
    assert all(
        "not registered by the overlay" in r for r in arm.snapshot["graphs_refused"].values()
    )


def test_verify_catches_a_wrong_provider(stock_dense, mocker) -> None:
    original = GraphWorkspaceProvider.values

    def lying(self, metadata):
        values = original(self, metadata)
        values["actual_seq_lengths_kv"] = [n + 1 for n in values["actual_seq_lengths_kv"]]
        return values

    mocker.patch.object(GraphWorkspaceProvider, "values", lying)
    arm = overlay_arm("dense_gqa", "verify", steps=STEPS)
    assert arm.counters["verify.mismatches"] == STEPS * 4  # every task, every step
    assert_bitwise(arm, stock_dense)  # verify applies stock


def test_strict_verify_raises_a_readable_diff(mocker, monkeypatch) -> None:
    original = LengthsWorkspaceProvider.values

    def lying(self, metadata):
        values = original(self, metadata)
        values["context_lens"] = values["context_lens"] * 0
        return values

    mocker.patch.object(LengthsWorkspaceProvider, "values", lying)
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_STRICT", "1")
    arm = overlay_arm("paged_attention", "verify", steps=3)
    assert arm.run.error_type == verify.VerifyMismatch.__name__
    text = arm.run.traceback.rsplit("VerifyMismatch: ", 1)[1]  # the whole message
    assert "context_lens: overlay tensor" in text and "!= stock tensor" in text
    assert "model.layers.0.self_attn.attn" in text


def test_a_fault_in_verify_comparison_still_applies_stock(stock_dense, mocker):
    mocker.patch.object(verify, "compare", side_effect=RuntimeError("compare bug"))
    arm = overlay_arm("dense_gqa", "verify", steps=STEPS)
    assert arm.error is None
    assert_bitwise(arm, stock_dense)
    assert arm.counters["errors.replay.update.verify"] == STEPS


# --- verify sees the whole relaunch: one argument mutated at a time ----------------------------


def _mutate_template(mocker, kind: str, mutate) -> None:
    """The line's relaunch template of ``kind``, with ``mutate(template, fields)`` applied to
    every task's (the overlay then relaunches that; verify applies stock's)."""
    layout = LINE.layouts[kind]
    original = layout.template

    def template(fields, module):
        return mutate(original(fields, module), fields)

    mocker.patch.dict(LINE.layouts, {kind: dataclasses.replace(layout, template=template)})


def _key_is_k_pe(t, f):
    t["key"] = f.k_pe
    return t


def _softmax_scale_one(t, f):
    t["softmax_scale"] = 1.0
    return t


def _value_is_key(t, f):
    t["value"] = t["key"]
    return t


def _caches_swapped(t, f):
    t["key_cache"], t["value_cache"] = t["value_cache"], t["key_cache"]
    return t


def _no_workspace(mocker) -> None:
    """MLA's provider reads no workspace: every relaunch gets None (the simulator runs it)."""
    original = MLAProvider.__post_init__

    def post_init(self):
        original(self)
        self.steady = ("workspace", lambda: None)

    mocker.patch.object(MLAProvider, "__post_init__", post_init)


MUTATIONS = [
    # (workload, kind, the argument, how) -- the three MLA mutations, target and draft
    pytest.param("mla", MLA, "workspace", _no_workspace, id="mla-workspace-none"),
    pytest.param("mla_mtp_k2", MLA, "workspace", _no_workspace, id="mla-draft-workspace-none"),
    pytest.param("mla", MLA, "key", _key_is_k_pe, id="mla-key-is-k_pe"),
    pytest.param("mla", MLA, "softmax_scale", _softmax_scale_one, id="mla-softmax-scale-1"),
    # arguments stock passes positionally in the op's schema (query, key, value; PA: all)
    pytest.param("dense_gqa", FIA, "value", _value_is_key, id="fia-value-is-key"),
    pytest.param("sinks", FIA_V2, "value", _value_is_key, id="fia-v2-value-is-key"),
    pytest.param("paged_attention", PA, "key_cache", _caches_swapped, id="pa-caches-swapped"),
]


@pytest.mark.parametrize("workload, kind, argument, mutation", MUTATIONS)
def test_verify_reports_a_mutated_relaunch_argument(
    workload: str, kind: str, argument: str, mutation, mocker, capfd
) -> None:
    """Each mutation relaunches one argument other than stock's, on every task: verify must
    report every task of every step, naming the task, the argument and both values. (Before
    verify compared the whole relaunch it compared only the lengths and block tables: each of
    these passed with 0 mismatches, the MLA ones on the real engine too.)"""
    if mutation is _no_workspace:
        mutation(mocker)
    else:
        _mutate_template(mocker, kind, mutation)
    arm = overlay_arm(workload, "verify", steps=6)
    assert arm.error is None, arm.error
    tasks = arm.counters["verify.tasks"]
    assert tasks > 0 and arm.counters["verify.updates"] == 6
    assert arm.counters.get("verify.mismatches", 0) == tasks  # every task, once each
    err = capfd.readouterr().err
    (line,) = [x for x in err.splitlines() if "verify: overlay differs from stock" in x]
    assert f": {argument}: overlay " in line and " != stock " in line, line
    assert f"{kind} model.layers." in line, line


def test_verify_names_an_argument_stock_passes_and_the_overlay_does_not(mocker, capfd) -> None:
    """A relaunch that drops an argument (FIA v2's learnable sinks) is a mismatch too, named."""

    def no_sinks(t, f):
        del t["learnable_sink"]
        return t

    _mutate_template(mocker, FIA_V2, no_sinks)
    arm = overlay_arm("sinks", "verify", steps=4)
    assert arm.counters.get("verify.mismatches", 0) == arm.counters["verify.tasks"] > 0
    err = capfd.readouterr().err
    assert "learnable_sink: stock passes tensor" in err and "overlay does not" in err
