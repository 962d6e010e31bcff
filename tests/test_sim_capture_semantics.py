"""Capture semantics the real vLLM engine relies on, each with the failure it prevents.

- A custom op's body runs transparently under capture: the graph holds the kernels the body
  launches, not the custom op. As one opaque task it re-ran its Python body at replay, so an NPU op
  inside it ran with the *current* host arguments: a replay that skipped the task update still
  matched eager (the false pass the negative control exposed).
- Higher-order ops (``auto_functionalized_v2`` in VLLM_COMPILE graphs) capture their dense body.
- A functional simulated op's outputs are rewritten at replay (they were dropped).
- A launch into given outputs whose captured arguments cannot run (paged attention captured at
  its maximum-workspace kv length, beyond the block table) captures: a capture executes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2

from torch_npu_sim import ops, runtime

npu = runtime


@pytest.fixture(scope="module")
def library() -> Iterator[torch.library.Library]:
    """Two custom ops, registered for CPU as vLLM's shimmed ``direct_register_custom_op`` does."""
    lib = torch.library.Library("simcapture", "DEF")
    lib.define("attend(Tensor lens, Tensor(a!) out) -> ()")
    lib.define("scale_into(Tensor x, Tensor(a!) out) -> ()")

    def attend(lens: torch.Tensor, out: torch.Tensor) -> None:
        # An attention-like body: a task group holding one NPU op with host lengths.
        stream = npu.current_stream()
        if npu.is_current_stream_capturing():
            npu.graph_task_group_begin(stream)
            _LENS_OP(context_lens=lens, out=out)
            _CAPTURED["handle"] = npu.graph_task_group_end(stream)
        else:
            _LENS_OP(context_lens=lens, out=out)

    def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x * 2)

    lib.impl("attend", attend, "CPU")
    lib.impl("scale_into", scale_into, "CPU")
    yield lib
    lib._destroy()


def _sum_lens(*, context_lens: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out.fill_(float(sum(int(v) for v in context_lens)))
    return out


# Named like PA so that its ``context_lens`` are frozen at launch, as hardware does.
_LENS_OP = runtime.make_op("_npu_paged_attention", _sum_lens)
_CAPTURED: dict[str, Any] = {}


def test_custom_op_body_is_captured_transparently(rt: Any, library: Any) -> None:
    lens, out = torch.tensor([1, 2]), torch.zeros(1)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        torch.ops.simcapture.attend(lens, out)
    assert [t.name for t in graph._tasks] == ["_npu_paged_attention"]  # not the custom op

    lens[:] = torch.tensor([5, 5])  # the runner's host buffer changes for the next step
    graph.replay()
    npu.synchronize()
    # Skipping the update must show: the task keeps its captured lengths (an opaque custom-op
    # task re-ran its body with the new lengths and gave 10, eager's answer: a false pass).
    assert float(out) == 3.0

    update = npu.Stream()
    npu.graph_task_update_begin(update, _CAPTURED["handle"])
    _LENS_OP(context_lens=lens, out=out)
    npu.graph_task_update_end(update)
    graph.replay()
    npu.synchronize()
    assert float(out) == 10.0


def test_higher_order_op_captures_its_dense_body(rt: Any, library: Any) -> None:
    x, out = torch.ones(3), torch.zeros(3)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        *_, new_out = auto_functionalized_v2(  # (the op's result, the new bases)
            torch.ops.simcapture.scale_into.default, x=x, _out_base_index=0, _all_bases=[out]
        )
    assert torch.equal(new_out, torch.full((3,), 2.0))
    x.fill_(5.0)
    graph.replay()
    npu.synchronize()
    assert torch.equal(new_out, torch.full((3,), 10.0))


def test_functional_op_outputs_are_rewritten_at_replay(rt: Any) -> None:
    double = runtime.make_op("toy_double", lambda x: x * 2)
    x = torch.ones(3)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        y = double(x)
    x.fill_(4.0)
    graph.replay()
    npu.synchronize()
    assert torch.equal(y, torch.full((3,), 8.0))


def _paged(batch: int, blocks: int, block_size: int = 4) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(8, block_size, 1, 8, generator=gen)
    return {
        "query": torch.randn(batch, 2, 8, generator=gen),
        "key_cache": cache,
        "value_cache": cache.clone(),
        "num_kv_heads": 1,
        "num_heads": 2,
        "scale_value": 0.35,
        "block_table": torch.arange(batch * blocks, dtype=torch.int32).reshape(batch, blocks) % 8,
    }


def test_paged_attention_captures_at_its_max_workspace_length(rt: Any) -> None:
    """vllm-ascend captures PA with kv length 6144 whatever max_model_len is (the workspace
    getter's maximum); the update then relaunches with the real lengths."""
    import torch_npu

    args = _paged(batch=2, blocks=2)
    out = torch.zeros(2, 2, 8)
    captured = torch.tensor([6144, 6144], dtype=torch.int32)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        stream = npu.current_stream()
        npu.graph_task_group_begin(stream)
        torch_npu._npu_paged_attention(**args, context_lens=captured, out=out)
        handle = npu.graph_task_group_end(stream)
    assert rt.stats()["capture_warmups_skipped"] == 1
    (task,) = (t for t in graph._tasks if t.sim)
    assert task.kwargs["context_lens"].tolist() == [6144, 6144]  # as captured, until updated
    with pytest.raises(ValueError, match="kv length 6144"):
        task.run()  # what a replay without the update would run

    real = torch.tensor([5, 7], dtype=torch.int32)
    update = npu.Stream()
    npu.graph_task_update_begin(update, handle)
    torch_npu._npu_paged_attention(**args, context_lens=real, out=out)
    npu.graph_task_update_end(update)
    graph.replay()
    npu.synchronize()
    expected = torch.zeros(2, 2, 8)
    ops._npu_paged_attention(**args, context_lens=real, out=expected)
    torch.testing.assert_close(out, expected)


def test_capture_failure_of_a_functional_op_still_raises(rt: Any) -> None:
    """Only launches into given outputs defer their failure: a functional op has no outputs."""

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad arguments")

    op = runtime.make_op("toy_broken", broken)
    graph = npu.NPUGraph()
    with pytest.raises(ValueError, match="bad arguments"), npu.graph(graph):
        op(torch.ones(1))
