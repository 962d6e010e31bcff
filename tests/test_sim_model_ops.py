"""The model-layer reference ops (``torch_npu_sim.model_ops``) against float64 oracles.

Each oracle restates the NPU kernel's documented formula element by element in float64, sharing no
code with the reference; the references run in float32, so they must agree to float32 rounding.
Also: the ops are in torch_npu's op table, and a captured functional op's outputs are rewritten at
replay.
"""

from __future__ import annotations

import math

import pytest
import torch

from torch_npu_sim import model_ops

ATOL = 1e-5


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def rms_oracle(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    x64, g64 = x.double(), gamma.double()
    rows = x64.reshape(-1, x64.shape[-1])
    out = torch.empty_like(rows)
    for r in range(rows.shape[0]):
        ms = sum(float(v) ** 2 for v in rows[r]) / rows.shape[1]
        out[r] = rows[r] / math.sqrt(ms + eps) * g64
    return out.reshape(x.shape)


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 8)])
def test_rms_norm_matches_oracle(gen: torch.Generator, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=gen) * 3
    gamma = torch.randn(shape[-1], generator=gen)
    y, rstd = model_ops.npu_rms_norm(x, gamma, 1e-6)
    torch.testing.assert_close(y.double(), rms_oracle(x, gamma, 1e-6), atol=ATOL, rtol=1e-5)
    assert rstd.shape == (*shape[:-1], 1) and rstd.dtype == torch.float32
    assert y.dtype == x.dtype


def test_rms_norm_keeps_half_precision_dtype(gen: torch.Generator) -> None:
    x = torch.randn(4, 8, generator=gen).to(torch.bfloat16)
    y, _ = model_ops.npu_rms_norm(x, torch.ones(8, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), rms_oracle(x, torch.ones(8), 1e-6), atol=2e-2, rtol=2e-2)


def test_add_rms_norm_returns_the_sum_and_its_norm(gen: torch.Generator) -> None:
    x1, x2 = torch.randn(6, 16, generator=gen), torch.randn(6, 16, generator=gen)
    gamma = torch.randn(16, generator=gen)
    y, rstd, total = model_ops.npu_add_rms_norm(x1, x2, gamma, 1e-5)
    torch.testing.assert_close(total, x1 + x2)
    torch.testing.assert_close(y.double(), rms_oracle(x1 + x2, gamma, 1e-5), atol=ATOL, rtol=1e-5)
    assert rstd.shape == (6, 1)


def rope_oracle(
    positions: list[int], x: torch.Tensor, head_size: int, cache: torch.Tensor, neox: bool
) -> torch.Tensor:
    """Rotate channel pairs by complex multiplication, one token, head and pair at a time."""
    rot = cache.shape[-1]
    half = rot // 2
    out = x.double().clone().reshape(x.shape[0], -1, head_size)
    for t, pos in enumerate(positions):
        for h in range(out.shape[1]):
            for i in range(half):
                a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
                z = complex(float(out[t, h, a]), float(out[t, h, b]))
                w = complex(float(cache[pos, i]), float(cache[pos, half + i]))  # cos, sin
                r = z * w
                out[t, h, a], out[t, h, b] = r.real, r.imag
    return out.reshape(x.shape)


def rope_cache(max_pos: int, rot: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rot", [16, 8])  # full and partial rotary dims (head 16)
def test_rotary_embedding_rotates_in_place(gen: torch.Generator, neox: bool, rot: int) -> None:
    head, positions = 16, [0, 3, 7, 2]
    cache = rope_cache(16, rot)
    q = torch.randn(4, 3 * head, generator=gen)
    k = torch.randn(4, 2 * head, generator=gen)
    q0, k0 = q.clone(), k.clone()
    pos = torch.tensor(positions)
    result = model_ops._npu_rotary_embedding(pos, q, k, head, cache, neox)
    assert result is None  # in place, like the ATB op
    torch.testing.assert_close(q.double(), rope_oracle(positions, q0, head, cache, neox))
    torch.testing.assert_close(k.double(), rope_oracle(positions, k0, head, cache, neox))
    if rot < head:  # channels past the rotary dim pass through
        torch.testing.assert_close(q.view(4, 3, head)[..., rot:], q0.view(4, 3, head)[..., rot:])


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_matches_oracle(gen: torch.Generator, mode: str) -> None:
    x = torch.randn(1, 5, 2, 8, generator=gen)
    cos = torch.randn(1, 5, 1, 8, generator=gen)
    sin = torch.randn(1, 5, 1, 8, generator=gen)
    out = model_ops.npu_rotary_mul(x, cos, sin, rotary_mode=mode)
    x64 = x.double()
    if mode == "half":
        partner = torch.cat([-x64[..., 4:], x64[..., :4]], dim=-1)
    else:
        partner = torch.empty_like(x64)
        partner[..., 0::2], partner[..., 1::2] = -x64[..., 1::2], x64[..., 0::2]
    torch.testing.assert_close(out.double(), x64 * cos.double() + partner * sin.double())


def test_swiglu_matches_oracle(gen: torch.Generator) -> None:
    x = torch.randn(3, 10, generator=gen)
    out = model_ops.npu_swiglu(x)
    a, b = x.double()[:, :5], x.double()[:, 5:]
    torch.testing.assert_close(out.double(), a / (1 + torch.exp(-a)) * b)


def test_matmul_add_fp32_accumulates_in_place(gen: torch.Generator) -> None:
    x = torch.randn(2, 4, generator=gen).half()
    w = torch.randn(2, 4, generator=gen).half()
    c = torch.randn(4, 4, generator=gen)
    c0 = c.clone()
    assert model_ops._npu_matmul_add_fp32(x, w, c) is None  # in place, like the ATB op
    torch.testing.assert_close(c.double(), c0.double() + x.double().T @ w.double())


def test_model_ops_are_in_torch_npus_op_table() -> None:
    """Each is a simulated op: on ``torch_npu`` itself, or (ATB ops) the registered op its lazy
    ``torch_npu`` function is swapped for, as in torch-npu."""
    import torch_npu

    from torch_npu_sim import atb

    for name, reference in model_ops.REFERENCE_OPS.items():
        op = getattr(atb.ATB_OPS, name) if name in atb.API_LIST else getattr(torch_npu, name)
        assert getattr(op, "__wrapped__", None) is reference, name


def test_captured_functional_op_writes_its_outputs_at_replay() -> None:
    """A functional NPU op (fresh outputs) replays into the tensors the capture returned."""
    import torch_npu

    x = torch.ones(2, 8)
    gamma = torch.ones(8)
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        y, _ = torch_npu.npu_rms_norm(x, gamma, 1e-6)
    x.copy_(torch.arange(16.0).reshape(2, 8))
    graph.replay()
    torch.npu.synchronize()
    torch.testing.assert_close(y.double(), rms_oracle(x, gamma, 1e-6), atol=ATOL, rtol=1e-5)
