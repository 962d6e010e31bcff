"""The overlay on the real vllm-ascend 0.23.0.post1 graph code (simulated NPU), target graphs, v1.

For every scenario, 150 replay steps with random batch sizes and KV lengths (padding included):
overlay == stock bitwise and == eager within tolerance; where stock itself crashes, the test
asserts that crash (evidence) and that the overlay matches eager. Verify finds 0 mismatches;
observe and off change nothing.
"""

from __future__ import annotations

import pytest

from tests.overlay_support import EAGER_TOL, STEPS, assert_bitwise, overlay_arm
from torch_npu_sim.harness.scenarios import SCENARIOS

NAMES = list(SCENARIOS)


def _stock_ok(name: str) -> bool:
    return SCENARIOS[name].stock == "ok"


@pytest.mark.parametrize("name", NAMES)
def test_overlay_equals_stock_and_eager(name: str) -> None:
    stock = overlay_arm(name, "off", eager=True)
    on = overlay_arm(name, "on", eager=True)
    assert on.error is None, on.error
    assert len(on.outputs) == STEPS
    assert on.max_eager_error <= EAGER_TOL
    n_tasks = sum(1 for spec in SCENARIOS[name].layers if spec.captures_task)
    assert on.counters.get("updates.owned") == STEPS
    assert on.counters.get("tasks.updated") == STEPS * n_tasks
    assert not any(k.startswith(("fallback", "errors", "updates.stock")) for k in on.counters)
    if _stock_ok(name):
        assert stock.error is None
        assert_bitwise(on, stock)
    else:
        # stock 0.23.0.post1 is wrong here: the recorded failure, exactly
        expected = SCENARIOS[name].stock.removeprefix("crash: ")
        assert stock.error is not None
        assert stock.error.startswith(expected)
        assert len(stock.outputs) == 0  # it fails on the very first replay


@pytest.mark.parametrize("name", NAMES)
def test_verify_reports_no_mismatch(name: str) -> None:
    arm = overlay_arm(name, "verify", eager=True)
    assert arm.error is None
    assert arm.counters.get("verify.updates") == STEPS
    assert arm.counters.get("verify.mismatches", 0) == 0
    assert arm.max_eager_error <= EAGER_TOL
    if _stock_ok(name):
        n_tasks = sum(1 for spec in SCENARIOS[name].layers if spec.captures_task)
        assert arm.counters.get("verify.tasks") == STEPS * n_tasks
        assert "verify.stock_failed" not in arm.counters
    else:
        # the dry run shows stock failing every step; the overlay's update was applied instead
        assert arm.counters.get("verify.stock_failed") == STEPS
        assert arm.counters.get("updates.owned") == STEPS


@pytest.mark.parametrize("name", [n for n in NAMES if _stock_ok(n)])
def test_observe_changes_nothing(name: str) -> None:
    stock = overlay_arm(name, "off", steps=50)
    observe = overlay_arm(name, "observe", steps=50)
    assert_bitwise(observe, stock)
    assert observe.counters.get("updates.observed") == 50
    assert "updates.owned" not in observe.counters
    assert observe.snapshot["aspects_effective"] == ["capture.v1"]


def test_observe_keeps_stock_failure() -> None:
    name = next(n for n in NAMES if not _stock_ok(n))
    observe = overlay_arm(name, "observe", steps=5)
    assert observe.error is not None  # observe changes nothing, including stock's bug


def test_update_then_replay_order_keeps_equality() -> None:
    stock = overlay_arm("dense_gqa", "off", steps=50, eager=True, update_order="update_then_replay")
    on = overlay_arm("dense_gqa", "on", steps=50, eager=True, update_order="update_then_replay")
    assert stock.error is None and on.error is None
    assert_bitwise(on, stock)
    assert on.max_eager_error <= EAGER_TOL
