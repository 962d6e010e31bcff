"""Plain-torch references of the non-attention torch_npu ops the real model layers call.

vllm-ascend's layer overrides (``ops/layernorm.py``, ``ops/rotary_embedding.py``,
``ops/activation.py``) and the worker's ATB warm-up call these NPU kernels; the tiny models the
engine tests build reach exactly these. They join the same op table as ``ops.py`` (``install()``
wraps each one as a simulated NPU op: one task under capture). Math is float32, cast back to the
input dtype, as the NPU kernels do for half-precision inputs. Signatures are torch-npu
2.10.0.post4's registered schemas (names, order, defaults: ``tests/test_torch_npu_conformance.py``
checks them against the wheel's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Tensor = torch.Tensor


def _rstd(x: Tensor, ndim: int, epsilon: float) -> Tensor:
    dims = tuple(range(x.dim() - ndim, x.dim()))
    return torch.rsqrt(x.float().pow(2).mean(dim=dims, keepdim=True) + epsilon)


def npu_rms_norm(input: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``y = x * rsqrt(mean(x^2) + eps) * gamma`` over gamma's trailing dims; returns (y, rstd)."""
    rstd = _rstd(input, gamma.dim(), epsilon)
    y = (input.float() * rstd * gamma.float()).to(input.dtype)
    return y, rstd


def npu_add_rms_norm(
    x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-6
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused residual add + RMSNorm: returns (norm(x1 + x2) * gamma, rstd, x1 + x2)."""
    x = x1 + x2
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y, rstd, x


def _rotate(x: Tensor, neox: bool) -> Tensor:
    """The partner of each element in a rotation: halves (NeoX) or interleaved pairs (GPT-J)."""
    if neox:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def _npu_rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox_style: bool,
) -> None:
    """ATB rotary embedding, in place on ``query`` and ``key`` (``(T, N * head_size)`` or 3-D).

    ``cos_sin_cache`` is vLLM's ``(max_position, rotary_dim)`` table, cos half then sin half; the
    first ``rotary_dim`` channels of each head rotate, the rest pass through.
    """
    cos, sin = cos_sin_cache.index_select(0, positions.reshape(-1).long()).float().chunk(2, -1)
    if is_neox_style:
        cos, sin = cos.repeat(1, 2), sin.repeat(1, 2)
    else:
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    rot = cos.shape[-1]
    for x in (query, key):
        heads = x.view(x.shape[0], -1, head_size)
        part = heads[..., :rot].float()
        rotated = part * cos[:, None] + _rotate(part, is_neox_style) * sin[:, None]
        heads[..., :rot] = rotated.to(x.dtype)


def npu_rotary_mul(
    input: Tensor,  # noqa: A002 - the registered schema's name
    r1: Tensor,
    r2: Tensor,
    rotary_mode: str = "half",
    rotate: Tensor | None = None,
) -> Tensor:
    """``x * r1 + rotate(x) * r2`` with broadcasting; ``half`` (NeoX) or ``interleave`` mode."""
    if rotary_mode not in ("half", "interleave") or rotate is not None:
        raise NotImplementedError(f"sim ops: rotary_mode {rotary_mode!r} / rotate not modelled")
    x = input.float()
    out = x * r1.float() + _rotate(x, rotary_mode == "half") * r2.float()
    return out.to(input.dtype)


def npu_swiglu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002 - the schema's name
    """``silu(a) * b`` where ``a, b`` are the two halves of ``x`` along ``dim``."""
    a, b = input.float().chunk(2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(input.dtype)


def _npu_matmul_add_fp32(x: Tensor, weight: Tensor, C: Tensor) -> None:  # noqa: N803
    """ATB ``C += x^T @ weight`` accumulated in float32, in place (gradient-accumulation GEMM)."""
    C.add_(x.float().transpose(-2, -1) @ weight.float())


REFERENCE_OPS: dict[str, Callable[..., Any]] = {
    "npu_rms_norm": npu_rms_norm,
    "npu_add_rms_norm": npu_add_rms_norm,
    "_npu_rotary_embedding": _npu_rotary_embedding,
    "npu_rotary_mul": npu_rotary_mul,
    "npu_swiglu": npu_swiglu,
    "_npu_matmul_add_fp32": _npu_matmul_add_fp32,
}

__all__ = ["REFERENCE_OPS"]
