"""Graph semantics of the simulated torch_npu: capture/replay, task-group updates, gates, errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_npu_sim import runtime
from torch_npu_sim.runtime import SimulatorError

npu = runtime  # the torch.npu surface lives in runtime (install.py re-exports it)


def _scale_out(a: torch.Tensor, *, scale: float, out: torch.Tensor) -> torch.Tensor:
    """Toy NPU op with several internal aten ops (which must not be recorded separately)."""
    tmp = a * scale
    tmp = tmp + 0.0
    out.copy_(tmp)
    return out


@pytest.fixture
def toy(rt: Any) -> Any:
    return rt.make_op("toy_scale", _scale_out)


def _capture_decode_like(toy: Any, a: torch.Tensor, out: torch.Tensor) -> tuple[Any, ...]:
    """Capture the stock FIA pattern: wait, reset, group(begin, op.out, end)."""
    g = npu.NPUGraph()
    ev = npu.ExternalEvent()
    with npu.graph(g):
        s = npu.current_stream()
        ev.wait(s)
        ev.reset(s)
        npu.graph_task_group_begin(s)
        toy(a, scale=1.0, out=out)
        handle = npu.graph_task_group_end(s)
        post = out * 2  # work behind the gated task
    return g, ev, handle, post


def _update(toy: Any, handle: Any, ev: Any, upd: Any, **kw: Any) -> None:
    with npu.stream(upd):
        npu.graph_task_update_begin(upd, handle)
        toy(**kw)
        npu.graph_task_update_end(upd)
        ev.record(upd)


# --------------------------------------------------------------------------------------------
# capture / replay of aten ops


def test_replay_reruns_aten_ops_on_new_input_values(rt: Any) -> None:
    x = torch.zeros(4)
    w = torch.ones(4)
    acc = torch.zeros(4)
    g = npu.NPUGraph()
    with npu.graph(g):
        assert npu.is_current_stream_capturing()
        y = (x * 2).sin() + w  # functional ops: results written into captured outputs
        v = y.view(2, 2)  # view: aliases y, not recorded
        o = torch.empty(4)  # allocation only: must not clobber at replay
        torch.add(x, 1, out=o)  # out= op: re-runs in place
        acc.add_(x)  # in-place op re-runs each replay
    assert not npu.is_current_stream_capturing()
    ptr = y.data_ptr()

    x.copy_(torch.arange(4.0))
    g.replay()
    npu.synchronize()
    expected = (torch.arange(4.0) * 2).sin() + 1
    torch.testing.assert_close(y, expected)
    assert y.data_ptr() == ptr
    torch.testing.assert_close(v, expected.view(2, 2))
    torch.testing.assert_close(o, torch.arange(4.0) + 1)
    torch.testing.assert_close(acc, torch.arange(4.0))
    g.replay()
    torch.testing.assert_close(acc, 2 * torch.arange(4.0))
    assert rt.stats()["replays"] == 2


def test_capture_warm_up_runs_ops_once(rt: Any) -> None:
    x = torch.full((3,), 2.0)
    g = npu.NPUGraph()
    with npu.graph(g):
        y = x * 3
    torch.testing.assert_close(y, torch.full((3,), 6.0))  # outputs exist after capture


def test_sim_op_is_one_task_and_eager_call_runs(rt: Any, toy: Any) -> None:
    a, out = torch.arange(3.0), torch.zeros(3)
    toy(a, scale=2.0, out=out)  # eager: runs at once
    torch.testing.assert_close(out, a * 2)
    g = npu.NPUGraph()
    with npu.graph(g):
        toy(a, scale=3.0, out=out)
    before = rt.stats()["tasks_run"]
    out.zero_()
    g.replay()
    assert rt.stats()["tasks_run"] - before == 1  # inner aten ops were not recorded
    torch.testing.assert_close(out, a * 3)


# --------------------------------------------------------------------------------------------
# task groups, updates, gates


def test_update_scope_replaces_launch_args_and_gate_orders_it(rt: Any, toy: Any) -> None:
    a, out = torch.arange(4.0), torch.zeros(4)
    g, ev, handle, post = _capture_decode_like(toy, a, out)
    assert isinstance(handle, runtime._NPUTaskGroupHandle)
    out.zero_()
    post.zero_()

    g.replay()  # blocks at the gate: nothing behind it ran yet
    torch.testing.assert_close(out, torch.zeros(4))
    torch.testing.assert_close(post, torch.zeros(4))

    b = torch.full((4,), 5.0)  # a new tensor: the task reads it at its (gated) execution
    _update(toy, handle, ev, npu.Stream(), a=b, scale=10.0, out=out)
    npu.synchronize()
    torch.testing.assert_close(out, torch.full((4,), 50.0))
    torch.testing.assert_close(post, torch.full((4,), 100.0))
    assert rt.stats()["updates"] == 1 and rt.stats()["records"] == 1


def test_update_before_gate_released_without_graph_rerun(rt: Any, toy: Any) -> None:
    """Replay, then update, then record (the runner's order) equals update-then-run."""
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    upd = npu.Stream()
    for scale in (2.0, 7.0):
        g.replay()
        _update(toy, handle, ev, upd, a=a, scale=scale, out=out)
        npu.current_stream().synchronize()
        torch.testing.assert_close(out, torch.full((2,), scale))


def test_task_group_handles_are_unique(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g = npu.NPUGraph()
    with npu.graph(g):
        s = npu.current_stream()
        handles = []
        for _ in range(3):
            npu.graph_task_group_begin(s)
            toy(a, scale=1.0, out=out)
            handles.append(npu.graph_task_group_end(s))
    assert len({h._id for h in handles}) == 3
    assert len(set(map(id, handles))) == 3


def test_eager_op_on_blocked_stream_queues_behind_the_gate(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    later = torch.zeros(2)
    g.replay()
    toy(out, scale=1.0, out=later)  # launched on the blocked stream: must see the final out
    _update(toy, handle, ev, npu.Stream(), a=a, scale=4.0, out=out)
    torch.testing.assert_close(later, torch.full((2,), 4.0))


# --------------------------------------------------------------------------------------------
# errors: never a hang


def test_sync_points_raise_when_a_replay_is_blocked(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    for sync in (npu.synchronize, lambda: npu.current_stream().synchronize()):
        g.replay()
        with pytest.raises(SimulatorError, match="hang"):
            sync()
    g.replay()
    with pytest.raises(SimulatorError, match="hang"):
        g.replay()  # the next replay of the same graph is a sync point too
    npu.synchronize()  # reported work was discarded: the runtime is usable again


def test_double_record_raises(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    upd = npu.Stream()
    g.replay()
    ev.record(upd)  # released the gate; the captured reset consumed it
    ev.record(upd)  # ahead of the next wait: legal (ENPU order)
    with pytest.raises(SimulatorError, match="double record"):
        ev.record(upd)  # twice for one wait
    g.replay()
    npu.synchronize()  # the record made ahead released this replay


def test_record_ahead_of_replay_releases_the_next_wait(rt: Any, toy: Any) -> None:
    """vllm-ascend's ENPU order: update and record first, then replay."""
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    _update(toy, handle, ev, npu.Stream(), a=a, scale=6.0, out=out)
    g.replay()
    npu.synchronize()
    torch.testing.assert_close(out, torch.full((2,), 6.0))
    g.replay()  # the reset re-armed the gate: without a new record this replay blocks
    with pytest.raises(SimulatorError, match="hang"):
        npu.synchronize()


def test_record_on_the_waiting_stream_is_a_deadlock(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    g.replay()
    with pytest.raises(SimulatorError, match="deadlock"):
        ev.record(npu.current_stream())  # queued behind the very gate it should release


def test_record_before_gate_reached_counts_once(rt: Any, toy: Any) -> None:
    """Two gated tasks: recording the second event first releases it when the first passes."""
    a, o1, o2 = torch.ones(2), torch.zeros(2), torch.zeros(2)
    g, e1, e2 = npu.NPUGraph(), npu.ExternalEvent(), npu.ExternalEvent()
    with npu.graph(g):
        s = npu.current_stream()
        for ev, out in ((e1, o1), (e2, o2)):
            ev.wait(s)
            ev.reset(s)
            toy(a, scale=3.0, out=out)
    o1.zero_()
    o2.zero_()
    g.replay()
    upd = npu.Stream()
    e2.record(upd)
    torch.testing.assert_close(o2, torch.zeros(2))  # still behind e1's gate
    with pytest.raises(SimulatorError, match="double record"):
        e2.record(upd)
    e1.record(upd)
    npu.synchronize()
    torch.testing.assert_close(o2, torch.full((2,), 3.0))


def test_update_scope_errors(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    upd = npu.Stream()
    with pytest.raises(SimulatorError, match="outside an update scope"):
        npu.graph_task_update_end(upd)
    with pytest.raises(SimulatorError, match="unknown task group handle"):
        npu.graph_task_update_begin(upd, runtime._NPUTaskGroupHandle(10**9))
    with pytest.raises(SimulatorError, match="unknown task group handle"):
        npu.graph_task_update_begin(upd, None)
    other = rt.make_op("other_op", _scale_out)
    npu.graph_task_update_begin(upd, handle)
    with pytest.raises(SimulatorError, match="mismatch"):
        other(a, scale=1.0, out=out)
    with pytest.raises(SimulatorError, match="nested"):
        npu.graph_task_update_begin(upd, handle)
    with pytest.raises(SimulatorError, match="without an op launch"):
        npu.graph_task_update_end(upd)
    with pytest.raises(SimulatorError, match="outside a graph capture"):
        npu.graph_task_group_begin(upd)


def test_nested_capture_and_replay_during_capture_raise(rt: Any) -> None:
    x = torch.ones(2)
    g1 = npu.NPUGraph()
    with npu.graph(g1):
        _ = x + 1
    g2, g3 = npu.NPUGraph(), npu.NPUGraph()
    with npu.graph(g2):
        with pytest.raises(SimulatorError, match="nested"):
            g3.capture_begin()
        with pytest.raises(SimulatorError, match="during graph capture"):
            g1.replay()
    assert not npu.is_current_stream_capturing()


def test_wait_stream_on_blocked_replay_is_a_deadlock(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    main, upd = npu.current_stream(), npu.Stream()
    upd.wait_stream(main)  # nothing blocked: harmless
    g.replay()
    upd.wait_stream(main)  # hardware: upd now waits for a replay that waits for upd
    with pytest.raises(SimulatorError, match="deadlock"):
        _update(toy, handle, ev, upd, a=a, scale=2.0, out=out)
    npu.synchronize()


# --------------------------------------------------------------------------------------------
# null-cost mode, isolation


def test_null_cost_mode_records_but_computes_nothing(rt: Any, mocker: Any) -> None:
    fn = mocker.Mock(return_value=None)
    op = rt.make_op("counted", fn)
    g = npu.NPUGraph()
    with npu.graph(g):
        s = npu.current_stream()
        npu.graph_task_group_begin(s)
        op(torch.ones(1))
        handle = npu.graph_task_group_end(s)
    assert fn.call_count == 1  # capture warm-up
    ev = npu.ExternalEvent()
    with rt.null_cost():
        assert rt.is_null_cost()
        g.replay()
        npu.graph_task_update_begin(s, handle)
        op(torch.ones(1))
        npu.graph_task_update_end(s)
        ev.record(s)  # no pending wait: not even checked
        op(torch.ones(1))
        npu.synchronize()
    assert not rt.is_null_cost()
    assert fn.call_count == 1
    stats = rt.stats()
    assert (stats["replays"], stats["updates"], stats["records"]) == (1, 1, 1)


def test_reset_forgets_state(rt: Any, toy: Any) -> None:
    a, out = torch.ones(2), torch.zeros(2)
    g, ev, handle, _ = _capture_decode_like(toy, a, out)
    g.replay()
    rt.reset()
    npu.synchronize()  # the blocked replay is gone
    assert rt.stats()["replays"] == 0
    with pytest.raises(SimulatorError, match="unknown task group handle"):
        npu.graph_task_update_begin(npu.Stream(), handle)


def test_copy_that_may_alias_is_replayed_under_inference_mode() -> None:
    """aten.to.dtype under inference_mode has an aliasing schema but copies: it must re-run."""
    pos = torch.zeros(8, dtype=torch.int64)
    out = torch.zeros(4, 3)
    freqs = torch.linspace(0, 1, 3)
    graph = torch.npu.NPUGraph()
    with torch.inference_mode(), torch.npu.graph(graph):
        out[:] = torch.sin(pos[:4].to(torch.float32).unsqueeze(-1) * freqs)
    pos[:4] = torch.tensor([1, 2, 3, 4])
    graph.replay()
    torch.npu.synchronize()
    assert torch.allclose(out[:, 2], torch.sin(torch.tensor([1.0, 2.0, 3.0, 4.0])))


def test_host_lengths_are_frozen_at_launch_until_the_next_task_update() -> None:
    """Host lists / CPU tensors given to an op are baked into the captured task, as on device."""
    seen: list[list[int]] = []

    def op(*, context_lens, out):
        seen.append(list(map(int, context_lens)))
        out.fill_(float(sum(map(int, context_lens))))

    sim_op = runtime.make_op("_npu_paged_attention", op)
    lens = torch.tensor([1, 2])
    out = torch.zeros(1)
    graph = torch.npu.NPUGraph()
    stream = torch.npu.current_stream()
    with torch.npu.graph(graph):
        torch.npu.graph_task_group_begin(stream)
        sim_op(context_lens=lens, out=out)
        handle = torch.npu.graph_task_group_end(stream)
    lens[:] = torch.tensor([5, 5])  # the runner mutates its host buffer in place
    graph.replay()
    torch.npu.synchronize()
    assert float(out) == 3.0  # the launch still has the captured values: stale without an update
    update = torch.npu.Stream()
    torch.npu.graph_task_update_begin(update, handle)
    sim_op(context_lens=lens, out=out)
    torch.npu.graph_task_update_end(update)
    lens[:] = torch.tensor([7, 7])
    graph.replay()
    torch.npu.synchronize()
    assert float(out) == 10.0  # the update's values, not the later mutation
