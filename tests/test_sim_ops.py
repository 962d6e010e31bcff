"""Reference NPU attention ops vs. a naive dense oracle, plus the call-site contract.

The oracle loops over requests, query tokens and heads, gathers KV slot by slot from the block
table and applies an explicit mask, so it shares no code or vectorisation trick with ``ops``.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from torch_npu_sim import ops
from torch_npu_sim.ops import HOST_FUNCTIONS, INT_MAX, REFERENCE_OPS

ATOL = 1e-5
RTOL = 1e-5


# --------------------------------------------------------------------------------------------------
# oracle
# --------------------------------------------------------------------------------------------------


def allowed(mode: int, i: int, j: int, q_len: int, kv_len: int, pre: int, nxt: int) -> bool:
    """Independent statement of the documented masking rules."""
    if j >= kv_len:
        return False
    p = kv_len - q_len + i
    if mode == 0:
        return True
    if mode == 3:
        return j <= p
    if mode == 4:
        return p - pre <= j <= p + nxt
    raise AssertionError(mode)


def oracle_request(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mode: int,
    pre: int = INT_MAX,
    nxt: int = INT_MAX,
    sinks: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (Q, N, D), k/v (K, Nkv, D) -> out (Q, N, Dv), lse (Q, N); -inf lse / 0 out if empty."""
    q_len, n, _ = q.shape
    kv_len, nkv, dv = v.shape
    g = n // nkv
    out = torch.zeros(q_len, n, dv, dtype=torch.float64)
    lse = torch.full((q_len, n), float("-inf"), dtype=torch.float64)
    for i in range(q_len):
        for h in range(n):
            logits, vals = [], []
            for j in range(kv_len):
                if not allowed(mode, i, j, q_len, kv_len, pre, nxt):
                    continue
                if mask is not None and mask[i, j]:
                    continue
                logits.append(float(q[i, h].double() @ k[j, h // g].double()) * scale)
                vals.append(v[j, h // g].double())
            all_logits = list(logits)
            if sinks is not None:
                all_logits.append(float(sinks[h]))
            if not all_logits:
                continue
            mx = max(all_logits)
            z = sum(math.exp(x - mx) for x in all_logits)
            lse[i, h] = mx + math.log(z)
            for x, val in zip(logits, vals, strict=True):
                out[i, h] += math.exp(x - mx) / z * val
    return out, lse


# --------------------------------------------------------------------------------------------------
# problem builder
# --------------------------------------------------------------------------------------------------


@dataclass
class Problem:
    """A random batch: per-request dense K/V scattered into a shuffled paged cache."""

    q: torch.Tensor  # (T, N, D), T may exceed sum(q_lens) (padding tokens)
    q_lens: list[int]
    kv_lens: list[int]
    k_dense: list[torch.Tensor]  # per request (kv_len, Nkv, D)
    v_dense: list[torch.Tensor]
    key_cache: torch.Tensor  # (nb, bs, Nkv, D)
    value_cache: torch.Tensor
    block_table: torch.Tensor  # (B, max_blocks) int32; unused entries are random live blocks
    block_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def cum_q(self) -> list[int]:
        out, acc = [], 0
        for n in self.q_lens:
            acc += n
            out.append(acc)
        return out


def make_problem(
    gen: torch.Generator,
    *,
    q_lens: list[int],
    kv_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    pad_tokens: int = 0,
    extra_blocks: int = 1,
) -> Problem:
    per_req = [max(1, -(-kv // block_size)) for kv in kv_lens]
    max_blocks = max(per_req) + extra_blocks
    num_blocks = sum(per_req) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    kc = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    vc = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    bt = torch.randint(0, num_blocks, (len(kv_lens), max_blocks), generator=gen, dtype=torch.int32)
    k_dense, v_dense, used = [], [], 0
    for b, kv in enumerate(kv_lens):
        blocks = perm[used : used + per_req[b]]
        used += per_req[b]
        bt[b, : per_req[b]] = blocks.to(torch.int32)
        kd = torch.randn(kv, num_kv_heads, head_dim, generator=gen)
        vd = torch.randn(kv, num_kv_heads, head_dim, generator=gen)
        for j in range(kv):
            kc[blocks[j // block_size], j % block_size] = kd[j]
            vc[blocks[j // block_size], j % block_size] = vd[j]
        k_dense.append(kd)
        v_dense.append(vd)
    t = sum(q_lens) + pad_tokens
    q = torch.randn(t, num_heads, head_dim, generator=gen)
    return Problem(
        q,
        q_lens,
        kv_lens,
        k_dense,
        v_dense,
        kc,
        vc,
        bt,
        block_size,
        num_heads,
        num_kv_heads,
        head_dim,
    )


def oracle_tnd(p: Problem, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle over a TND batch; padding tokens get zero output / -inf lse."""
    out = torch.zeros(p.q.shape[0], p.num_heads, p.head_dim, dtype=torch.float64)
    lse = torch.full((p.q.shape[0], p.num_heads), float("-inf"), dtype=torch.float64)
    start = 0
    for b, ql in enumerate(p.q_lens):
        o, s = oracle_request(p.q[start : start + ql], p.k_dense[b], p.v_dense[b], **kw)
        out[start : start + ql] = o
        lse[start : start + ql] = s
        start += ql
    return out, lse


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert not torch.isnan(actual).any()
    torch.testing.assert_close(actual.double(), expected.double(), atol=ATOL, rtol=RTOL)


def assert_lse_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    actual = actual.reshape(expected.shape).double()
    fin = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), fin)
    torch.testing.assert_close(actual[fin], expected[fin], atol=ATOL, rtol=RTOL)


def random_lengths(gen: torch.Generator, batch: int, max_kv: int, decode_only: bool):
    q_lens, kv_lens = [], []
    for _ in range(batch):
        kv = int(torch.randint(1, max_kv + 1, (1,), generator=gen))
        ql = 1 if decode_only else int(torch.randint(1, min(kv, 9) + 1, (1,), generator=gen))
        q_lens.append(ql)
        kv_lens.append(kv)
    return q_lens, kv_lens


CASES = [
    # seed, batch, heads, kv_heads, head_dim, block_size, decode_only, pad_tokens
    (0, 1, 4, 4, 16, 16, True, 0),
    (1, 5, 8, 2, 16, 16, True, 3),
    (2, 3, 8, 1, 8, 32, False, 0),
    (3, 6, 4, 2, 32, 128, False, 5),
    (4, 4, 6, 3, 8, 16, False, 2),
]


# --------------------------------------------------------------------------------------------------
# FIA v1
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode,window", [(3, None), (4, 5), (4, 0), (0, None)])
def test_fia_out_tnd_paged_matches_oracle(case, mode, window):
    seed, batch, n, nkv, d, bs, decode_only, pad = case
    gen = torch.Generator().manual_seed(seed * 7 + mode)
    q_lens, kv_lens = random_lengths(gen, batch, 3 * bs // 2 + 3, decode_only)
    p = make_problem(
        gen,
        q_lens=q_lens,
        kv_lens=kv_lens,
        num_heads=n,
        num_kv_heads=nkv,
        head_dim=d,
        block_size=bs,
        pad_tokens=pad,
    )
    scale = 1.0 / math.sqrt(d)
    pre = window if window is not None else INT_MAX
    nxt = 0 if mode == 4 else INT_MAX
    nb = p.key_cache.shape[0]
    kwargs = dict(
        query=p.q,
        key=p.key_cache.view(nb, bs, -1),  # the (nb, bs, Nkv*D) view _get_fia_params passes
        value=p.value_cache.view(nb, bs, -1),
        atten_mask=torch.triu(torch.ones(2048, 2048), diagonal=1).to(torch.int8)
        if mode != 0
        else None,
        block_table=p.block_table,
        input_layout="TND",
        block_size=bs,
        actual_seq_lengths=p.cum_q,
        actual_seq_lengths_kv=p.kv_lens,
        num_key_value_heads=nkv,
        num_heads=n,
        scale=scale,
        sparse_mode=mode,
        pre_tokens=pre,
        next_tokens=nxt,
    )
    ws = REFERENCE_OPS["_npu_fused_infer_attention_score_get_max_workspace"](**kwargs)
    out = torch.full_like(p.q, float("nan"))
    lse = torch.full((p.q.shape[0], n, 1), float("nan"))
    ret = REFERENCE_OPS["npu_fused_infer_attention_score.out"](
        **kwargs, workspace=ws, out=[out, lse]
    )
    assert ret[0] is out and ret[1] is lse
    exp_out, exp_lse = oracle_tnd(p, scale=scale, mode=mode, pre=pre, nxt=nxt)
    assert_close(out, exp_out)
    assert_lse_close(lse, exp_lse)

    # functional variant agrees, and only returns the LSE when asked
    fout, flse = REFERENCE_OPS["npu_fused_infer_attention_score"](**kwargs)
    assert_close(fout, exp_out)
    assert flse.numel() == 1
    _, flse = REFERENCE_OPS["npu_fused_infer_attention_score"](**kwargs, softmax_lse_flag=True)
    assert_lse_close(flse, exp_lse)


def test_fia_out_leaves_placeholder_lse_and_zeroes_padding():
    """vllm-ascend passes a 1-element softmax_lse and pads T past the last cumulative end."""
    gen = torch.Generator().manual_seed(11)
    p = make_problem(
        gen,
        q_lens=[1, 1, 1],
        kv_lens=[5, 17, 1],
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        block_size=16,
        pad_tokens=4,
    )
    nb = p.key_cache.shape[0]
    out = torch.full_like(p.q, 7.0)
    lse = torch.full((1,), 3.0)
    REFERENCE_OPS["npu_fused_infer_attention_score.out"](
        query=p.q,
        key=p.key_cache.view(nb, 16, -1),
        value=p.value_cache.view(nb, 16, -1),
        block_table=p.block_table,
        input_layout="TND",
        block_size=16,
        actual_seq_lengths=p.cum_q,
        actual_seq_lengths_kv=p.kv_lens,
        num_key_value_heads=2,
        num_heads=4,
        scale=0.5,
        sparse_mode=3,
        pre_tokens=INT_MAX,
        next_tokens=0,
        out=[out, lse],
    )
    assert lse.item() == 3.0
    assert torch.count_nonzero(out[3:]) == 0
    exp, _ = oracle_tnd(p, scale=0.5, mode=3)
    assert_close(out, exp)


def test_fia_padded_requests_give_zeros_not_nan():
    """kv len 0 requests and a dummy padding request yield zeros. (A block table shorter than
    the batch is refused, as the real op documents: ``tests/test_sim_op_rules.py``.)"""
    gen = torch.Generator().manual_seed(12)
    p = make_problem(
        gen,
        q_lens=[1, 1, 1, 1],
        kv_lens=[3, 1, 2, 9],
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        block_size=4,
    )
    nb = p.key_cache.shape[0]
    kv_lens = [3, 0, 2, 0]  # request 1 is empty, request 3 a padding request
    bt = p.block_table
    out, _ = REFERENCE_OPS["npu_fused_infer_attention_score"](
        query=p.q,
        key=p.key_cache.view(nb, 4, -1),
        value=p.value_cache.view(nb, 4, -1),
        block_table=bt,
        input_layout="TND",
        block_size=4,
        actual_seq_lengths=p.cum_q,
        actual_seq_lengths_kv=kv_lens,
        num_key_value_heads=1,
        num_heads=2,
        scale=1.0,
        sparse_mode=3,
        next_tokens=0,
    )
    assert not torch.isnan(out).any()
    assert torch.count_nonzero(out[1]) == 0 and torch.count_nonzero(out[3]) == 0
    exp, _ = oracle_request(p.q[2:3], p.k_dense[2][:2], p.v_dense[2][:2], scale=1.0, mode=3)
    assert_close(out[2:3], exp)


def test_fia_reads_lengths_at_call_time():
    """A recorded task replayed after the length tensor changed must see the new lengths."""
    gen = torch.Generator().manual_seed(13)
    p = make_problem(
        gen, q_lens=[1, 1], kv_lens=[20, 20], num_heads=2, num_kv_heads=2, head_dim=8, block_size=8
    )
    nb = p.key_cache.shape[0]
    lens = torch.tensor([20, 20], dtype=torch.int32)
    kw = dict(
        query=p.q,
        key=p.key_cache.view(nb, 8, -1),
        value=p.value_cache.view(nb, 8, -1),
        block_table=p.block_table,
        input_layout="TND",
        block_size=8,
        actual_seq_lengths=p.cum_q,
        actual_seq_lengths_kv=lens,
        num_key_value_heads=2,
        num_heads=2,
        scale=0.3,
        sparse_mode=3,
        next_tokens=0,
    )
    first, _ = REFERENCE_OPS["npu_fused_infer_attention_score"](**kw)
    lens[0] = 7
    second, _ = REFERENCE_OPS["npu_fused_infer_attention_score"](**kw)
    assert not torch.allclose(first[0], second[0])
    assert torch.equal(first[1], second[1])
    exp, _ = oracle_request(p.q[0:1], p.k_dense[0][:7], p.v_dense[0][:7], scale=0.3, mode=3)
    assert_close(second[0:1], exp)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fia_dense_tnd_prefill_cumulative_kv(seed):
    """PrefillNoCache: no block table, key/value are (T, Nkv, D), kv lengths cumulative."""
    gen = torch.Generator().manual_seed(100 + seed)
    q_lens = [int(x) for x in torch.randint(1, 7, (3,), generator=gen)]
    t = sum(q_lens)
    n, nkv, d = 4, 2, 8
    q = torch.randn(t + 2, n, d, generator=gen)
    k = torch.randn(t, nkv, d, generator=gen)
    v = torch.randn(t, nkv, d, generator=gen)
    cum = torch.tensor(q_lens).cumsum(0).tolist()
    out, _ = REFERENCE_OPS["npu_fused_infer_attention_score"](
        query=q,
        key=k,
        value=v,
        atten_mask=torch.ones(2048, 2048, dtype=torch.int8).triu(1),
        block_table=None,
        input_layout="TND",
        block_size=128,
        actual_seq_lengths=cum,
        actual_seq_lengths_kv=cum,
        num_key_value_heads=nkv,
        num_heads=n,
        scale=0.4,
        sparse_mode=3,
    )
    start = 0
    for ql in q_lens:
        sl = slice(start, start + ql)
        exp, _ = oracle_request(q[sl], k[sl], v[sl], scale=0.4, mode=3)
        assert_close(out[sl], exp)
        start += ql
    assert torch.count_nonzero(out[t:]) == 0


def test_fia_mode0_explicit_mask():
    gen = torch.Generator().manual_seed(21)
    p = make_problem(
        gen, q_lens=[3, 2], kv_lens=[6, 4], num_heads=2, num_kv_heads=1, head_dim=8, block_size=4
    )
    nb = p.key_cache.shape[0]
    mask = torch.rand(8, 8, generator=gen) > 0.6
    out, _ = REFERENCE_OPS["npu_fused_infer_attention_score"](
        query=p.q,
        key=p.key_cache.view(nb, 4, -1),
        value=p.value_cache.view(nb, 4, -1),
        atten_mask=mask,
        block_table=p.block_table,
        input_layout="TND",
        block_size=4,
        actual_seq_lengths=p.cum_q,
        actual_seq_lengths_kv=p.kv_lens,
        num_key_value_heads=1,
        num_heads=2,
        scale=0.7,
        sparse_mode=0,
    )
    exp0, _ = oracle_request(p.q[:3], p.k_dense[0], p.v_dense[0], scale=0.7, mode=0, mask=mask)
    exp1, _ = oracle_request(p.q[3:5], p.k_dense[1], p.v_dense[1], scale=0.7, mode=0, mask=mask)
    assert_close(out[:3], exp0)
    assert_close(out[3:5], exp1)


def test_fia_layouts_agree_bnsd_bsnd_bsh_and_4d_caches():
    """Decode through BNSD/BSND/BSH query layouts and the three 4-D/3-D cache layouts."""
    gen = torch.Generator().manual_seed(31)
    p = make_problem(
        gen,
        q_lens=[1, 1, 1],
        kv_lens=[9, 2, 16],
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        block_size=8,
    )
    exp, _ = oracle_tnd(p, scale=0.5, mode=0)
    kc, vc = p.key_cache, p.value_cache
    common = dict(
        block_table=p.block_table,
        block_size=8,
        actual_seq_lengths_kv=p.kv_lens,
        num_key_value_heads=2,
        num_heads=4,
        scale=0.5,
    )
    fia = REFERENCE_OPS["npu_fused_infer_attention_score"]
    bnsd, _ = fia(
        p.q.unsqueeze(2),
        kc.permute(0, 2, 1, 3).contiguous(),
        vc.permute(0, 2, 1, 3).contiguous(),
        input_layout="BNSD",
        **common,
    )
    assert bnsd.shape == (3, 4, 1, 8)
    assert_close(bnsd.squeeze(2), exp)
    bsnd, _ = fia(p.q.unsqueeze(1), kc, vc, input_layout="BSND", **common)
    assert_close(bsnd.squeeze(1), exp)
    bsh, _ = fia(p.q.reshape(3, 1, 32), kc.flatten(2), vc.flatten(2), input_layout="BSH", **common)
    assert_close(bsh.reshape(3, 4, 8), exp)


def test_fia_c8_bnsd_nz_int8_antiquant():
    """The C8 decode path: int8 NZ 5-D cache view, per-channel scale, cumulative q ends."""
    gen = torch.Generator().manual_seed(41)
    n, nkv, d, bs = 4, 2, 64, 32
    kv_lens = [40, 3, 64]
    nb = 8
    k_int = torch.randint(-128, 128, (nb, bs, nkv, d), generator=gen, dtype=torch.int8)
    v_int = torch.randint(-128, 128, (nb, bs, nkv, d), generator=gen, dtype=torch.int8)
    # vllm-ascend writes int8 through the NZ view; emulate with npu_scatter_pa_kv_cache
    key_cache = torch.zeros(nb, bs, nkv, d, dtype=torch.int8)
    value_cache = torch.zeros_like(key_cache)
    nz = (-1, nkv, d // 32, bs, 32)
    slots = torch.arange(nb * bs, dtype=torch.int32)
    REFERENCE_OPS["npu_scatter_pa_kv_cache"](
        key=k_int.reshape(-1, nkv, d),
        value=v_int.reshape(-1, nkv, d),
        key_cache=key_cache.view(nz),
        value_cache=value_cache.view(nz),
        slot_mapping=slots,
    )
    k_scale = torch.rand(nkv, 1, d, generator=gen) * 0.02 + 0.001
    v_scale = torch.rand(nkv, 1, d, generator=gen) * 0.02 + 0.001
    bt = torch.tensor([[3, 1, 0], [5, 0, 0], [2, 7, 0]], dtype=torch.int32)
    q = torch.randn(3, n, d, generator=gen)
    out, _ = REFERENCE_OPS["npu_fused_infer_attention_score"](
        q.unsqueeze(2),
        key_cache.view(nz),
        value_cache.view(nz),
        key_antiquant_scale=k_scale,
        value_antiquant_scale=v_scale,
        block_table=bt,
        actual_seq_lengths_kv=kv_lens,
        num_heads=n,
        num_key_value_heads=nkv,
        input_layout="BNSD",
        scale=0.1,
        block_size=bs,
        antiquant_mode=0,
        key_antiquant_mode=0,
        value_antiquant_mode=0,
        inner_precise=1,
        sparse_mode=0,
    )
    for b, kv in enumerate(kv_lens):
        pos = torch.arange(kv)
        blocks = bt[b, pos // bs].long()
        kd = k_int[blocks, pos % bs].float() * k_scale.reshape(nkv, d)
        vd = v_int[blocks, pos % bs].float() * v_scale.reshape(nkv, d)
        exp, _ = oracle_request(q[b : b + 1], kd, vd, scale=0.1, mode=0)
        assert_close(out[b, :, 0], exp[0])

    # capture path: .out with output.unsqueeze(2) and cumulative q ends (clamped to S=1)
    output = torch.zeros(3, n, d)
    REFERENCE_OPS["npu_fused_infer_attention_score.out"](
        query=q.unsqueeze(2),
        key=key_cache.view(nz),
        value=value_cache.view(nz),
        atten_mask=None,
        block_table=bt,
        input_layout="BNSD",
        block_size=bs,
        actual_seq_lengths=[1, 2, 3],
        actual_seq_lengths_kv=kv_lens,
        num_key_value_heads=nkv,
        num_heads=n,
        scale=0.1,
        sparse_mode=0,
        pre_tokens=INT_MAX,
        next_tokens=INT_MAX,
        workspace=None,
        out=[output.unsqueeze(2), torch.empty(1)],
        key_antiquant_scale=k_scale,
        value_antiquant_scale=v_scale,
        key_antiquant_mode=0,
        value_antiquant_mode=0,
        inner_precise=1,
    )
    assert_close(output, out.squeeze(2))


# --------------------------------------------------------------------------------------------------
# FIA v2 (sinks)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("window", [None, 3])
def test_fia_v2_sinks_matches_oracle(case, window):
    seed, batch, n, nkv, d, bs, decode_only, pad = case
    gen = torch.Generator().manual_seed(seed * 13 + (window or 0))
    q_lens, kv_lens = random_lengths(gen, batch, 2 * bs + 1, decode_only)
    p = make_problem(
        gen,
        q_lens=q_lens,
        kv_lens=kv_lens,
        num_heads=n,
        num_kv_heads=nkv,
        head_dim=d,
        block_size=bs,
        pad_tokens=pad,
    )
    sinks = torch.randn(n, generator=gen) * 2
    nb = p.key_cache.shape[0]
    mode = 4 if window is not None else 3
    pre = window if window is not None else INT_MAX
    kwargs = dict(
        query=p.q,
        key=p.key_cache.view(nb, bs, -1),
        value=p.value_cache.view(nb, bs, -1),
        atten_mask=torch.ones(2048, 2048, dtype=torch.int8).triu(1),
        block_table=p.block_table,
        input_layout="TND",
        block_size=bs,
        actual_seq_qlen=torch.tensor(p.cum_q).int(),
        actual_seq_kvlen=torch.tensor(p.kv_lens, dtype=torch.int32),
        num_key_value_heads=nkv,
        num_query_heads=n,
        sparse_mode=mode,
        pre_tokens=pre,
        next_tokens=0,
        softmax_scale=0.25,
        learnable_sink=sinks,
    )
    ws = REFERENCE_OPS["_npu_fused_infer_attention_score_v2_get_max_workspace"](**kwargs)
    out = torch.full_like(p.q, float("nan"))
    lse = torch.empty(p.q.shape[0], n, 1)
    REFERENCE_OPS["npu_fused_infer_attention_score_v2.out"](**kwargs, workspace=ws, out=[out, lse])
    exp, exp_lse = oracle_tnd(p, scale=0.25, mode=mode, pre=pre, nxt=0, sinks=sinks)
    # padding tokens belong to no request: zero output, no sink
    assert_close(out, exp)
    assert_lse_close(lse[: sum(q_lens)], exp_lse[: sum(q_lens)])
    fout, _ = REFERENCE_OPS["npu_fused_infer_attention_score_v2"](**kwargs)
    assert_close(fout, exp)


def test_fia_v2_sink_changes_result_and_empty_kv_gives_zero():
    gen = torch.Generator().manual_seed(51)
    p = make_problem(
        gen, q_lens=[1, 1], kv_lens=[5, 5], num_heads=2, num_kv_heads=1, head_dim=8, block_size=8
    )
    nb = p.key_cache.shape[0]
    kw = dict(
        query=p.q,
        key=p.key_cache.view(nb, 8, -1),
        value=p.value_cache.view(nb, 8, -1),
        block_table=p.block_table,
        input_layout="TND",
        block_size=8,
        actual_seq_qlen=[1, 2],
        actual_seq_kvlen=[5, 0],
        num_key_value_heads=1,
        num_query_heads=2,
        sparse_mode=3,
        next_tokens=0,
        softmax_scale=1.0,
    )
    v2 = REFERENCE_OPS["npu_fused_infer_attention_score_v2"]
    plain, _ = v2(**kw)
    sunk, lse = v2(**kw, learnable_sink=torch.tensor([3.0, -1.0]), return_softmax_lse=True)
    assert not torch.allclose(plain[0], sunk[0])
    assert torch.count_nonzero(sunk[1]) == 0 and not torch.isnan(sunk).any()
    # empty request: only the sink is in the denominator
    torch.testing.assert_close(lse[1, :, 0], torch.tensor([3.0, -1.0]))


def test_fia_v2_mla_rope_split_layout():
    """MLA decode shape: q/k rope parts concatenated for scores, value = k_nope, NBSD output."""
    gen = torch.Generator().manual_seed(52)
    n, d, dr, bs = 4, 16, 8, 8
    p = make_problem(
        gen,
        q_lens=[1, 1, 1],
        kv_lens=[5, 12, 1],
        num_heads=n,
        num_kv_heads=1,
        head_dim=d + dr,
        block_size=bs,
    )
    k_nope, k_pe = p.key_cache[..., :d].contiguous(), p.key_cache[..., d:].contiguous()
    q_nope, q_pe = p.q[..., :d], p.q[..., d:]
    out, _ = REFERENCE_OPS["npu_fused_infer_attention_score_v2"](
        q_nope.unsqueeze(2),
        k_nope,
        k_nope,
        query_rope=q_pe.unsqueeze(2),
        key_rope=k_pe,
        num_query_heads=n,
        num_key_value_heads=1,
        input_layout="BNSD_NBSD",
        sparse_mode=0,
        softmax_scale=0.2,
        block_table=p.block_table,
        block_size=bs,
        actual_seq_qlen=[1, 2, 3],
        actual_seq_kvlen=p.kv_lens,
    )
    assert out.shape == (n, 3, 1, d)
    for b in range(3):
        exp, _ = oracle_request(
            p.q[b : b + 1], p.k_dense[b], p.k_dense[b][..., :d], scale=0.2, mode=0
        )
        assert_close(out[:, b, 0], exp[0])


# --------------------------------------------------------------------------------------------------
# paged attention, cache writes
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_paged_attention_matches_oracle(case):
    seed, batch, n, nkv, d, bs, _, pad = case
    gen = torch.Generator().manual_seed(seed + 200)
    _, kv_lens = random_lengths(gen, batch, 2 * bs + 5, True)
    p = make_problem(
        gen,
        q_lens=[1] * batch,
        kv_lens=kv_lens,
        num_heads=n,
        num_kv_heads=nkv,
        head_dim=d,
        block_size=bs,
        pad_tokens=pad,
    )
    ctx = torch.tensor(kv_lens, dtype=torch.int32)
    args = dict(
        query=p.q,
        key_cache=p.key_cache,
        value_cache=p.value_cache,
        num_kv_heads=nkv,
        num_heads=n,
        scale_value=0.2,
        block_table=p.block_table,
        context_lens=ctx,
    )
    out = torch.full_like(p.q, float("nan"))
    ws = REFERENCE_OPS["_npu_paged_attention_get_workspace"](**args, out=out)
    ret = REFERENCE_OPS["_npu_paged_attention"](**args, out=out, workspace=ws)
    assert ret is None  # registered as "-> ()": it writes ``out`` only
    exp, _ = oracle_tnd(p, scale=0.2, mode=0)
    assert_close(out, exp)
    # positional form, as torch_npu allows
    out2 = torch.empty_like(p.q)
    REFERENCE_OPS["_npu_paged_attention"](
        p.q, p.key_cache, p.value_cache, nkv, n, 0.2, p.block_table, ctx, out2
    )
    assert torch.equal(out, out2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reshape_and_cache_then_attention_round_trip(seed):
    gen = torch.Generator().manual_seed(300 + seed)
    nb, bs, nkv, d = 6, 4, 2, 8
    key_cache = torch.zeros(nb, bs, nkv, d)
    value_cache = torch.zeros(nb, bs, nkv, d)
    kv_cache = torch.stack([key_cache, value_cache])  # real layout: (2, nb, bs, Nkv, D)
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    t = 10
    key = torch.randn(t, nkv, d, generator=gen)
    value = torch.randn(t, nkv, d, generator=gen)
    slots = torch.randperm(nb * bs, generator=gen)[:t].to(torch.int32)
    slots[3] = -1  # padding token
    REFERENCE_OPS["_npu_reshape_and_cache"](
        key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_indices=slots
    )
    expected = torch.zeros(nb * bs, nkv, d)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[s] = key[i]
    assert torch.equal(kv_cache[0].reshape(-1, nkv, d), expected)
    assert int(torch.count_nonzero(kv_cache[0].reshape(-1, nkv * d).any(-1))) == t - 1

    # A5 path writes the same layout through npu_scatter_pa_kv_cache(cache_mode="Norm")
    kc2 = torch.zeros(nb, bs, nkv, d)
    vc2 = torch.zeros(nb, bs, nkv, d)
    REFERENCE_OPS["npu_scatter_pa_kv_cache"](
        key=key, value=value, key_cache=kc2, value_cache=vc2, slot_mapping=slots, cache_mode="Norm"
    )
    assert torch.equal(kc2, key_cache) and torch.equal(vc2, value_cache)


def test_scatter_nz_layout_matches_manual_placement():
    gen = torch.Generator().manual_seed(61)
    nb, bs, nkv, d = 3, 32, 2, 64
    cache = torch.zeros(nb, bs, nkv, d, dtype=torch.int8)
    nz = cache.view(-1, nkv, d // 32, bs, 32)
    key = torch.randint(-100, 100, (5, nkv, d), generator=gen, dtype=torch.int8)
    slots = torch.tensor([0, 33, -1, 95, 64], dtype=torch.int32)
    REFERENCE_OPS["npu_scatter_pa_kv_cache"](
        key=key,
        value=key.clone(),
        key_cache=nz,
        value_cache=torch.zeros_like(nz),
        slot_mapping=slots,
    )
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        blk, off = divmod(s, bs)
        for c in range(d // 32):
            assert torch.equal(nz[blk, :, c, off, :], key[i, :, c * 32 : (c + 1) * 32])
    assert int(torch.count_nonzero(nz)) == int(torch.count_nonzero(key[[0, 1, 3, 4]]))


# --------------------------------------------------------------------------------------------------
# npu_fusion_attention
# --------------------------------------------------------------------------------------------------


def test_fusion_attention_tnd_with_trailing_zero_end():
    """The pooling path appends a 0 end when T exceeds the last cumulative length."""
    gen = torch.Generator().manual_seed(71)
    n, d = 2, 8
    q = torch.randn(7, n, d, generator=gen)
    k = torch.randn(7, n, d, generator=gen)
    v = torch.randn(7, n, d, generator=gen)
    out = REFERENCE_OPS["npu_fusion_attention"](
        query=q,
        key=k,
        value=v,
        head_num=n,
        input_layout="TND",
        scale=0.3,
        actual_seq_qlen=[2, 5, 0],
        actual_seq_kvlen=[2, 5, 0],
    )[0]
    for sl in (slice(0, 2), slice(2, 5)):
        exp, _ = oracle_request(q[sl], k[sl], v[sl], scale=0.3, mode=0)
        assert_close(out[sl], exp)
    assert torch.count_nonzero(out[5:]) == 0


# --------------------------------------------------------------------------------------------------
# workspaces, registry, contract
# --------------------------------------------------------------------------------------------------


def test_workspace_monotone_and_enforced():
    def ws(t: int, n: int) -> int:
        q = torch.zeros(t, n, 16)
        kc = torch.zeros(4, 16, 2 * 16)
        w = REFERENCE_OPS["_npu_fused_infer_attention_score_get_max_workspace"](
            query=q,
            key=kc,
            value=kc,
            block_table=torch.zeros(t, 4, dtype=torch.int32),
            input_layout="TND",
            block_size=16,
            actual_seq_lengths=list(range(1, t + 1)),
            actual_seq_lengths_kv=[1] * t,
            num_key_value_heads=2,
            num_heads=n,
            scale=1.0,
            sparse_mode=3,
            pre_tokens=INT_MAX,
            next_tokens=0,
        )
        return w.numel() * w.element_size()

    sizes = [ws(t, n) for t, n in [(1, 2), (4, 2), (16, 2), (16, 8)]]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert sizes[-1] < 1 << 20  # cheap

    # a workspace captured for a smaller problem is rejected, like a kernel overrun
    small = torch.empty(ws(1, 2), dtype=torch.uint8)
    q = torch.randn(16, 8, 16)
    kc = torch.randn(4, 16, 32)
    with pytest.raises(RuntimeError, match="workspace"):
        REFERENCE_OPS["npu_fused_infer_attention_score.out"](
            query=q,
            key=kc,
            value=kc,
            block_table=torch.zeros(16, 4, dtype=torch.int32),
            input_layout="TND",
            block_size=16,
            actual_seq_lengths=list(range(1, 17)),
            actual_seq_lengths_kv=[1] * 16,
            num_key_value_heads=2,
            num_heads=8,
            scale=1.0,
            sparse_mode=3,
            workspace=small,
            out=[torch.empty_like(q), torch.empty(1)],
        )
    # getters reject keywords the op would reject
    with pytest.raises(TypeError):
        REFERENCE_OPS["_npu_fused_infer_attention_score_get_max_workspace"](
            query=q, key=kc, value=kc, actual_seq_qlen=[1]
        )


def test_registry_contents():
    required = {
        "npu_fused_infer_attention_score",
        "npu_fused_infer_attention_score.out",
        "_npu_fused_infer_attention_score_get_max_workspace",
        "npu_fused_infer_attention_score_v2",
        "npu_fused_infer_attention_score_v2.out",
        "_npu_fused_infer_attention_score_v2_get_max_workspace",
        "_npu_paged_attention",
        "_npu_paged_attention_get_workspace",
        "_npu_reshape_and_cache",
        "npu_scatter_pa_kv_cache",
        "npu_fusion_attention",
    }
    assert required <= set(REFERENCE_OPS)
    assert set(REFERENCE_OPS) >= HOST_FUNCTIONS
    assert {k for k in REFERENCE_OPS if "workspace" in k} == set(HOST_FUNCTIONS)
    assert all(callable(f) for f in REFERENCE_OPS.values())


def _vllm_ascend_root() -> Path | None:
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


CALL_SITE_FILES = [
    "attention/attention_v1.py",
    "attention/utils.py",
    "device/device_op.py",
    "device/utils.py",
]


def _torch_npu_calls(path: Path):
    """Yield (op name, n positional args, keyword names) for each torch_npu.<op>(...) call."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id == "torch_npu":
                name = f.attr
        elif (
            isinstance(f, ast.Attribute)
            and f.attr == "out"
            and isinstance(f.value, ast.Attribute)
            and isinstance(f.value.value, ast.Name)
            and f.value.value.id == "torch_npu"
        ):
            name = f.value.attr + ".out"
        if name is None:
            continue
        kws = [k.arg for k in node.keywords if k.arg is not None]
        yield name, len(node.args), kws, node.lineno


def test_signatures_accept_every_vllm_ascend_call_site():
    """Every torch_npu attention call in the installed vllm-ascend binds to our signature."""
    root = _vllm_ascend_root()
    if root is None:
        pytest.skip("vllm_ascend not installed")
    seen = set()
    for rel in CALL_SITE_FILES:
        path = root / rel
        for name, npos, kws, line in _torch_npu_calls(path):
            if name not in REFERENCE_OPS:
                # attention_v1 / attention utils must be fully covered; device_op has MoE etc.
                assert not rel.startswith("attention/"), f"{rel}:{line} calls unmodelled {name}"
                continue
            seen.add(name)
            sig = inspect.signature(REFERENCE_OPS[name])
            if name in HOST_FUNCTIONS and "kwargs" in sig.parameters:
                op = REFERENCE_OPS[name.replace("_get_max_workspace", "").lstrip("_")]
                sig = inspect.signature(op)
            sig.bind(*([None] * npos), **dict.fromkeys(kws))  # raises TypeError on mismatch
    assert {
        "npu_fused_infer_attention_score",
        "npu_fused_infer_attention_score.out",
        "npu_fused_infer_attention_score_v2",
        "npu_fused_infer_attention_score_v2.out",
        "_npu_fused_infer_attention_score_get_max_workspace",
        "_npu_fused_infer_attention_score_v2_get_max_workspace",
        "_npu_paged_attention",
        "_npu_paged_attention_get_workspace",
        "_npu_reshape_and_cache",
        "npu_scatter_pa_kv_cache",
        "npu_fusion_attention",
    } <= seen


def test_out_variants_attached_as_attribute():
    """``torch_npu.op.out`` is an attribute of the op; the functions carry it too."""
    assert (
        ops.npu_fused_infer_attention_score.out
        is REFERENCE_OPS["npu_fused_infer_attention_score.out"]
    )
    assert (
        ops.npu_fused_infer_attention_score_v2.out
        is REFERENCE_OPS["npu_fused_infer_attention_score_v2.out"]
    )
