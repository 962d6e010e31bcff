"""The Gated DeltaNet references (``torch_npu_sim.gdn_ops``) against float64 oracles.

Each oracle is written another way than its reference and shares no code with it:

- the convolution as ``F.conv1d`` over a sequence's whole token stream (transformers'
  ``torch_causal_conv1d_update`` for a prefill from a state), speculative steps included: what
  the op computes from its state slots and accepted-token offsets must equal a plain causal
  convolution over the tokens that were accepted;
- the delta rule as a per-head matrix recurrence ``S = e^g S + k (beta (v - S^T k))^T``,
  ``o = S^T q`` over the accepted stream (and transformers' ``torch_recurrent_gated_delta_rule``
  and chunked ``torch_chunk_gated_delta_rule``, float32 inside, at a looser tolerance);
- the gates, norms and the M-RoPE kernel from their formulas, the rotation as a complex product;
- Qwen3-Next's ``in_proj_qkvz`` / ``in_proj_ba`` split as transformers' own
  ``Qwen3NextGatedDeltaNet.fix_query_key_value_ordering`` splits the same rows.
"""

from __future__ import annotations

import ast
import inspect
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from tests import torch_npu_conformance as conf
from torch_npu_sim import gdn_ops

PAD = -1


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


# --------------------------------------------------------------------------------------------
# Causal conv1d


def conv_oracle(stream: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """SiLU(causal depthwise conv) of a whole stream ``(T, dim)`` in float64, zeros before it."""
    width = weight.shape[0]
    x = stream.double().t()[None]  # (1, dim, T)
    w = weight.double().t()[:, None, :]  # (dim, 1, width)
    y = F.conv1d(F.pad(x, (width - 1, 0)), w, bias.double(), groups=x.shape[1])
    return F.silu(y)[0].t()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv_prefill_matches_transformers_update(gen: torch.Generator, dtype: torch.dtype) -> None:
    """run_mode 0: three sequences into slots 5, 2, PAD; the first continues from its state."""
    dim, width, slots = 8, 4, 6
    x = torch.randn(9, dim, generator=gen, dtype=dtype)
    weight = torch.randn(width, dim, generator=gen, dtype=dtype)
    bias = torch.randn(dim, generator=gen, dtype=dtype)
    state = torch.randn(slots, width - 1, dim, generator=gen, dtype=dtype)
    before = state.clone()
    qsl = torch.tensor([0, 4, 6, 9])
    out = torch.zeros_like(x)
    gdn_ops.npu_causal_conv1d_custom(
        out, x, weight, state, bias, qsl, torch.tensor([5, 2, PAD]),
        torch.tensor([True, False, True]), None, 1, PAD, 0,
    )  # fmt: skip
    for s, (slot, init) in enumerate([(5, True), (2, False)]):
        hf_state = (before[slot] if init else torch.zeros(width - 1, dim)).double().t()[None]
        seq = x[qsl[s] : qsl[s + 1]].double().t()[None]
        hf_state = hf_state.clone()
        want = hf.torch_causal_conv1d_update(
            seq, hf_state, weight.double().t(), bias.double(), "silu"
        )
        assert _max_err(out[qsl[s] : qsl[s + 1]], want[0].t()) < 1e-5
        assert _max_err(state[slot], hf_state[0].t()) == 0.0
    assert torch.equal(out[6:], torch.zeros(3, dim, dtype=dtype))  # the PAD sequence is skipped
    assert torch.equal(state[[0, 1, 3, 4]], before[[0, 1, 3, 4]])


def test_conv_decode_and_speculative_steps_follow_the_accepted_stream(gen: torch.Generator) -> None:
    """Prefill, then a decode step (run_mode 1), then speculative steps of k + 1 = 3 tokens with
    1, 3 and 2 tokens accepted: every output equals the causal conv over the stream of accepted
    tokens plus the step's own tokens."""
    dim, width, k = 6, 4, 2
    weight = torch.randn(width, dim, generator=gen)
    bias = torch.randn(dim, generator=gen)
    state = torch.zeros(3, width - 1 + k, dim)
    prompt = torch.randn(5, dim, generator=gen)
    out = torch.zeros_like(prompt)
    gdn_ops.npu_causal_conv1d_custom(
        out, prompt, weight, state, bias, torch.tensor([0, 5]), torch.tensor([1]),
        torch.tensor([False]), None, 1, PAD, 0,
    )  # fmt: skip
    assert _max_err(out, conv_oracle(prompt, weight, bias)) < 1e-5
    stream = prompt
    token = torch.randn(1, dim, generator=gen)
    out = torch.zeros_like(token)
    gdn_ops.npu_causal_conv1d_custom(
        out, token, weight, state, bias, torch.tensor([0, 1]), torch.tensor([1]), None, None,
        1, PAD, 1,
    )  # fmt: skip
    stream = torch.cat([stream, token])
    assert _max_err(out, conv_oracle(stream, weight, bias)[-1:]) < 1e-5
    accepted = 1  # the decode step's token
    for next_accepted in (1, 3, 2):
        step = torch.randn(k + 1, dim, generator=gen)
        out = torch.zeros_like(step)
        gdn_ops.npu_causal_conv1d_custom(
            out, step, weight, state, bias, torch.tensor([0, k + 1]),
            torch.tensor([[1, 2, 0]]), None, torch.tensor([accepted]), 1, PAD, 1,
        )  # fmt: skip
        want = conv_oracle(torch.cat([stream, step]), weight, bias)[-(k + 1) :]
        assert _max_err(out, want) < 1e-5, (accepted, next_accepted)
        stream = torch.cat([stream, step[:next_accepted]])
        accepted = next_accepted


def test_conv_without_accepted_offsets_would_read_the_wrong_history(gen: torch.Generator) -> None:
    """Negative control of the test above: the step after 3 accepted tokens, run as if 1 were
    accepted, differs from the oracle (the offset matters, so the test can fail)."""
    dim, width, k = 4, 4, 2
    weight, bias = torch.randn(width, dim, generator=gen), torch.randn(dim, generator=gen)
    state = torch.randn(1, width - 1 + k, dim, generator=gen)
    step = torch.randn(k + 1, dim, generator=gen)
    outs = []
    for accepted in (3, 1):
        out = torch.zeros_like(step)
        gdn_ops.npu_causal_conv1d_custom(
            out, step, weight, state.clone(), bias, torch.tensor([0, 3]), torch.tensor([[0, 0, 0]]),
            None, torch.tensor([accepted]), 1, PAD, 1,
        )  # fmt: skip
        outs.append(out)
    assert _max_err(outs[0], outs[1]) > 1e-2


# --------------------------------------------------------------------------------------------
# Gating


def test_fused_gdn_gating_matches_its_formula(gen: torch.Generator) -> None:
    a, b = torch.randn(5, 4, generator=gen) * 8, torch.randn(5, 4, generator=gen)
    a_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    g, beta = gdn_ops.npu_fused_gdn_gating(a_log, a, b, dt_bias)
    x = a.double() + dt_bias.double()
    softplus = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    assert g.shape == beta.shape == (1, 5, 4) and g.dtype == torch.float32
    assert _max_err(g[0], -torch.exp(a_log.double()) * softplus) < 1e-5
    assert _max_err(beta[0], 1 / (1 + torch.exp(-b.double()))) < 1e-6


# --------------------------------------------------------------------------------------------
# The delta rule


def delta_rule_oracle(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per value head ``h`` (key head ``h // (HV / H)``), a ``(K, V)`` matrix recurrence in float64.
    ``q`` / ``k`` ``(T, H, K)``, ``v`` ``(T, HV, V)``, ``g`` / ``beta`` ``(T, HV)``; ``state``
    ``(HV, K, V)``. Returns the outputs ``(T, HV, V)`` and the final state."""
    heads, ratio = v.shape[1], v.shape[1] // q.shape[1]
    out = torch.zeros(v.shape, dtype=torch.float64)
    final = state.double().clone()
    for h in range(heads):
        s = final[h]
        for t in range(v.shape[0]):
            kt = k[t, h // ratio].double()
            kt = kt / math.sqrt(float(kt @ kt) + 1e-6)
            qt = q[t, h // ratio].double()
            qt = qt / math.sqrt(float(qt @ qt) + 1e-6) * scale
            s = math.exp(float(g[t, h])) * s
            s = s + torch.outer(kt, float(beta[t, h]) * (v[t, h].double() - s.t() @ kt))
            out[t, h] = s.t() @ qt
        final[h] = s
    return out, final


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x / (x.double().pow(2).sum(-1, keepdim=True) + 1e-6).sqrt().to(x.dtype)


def _inputs(gen: torch.Generator, t: int, h: int = 2, hv: int = 4, d: int = 8) -> tuple:
    q, k = torch.randn(t, h, d, generator=gen), torch.randn(t, h, d, generator=gen)
    v = torch.randn(t, hv, d, generator=gen)
    g = -torch.rand(t, hv, generator=gen)
    beta = torch.rand(t, hv, generator=gen)
    return q, k, v, g, beta


def test_recurrent_decode_matches_oracle(gen: torch.Generator) -> None:
    """Three sequences of one token (slots 3, 0, and an empty padded one)."""
    d, scale = 8, 8**-0.5
    q, k, v, g, beta = _inputs(gen, 2)
    state = torch.randn(4, 4, d, d, generator=gen)  # (slots, HV, V, K)
    before = state.clone()
    out = gdn_ops.npu_recurrent_gated_delta_rule(
        _l2(q), _l2(k), v, state, beta=beta, scale=scale, g=g,
        actual_seq_lengths=torch.tensor([0, 1, 1, 0], dtype=torch.int32),
        ssm_state_indices=torch.tensor([3, 0, PAD], dtype=torch.int32),
    )  # fmt: skip
    for t, slot in enumerate((3, 0)):
        sl = slice(t, t + 1)
        want, final = delta_rule_oracle(
            q[sl], k[sl], v[sl], g[sl], beta[sl], before[slot].transpose(-1, -2), scale
        )
        assert _max_err(out[sl], want) < 1e-5
        assert _max_err(state[slot].transpose(-1, -2), final) < 1e-5
    assert torch.equal(state[[1, 2]], before[[1, 2]])


def test_recurrent_matches_transformers_recurrent(gen: torch.Generator) -> None:
    """One sequence of four tokens against transformers' torch_recurrent_gated_delta_rule (its
    math is float32 inside: a looser tolerance)."""
    d, scale = 8, 8**-0.5
    q, k, v, g, beta = _inputs(gen, 4)
    state = torch.randn(1, 4, d, d, generator=gen)
    before = state.clone()
    out = gdn_ops.npu_recurrent_gated_delta_rule(
        _l2(q), _l2(k), v, state, beta=beta, scale=scale, g=g,
        actual_seq_lengths=torch.tensor([0, 4], dtype=torch.int32),
        ssm_state_indices=torch.tensor([0, 0, 0, 0], dtype=torch.int32),
    )  # fmt: skip
    rep = lambda x: x.repeat_interleave(2, 1)[None]  # noqa: E731 - key heads onto value heads
    want, final = hf.torch_recurrent_gated_delta_rule(
        rep(q), rep(k), v[None], g[None], beta[None], before[0].transpose(-1, -2)[None], True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert _max_err(out, want[0]) < 1e-4
    assert _max_err(state[0].transpose(-1, -2), final[0]) < 1e-4


def test_recurrent_speculative_steps_follow_the_accepted_stream(gen: torch.Generator) -> None:
    """Two sequences, k + 1 = 3 tokens a step, each token's state in its own slot (2-D indices,
    flattened as the release passes them): with 2 then 1 then 3 tokens accepted, every output
    equals the oracle over the accepted stream plus the step's tokens."""
    d, scale, k1 = 8, 8**-0.5, 3
    state = torch.zeros(8, 4, d, d)
    indices = torch.tensor([[1, 2, 3], [5, 6, 7]], dtype=torch.int32)
    init = [torch.randn(4, d, d, generator=gen) for _ in range(2)]  # (HV, K, V) after a prompt
    state[1], state[5] = init[0].transpose(-1, -2), init[1].transpose(-1, -2)
    streams: list[list[tuple]] = [[], []]
    accepted = [1, 1]
    for step_accepts in ([2, 1], [1, 3], [3, 2]):
        q, k, v, g, beta = _inputs(gen, 2 * k1)
        out = gdn_ops.npu_recurrent_gated_delta_rule(
            _l2(q), _l2(k), v, state, beta=beta, scale=scale, g=g,
            actual_seq_lengths=torch.tensor([0, k1, k1], dtype=torch.int32),
            ssm_state_indices=indices.flatten(),
            num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32),
        )  # fmt: skip
        for s in range(2):
            sl = slice(s * k1, (s + 1) * k1)
            tokens = [x[sl] for x in (q, k, v, g, beta)]
            # the accepted tokens of earlier steps, then this step's: one stream per input
            full = [torch.cat(p) for p in zip(*streams[s], tokens, strict=True)]
            want, _ = delta_rule_oracle(*full, init[s], scale)
            assert _max_err(out[sl], want[-k1:]) < 1e-5, (s, accepted)
            streams[s].append(tuple(x[: step_accepts[s]] for x in tokens))
        accepted = step_accepts


def test_chunked_prefill_matches_oracle_and_transformers_chunked(gen: torch.Generator) -> None:
    """Two prompts (70 and 5 tokens: more than one 64-token chunk) from initial states."""
    d, hv = 8, 4
    q, k, v, g, beta = _inputs(gen, 75)
    init = torch.randn(2, hv, d, d, generator=gen)  # (N, HV, K, V)
    cu = torch.tensor([0, 70, 75])
    out, final = gdn_ops.chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=init,
        output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    rep = lambda x: x.repeat_interleave(2, 1)[None]  # noqa: E731
    for s in range(2):
        sl = slice(int(cu[s]), int(cu[s + 1]))
        want, want_final = delta_rule_oracle(q[sl], k[sl], v[sl], g[sl], beta[sl], init[s], d**-0.5)
        assert _max_err(out[0, sl], want) < 1e-4
        assert _max_err(final[s], want_final) < 1e-4
        hf_out, hf_final = hf.torch_chunk_gated_delta_rule(
            rep(q[sl]), rep(k[sl]), v[None, sl], g[None, sl], beta[None, sl],
            initial_state=init[s][None], output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        assert _max_err(out[0, sl], hf_out[0]) < 1e-3
        assert _max_err(final[s], hf_final[0]) < 1e-3


# --------------------------------------------------------------------------------------------
# Triton kernels


def test_l2norm_kernel_matches_its_formula(gen: torch.Generator) -> None:
    x = torch.randn(7, 16, generator=gen)
    y = torch.empty_like(x)
    gdn_ops.l2norm_fwd_kernel2((1,), x, y, 1e-6, 7, 16, 16, 32)
    want = x.double() / (x.double().norm(dim=-1, keepdim=True) ** 2 + 1e-6).sqrt()
    assert _max_err(y, want) < 1e-6


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_gated_rms_norm_kernel_matches_its_formula(
    gen: torch.Generator, norm_before_gate: bool
) -> None:
    """Two groups of 8 channels, RMS norm, gate ``z * sigmoid(z)`` after or before the norm."""
    m, groups, n = 5, 2, 8
    x, z = torch.randn(m, groups * n, generator=gen), torch.randn(m, groups * n, generator=gen)
    w = torch.randn(groups * n, generator=gen)
    y, rstd = torch.empty_like(x), torch.empty(groups * m)
    gdn_ops.layer_norm_fwd_1pass_kernel(
        (1, groups), x, y, w, None, z, None, rstd, x.stride(0), y.stride(0), z.stride(0), m, n,
        1e-6, BLOCK_M=64, BLOCK_N=8, NORM_BEFORE_GATE=norm_before_gate, IS_RMS_NORM=True,
    )  # fmt: skip
    for row in range(m):
        for grp in range(groups):
            cols = slice(grp * n, (grp + 1) * n)
            xs, zs = x[row, cols].double(), z[row, cols].double()
            gate = zs / (1 + torch.exp(-zs))
            if not norm_before_gate:
                xs = xs * gate
            r = 1 / math.sqrt(float((xs * xs).mean()) + 1e-6)
            want = xs * r * w[cols].double() * (gate if norm_before_gate else 1)
            assert _max_err(y[row, cols], want) < 1e-5
            assert abs(float(rstd[grp * m + row]) - r) < 1e-4


def test_clear_ssm_states_zeroes_rows_without_initial_state(gen: torch.Generator) -> None:
    states = torch.randn(3, 2, 4, 4, generator=gen)
    before = states.clone()
    gdn_ops.clear_ssm_states_kernel((3, 1), states, torch.tensor([True, False, True]), 32, 32)
    assert torch.equal(states[[0, 2]], before[[0, 2]])
    assert not states[1].any()


def _mrope_oracle(
    x: torch.Tensor, pos3: torch.Tensor, sections: list[int], rope_dim: int
) -> torch.Tensor:
    """Channels ``(i, i + half)`` of the first ``rope_dim`` as a complex number turned by
    ``pos * theta_i``, ``pos`` the t / h / w position Qwen3.5's interleaved M-RoPE assigns channel
    ``i``: h for ``i % 3 == 1``, w for ``i % 3 == 2`` within their sections, else t."""
    half = rope_dim // 2
    theta = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) * 2 / rope_dim))
    which = torch.zeros(half, dtype=torch.long)
    for i in range(half):
        if i % 3 == 1 and i < 3 * sections[1]:
            which[i] = 1
        elif i % 3 == 2 and i < 3 * sections[2]:
            which[i] = 2
    pos = pos3.double()[which].t()  # (T, half)
    pairs = torch.complex(x[..., :half].double(), x[..., half:rope_dim].double())
    turned = pairs * torch.polar(torch.ones_like(pos), pos * theta)[:, None, :]
    return torch.cat([turned.real, turned.imag, x[..., rope_dim:].double()], -1)


def test_split_qkv_rmsnorm_mrope_matches_its_formula(gen: torch.Generator) -> None:
    """Gated q (per head: q rows then gate rows), q / k RMSNorm, partial interleaved M-RoPE."""
    t, nq, nkv, hd, rope_dim, sections = 3, 4, 2, 16, 8, [2, 1, 1]
    q_size, kv_size = nq * hd, nkv * hd
    qkv = torch.randn(t, 2 * q_size + 2 * kv_size, generator=gen)
    qw, kw = torch.randn(hd, generator=gen), torch.randn(hd, generator=gen)
    pos3 = torch.tensor([[5, 9, 30], [2, 9, 11], [7, 0, 40]])
    theta = 1.0 / (10000.0 ** (torch.arange(rope_dim // 2, dtype=torch.float64) * 2 / rope_dim))
    angles = pos3.double()[..., None] * theta  # (3, T, half): each section's table, as the cache
    cos_sin = torch.cat([angles.cos(), angles.sin()], -1).float()
    outs = [
        torch.empty(t, q_size),
        torch.empty(t, kv_size),
        torch.empty(t, kv_size),
        torch.empty(t, q_size),
    ]
    gdn_ops.split_qkv_rmsnorm_mrope_kernel(
        (1,), qkv, qw, None, kw, None, cos_sin, *outs, t, 1, t, 0, nq, nkv, hd, q_size, kv_size,
        1e-6, *sections, False, True, rope_dim, rope_dim // 2, True, q_size,
    )  # fmt: skip
    q_gate = qkv[:, : 2 * q_size].double().reshape(t, nq, 2 * hd)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w.double()

    q = _mrope_oracle(rms(q_gate[..., :hd], qw), pos3, sections, rope_dim)
    k_in = qkv[:, 2 * q_size : 2 * q_size + kv_size].double().reshape(t, nkv, hd)
    k = _mrope_oracle(rms(k_in, kw), pos3, sections, rope_dim)
    assert _max_err(outs[0], q.reshape(t, q_size)) < 1e-5
    assert _max_err(outs[1], k.reshape(t, kv_size)) < 1e-5
    assert torch.equal(outs[2], qkv[:, 2 * q_size + kv_size :])
    assert torch.equal(outs[3], q_gate[..., hd:].reshape(t, q_size).float())


def _split_qkvzba(
    kernel: object, qkvz: torch.Tensor, ba: torch.Tensor, nk: int, nv: int, hk: int, hv: int
) -> tuple[torch.Tensor, ...]:
    """Launch ``kernel`` with vllm-ascend's ``fused_qkvzba_split_reshape_cat`` arguments."""
    n = qkvz.shape[0]
    qkv = torch.full((n, 2 * nk * hk + nv * hv), float("nan"))
    z = torch.full((n, nv, hv), float("nan"))
    b, a = torch.full((n, nv), float("nan")), torch.full((n, nv), float("nan"))
    per_k = 2 * hk + 2 * nv // nk * hv
    kernel(  # type: ignore[operator]
        (1, 1), qkv, z, b, a, qkvz, ba, nk, nv, hk, hv, n, n, nk * per_k, 2 * nv,
        2 * nk * hk + nv * hv, nv * hv, nv, 8,
    )  # fmt: skip
    return qkv, z, b, a


def _hf_split(
    qkvz: torch.Tensor, ba: torch.Tensor, nk: int, nv: int, hk: int, hv: int
) -> tuple[torch.Tensor, ...]:
    """transformers' ``Qwen3NextGatedDeltaNet.fix_query_key_value_ordering`` (the model's own
    torch code, batch 1), laid out as the kernel's outputs: q, k, v heads concatenated."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf_next

    layer = SimpleNamespace(num_k_heads=nk, num_v_heads=nv, head_k_dim=hk, head_v_dim=hv)
    q, k, v, z, b, a = hf_next.Qwen3NextGatedDeltaNet.fix_query_key_value_ordering(
        layer, qkvz[None], ba[None]
    )
    n = qkvz.shape[0]
    qkv = torch.cat([x[0].reshape(n, -1) for x in (q, k, v)], -1)
    return qkv, z[0], b[0], a[0]


@pytest.mark.parametrize("nk,nv", [(2, 4), (2, 2), (1, 3)])
def test_fused_qkvzba_split_matches_transformers_ordering(
    gen: torch.Generator, nk: int, nv: int
) -> None:
    """Qwen3-Next's interleaved ``in_proj_qkvz`` / ``in_proj_ba`` rows (per key head: q, k, its
    value heads' v, then z; b then a) split as transformers' own model splits them."""
    hk, hv, n = 8, 4, 5
    qkvz = torch.randn(n, nk * (2 * hk + 2 * nv // nk * hv), generator=gen)
    ba = torch.randn(n, 2 * nv, generator=gen)
    got = _split_qkvzba(gdn_ops.fused_qkvzba_split_reshape_cat_kernel, qkvz, ba, nk, nv, hk, hv)
    want = _hf_split(qkvz, ba, nk, nv, hk, hv)
    for name, g_, w_ in zip("qkv z b a".split(), got, want, strict=True):
        assert g_.shape == w_.shape, name
        assert torch.equal(g_, w_), name


QKVZBA_KEY = (
    "vllm_ascend.ops.triton.fla.fused_qkvzba_split_reshape.fused_qkvzba_split_reshape_cat_kernel"
)


def _contiguous_split(grid, qkv, z, b, a, mixed_qkvz, mixed_ba, nk, nv, hk, hv, rows, *_):  # noqa: ANN001, ANN202
    """A wrong reference: Qwen3.5's contiguous ``[q | k | v | z]``, ``[b | a]`` reading of the
    rows (the split without the per-key-head interleave)."""
    qkv[:rows].copy_(mixed_qkvz[:rows, : qkv.shape[1]])
    z[:rows].copy_(mixed_qkvz[:rows, qkv.shape[1] :].reshape(rows, nv, hv))
    b[:rows].copy_(mixed_ba[:rows, :nv])
    a[:rows].copy_(mixed_ba[:rows, nv:])


@pytest.mark.parametrize("reference", ["simulator", "contiguous"])
def test_release_qkvzba_split_launches_the_reference_in_transformers_ordering(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch, reference: str
) -> None:
    """vllm-ascend's own ``fused_qkvzba_split_reshape_cat`` (its strides, its launch arguments)
    through the simulator's kernel stub gives transformers' split. Negative control
    (``contiguous``): the same launch with a reference that ignores the interleave differs."""
    from torch_npu_sim.engine import gdn_path, triton_refs

    gdn_path.install()
    from vllm_ascend.ops.triton.fla import fused_qkvzba_split_reshape as release

    if reference == "contiguous":
        monkeypatch.setitem(triton_refs.REFERENCES, QKVZBA_KEY, _contiguous_split)
    nk, nv, hk, hv, n = 2, 4, 8, 4, 6
    qkvz = torch.randn(n, nk * (2 * hk + 2 * nv // nk * hv), generator=gen)
    ba = torch.randn(n, 2 * nv, generator=gen)
    launches = triton_refs.LAUNCHES.get(QKVZBA_KEY, 0)
    got = release.fused_qkvzba_split_reshape_cat(qkvz, ba, nk, nv, hk, hv)
    assert triton_refs.LAUNCHES[QKVZBA_KEY] == launches + 1
    want = _hf_split(qkvz, ba, nk, nv, hk, hv)
    same = [torch.equal(g_, w_) for g_, w_ in zip(got, want, strict=True)]
    assert same == ([True] * 4 if reference == "simulator" else [False] * 4)


def test_recurrent_ignoring_accepted_tokens_would_start_from_the_wrong_slot(
    gen: torch.Generator,
) -> None:
    """Negative control of the speculative test: the same step read with 1 instead of 3 tokens
    accepted starts from another state slot, and its outputs differ."""
    d = 8
    q, k, v, g, beta = _inputs(gen, 3)
    state = torch.randn(3, 4, d, d, generator=gen)
    outs = []
    for accepted in (3, 1):
        out = gdn_ops.npu_recurrent_gated_delta_rule(
            _l2(q), _l2(k), v, state.clone(), beta=beta, scale=d**-0.5, g=g,
            actual_seq_lengths=torch.tensor([0, 3], dtype=torch.int32),
            ssm_state_indices=torch.tensor([0, 1, 2], dtype=torch.int32),
            num_accepted_tokens=torch.tensor([accepted], dtype=torch.int32),
        )  # fmt: skip
        outs.append(out)
    assert _max_err(outs[0], outs[1]) > 1e-2


# --------------------------------------------------------------------------------------------
# As the engine reaches them: the registered ops, under graph capture


def _schema_signature(schema: torch.FunctionSchema) -> inspect.Signature:
    """How Python calls an op of this schema (keyword-only after ``*``)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = []
    for a in schema.arguments:
        default = None if a.has_default_value() else inspect.Parameter.empty
        params.append(inspect.Parameter(a.name, kinds[a.kwarg_only], default=default))
    return inspect.Signature(params)


def _release_calls(name: str) -> list[tuple[str, int, int, list[str]]]:
    """Every ``torch.ops._C_ascend.<name>(...)`` call in the installed vllm-ascend's source:
    (file, line, positional count, keyword names)."""
    root = conf.vllm_ascend_root()
    calls = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if name not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == name
                and ast.unparse(node.func.value) == "torch.ops._C_ascend"
            ):
                keywords = [k.arg for k in node.keywords if k.arg is not None]
                where = str(path.relative_to(root))
                calls.append((where, node.lineno, len(node.args), keywords))
    return calls


def test_gdn_ops_are_registered_with_schemas_the_releases_calls_bind_to() -> None:
    """``torch.ops._C_ascend`` carries the three GDN ops, and every call the installed
    vllm-ascend makes to each (read from its source, not from the simulator's schema table)
    binds to the registered schema: a parameter renamed, dropped or made keyword-only there
    breaks a call of the release, as it would on hardware with its ``csrc/torch_binding.cpp``."""
    from torch_npu_sim.engine import gdn_path

    gdn_path.install()
    for name in gdn_path.SCHEMAS:
        signature = _schema_signature(getattr(torch.ops._C_ascend, name).default._schema)
        calls = _release_calls(name)
        assert calls, f"the release never calls _C_ascend.{name}"
        for where, line, positional, keywords in calls:
            try:
                signature.bind(*([None] * positional), **dict.fromkeys(keywords))
            except TypeError as exc:
                raise AssertionError(f"{where}:{line}: _C_ascend.{name}: {exc}") from None


def test_captured_recurrence_replays_on_the_current_state_and_lengths() -> None:
    """A captured decode recurrence re-reads its length and index tensors and the state at
    replay, as the kernel reads device memory: a graph captured for one batch serves the next
    (persistent buffers refreshed in place), with no host value frozen at capture."""
    from torch_npu_sim.engine import gdn_path

    gdn_path.install()
    gen = torch.Generator().manual_seed(1)
    d = 8
    q, k, v, g, beta = (x.contiguous() for x in _inputs(gen, 2))
    qn, kn = _l2(q), _l2(k)  # the caller's l2norm_fwd
    state = torch.randn(4, 4, d, d, generator=gen)
    lengths = torch.tensor([0, 1, 1], dtype=torch.int32)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        out = torch.ops._C_ascend.npu_recurrent_gated_delta_rule(
            qn, kn, v, state, beta=beta, scale=d**-0.5, actual_seq_lengths=lengths,
            ssm_state_indices=slots, g=g,
        )  # fmt: skip
    # two live sequences in slots 3 and 2, then the second padded away (length 0), slot 1
    for new_lengths, new_slots in (([0, 1, 1], [3, 2]), ([0, 1, 0], [1, 0])):
        lengths.copy_(torch.tensor(new_lengths))
        slots.copy_(torch.tensor(new_slots))
        before = state.clone()
        graph.replay()
        torch.npu.synchronize()
        want = torch.zeros(out.shape, dtype=torch.float64)
        for row, (live, slot) in enumerate(zip(new_lengths[1:], new_slots, strict=True)):
            if not live:
                continue
            sl = slice(row, row + 1)
            start = before[slot].transpose(-1, -2)
            want[sl], final = delta_rule_oracle(
                q[sl], k[sl], v[sl], g[sl], beta[sl], start, d**-0.5
            )
            assert _max_err(state[slot].transpose(-1, -2), final) < 1e-5
        assert _max_err(out, want) < 1e-5
