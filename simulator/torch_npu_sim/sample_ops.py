"""Plain-torch references of the torch_npu ops vllm-ascend's NPU sampler calls.

vllm-ascend 0.23.0.post1's ``AscendTopKTopPSampler`` filters the logits of every request that
asks for top-k or top-p with ``torch_npu.npu_top_k_top_p`` (on A2 / A3 devices, which the
simulated device reports); the rest of its sampling path (the exponential race of
``random_sample`` with per-request seeded ``torch.Generator``s, softmax, argmax, logprobs,
and the penalties, which take vLLM's torch path where Triton is absent) is plain torch, so it runs
here as it is. The ops join the simulator's op table like ``model_ops`` (one task under
capture). Semantics follow the operator's documentation in the real wheel
(``torch_npu/_op_plugin_docs.py``); the signature is torch-npu 2.10.0.post4's registered schema
(``tests/test_torch_npu_conformance.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .runtime import SimulatorError

Tensor = torch.Tensor

#: Data types the operator accepts for ``logits`` (and ``p``, which must match them).
FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check(logits: Tensor, p: Tensor | None, k: Tensor | None) -> None:
    """The operator's documented constraints, each a clear error instead of a wrong result."""
    if p is None and k is None:
        raise SimulatorError("npu_top_k_top_p: p and k cannot both be None")
    if logits.dim() != 2 or logits.dtype not in FLOAT_TYPES:
        raise SimulatorError(
            f"npu_top_k_top_p: logits must be 2-D float16/bfloat16/float32, got "
            f"{tuple(logits.shape)} {logits.dtype}"
        )
    rows, vocab = logits.shape
    if p is not None and (p.dim() != 1 or p.shape[0] != rows or p.dtype != logits.dtype):
        raise SimulatorError(
            f"npu_top_k_top_p: p must be 1-D of {rows} rows with logits' dtype {logits.dtype}, "
            f"got {tuple(p.shape)} {p.dtype}"
        )
    if k is not None:
        if k.dim() != 1 or k.shape[0] != rows or k.dtype != torch.int32:
            raise SimulatorError(
                f"npu_top_k_top_p: k must be 1-D int32 of {rows} rows, got "
                f"{tuple(k.shape)} {k.dtype}"
            )
        if rows and (int(k.min()) < 1 or int(k.max()) > vocab):
            raise SimulatorError(
                f"npu_top_k_top_p: k must lie in [1, {vocab}], got [{int(k.min())}, {int(k.max())}]"
            )


def npu_top_k_top_p(logits: Tensor, p: Tensor | None = None, k: Tensor | None = None) -> Tensor:
    """Top-k, then top-p filtering of ``logits`` (filtered entries become ``-inf``).

    As documented for the operator: sort each row ascending (stable); top-k keeps the values not
    below the k-th largest (ties with it stay); top-p takes the softmax of what top-k kept,
    accumulates it from the smallest probability up and drops the entries whose running sum is at
    most ``1 - p``, always keeping the largest; the result is put back in the original order.
    The mask arithmetic is float32, the result has ``logits``' dtype.
    """
    _check(logits, p, k)
    values, order = logits.float().sort(dim=-1, stable=True)
    vocab = values.shape[-1]
    if k is not None:
        kth = values.gather(-1, (vocab - k.long()).unsqueeze(-1))
        values = values.masked_fill(values < kth, float("-inf"))
    if p is not None:
        running = values.softmax(dim=-1).cumsum(dim=-1)
        drop = running <= (1 - p.float()).unsqueeze(-1)
        drop[:, -1] = False
        values = values.masked_fill(drop, float("-inf"))
    out = torch.empty_like(values).scatter_(-1, order, values)
    return out.to(logits.dtype)


REFERENCE_OPS: dict[str, Callable[..., Any]] = {
    "npu_top_k_top_p": npu_top_k_top_p,
}

__all__ = ["REFERENCE_OPS"]
