"""The gate refuses drifted seams and unknown versions cleanly: one warning, nothing installed."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from ascend_graph_patch import activation, gate, state
from ascend_graph_patch.lines import LINES
from tests.overlay_support import assert_bitwise, overlay_arm


@pytest.fixture
def seams():
    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    attn = importlib.import_module("vllm_ascend.attention.attention_v1")
    utils = importlib.import_module("vllm_ascend.attention.utils")
    yield attn, utils
    activation.disable()


def _impl(attn):
    return attn.AscendAttentionBackendImpl


def test_supported_release_passes(seams) -> None:
    verdict = gate.check("v1")
    assert verdict.ok and not verdict.forced
    assert "0.23.0.post1" in verdict.reason


def _enable_and_expect_refusal(capfd, fragment: str) -> None:
    activation.enable("on")
    assert state.STATE.gate["v1"]["verdict"] == "refused"
    assert fragment in state.STATE.gate["v1"]["reason"]
    assert activation.installed() == []
    # MLA builds on v1's capture and update wrappers: where its module has loaded (it has, after
    # another test imported it), refused with v1, silently (one line), and status says why.
    importlib.import_module("vllm_ascend.attention.mla_v1")
    mla = state.STATE.gate["mla"]
    assert mla["verdict"] == "refused" and mla["reason"].startswith("needs v1: "), mla
    assert fragment in mla["reason"]
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ascend-graph-patch: not installed (v1)")
    assert fragment in err[0]


def test_changed_signature_is_refused(seams, monkeypatch, capfd) -> None:
    attn, _ = seams

    def full_graph_pa(self, query, attn_metadata, output=None, layer_name=None):
        raise AssertionError("never called")

    monkeypatch.setattr(_impl(attn), "full_graph_pa", full_graph_pa)
    _enable_and_expect_refusal(capfd, "signature of AscendAttentionBackendImpl.full_graph_pa")
    assert type(_impl(attn).__dict__["update_graph_params"]) is staticmethod


def test_missing_method_is_refused(seams, monkeypatch, capfd) -> None:
    attn, _ = seams
    monkeypatch.delattr(_impl(attn), "full_graph_fia_v2")
    _enable_and_expect_refusal(capfd, "AscendAttentionBackendImpl.full_graph_fia_v2 is missing")


def test_marker_of_the_newer_line_is_refused(seams, monkeypatch, capfd) -> None:
    _, utils = seams
    monkeypatch.setattr(utils, "PagedAttentionGraphParam", object, raising=False)
    _enable_and_expect_refusal(capfd, "PagedAttentionGraphParam exists")


def test_unsupported_version_is_refused(seams, monkeypatch, capfd) -> None:
    real = gate.installed_version
    monkeypatch.setattr(gate, "installed_version", lambda d: "0.24.0" if "ascend" in d else real(d))
    _enable_and_expect_refusal(capfd, "unsupported versions: vllm-ascend 0.24.0")


def test_force_overrides_a_refusal_with_a_warning(seams, monkeypatch, capfd) -> None:
    real = gate.installed_version
    monkeypatch.setattr(gate, "installed_version", lambda d: "0.24.0" if "ascend" in d else real(d))
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_FORCE", "1")
    activation.enable("on")
    assert state.STATE.gate["v1"]["verdict"] == "forced"
    assert "replay.update" in activation.installed()
    assert "FORCED install (v1)" in capfd.readouterr().err


def test_wrong_tuple_arity_at_first_capture_leaves_graphs_to_stock(monkeypatch) -> None:
    stock = overlay_arm("dense_gqa", "off", steps=20)
    line = LINES[0]
    fia = dataclasses.replace(line.layouts["fia"], fields=line.layouts["fia"].fields[:-1])
    drifted = dataclasses.replace(line, layouts={**line.layouts, "fia": fia})
    monkeypatch.setattr(gate, "LINES", (drifted,))
    arm = overlay_arm("dense_gqa", "on", steps=20)
    assert_bitwise(arm, stock)
    assert "graphs.owned" not in arm.counters
    assert arm.counters["updates.stock.unowned"] == 20
    refused = arm.snapshot["graphs_refused"]
    assert refused and all("tuple arity: fia tuple has 22 fields" in r for r in refused.values())
