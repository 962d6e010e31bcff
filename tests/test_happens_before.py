"""The happens-before race detector (``torch_npu_sim.happens_before``) on hand-built programs.

Each program is stock's decode step on the simulated runtime: a graph captured with an
``ExternalEvent`` gate before its attention task group, replayed on the compute stream, its task
updated on an update stream and the event recorded there. Every ordering test has its negative
control: the same program with one wait removed, where the detector must fire.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.decode_step import Step, scale_out
from torch_npu_sim import happens_before as hb
from torch_npu_sim import runtime
from torch_npu_sim.runtime import SimulatorError

npu = runtime


def _barrier(step: Step) -> None:
    npu.current_stream().synchronize()  # stock 0.23.0.post1: ACLGraphWrapper.__call__


def _nothing(step: Step) -> None:
    return None


def _stream_order(step: Step) -> None:
    step.update_stream.wait_stream(npu.current_stream())  # upstream main's order


def _event_order(step: Step) -> None:
    done = npu.Event()
    done.record(npu.current_stream())
    step.update_stream.wait_event(done)


def _host_event_sync(step: Step) -> None:
    done = npu.Event()
    done.record(npu.current_stream())
    done.synchronize()


def _host_event_query(step: Step) -> None:
    done = npu.Event()
    done.record(npu.current_stream())
    assert done.query()


def _races(rt: Any) -> dict[str, int]:
    return rt.race_report()["by_kind"]


@pytest.mark.parametrize(
    "order",
    [_barrier, _stream_order, _event_order, _host_event_sync, _host_event_query],
    ids=lambda f: f.__name__.strip("_"),
)
def test_each_wait_orders_the_update_after_the_previous_replay(detector: Any, order: Any) -> None:
    Step(detector).run(3, order)
    assert _races(detector) == {"update": 0, "run": 0, "record": 0}


def test_without_a_wait_every_later_update_and_record_races(detector: Any) -> None:
    """The negative control of the test above: the same steps with the wait removed. The
    simulator itself runs them in program order (every replay's task ran before the next update),
    so its outputs are right; the device may apply the update first."""
    seen = Step(detector).run(3, _nothing)
    assert _races(detector) == {"update": 2, "run": 0, "record": 2}
    assert seen == [2.0, 3.0, 4.0]  # the simulator's in-order schedule hides the race
    report = detector.race_report()
    assert report["races"] == 4 and report["mode"] == "count"
    assert "not ordered after the previous replay's run" in report["examples"][0]["detail"]
    assert detector.stats()["races_update"] == 2


def test_a_wait_on_the_wrong_stream_does_not_order(detector: Any) -> None:
    """The compute stream waiting on the update stream (the reverse edge) orders nothing the
    update needs."""

    def reverse(step: Step) -> None:
        npu.current_stream().wait_stream(step.update_stream)

    Step(detector).run(3, reverse)
    assert _races(detector)["update"] == 2


def test_a_sync_of_another_stream_does_not_order(detector: Any) -> None:
    def other(step: Step) -> None:
        step.update_stream.synchronize()

    Step(detector).run(2, other)
    assert _races(detector) == {"update": 1, "run": 0, "record": 1}


def test_an_ungated_task_group_races_with_its_update(detector: Any) -> None:
    """A task group with no event gate before it: the run is not ordered after the update
    (the update stream's work may land after the replay ran the task)."""
    op = detector.make_op("toy_scale", scale_out)
    a, out = torch.ones(2), torch.zeros(2)
    g = npu.NPUGraph()
    with npu.graph(g):
        s = npu.current_stream()
        npu.graph_task_group_begin(s)
        op(a, scale=1.0, out=out)
        handle = npu.graph_task_group_end(s)
    upd = npu.Stream()
    for scale in (2.0, 3.0):
        npu.current_stream().synchronize()
        with npu.stream(upd):
            npu.graph_task_update_begin(upd, handle)
            op(a, scale=scale, out=out)
            npu.graph_task_update_end(upd)
        g.replay()
    assert _races(detector) == {"update": 0, "run": 2, "record": 0}
    # the negative control: the compute stream waits for the update stream before the replay
    detector.reset()
    g2 = npu.NPUGraph()
    with npu.graph(g2):
        s = npu.current_stream()
        npu.graph_task_group_begin(s)
        op(a, scale=1.0, out=out)
        handle = npu.graph_task_group_end(s)
    for scale in (2.0, 3.0):
        npu.current_stream().synchronize()
        with npu.stream(upd):
            npu.graph_task_update_begin(upd, handle)
            op(a, scale=scale, out=out)
            npu.graph_task_update_end(upd)
        npu.current_stream().wait_stream(upd)
        g2.replay()
    assert _races(detector) == {"update": 0, "run": 0, "record": 0}


def test_a_record_before_the_previous_consumption_races(detector: Any) -> None:
    """ENPU's order (record, then replay) is legal while each record follows the previous
    consumption; two records without the replay between are not."""
    step = Step(detector)
    step.update(2.0)
    step.graph.replay()
    npu.current_stream().synchronize()
    step.update(3.0)
    step.graph.replay()
    npu.synchronize()
    assert _races(detector) == {"update": 0, "run": 0, "record": 0}
    # the negative control: the sync between the steps removed
    detector.reset()
    step = Step(detector)
    step.update(2.0)
    step.graph.replay()
    step.update(3.0)
    step.graph.replay()
    npu.synchronize()
    assert _races(detector) == {"update": 1, "run": 0, "record": 1}


def test_raise_mode_raises_a_simulator_error(rt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hb.ENV_VAR, "raise")
    rt.reset()
    step = Step(rt)
    step.graph.replay()
    step.update(2.0)
    step.graph.replay()
    with pytest.raises(SimulatorError, match=r"happens-before race \(update\)"):
        step.update(3.0)
    monkeypatch.delenv(hb.ENV_VAR)
    rt.reset()


def test_off_by_default_and_counters_unchanged(rt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hb.ENV_VAR, raising=False)
    rt.reset()
    Step(rt).run(2, _nothing)
    assert rt.race_report() is None
    assert not any(k.startswith("races_") for k in rt.stats())


def test_mode_from_env() -> None:
    assert hb.mode_from_env({}) == hb.OFF
    assert hb.mode_from_env({hb.ENV_VAR: "1"}) == hb.COUNT
    assert hb.mode_from_env({hb.ENV_VAR: "raise"}) == hb.RAISE
    with pytest.raises(ValueError, match="expected one of"):
        hb.mode_from_env({hb.ENV_VAR: "loud"})


class _Obj:
    """A stand-in stream, event or graph for driving the detector without the simulator."""

    def __init__(self, kind: str = "op", event: Any = None, sim: bool = False) -> None:
        self.kind, self.event, self.sim = kind, event, sim
        self._default = False
        self._id = 1


def _drive(detector: hb.Detector, order: str) -> dict[str, Any]:
    """The host calls of ``Step.run(3, order)`` fed to a detector alone: nothing runs."""
    compute, update, event = _Obj(), _Obj(), _Obj()
    graph = _Obj()
    op = _Obj(sim=True)
    tasks = [_Obj("gate", event), _Obj("reset", event), op]
    for _ in range(3):
        if order == "barrier":
            detector.sync_stream(compute)
        detector.replay(compute, graph, tasks, {7: [op]})
        detector.update_begin(update, 7)
        detector.update_end(graph)
        detector.record_external(update, event)
    detector.sync_all()
    return detector.report()["by_kind"]


@pytest.mark.parametrize("order", ["barrier", "nothing"])
def test_the_verdict_depends_on_the_host_calls_only(detector: Any, order: str) -> None:
    """The same host calls give the same verdict whether the simulator executes them (in its
    own order: each replay's task runs when its record arrives) or nothing executes at all: the
    detector never reads the simulator's queues."""
    Step(detector).run(3, _barrier if order == "barrier" else _nothing)
    alone = _drive(hb.Detector(hb.COUNT), order)
    assert alone == _races(detector)
    assert alone["update"] == (0 if order == "barrier" else 2)


def test_the_detector_sees_what_the_simulator_did_not_run_yet(detector: Any) -> None:
    """A replay whose gate is still closed when the next update is launched: the simulator has
    not run the task (its queue holds it), the device would neither; the update is flagged the
    same as when the simulator had already run it."""
    step = Step(detector)
    step.graph.replay()  # gate closed: the task waits in the simulator's queue
    tasks_before = detector.stats()["tasks_run"]
    step.update(2.0)  # releases it
    assert detector.stats()["tasks_run"] > tasks_before
    step.graph.replay()  # gate closed again
    step.update(3.0)  # the update of step 2 while step 2's replay ... and step 1's run: unordered
    npu.synchronize()
    assert _races(detector) == {"update": 1, "run": 0, "record": 1}


_WRAPPER_SRC = """
class ACLGraphWrapper:
    def __init__(self, npu, graph):
        self.npu, self.graph = npu, graph

    def __call__(self):
        self.npu.current_stream().synchronize()
        self.graph.replay()
"""


def _wrapper_class(filename: str) -> type:
    namespace: dict[str, Any] = {}
    exec(compile(_WRAPPER_SRC, filename, "exec"), namespace)  # noqa: S102 - a stand-in caller
    return namespace["ACLGraphWrapper"]


@pytest.mark.parametrize("where", ["acl_graph", "elsewhere"])
def test_the_barrier_switch_removes_only_the_wrappers_sync(detector: Any, where: str) -> None:
    """``TORCH_NPU_SIM_TEST_NO_REPLAY_BARRIER``: the stream synchronize called by
    ``ACLGraphWrapper.__call__`` in ``vllm_ascend/compilation/acl_graph.py`` is skipped (and the
    detector then counts the races); the same code in another file keeps its barrier."""
    from torch_npu_sim.engine import barrier

    path = "/site/vllm_ascend/compilation/acl_graph.py" if where == "acl_graph" else "/site/x.py"
    assert not barrier.install({})  # not asked: nothing installed
    assert barrier.install({barrier.ENV_VAR: "1"}) and barrier.active()
    try:
        step = Step(detector)
        wrapper = _wrapper_class(path)(npu, step.graph)
        for i in range(3):
            wrapper()
            step.update(float(i + 2))
        npu.synchronize()
    finally:
        barrier.uninstall()
    assert not barrier.active()
    skipped = detector.stats().get(barrier.COUNTER, 0)
    if where == "acl_graph":
        assert skipped == 3 and _races(detector) == {"update": 2, "run": 0, "record": 2}
    else:
        assert skipped == 0 and _races(detector) == {"update": 0, "run": 0, "record": 0}


def test_a_graph_captured_again_after_reset_is_analysed_with_its_new_tasks(detector: Any) -> None:
    """``NPUGraph.reset`` then a new capture (new events, new task groups): the detector's view
    of the graph's replay is rebuilt, so the barrier-ordered steps stay clean."""
    step = Step(detector)
    step.run(2, _barrier)
    step.graph.reset()
    step.capture()
    step.run(3, _barrier)
    assert _races(detector) == {"update": 0, "run": 0, "record": 0}
