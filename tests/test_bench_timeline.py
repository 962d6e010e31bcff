"""The modelled step timeline (``bench --project --timeline``): its arithmetic against steps
worked out by hand, and what the arms must show.

Hand oracle, two tasks, two layers, async scheduling (step i waits for step i-2's output), costs
in microseconds: host work besides the update 50, no launch cost, 100 per layer on the device,
no sampler, no device cost per update, 20 of host update per step (10 per task).

- stock (barrier): step 0 launches at 50, the updates are issued at 60 and 70, layer 0 runs
  60-160, layer 1 160-260 (done 260). Step 1: the host is free at 70, prepares until 120, the
  barrier waits for the compute stream (260), updates at 270 and 280: layers 270-370, 370-470.
  Every later step the same: 210 per step, the device idle 10 of them (the first update's host
  cost after the barrier).
- stream order: step 1 launches at 120 without waiting; its updates (issued at 130, 140) wait on
  the update stream for the compute stream's 260: layers 260-360, 360-460: 200 per step (device
  bound: 2 x 100).
- host bound (100 per layer replaced by 10, update 200 per step, host work 100): 300 per step
  (100 + 200) in every arm, the device idle 280 of them.
"""

from __future__ import annotations

import pytest

from torch_npu_sim.bench import timeline as tl

DEVICE_BOUND = tl.StepModel(
    host_other_us=50, launch_us=0, layer_device_us=100, sample_device_us=0, update_device_us=0
)


def _step(
    model: tl.StepModel, arm: tl.Arm, tasks: int = 2, async_scheduling: bool = True
) -> tl.Timeline:
    return tl.simulate(model, arm, tasks, tasks, async_scheduling, steps=8, warmup=2)


def test_stock_waits_for_the_device_before_each_replay() -> None:
    line = _step(DEVICE_BOUND, tl.Arm("stock", 20, barrier=True, stream_order=False))
    assert line.step_ms == pytest.approx(0.210)
    assert line.device_idle == pytest.approx(10 / 210)
    assert line.limit_ms == pytest.approx(0.200)


def test_stream_order_reaches_the_device_limit() -> None:
    line = _step(DEVICE_BOUND, tl.Arm("stream", 20, barrier=False, stream_order=True))
    assert line.step_ms == pytest.approx(0.200)
    assert line.device_idle == pytest.approx(0.0)
    assert line.host_idle == pytest.approx(1 - 70 / 200)


def test_a_host_bound_step_gains_nothing_from_stream_order() -> None:
    model = tl.StepModel(
        host_other_us=100, launch_us=0, layer_device_us=10, sample_device_us=0, update_device_us=0
    )
    for arm in tl.arms(200, 200):
        line = _step(model, arm)
        assert line.step_ms == pytest.approx(0.300), arm
        assert line.device_idle == pytest.approx(280 / 300), arm


def test_without_async_scheduling_the_barrier_costs_nothing_more() -> None:
    """The host waits for step i-1's output before preparing step i: the device is idle at the
    barrier, so stock and stream order give the same step (50 + 10 + 200 = 260)."""
    for arm in (
        tl.Arm("stock", 20, barrier=True, stream_order=False),
        tl.Arm("stream", 20, barrier=False, stream_order=True),
    ):
        assert _step(DEVICE_BOUND, arm, async_scheduling=False).step_ms == pytest.approx(0.260)


def test_only_the_unsafe_arm_lets_an_update_overtake_the_previous_replay() -> None:
    """Step 1's first update is issued at 130 while step 0's replay runs until 260: without the
    barrier or the wait, it would run on the device then (every step after the first); stock
    waits on the host, stream order on the update stream."""
    safe = [tl.Arm("stock", 20, True, False), tl.Arm("stream", 20, False, True)]
    for arm in safe:
        assert _step(DEVICE_BOUND, arm).overtaking_steps == 0, arm
    unsafe = _step(DEVICE_BOUND, tl.Arm("unsafe", 20, barrier=False, stream_order=False))
    assert unsafe.unsafe and unsafe.overtaking_steps == 7


def test_the_report_covers_every_shape_and_arm_and_the_sensitivity() -> None:
    projection = {
        "rows": [
            {"shape": "64 layers FIA", "tasks": 64, "stock_ms": 12.0, "overlay_ms": 11.8},
            {"shape": "64 layers PA", "tasks": 64, "stock_ms": 4.2, "overlay_ms": 2.0},
        ]
    }
    data = tl.report(projection)
    assert [(r["shape"], r["arm"]) for r in data["async_scheduling"]] == [
        (s, a) for s in ("64 layers FIA", "64 layers PA") for a in tl.ARMS
    ]
    by = {(r["shape"], r["arm"]): r for r in data["async_scheduling"]}
    # a device-bound step (PA with the overlay's update): stream order is faster than the barrier
    pa = by[("64 layers PA", tl.ARMS[3])]["step_ms"], by[("64 layers PA", tl.ARMS[2])]["step_ms"]
    assert pa[0] < pa[1]
    # and never below the physical limit
    for row in data["async_scheduling"]:
        assert row["step_ms"] >= row["limit_ms"] - 1e-9, row
    varied = {(r["shape"], r["varied"], r["factor"]) for r in data["sensitivity"]}
    assert len(varied) == 2 * (1 + 2 * len(tl.VARIED))
    text = tl.render(data)
    assert "NOT a measurement" in text and "unsafe" in text and "13058" in text
