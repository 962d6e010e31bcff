"""Stream-ordered replay (``ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream``) on the real v1 graph wrapper.

For owned FULL graphs whose update stream is known, the replay runs without stock's device
synchronize and the update stream waits on the compute stream first; everything else keeps the
barrier, counted by reason. Outputs stay bitwise equal to stock's (the simulator runs device work
in host order, so this shows the wiring, not the ordering: the race detector shows that).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pytest_mock import MockerFixture

from ascend_graph_patch import settings
from ascend_graph_patch.aspects import replay_order
from tests.overlay_support import EAGER_TOL, assert_bitwise, overlay_arm
from torch_npu_sim import runtime

STEPS = 30
STREAM = replay_order.STREAM
FIRST = replay_order.BARRIER + ".first_replay"


@pytest.fixture
def stream_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.ENV_REPLAY_SYNC, "stream")


class _Calls:
    """How often the simulated streams were synchronised / made to wait, per arm."""

    def __init__(self, mocker: MockerFixture) -> None:
        self.sync = mocker.spy(runtime.Stream, "synchronize")
        self.wait = mocker.spy(runtime.Stream, "wait_stream")

    def take(self) -> tuple[int, int]:
        found = (self.sync.call_count, self.wait.call_count)
        self.sync.reset_mock()
        self.wait.reset_mock()
        return found


def _graphs_replayed(arm: Any) -> int:
    return len({descriptor for (_, descriptor) in arm.keys})


@pytest.mark.parametrize("name", ["dense_gqa", "paged_attention", "mla"])
def test_owned_graphs_replay_without_the_barrier_and_equal_stock(
    name: str, monkeypatch: pytest.MonkeyPatch, mocker: MockerFixture
) -> None:
    calls = _Calls(mocker)
    stock = overlay_arm(name, "off", STEPS, eager=True)
    stock_sync, stock_wait = calls.take()
    monkeypatch.setenv(settings.ENV_REPLAY_SYNC, "stream")
    ordered = overlay_arm(name, "on", STEPS, eager=True)
    sync, wait = calls.take()

    assert ordered.error is None, ordered.error
    assert_bitwise(ordered, stock)
    assert ordered.max_eager_error <= EAGER_TOL
    counters = ordered.counters
    graphs = _graphs_replayed(ordered)
    # the first replay of each graph keeps the barrier (its update stream is not known yet)
    assert counters.get(FIRST) == graphs and graphs >= 2, counters
    assert counters.get(STREAM) == STEPS - graphs, counters
    # each stream-ordered replay dropped exactly one synchronize and made the update stream wait
    assert stock_sync - sync == counters[STREAM], (stock_sync, sync)
    assert wait - stock_wait == counters[STREAM], (stock_wait, wait)
    assert counters.get("updates.owned") == STEPS


def test_enpu_wrappers_are_left_as_stock_built_them(
    stream_order: None, mocker: MockerFixture
) -> None:
    """ENPU updates before it replays and stock has no barrier there: nothing to replace."""
    calls = _Calls(mocker)
    arm = overlay_arm("dense_enpu", "on", 20, eager=True)
    assert arm.error is None, arm.error
    assert arm.max_eager_error <= EAGER_TOL
    assert {k for k in arm.counters if k.startswith("replay_order")} == {replay_order.NO_BARRIER}, (
        arm.counters
    )
    assert calls.take()[1] == 0


def test_default_and_unknown_values_keep_the_barrier(mocker: MockerFixture) -> None:
    for environ in ({}, {settings.ENV_REPLAY_SYNC: "streams"}):
        assert settings.replay_sync(environ) == "device"
    (problem,) = settings.problems({settings.ENV_REPLAY_SYNC: "streams"})
    assert "device" in problem and "stream" in problem and "barrier" in problem
    assert settings.replay_sync({settings.ENV_REPLAY_SYNC: " Stream "}) == "stream"
    arm = overlay_arm("dense_gqa", "on", 10)
    assert not any(k.startswith("replay_order") for k in arm.counters), arm.counters


class _Wrapper:
    """Stands in for ``ACLGraphWrapper``: the attributes the aspect reads, and a replay that
    records whether the barrier would have run (stock reads ``enable_enpu`` there)."""

    def __init__(self, enable_enpu: bool = False, use_eagle: bool = False) -> None:
        self.enable_enpu = enable_enpu
        self.use_eagle = use_eagle
        self.barrier: list[bool] = []

    def replay(self, fail: bool = False) -> str:
        self.barrier.append(not self.enable_enpu)
        if fail:
            raise RuntimeError("replay failed")
        return "out"


class _Owned:
    def __init__(self, tasks: int, stream: Any) -> None:
        self.tasks = [object()] * tasks
        self.update_stream = stream


@pytest.fixture
def registry(mocker: MockerFixture) -> dict[Any, Any]:
    graphs: dict[Any, Any] = {}
    mocker.patch.object(
        replay_order.REGISTRY, "lookup", side_effect=lambda role, d, owner: graphs.get(d)
    )
    return graphs


def _replay(wrapper: _Wrapper, role: str = "target", streams: Any = (), fail: bool = False) -> Any:
    """The capture aspect's replay branch, as it calls this module."""
    if replay_order.prepare_v1(wrapper, role, "d", list(streams)):
        return replay_order.without_barrier(lambda: wrapper.replay(fail), wrapper, (), {})
    return wrapper.replay(fail)


@pytest.mark.parametrize(
    ("graph", "reason"),
    [(None, "unowned"), ((0, "s"), "no_tasks"), ((2, None), "first_replay"), ((2, "s"), None)],
)
def test_which_replays_keep_the_barrier(
    registry: dict[Any, Any], graph: Any, reason: str | None, mocker: MockerFixture
) -> None:
    registry["d"] = None if graph is None else _Owned(*graph)
    count = mocker.patch.object(replay_order.state, "count")
    wrapper = _Wrapper()
    assert _replay(wrapper) == "out"
    assert wrapper.barrier == [reason is not None]
    expected = replay_order.STREAM if reason is None else f"{replay_order.BARRIER}.{reason}"
    count.assert_called_once_with(expected)
    assert wrapper.enable_enpu is False


def test_the_switch_is_restored_when_the_replay_raises(registry: dict[Any, Any]) -> None:
    registry["d"] = _Owned(2, "s")
    wrapper = _Wrapper()
    with pytest.raises(RuntimeError, match="replay failed"):
        _replay(wrapper, fail=True)
    assert wrapper.barrier == [False] and wrapper.enable_enpu is False


@pytest.mark.parametrize(
    ("wrapper", "role"),
    [(_Wrapper(enable_enpu=True), "target"), (_Wrapper(use_eagle=True), "draft")],
    ids=["enpu", "eagle-draft"],
)
def test_replays_stock_does_not_synchronise_are_untouched(
    registry: dict[Any, Any], wrapper: _Wrapper, role: str, mocker: MockerFixture
) -> None:
    registry["d"] = _Owned(2, "s")
    count = mocker.patch.object(replay_order.state, "count")
    before = wrapper.enable_enpu
    _replay(wrapper, role)
    assert wrapper.enable_enpu is before and wrapper.barrier == [not before]  # as built
    count.assert_called_once_with(replay_order.NO_BARRIER)


def test_every_known_update_stream_waits_on_the_compute_stream(
    registry: dict[Any, Any], mocker: MockerFixture
) -> None:
    """The runner's and a drafter's update streams both wait (a draft's update, later in the
    step, must not overtake an earlier replay either); the compute stream never waits on itself;
    a stream is remembered once."""
    compute, target_stream, draft_stream = (mocker.Mock(name=n) for n in ("c", "t", "d"))
    mocker.patch.object(torch.npu, "current_stream", return_value=compute)
    streams: list[Any] = []
    for stream in (target_stream, draft_stream, target_stream, compute, None):
        replay_order.note_update_stream(streams, stream)
    assert streams == [target_stream, draft_stream, compute]
    registry["d"] = _Owned(2, target_stream)
    wrapper = _Wrapper()
    _replay(wrapper, streams=streams)
    target_stream.wait_stream.assert_called_once_with(compute)
    draft_stream.wait_stream.assert_called_once_with(compute)
    compute.wait_stream.assert_not_called()


# --- what the device orders: the simulator's race detector ---------------------------------


@pytest.mark.parametrize("wait", ["kept", "dropped"])
def test_the_stream_order_wait_is_what_orders_the_update(detector: Any, wait: str) -> None:
    """Stock's decode step (a captured graph gated on an event, replayed, then its task updated
    on the update stream and the event recorded), with this module's wait before each replay in
    place of the barrier: no race. Its negative control, the same wait dropped by the simulator's
    switch (``engine.order_wait``, the engine's ``stream-nowait`` arm): every later step races."""
    from tests.decode_step import Step
    from torch_npu_sim.engine import order_wait

    if wait == "dropped":
        assert order_wait.install({order_wait.ENV_VAR: "1"}) and order_wait.active()
    try:
        step = Step(detector)
        step.run(3, lambda s: replay_order._order_updates_after_compute([s.update_stream]))
    finally:
        order_wait.uninstall()
    races = detector.race_report()["by_kind"]
    skipped = detector.stats().get(order_wait.COUNTER, 0)
    if wait == "kept":
        assert races == {"update": 0, "run": 0, "record": 0} and skipped == 0
    else:
        assert races == {"update": 2, "run": 0, "record": 2} and skipped == 3


def test_the_engine_race_table_counts_every_stream_ordered_counter_the_overlay_writes() -> None:
    """The simulator reads the overlay's status counters by name (it never imports the overlay);
    a renamed counter would read as 0 stream-ordered replays in the engine table."""
    from torch_npu_sim.engine.race_table import stream_order

    counters = {name: 3 for name in replay_order.ORDERED}
    counters[replay_order.NO_BARRIER] = 5  # not a stream-ordered replay
    record = {"runners": [{"overlay": {"counters": counters}, "sim": {"order_waits_skipped": 2}}]}
    assert stream_order(record) == (3 * len(replay_order.ORDERED), 2)
