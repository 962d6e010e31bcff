"""Behaviours the simulator copies from the real torch-npu 2.10.0.post4.

The capture rules torch_npu enforces, non-owning weak references, the ATB op swap, and the
argument types and returns of the registered schemas. Each behaviour has its counterpart that
must not trip (the same code with the rule respected).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import torch_npu_sim
from torch_npu_sim import ops, runtime
from torch_npu_sim.runtime import SimulatorError


@pytest.fixture
def npu() -> Any:
    return torch_npu_sim.install()


def _scale_out(a: torch.Tensor, *, scale: float, out: torch.Tensor) -> torch.Tensor:
    out.copy_(a * scale)
    return out


@pytest.fixture
def toy(rt: Any) -> Any:
    return rt.make_op("toy_scale", _scale_out)


# --------------------------------------------------------------------------------------------
# capture rules


def test_capture_on_the_default_stream_is_refused_with_torch_npus_message(rt: Any) -> None:
    g = rt.NPUGraph()
    assert rt.current_stream() is rt.default_stream()
    with pytest.raises(SimulatorError, match="must be captured on a non-default stream"):
        g.capture_begin()
    assert not rt.is_current_stream_capturing()
    with rt.stream(rt.Stream()):  # the same capture on a side stream is fine
        g.capture_begin()
        torch.ones(2) * 2
        g.capture_end()


def test_capture_must_end_on_the_stream_it_began_on(rt: Any) -> None:
    g = rt.NPUGraph()
    side = rt.Stream()
    with rt.stream(side):
        g.capture_begin()
        torch.ones(2) * 2
    with pytest.raises(SimulatorError, match="Capture must end on the same stream it began on"):
        g.capture_end()
    assert not rt.is_current_stream_capturing()  # abandoned: later captures still work
    g2 = rt.NPUGraph()
    with rt.graph(g2):
        torch.ones(2) * 3
    g2.replay()


def test_a_capture_body_interrupted_in_a_task_group_raises_its_own_exception(
    rt: Any, toy: Any
) -> None:
    """SIGTERM (a KeyboardInterrupt) between a task group's begin and end: the interruption
    propagates, not the complaint about the open group that capture_end makes (the ``except
    Exception`` of a caller would take that for an ordinary failure and run on), and the next
    capture works. Without a failing body, ending inside an open group is still an error."""
    x, out = torch.ones(2), torch.empty(2)
    g = rt.NPUGraph()
    with pytest.raises(KeyboardInterrupt), rt.graph(g):
        rt.graph_task_group_begin(rt.current_stream())
        toy(x, scale=2.0, out=out)
        raise KeyboardInterrupt
    assert not rt.is_current_stream_capturing()
    g2 = rt.NPUGraph()
    with rt.graph(g2):
        rt.graph_task_group_begin(rt.current_stream())
        toy(x, scale=2.0, out=out)
        rt.graph_task_group_end(rt.current_stream())
    g2.replay()
    g3 = rt.NPUGraph()
    with pytest.raises(SimulatorError, match="inside an open graph task group"), rt.graph(g3):
        rt.graph_task_group_begin(rt.current_stream())


def test_graph_update_needs_auto_dispatch_capture_as_in_torch_npu(rt: Any) -> None:
    g = rt.NPUGraph()
    with rt.graph(g):
        torch.ones(1) + 1
    with pytest.raises(RuntimeError, match="does not support update"):
        g.update([{}])
    auto = rt.graph(rt.NPUGraph(), None, None, True)  # 4th positional: auto_dispatch_capture
    with pytest.raises(SimulatorError, match=r"auto_dispatch_capture=True\) is not simulated"):
        auto.__enter__()
    assert not rt.is_current_stream_capturing()


def test_set_stream_none_is_a_no_op(rt: Any) -> None:
    side = rt.Stream()
    rt.set_stream(side)
    rt.set_stream(None)
    assert rt.current_stream() is side


# --------------------------------------------------------------------------------------------
# non-owning weak references


def _capture_group(rt: Any, toy: Any, a: torch.Tensor, out: torch.Tensor) -> tuple[Any, Any]:
    g = rt.NPUGraph()
    with rt.graph(g):
        s = rt.current_stream()
        rt.graph_task_group_begin(s)
        toy(a, scale=2.0, out=out)
        handle = rt.graph_task_group_end(s)
    return g, handle


def test_a_freed_weak_argument_of_a_captured_task_is_caught_at_replay(
    rt: Any, npu: Any, toy: Any
) -> None:
    owner = torch.arange(4.0)
    weak = npu._C._weak_ref_tensor(owner)
    assert weak.data_ptr() == owner.data_ptr()
    out = torch.zeros(4)
    g, _ = _capture_group(rt, toy, weak, out)
    g.replay()  # owner alive: fine
    torch.testing.assert_close(out, torch.arange(4.0) * 2)
    del owner
    gc.collect()
    with pytest.raises(SimulatorError, match="use after free: task toy_scale runs"):
        g.replay()
        rt.synchronize()


def test_a_freed_weak_argument_of_a_relaunch_is_caught_at_the_update(
    rt: Any, npu: Any, toy: Any
) -> None:
    a, out = torch.arange(4.0), torch.zeros(4)
    g, handle = _capture_group(rt, toy, a, out)
    fresh = torch.ones(4)
    weak = npu._C._weak_ref_tensor(fresh)
    upd = rt.Stream()
    rt.graph_task_update_begin(upd, handle)
    toy(weak, scale=3.0, out=out)  # owner alive: the relaunch is accepted
    rt.graph_task_update_end(upd)
    g.replay()
    torch.testing.assert_close(out, torch.full((4,), 3.0))
    del fresh
    gc.collect()
    with pytest.raises(SimulatorError, match="use after free: task toy_scale is relaunched"):
        rt.graph_task_update_begin(upd, handle)
        try:
            toy(weak, scale=3.0, out=out)
        finally:
            rt.reset()


def test_weak_references_to_memory_allocated_in_the_capture_stay_owned_by_the_graph(
    rt: Any, npu: Any, toy: Any
) -> None:
    """vllm-ascend keeps only weak references to its capture-time workspace and LSE buffer."""
    a = torch.arange(4.0)
    g = rt.NPUGraph()
    with rt.graph(g):
        s = rt.current_stream()
        out = torch.empty(4)  # graph-pool memory
        weak_out = npu._C._weak_ref_tensor(out)
        rt.graph_task_group_begin(s)
        toy(a, scale=2.0, out=out)
        handle = rt.graph_task_group_end(s)
    del out
    gc.collect()
    upd = rt.Stream()
    rt.graph_task_update_begin(upd, handle)
    toy(a, scale=5.0, out=weak_out)  # the capture's own task no longer holds `out`
    rt.graph_task_update_end(upd)
    g.replay()
    torch.testing.assert_close(weak_out, torch.arange(4.0) * 5)
    g.reset()  # the pool goes with the graph
    assert runtime.lifetimes.owners(weak_out) == 0


# --------------------------------------------------------------------------------------------
# the ATB swap


def test_register_atb_extensions_swaps_the_atb_ops_for_new_objects(npu: Any, atb_lazy: Any):
    from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions

    lazy = npu._npu_paged_attention
    lazy_getter = npu._npu_paged_attention_get_workspace
    lazy_load = npu.atb.npu_paged_cache_load
    _register_atb_extensions()
    assert npu._npu_paged_attention is not lazy
    assert npu._npu_paged_attention is atb_lazy.ATB_OPS._npu_paged_attention
    assert npu._npu_paged_attention_get_workspace is not lazy_getter
    assert npu.atb.npu_paged_cache_load is not lazy_load
    assert npu.npu_fused_infer_attention_score.out.name.startswith("npu_fused")  # not ATB
    swapped = npu._npu_paged_attention
    _register_atb_extensions()  # cached: once per process
    assert npu._npu_paged_attention is swapped


def test_the_first_call_of_a_lazy_atb_op_swaps_too(npu: Any, atb_lazy: Any) -> None:
    lazy = npu._npu_reshape_and_cache
    key, cache = torch.ones(1, 1, 2), torch.zeros(2, 2, 1, 2)
    lazy(key, key, cache, cache.clone(), torch.tensor([3], dtype=torch.int32))
    assert npu._npu_reshape_and_cache is not lazy
    assert torch.equal(cache[1, 1], key[0])


def test_a_task_captured_through_the_lazy_op_is_updated_through_the_swapped_one(
    rt: Any, npu: Any, atb_lazy: Any
) -> None:
    q = torch.randn(2, 2, 8)
    key_cache = torch.randn(4, 4, 1, 8)
    value_cache = torch.randn(4, 4, 1, 8)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    out = torch.zeros_like(q)
    args = (q, key_cache, value_cache, 1, 2, 0.5, table)
    g = rt.NPUGraph()
    with rt.graph(g):
        s = rt.current_stream()
        rt.graph_task_group_begin(s)
        npu._npu_paged_attention(*args, torch.tensor([1, 1]), out)  # lazy: swaps on the way
        handle = rt.graph_task_group_end(s)
    assert npu._npu_paged_attention is atb_lazy.ATB_OPS._npu_paged_attention
    lens = torch.tensor([5, 7])
    upd = rt.Stream()
    rt.graph_task_update_begin(upd, handle)
    npu._npu_paged_attention(*args, lens, out)
    rt.graph_task_update_end(upd)
    g.replay()
    expected = torch.zeros_like(q)
    ops._npu_paged_attention(*args, lens, expected)
    torch.testing.assert_close(out, expected)


# --------------------------------------------------------------------------------------------
# registered argument types and returns


def _pa_args() -> dict[str, Any]:
    return dict(
        query=torch.randn(2, 2, 8),
        key_cache=torch.randn(4, 4, 1, 8),
        value_cache=torch.randn(4, 4, 1, 8),
        num_kv_heads=1,
        num_heads=2,
        scale_value=0.5,
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
    )


def test_paged_attention_returns_nothing_and_wants_tensor_lengths(rt: Any, npu: Any) -> None:
    from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions

    _register_atb_extensions()
    out = torch.zeros(2, 2, 8)
    assert npu._npu_paged_attention(**_pa_args(), context_lens=torch.tensor([3, 4]), out=out) is (
        None
    )
    with pytest.raises(TypeError, match="'context_lens' \\(position 8\\) must be Tensor, not list"):
        npu._npu_paged_attention(**_pa_args(), context_lens=[3, 4], out=out)
    with pytest.raises(TypeError, match="takes 9 positional arguments"):  # workspace: kw-only
        ops._npu_paged_attention(*_pa_args().values(), torch.tensor([3, 4]), out, None)
    g = rt.NPUGraph()
    with rt.graph(g):
        s = rt.current_stream()
        rt.graph_task_group_begin(s)
        npu._npu_paged_attention(**_pa_args(), context_lens=torch.tensor([3, 4]), out=out)
        handle = rt.graph_task_group_end(s)
    rt.graph_task_update_begin(s, handle)
    with pytest.raises(TypeError, match="must be Tensor"):  # a relaunch is type-checked too
        npu._npu_paged_attention(**_pa_args(), context_lens=[3, 4], out=out)


def test_pa_workspace_depends_on_the_lengths_and_the_block_table() -> None:
    args = _pa_args()
    out = torch.zeros(2, 2, 8)
    short = ops._npu_paged_attention_get_workspace(
        **args, context_lens=torch.tensor([1, 2]), out=out
    )
    long = ops._npu_paged_attention_get_workspace(
        **args, context_lens=torch.tensor([7, 8]), out=out
    )
    assert long.numel() > short.numel()
    wider = dict(args, block_table=torch.zeros(2, 8, dtype=torch.int32))
    assert (
        ops._npu_paged_attention_get_workspace(
            **wider, context_lens=torch.tensor([1, 2]), out=out
        ).numel()
        > short.numel()
    )
    ops._npu_paged_attention(**args, context_lens=torch.tensor([7, 8]), out=out, workspace=long)
    with pytest.raises(RuntimeError, match="PA workspace of .* smaller"):
        ops._npu_paged_attention(
            **args, context_lens=torch.tensor([7, 8]), out=out, workspace=short
        )


def test_scatter_pa_kv_cache_defaults_to_the_nz_cache_mode() -> None:
    key = torch.ones(1, 1, 32, dtype=torch.int8)
    nd_cache = torch.zeros(2, 16, 1, 32, dtype=torch.int8)
    nz_cache = torch.zeros(2, 1, 1, 16, 32, dtype=torch.int8)
    slots = torch.tensor([17], dtype=torch.int32)
    ops.npu_scatter_pa_kv_cache(key, key, nz_cache, nz_cache.clone(), slots)  # PA_NZ
    assert int(nz_cache[1, 0, 0, 1].sum()) == 32
    with pytest.raises(ValueError, match="cache_mode 'PA_NZ' needs NZ 5-D caches"):
        ops.npu_scatter_pa_kv_cache(key, key, nd_cache, nd_cache.clone(), slots)
    ops.npu_scatter_pa_kv_cache(key, key, nd_cache, nd_cache.clone(), slots, cache_mode="Norm")
    assert int(nd_cache[1, 1].sum()) == 32
