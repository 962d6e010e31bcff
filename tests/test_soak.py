"""The soak with faults, small: faults at random steps, each step as stock shows it or as eager.

``make soak`` runs the full size (>= 10,000 steps at 1%); this runs enough to meet every fault of
the soak's pool on the FIA and PA paths, and a negative control that must fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from ascend_graph_patch.aspects import replay
from torch_npu_sim import soak

STEPS, CHUNK, RATE = 300, 50, 0.08


def test_faults_at_random_steps_are_met_as_stock_meets_them() -> None:
    per = soak.fault_pass(STEPS, CHUNK, RATE, 11, 1e-3, ["dense_gqa", "paged_attention"])
    injected = {name for s in per.values() for name in s["faults"]}
    assert sum(s["steps"] for s in per.values()) == STEPS
    assert {f.name for f in soak._soak_faults()} <= injected | {"metadata: lists one long"}
    for name, stats in per.items():
        assert stats["unexpected"] == 0, (name, stats.get("first_unexpected"))
        assert stats["hangs"] == 0


def test_negative_control_stock_fallback_on_broken_metadata_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old rule (broken metadata: hand the step to stock, whose key buffer is cold) must make
    the soak report unexpected steps."""
    original = replay._step_fault

    def old_rule(owned: Any, fault: Any, stream: Any) -> BaseException:
        raise replay.ResolutionError(str(fault))

    monkeypatch.setattr(replay, "_step_fault", old_rule)
    per = soak.fault_pass(STEPS, CHUNK, RATE, 11, 1e-3, ["dense_gqa"])
    assert per["dense_gqa"]["unexpected"] > 0
    assert per["dense_gqa"]["hangs"] > 0  # stock, with its key buffer cold, left tasks waiting
    assert original is not old_rule
