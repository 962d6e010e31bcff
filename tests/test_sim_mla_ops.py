"""The MLA / DeepSeek reference ops (``torch_npu_sim.mla_ops``) against float64 oracles.

Each oracle is written another way than its reference: the interleaved RoPE as a complex
rotation of the channel pairs, the KV write as per-token float64 RMSNorm plus that rotation, the
batched matmul as an ``einsum``, the attention merge as attention over the whole key set, the
router as DeepSeek-V3's grouped routing written per token, and MLA's decode attention (FIA v2 with
the rope split, as ``AscendMLAImpl._forward_decode`` calls it, and its ``.out`` relaunch) as
absorbed attention over the latent cache.
"""

from __future__ import annotations

import math

import pytest
import torch

from torch_npu_sim import mla_ops, ops


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _angles(positions: torch.Tensor, half: int) -> torch.Tensor:
    freqs = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    return positions.double()[:, None] * freqs[None, :]


def _cos_sin(positions: torch.Tensor, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vllm-ascend's MLA tables: each half of the rope width repeats the frequencies."""
    theta = _angles(positions, half)
    cos, sin = theta.cos().repeat(1, 2), theta.sin().repeat(1, 2)
    return cos[:, None, None].float(), sin[:, None, None].float()  # (T, 1, 1, D)


def rope_oracle(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Channels (2i, 2i+1) as one complex number, turned by the position's angle; the result
    laid out as (real parts, imaginary parts), as the kernel writes it."""
    half = x.shape[-1] // 2
    pairs = torch.complex(x[..., ::2].double(), x[..., 1::2].double())
    theta = _angles(positions, half).reshape(-1, *([1] * (x.dim() - 2)), half)
    turned = pairs * torch.polar(torch.ones_like(theta), theta)
    return torch.cat((turned.real, turned.imag), -1)


def test_interleave_rope_matches_a_complex_rotation(gen: torch.Generator) -> None:
    positions = torch.tensor([0, 3, 17, 250])
    x = torch.randn(4, 2, 1, 16, generator=gen)  # (B, N, S, D) as rope_single passes it
    cos, sin = _cos_sin(positions, 8)
    out = mla_ops.npu_interleave_rope(x, cos, sin)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), rope_oracle(x, positions), atol=1e-5, rtol=1e-5)
    # a relative rotation: the dot product of two rotated vectors depends on the position gap only
    q, k = torch.randn(2, 1, 1, 16, generator=gen).unbind(0)
    dots = []
    for base in (0, 40):
        c, s = _cos_sin(torch.tensor([base + 5, base]), 8)
        turned = mla_ops.npu_interleave_rope(torch.stack([q, k]), c, s)
        dots.append(float((turned[0] * turned[1]).sum()))
    assert dots[0] == pytest.approx(dots[1], abs=1e-4)


def _rms_oracle(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma.double()


def test_kv_rmsnorm_rope_cache_writes_both_caches_at_their_slots(gen: torch.Generator) -> None:
    """PA mode, as AscendMLAImpl.exec_kv_decode calls it: latent normed into ``ckv_cache``, key
    rope rotated into ``k_cache``, each token at its flat slot; a padded token (slot -1) is not
    written; the caches are updated in place and returned."""
    latent, rope, blocks, block_size = 24, 8, 3, 4
    kv = torch.randn(3, 1, 1, latent + rope, generator=gen)
    gamma = 1 + 0.1 * torch.randn(latent, generator=gen)
    positions = torch.tensor([2, 9, 5])
    cos, sin = _cos_sin(positions, rope // 2)
    slots = torch.tensor([5, -1, 10])
    k_cache = torch.full((blocks, block_size, 1, rope), 7.0)
    ckv_cache = torch.full((blocks, block_size, 1, latent), 7.0)
    got = mla_ops.npu_kv_rmsnorm_rope_cache(
        kv, gamma, cos, sin, slots, k_cache, ckv_cache, epsilon=1e-6, cache_mode="PA"
    )
    assert got[0] is k_cache and got[1] is ckv_cache
    assert got[2].numel() == got[3].numel() == 0  # no is_output_kv: nothing else returned
    flat_k, flat_c = k_cache.view(-1, rope), ckv_cache.view(-1, latent)
    want_c = _rms_oracle(kv[:, 0, 0, :latent], gamma, 1e-6)
    want_k = rope_oracle(kv[:, :, :, latent:], positions)[:, 0, 0]
    for token, slot in ((0, 5), (2, 10)):
        torch.testing.assert_close(flat_c[slot].double(), want_c[token], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(flat_k[slot].double(), want_k[token], atol=1e-5, rtol=1e-5)
    untouched = [s for s in range(blocks * block_size) if s not in (5, 10)]
    assert bool((flat_c[untouched] == 7.0).all()) and bool((flat_k[untouched] == 7.0).all())


def test_kv_rmsnorm_rope_cache_returns_the_values_for_prefill(gen: torch.Generator) -> None:
    """``is_output_kv`` (exec_kv_prefill): the rotated rope and the normed latent come back as
    ``(B, N, S, D)``; ``Norm`` mode writes per-batch offsets."""
    kv = torch.randn(2, 1, 3, 12, generator=gen)
    gamma = torch.ones(8)
    positions = torch.tensor([0, 1, 2])
    cos, sin = (t.reshape(1, 1, 3, 4) for t in _cos_sin(positions, 2))
    k_cache, ckv_cache = torch.zeros(2, 1, 6, 4), torch.zeros(2, 1, 6, 8)
    offsets = torch.tensor([[0, 1, 2], [3, 4, 5]])
    _, _, k_rope, c_kv = mla_ops.npu_kv_rmsnorm_rope_cache(
        kv, gamma, cos, sin, offsets, k_cache, ckv_cache, cache_mode="Norm", is_output_kv=True
    )
    assert k_rope.shape == (2, 1, 3, 4) and c_kv.shape == (2, 1, 3, 8)
    want_c = _rms_oracle(kv[..., :8], gamma, 1e-5)
    # the rope oracle turns dimension 0 by its position: put the sequence there and back
    want_k = rope_oracle(kv[..., 8:].permute(2, 0, 1, 3), positions).permute(1, 2, 0, 3)
    torch.testing.assert_close(c_kv.double(), want_c, atol=1e-5, rtol=0)
    torch.testing.assert_close(k_rope.double(), want_k, atol=1e-5, rtol=0)
    # each batch's tokens at its own offsets in both caches, from the oracles, not the returns
    for b, rows in enumerate(offsets.tolist()):
        torch.testing.assert_close(ckv_cache[b, 0, rows].double(), want_c[b, 0], atol=1e-5, rtol=0)
        torch.testing.assert_close(k_cache[b, 0, rows].double(), want_k[b, 0], atol=1e-5, rtol=0)
        others = [r for r in range(6) if r not in rows]
        assert bool((ckv_cache[b, 0, others] == 0).all()) and bool(
            (k_cache[b, 0, others] == 0).all()
        )


@pytest.mark.parametrize("quantised", ["c_kv_scale", "v"])
def test_kv_rmsnorm_rope_cache_quantised_variant_is_named_not_simulated(quantised: str) -> None:
    kv = torch.zeros(1, 1, 1, 12)
    with pytest.raises(NotImplementedError, match="quantised"):
        mla_ops.npu_kv_rmsnorm_rope_cache(
            kv,
            torch.ones(8),
            torch.ones(1, 1, 1, 4),
            torch.zeros(1, 1, 1, 4),
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, 4, 1, 4),
            torch.zeros(1, 4, 1, 8),
            cache_mode="PA",
            **{quantised: torch.ones(8)},
        )


def test_transpose_batchmatmul_matches_einsum(gen: torch.Generator) -> None:
    """MLA's value up-projection ``(N, B, L) x (N, L, V) -> (B, N, V)`` (perm_y [1, 0, 2]), a
    transposed first input, and a split of the output's last dimension."""
    x, w = torch.randn(4, 3, 16, generator=gen), torch.randn(4, 16, 8, generator=gen)
    out = mla_ops.npu_transpose_batchmatmul(x, w, perm_y=(1, 0, 2))
    want = torch.einsum("nbl,nlv->bnv", x.double(), w.double())
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    m_first = torch.randn(3, 4, 16, generator=gen)  # (M, B, K)
    out = mla_ops.npu_transpose_batchmatmul(m_first, w, perm_x1=(1, 0, 2), perm_y=(1, 0, 2))
    want = torch.einsum("mbk,bkn->mbn", m_first.double(), w.double())
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    split = mla_ops.npu_transpose_batchmatmul(m_first, w, perm_x1=(1, 0, 2), batch_split_factor=2)
    assert split.shape == (2, 3, 16)
    torch.testing.assert_close(
        split.transpose(0, 1).reshape(3, 32).double(), want.reshape(3, 32), atol=1e-5, rtol=1e-5
    )


def test_attention_update_merges_partial_attention_into_the_whole(gen: torch.Generator) -> None:
    """Attention over three chunks of keys, each with its LSE, merged, equals attention over all
    keys (what a long prefill's context chunks rely on); a row no chunk saw stays zero."""
    rows, keys, d = 5, 12, 6
    scores = torch.randn(rows, keys, generator=gen, dtype=torch.float64)
    values = torch.randn(keys, d, generator=gen, dtype=torch.float64)
    whole = torch.softmax(scores, -1) @ values
    outs, lses = [], []
    for part in torch.tensor_split(torch.arange(keys), 3):
        s = scores[:, part]
        outs.append((torch.softmax(s, -1) @ values[part]).float())
        lses.append(torch.logsumexp(s, -1).float())
    merged, lse = mla_ops.npu_attention_update(lses, outs, 0)
    torch.testing.assert_close(merged.double(), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-5)
    empty = [torch.full((rows,), float("-inf"))] * 2
    zeros, _ = mla_ops.npu_attention_update(empty, [torch.ones(rows, d)] * 2, 0)
    assert bool((zeros == 0).all())


def deepseek_routing_oracle(
    logits: torch.Tensor,
    bias: torch.Tensor,
    k: int,
    groups: int,
    k_group: int,
    scale: float,
    softmax: bool = False,
) -> list[dict[int, float]]:
    """DeepSeek-V3's router per token: sigmoid scores, groups ranked by the sum of their two
    best biased scores, experts outside the best ``k_group`` groups masked, top-k by biased score,
    weights the unbiased scores renormalised and scaled. With ``softmax``: softmax scores,
    weights not renormalised (``norm_type`` 0, ``renorm`` 0)."""
    out = []
    per_group = logits.shape[1] // groups
    for row in logits.double().tolist():
        if softmax:
            top = max(row)
            exps = [math.exp(v - top) for v in row]
            scores = [e / sum(exps) for e in exps]
        else:
            scores = [1 / (1 + math.exp(-v)) for v in row]
        biased = [s + float(b) for s, b in zip(scores, bias.tolist(), strict=True)]
        rank = []
        for g in range(groups):
            members = sorted(biased[g * per_group : (g + 1) * per_group], reverse=True)
            rank.append((members[0] + members[1], g))
        kept = {g for _, g in sorted(rank, reverse=True)[:k_group]}
        allowed = [e for e in range(len(row)) if e // per_group in kept]
        chosen = sorted(allowed, key=lambda e: -biased[e])[:k]
        total = 1.0 if softmax else sum(scores[e] for e in chosen)
        out.append({e: scores[e] / total * scale for e in chosen})
    return out


def _same_routing(weights: torch.Tensor, ids: torch.Tensor, want: list[dict[int, float]]) -> None:
    for r, expected in enumerate(want):
        got = dict(zip(ids[r].tolist(), weights[r].tolist(), strict=True))
        assert set(got) == set(expected)
        for e, w in expected.items():
            assert got[e] == pytest.approx(w, abs=1e-5)


def test_moe_gating_top_k_routes_as_deepseek_v3(gen: torch.Generator) -> None:
    logits = torch.randn(9, 8, generator=gen)
    bias = 0.5 * torch.randn(8, generator=gen)
    weights, ids, scores = mla_ops.npu_moe_gating_top_k(
        logits,
        2,
        bias=bias,
        k_group=1,
        group_count=2,
        group_select_mode=1,
        norm_type=1,
        out_flag=True,
        routed_scaling_factor=2.5,
        eps=0.0,
    )
    assert ids.dtype == torch.int32 and scores.dtype == torch.float32
    torch.testing.assert_close(scores.double(), torch.sigmoid(logits.double()), atol=1e-6, rtol=0)
    _same_routing(weights, ids, deepseek_routing_oracle(logits, bias, 2, 2, 1, 2.5))
    # the grouping decides: without it some token picks experts from both groups
    _, free, _ = mla_ops.npu_moe_gating_top_k(logits, 2, bias=bias, norm_type=1)
    assert any(len({e // 4 for e in row}) == 2 for row in free.tolist())
    # softmax scoring (norm_type 0), not renormalised
    weights, ids, _ = mla_ops.npu_moe_gating_top_k(
        logits, 3, bias=bias, group_count=2, k_group=1, group_select_mode=1, eps=0.0
    )
    _same_routing(weights, ids, deepseek_routing_oracle(logits, bias, 3, 2, 1, 1.0, softmax=True))
    with pytest.raises(NotImplementedError, match="renorm"):
        mla_ops.npu_moe_gating_top_k(logits, 2, renorm=1)


def test_the_a2_router_routes_as_deepseek_v3(gen: torch.Generator) -> None:
    """The A2 device's router, ``torch.ops._C_ascend.moe_gating_top_k``, called as vllm-ascend's
    ``DeviceOperator.moe_gating_top_k`` calls it (renorm 1 for DeepSeek's sigmoid scoring),
    against the per-token oracle (it used to be compared with ``npu_moe_gating_top_k``, which
    computes it with the same function)."""
    from torch_npu_sim.engine import ascend_c_ops

    ascend_c_ops.install()
    logits = torch.randn(9, 8, generator=gen)
    bias = 0.5 * torch.randn(8, generator=gen)
    weights, ids, _ = torch.ops._C_ascend.moe_gating_top_k(
        logits,
        k=2,
        k_group=1,
        group_count=2,
        group_select_mode=1,
        renorm=1,
        norm_type=1,
        out_flag=False,
        routed_scaling_factor=2.5,
        eps=1e-20,
        bias_opt=bias,
    )
    assert ids.dtype == torch.int32
    _same_routing(weights, ids, deepseek_routing_oracle(logits, bias, 2, 2, 1, 2.5))


@pytest.mark.parametrize(
    ("variant", "k", "experts", "renorm", "norm_type", "scale", "biased"),
    [
        # DeepSeek-V2-Lite: softmax, greedy over all experts (one group), weights as scored
        ("deepseek-v2-lite", 3, 8, 0, 0, 1.0, False),
        # Moonlight / Kimi-K2: sigmoid with a correction bias, one group, renormalised and scaled
        ("moonlight", 6, 16, 1, 1, 2.446, True),
        ("kimi-k2", 8, 32, 1, 1, 2.827, True),
    ],
)
def test_the_a2_router_routes_the_mla_variants(
    gen: torch.Generator,
    variant: str,
    k: int,
    experts: int,
    renorm: int,
    norm_type: int,
    scale: float,
    biased: bool,
) -> None:
    """The A2 router as ``experts_selector._select_experts_with_fusion_ops`` calls it for the
    optional MLA variants' routing (``n_group: 1``: ``group_count`` 1, ``k_group`` 1), against
    the per-token oracle; the negative control: the other ``renorm`` gives other weights."""
    from torch_npu_sim.engine import ascend_c_ops

    ascend_c_ops.install()
    logits = torch.randn(9, experts, generator=gen)
    bias = 0.5 * torch.randn(experts, generator=gen) if biased else None

    def route(renormalise: int) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids, _ = torch.ops._C_ascend.moe_gating_top_k(
            logits,
            k=k,
            k_group=1,
            group_count=1,
            group_select_mode=1,
            renorm=renormalise,
            norm_type=norm_type,
            out_flag=False,
            routed_scaling_factor=scale,
            eps=1e-20,
            bias_opt=bias,
        )
        return weights, ids

    want = deepseek_routing_oracle(
        logits,
        torch.zeros(experts) if bias is None else bias,
        k,
        1,
        1,
        scale,
        softmax=norm_type == 0,
    )
    _same_routing(*route(renorm), want)
    with pytest.raises(AssertionError):
        _same_routing(*route(1 - renorm), want)


# --- MLA decode attention: FIA v2 with the rope split --------------------------------------------


def _latent_cache(gen: torch.Generator, lengths: list[int], latent: int, rope: int, bs: int):
    """A paged latent cache as AscendMLAImpl views it: ``(blocks, 1, bs, D)``, one block table
    row per request, blocks handed out shuffled."""
    per = [-(-n // bs) for n in lengths]
    order = torch.randperm(sum(per) + 1, generator=gen)
    table = torch.zeros(len(lengths), max(per), dtype=torch.int32)
    start = 0
    for r, n in enumerate(per):
        table[r, :n] = order[start : start + n]
        start += n
    blocks = sum(per) + 1
    return (
        torch.randn(blocks, 1, bs, latent, generator=gen),
        torch.randn(blocks, 1, bs, rope, generator=gen),
        table,
    )


def _latent_rows(cache: torch.Tensor, table: torch.Tensor, request: int, n: int) -> torch.Tensor:
    bs = cache.shape[2]
    return torch.stack([cache[int(table[request, j // bs]), 0, j % bs] for j in range(n)]).double()


def mla_oracle(q_nope, q_pe, k_nope, k_pe, table, lengths, scale, causal_rows=None):
    """Absorbed MLA attention per request and head over the latent rows: scores
    ``q_nope . c + q_pe . k_pe``, values ``c``; with ``causal_rows`` r query rows, row i sees
    the keys up to ``length - r + i``."""
    outs = []
    for request, n in enumerate(lengths):
        c = _latent_rows(k_nope, table, request, n)
        kr = _latent_rows(k_pe, table, request, n)
        rows = [] if causal_rows is None else range(causal_rows)
        queries = (
            [(q_nope[request], q_pe[request], n)]
            if causal_rows is None
            else [
                (
                    q_nope[request * causal_rows + i],
                    q_pe[request * causal_rows + i],
                    n - causal_rows + i + 1,
                )
                for i in rows
            ]
        )
        for qn, qr, visible in queries:
            s = (qn.double() @ c[:visible].T + qr.double() @ kr[:visible].T) * scale
            outs.append(torch.softmax(s, -1) @ c[:visible])  # (heads, latent)
    return torch.stack(outs)


def test_mla_decode_attention_and_its_relaunch_match_absorbed_attention(gen) -> None:
    """BNSD_NBSD (a plain target's decode), then the same launch through ``.out`` into the
    graph's buffers with the workspace the getter sizes: equal outputs."""
    heads, latent, rope, bs, scale = 4, 32, 8, 8, 0.3
    lengths = [5, 17, 1]
    k_nope, k_pe, table = _latent_cache(gen, lengths, latent, rope, bs)
    q_nope = torch.randn(3, heads, 1, latent, generator=gen)
    q_pe = torch.randn(3, heads, 1, rope, generator=gen)
    kwargs = dict(
        query_rope=q_pe,
        key_rope=k_pe,
        num_query_heads=heads,
        num_key_value_heads=1,
        input_layout="BNSD_NBSD",
        atten_mask=None,
        sparse_mode=0,
        softmax_scale=scale,
        block_table=table,
        block_size=bs,
        actual_seq_qlen=None,
        actual_seq_kvlen=lengths,
    )
    out, _ = ops.npu_fused_infer_attention_score_v2(q_nope, k_nope, k_nope, **kwargs)
    assert out.shape == (heads, 3, 1, latent)  # NBSD: heads first, as _v_up_proj reads it
    want = mla_oracle(q_nope[:, :, 0], q_pe[:, :, 0], k_nope, k_pe, table, lengths, scale)
    torch.testing.assert_close(out[:, :, 0].transpose(0, 1).double(), want, atol=1e-5, rtol=1e-5)
    workspace = ops._npu_fused_infer_attention_score_v2_get_max_workspace(
        q_nope, k_nope, k_nope, **kwargs
    )
    buffer, lse = torch.full_like(out, float("nan")), torch.empty(3)
    ops.npu_fused_infer_attention_score_v2_out(
        q_nope, k_nope, k_nope, **kwargs, workspace=workspace, out=[buffer, lse]
    )
    torch.testing.assert_close(buffer, out)


def test_mla_spec_decode_attention_is_causal_within_a_request(gen) -> None:
    """TND_NTD with cumulative query ends (an MTP target: k + 1 = 2 rows per request, sparse
    mode 3): each row sees the keys up to its own position; output heads first (NTD)."""
    heads, latent, rope, bs, scale, rows = 2, 16, 8, 8, 0.25, 2
    lengths = [6, 11]
    k_nope, k_pe, table = _latent_cache(gen, lengths, latent, rope, bs)
    q_nope = torch.randn(4, heads, latent, generator=gen)
    q_pe = torch.randn(4, heads, rope, generator=gen)
    out, _ = ops.npu_fused_infer_attention_score_v2(
        q_nope,
        k_nope,
        k_nope,
        query_rope=q_pe,
        key_rope=k_pe,
        num_query_heads=heads,
        num_key_value_heads=1,
        input_layout="TND_NTD",
        sparse_mode=3,
        softmax_scale=scale,
        block_table=table,
        block_size=bs,
        actual_seq_qlen=[2, 4],
        actual_seq_kvlen=lengths,
    )
    assert out.shape == (heads, 4, latent)
    want = mla_oracle(q_nope, q_pe, k_nope, k_pe, table, lengths, scale, causal_rows=rows)
    torch.testing.assert_close(out.transpose(0, 1).double(), want, atol=1e-5, rtol=1e-5)
    # a stale kv length (the newest key missing) changes the answer: the relaunch must rebind it
    stale, _ = ops.npu_fused_infer_attention_score_v2(
        q_nope,
        k_nope,
        k_nope,
        query_rope=q_pe,
        key_rope=k_pe,
        num_query_heads=heads,
        num_key_value_heads=1,
        input_layout="TND_NTD",
        sparse_mode=3,
        softmax_scale=scale,
        block_table=table,
        block_size=bs,
        actual_seq_qlen=[2, 4],
        actual_seq_kvlen=[5, 10],
    )
    assert not torch.allclose(stale, out)


# --------------------------------------------------------------------------------------------
# a long prefill's context chunks (AscendMLAImpl._forward_prefill / _compute_prefill_context)


def _paged(gen: torch.Generator, blocks: int, bs: int, width: int) -> torch.Tensor:
    return torch.randn(blocks, bs, 1, width, generator=gen)


def gather_oracle(cache: torch.Tensor, row: list[int], start: int, length: int) -> torch.Tensor:
    """One sequence's tokens: its blocks laid end to end in block-table order, then sliced."""
    laid = torch.cat([cache[block] for block in row])  # (len(row) * block_size, N, D)
    return laid[start : start + length]


def test_paged_cache_load_gathers_each_sequence_from_its_blocks(gen: torch.Generator) -> None:
    """Key and value caches of different widths (the latent and the key rope), three sequences
    with shuffled blocks, a start offset each (context chunk 1 starts one block in), one empty:
    sequence after sequence, as the blocks laid end to end hold them."""
    bs, latent, rope = 4, 6, 3
    k_cache, v_cache = _paged(gen, 9, bs, latent), _paged(gen, 9, bs, rope)
    table = torch.tensor([[3, 7, 1, 0], [8, 2, 5, 6], [4, 0, 0, 0]], dtype=torch.int32)
    lens, starts = [6, 9, 0], [4, 2, 0]
    key, value = mla_ops.npu_paged_cache_load(
        k_cache,
        v_cache,
        table,
        torch.tensor(lens, dtype=torch.int32),
        seq_starts=torch.tensor(starts, dtype=torch.int32),
    )
    rows = table.tolist()
    for got, cache in ((key, k_cache), (value, v_cache)):
        want = torch.cat(
            [gather_oracle(cache, r, s, n) for r, s, n in zip(rows, starts, lens, strict=True)]
        )
        assert torch.equal(got, want)
    # cumulative lengths, no starts: the same tokens from position 0
    cum = torch.tensor([0, 6, 15, 15], dtype=torch.int32)
    key0, _ = mla_ops.npu_paged_cache_load(k_cache, v_cache, table, cum, cumsum=True)
    want0 = torch.cat([gather_oracle(k_cache, r, 0, n) for r, n in zip(rows, lens, strict=True)])
    assert torch.equal(key0, want0)


def test_paged_cache_load_out_overload_is_what_vllm_ascend_calls(gen: torch.Generator) -> None:
    """``torch_npu.atb.npu_paged_cache_load(..., key=, value=)`` (``kv_cache_load`` on A2) runs
    the ``.out`` overload into the given buffers; a buffer of the wrong length is an error."""
    import torch_npu

    bs = 4
    k_cache, v_cache = _paged(gen, 5, bs, 6), _paged(gen, 5, bs, 3)
    table = torch.tensor([[2, 4, 1], [3, 0, 0]], dtype=torch.int32)
    lens, starts = torch.tensor([5, 3], dtype=torch.int32), torch.tensor([4, 0], dtype=torch.int32)
    key, value = torch.full((8, 1, 6), float("nan")), torch.full((8, 1, 3), float("nan"))
    out = torch_npu.atb.npu_paged_cache_load(
        k_cache, v_cache, table, lens, seq_starts=starts, key=key, value=value
    )
    assert out[0] is key and out[1] is value
    want = torch.cat([gather_oracle(k_cache, [2, 4, 1], 4, 5), gather_oracle(k_cache, [3], 0, 3)])
    assert torch.equal(key, want)
    with pytest.raises(ValueError, match="7 tokens into 8"):
        mla_ops.npu_paged_cache_load_out(
            k_cache,
            v_cache,
            table,
            lens - torch.tensor([1, 0], dtype=torch.int32),
            key=key,
            value=value,
        )


def causal_mla_oracle(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    value: torch.Tensor,
    context: int,
    scale: float,
) -> torch.Tensor:
    """One request's chunk of queries (positions ``context ..``) over all its keys so far, in
    float64: query row i sees keys ``0 .. context + i``; scores = nope part + rope part."""
    t, keys = q_nope.shape[0], k_nope.shape[0]
    scores = torch.einsum("thd,khd->htk", q_nope.double(), k_nope.double())
    scores = scores + torch.einsum("thd,khd->htk", q_pe.double(), k_pe.double())
    visible = torch.arange(keys)[None, :] <= context + torch.arange(t)[:, None]
    scores = (scores * scale).masked_fill(~visible, float("-inf"))
    return torch.einsum("htk,khd->thd", torch.softmax(scores, -1), value.double())


def test_prefill_chunk_with_context_equals_causal_attention_over_the_whole(gen) -> None:
    """``_forward_prefill`` then ``_compute_prefill_context`` as vllm-ascend calls the ops for
    two prefill requests whose earlier chunks are in the paged latent cache: FIA over the chunk
    itself (TND, causal: sparse mode 3), the context loaded by ``npu_paged_cache_load`` from a
    block-aligned start, expanded by ``kv_b_proj`` (here a matrix), FIA over it (TND, sparse mode
    0, cumulative KV ends), the two merged by ``npu_attention_update``: equal to causal attention
    over context and chunk together (float64). Without the context part it is not."""
    import torch_npu

    heads, nope, rope, dv, latent, bs, scale = 2, 8, 4, 8, 12, 4, 0.3
    contexts, chunks = [8, 5], [3, 4]
    table = torch.tensor([[5, 2, 7], [1, 6, 3]], dtype=torch.int32)
    latent_cache = _paged(gen, 8, bs, latent)
    rope_cache = _paged(gen, 8, bs, rope)
    kv_b = torch.randn(latent, heads * (nope + dv), generator=gen) / latent**0.5
    q_nope = torch.randn(sum(chunks), heads, nope, generator=gen)
    q_pe = torch.randn(sum(chunks), heads, rope, generator=gen)
    k_nope = torch.randn(sum(chunks), heads, nope, generator=gen)
    k_pe = torch.randn(sum(chunks), 1, rope, generator=gen).expand(-1, heads, -1)
    v = torch.randn(sum(chunks), heads, dv, generator=gen)
    ends = torch.cumsum(torch.tensor(chunks), 0).tolist()
    common = dict(num_heads=heads, num_key_value_heads=heads, input_layout="TND", scale=scale)
    mask = torch.triu(torch.ones(2048, 2048), diagonal=1).to(torch.int8)
    prefix_out, prefix_lse = torch_npu.npu_fused_infer_attention_score(
        q_nope,
        k_nope,
        v,
        query_rope=q_pe,
        key_rope=k_pe.contiguous(),
        atten_mask=mask,
        sparse_mode=3,
        softmax_lse_flag=True,
        actual_seq_lengths=ends,
        actual_seq_lengths_kv=list(ends),
        **common,
    )
    total = sum(contexts)
    loaded_latent, loaded_rope = torch.empty(total, 1, latent), torch.empty(total, 1, rope)
    torch_npu.atb.npu_paged_cache_load(
        latent_cache,
        rope_cache,
        table,
        torch.tensor(contexts, dtype=torch.int32),
        seq_starts=torch.zeros(2, dtype=torch.int32),  # context chunk 0 of one
        key=loaded_latent,
        value=loaded_rope,
    )
    kv = (loaded_latent.squeeze(1) @ kv_b).view(total, heads, nope + dv)
    ctx_nope, ctx_v = kv.split([nope, dv], -1)
    ctx_pe = loaded_rope.expand(-1, heads, -1)
    chunk_out, chunk_lse = torch_npu.npu_fused_infer_attention_score(
        q_nope,
        ctx_nope.contiguous(),
        ctx_v.contiguous(),
        query_rope=q_pe,
        key_rope=ctx_pe.contiguous(),
        atten_mask=None,
        sparse_mode=0,
        softmax_lse_flag=True,
        actual_seq_lengths=ends,
        actual_seq_lengths_kv=torch.cumsum(torch.tensor(contexts), 0).tolist(),
        **common,
    )
    rows = sum(chunks) * heads
    merged, _ = torch_npu.npu_attention_update(
        (prefix_lse.float().reshape(rows), chunk_lse.float().reshape(rows)),
        (prefix_out.float().reshape(rows, dv), chunk_out.float().reshape(rows, dv)),
        0,
    )
    merged = merged.view(sum(chunks), heads, dv)
    q_start = 0
    for req, (ctx, chunk) in enumerate(zip(contexts, chunks, strict=True)):
        row = table[req].tolist()
        past_latent = gather_oracle(latent_cache, row, 0, ctx).squeeze(1).double()
        past = (past_latent @ kv_b.double()).view(ctx, heads, nope + dv)
        past_pe = gather_oracle(rope_cache, row, 0, ctx).expand(-1, heads, -1)
        here = slice(q_start, q_start + chunk)
        want = causal_mla_oracle(
            q_nope[here],
            q_pe[here],
            torch.cat([past[..., :nope], k_nope[here].double()]),
            torch.cat([past_pe.double(), k_pe[here].double()]),
            torch.cat([past[..., nope:], v[here].double()]),
            ctx,
            scale,
        )
        torch.testing.assert_close(merged[here].double(), want, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(prefix_out[here].double(), want, atol=1e-3)  # context matters
        q_start += chunk
