"""The MoE reference ops (``torch_npu_sim.moe_ops``) and the ``_C_ascend`` ops against oracles.

The oracle is the MoE block written per token in float64 (route, run each chosen expert, weigh,
sum), sharing no code with the references; the references' chain (gating -> init routing ->
grouped matmul -> swiglu -> grouped matmul -> unpermute), as vllm-ascend's all-gather MoE path
calls it, must give the same output. Each op is also checked on its own.
"""

from __future__ import annotations

import math

import pytest
import torch

from torch_npu_sim import moe_ops


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def gating_oracle(
    logits: torch.Tensor, bias: torch.Tensor, k: int, sigmoid: bool, renorm: bool
) -> tuple[list[list[int]], list[list[float]]]:
    ids, weights = [], []
    for row in logits.double().tolist():
        if sigmoid:
            scores = [1 / (1 + math.exp(-v)) for v in row]
        else:
            top = max(row)
            exps = [math.exp(v - top) for v in row]
            scores = [e / sum(exps) for e in exps]
        choice = [s + float(b) for s, b in zip(scores, bias.tolist(), strict=True)]
        chosen = sorted(range(len(row)), key=lambda e: -choice[e])[:k]
        w = [scores[e] for e in chosen]
        if renorm:
            w = [v / sum(w) for v in w]
        ids.append(chosen)
        weights.append(w)
    return ids, weights


@pytest.mark.parametrize(("sigmoid", "renorm"), [(True, True), (False, False), (False, True)])
def test_gating_top_k_matches_oracle(gen: torch.Generator, sigmoid: bool, renorm: bool) -> None:
    logits = torch.randn(7, 8, generator=gen)
    bias = 0.3 * torch.randn(8, generator=gen)
    weights, ids, _ = moe_ops.moe_gating_top_k(
        logits, k=3, renorm=int(renorm), norm_type=int(sigmoid), bias_opt=bias, eps=0.0
    )
    want_ids, want_w = gating_oracle(logits, bias, 3, sigmoid, renorm)
    assert ids.dtype == torch.int32
    for r in range(7):  # the order among the chosen experts is the kernel's: compare as sets
        got = dict(zip(ids[r].tolist(), weights[r].tolist(), strict=True))
        assert set(got) == set(want_ids[r])
        for e, w in zip(want_ids[r], want_w[r], strict=True):
            assert got[e] == pytest.approx(w, abs=1e-6)


def test_gating_scaling_factor_and_groups(gen: torch.Generator) -> None:
    logits = torch.randn(5, 8, generator=gen)
    plain, _, _ = moe_ops.moe_gating_top_k(logits, k=2, norm_type=1, renorm=1)
    scaled, _, _ = moe_ops.moe_gating_top_k(
        logits, k=2, norm_type=1, renorm=1, routed_scaling_factor=2.5
    )
    torch.testing.assert_close(scaled, 2.5 * plain)
    # two groups of four, one kept: every chosen expert comes from one group
    _, ids, _ = moe_ops.moe_gating_top_k(logits, k=2, k_group=1, group_count=2, norm_type=1)
    assert all(len({int(e) // 4 for e in row}) == 1 for row in ids)


def test_init_routing_sorts_by_expert_and_indexes_back(gen: torch.Generator) -> None:
    x = torch.randn(4, 6, generator=gen)
    expert_idx = torch.tensor([[2, 0], [1, 2], [0, 3], [2, 1]], dtype=torch.int32)
    expanded, row_idx, counts, _ = moe_ops.npu_moe_init_routing_v2(
        x, expert_idx, active_num=8, expert_num=4, expert_tokens_num_type=1
    )
    assert counts.tolist() == [2, 2, 3, 1]
    flat = expert_idx.reshape(-1).tolist()
    for slot, row in enumerate(row_idx.tolist()):  # slot t*k+j sits at row idx[slot]
        torch.testing.assert_close(expanded[row], x[slot // 2])
    rows_expert = [flat[row_idx.tolist().index(r)] for r in range(8)]
    assert rows_expert == sorted(rows_expert)
    _, _, cumulative, _ = moe_ops.npu_moe_init_routing_v2(
        x, expert_idx, active_num=8, expert_num=4, expert_tokens_num_type=0
    )
    assert cumulative.tolist() == [2, 4, 7, 8]


def test_grouped_matmul_multiplies_each_group_by_its_expert(gen: torch.Generator) -> None:
    rows = torch.randn(6, 5, generator=gen)
    weight = torch.randn(3, 5, 4, generator=gen)
    counts = torch.tensor([2, 0, 3])  # the last row is past every group: stays zero
    (out,) = moe_ops.npu_grouped_matmul(
        [rows], [weight], group_list=counts, split_item=2, group_type=0, group_list_type=1
    )
    want = torch.zeros(6, 4, dtype=torch.float64)
    for r, e in enumerate([0, 0, 2, 2, 2]):
        want[r] = rows[r].double() @ weight[e].double()
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    (same,) = moe_ops.npu_grouped_matmul(
        [rows], [weight], group_list=counts.cumsum(0), group_type=0, group_list_type=0
    )
    torch.testing.assert_close(same, out)


def test_moe_chain_matches_the_per_token_oracle(gen: torch.Generator) -> None:
    tokens, hidden, inter, experts, k = 5, 8, 6, 4, 2
    x = torch.randn(tokens, hidden, generator=gen)
    logits = torch.randn(tokens, experts, generator=gen)
    bias = 0.1 * torch.randn(experts, generator=gen)
    w13 = torch.randn(experts, hidden, 2 * inter, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, inter, hidden, generator=gen) / inter**0.5

    weights, ids, _ = moe_ops.moe_gating_top_k(logits, k=k, renorm=1, norm_type=1, bias_opt=bias)
    expanded, row_idx, counts, _ = moe_ops.npu_moe_init_routing_v2(
        x, ids, active_num=tokens * k, expert_num=experts, expert_tokens_num_type=1
    )
    (h,) = moe_ops.npu_grouped_matmul(
        [expanded], [w13], group_list=counts, group_type=0, group_list_type=1
    )
    gate, up = h.chunk(2, -1)
    (h,) = moe_ops.npu_grouped_matmul(
        [torch.nn.functional.silu(gate) * up],
        [w2],
        group_list=counts,
        group_type=0,
        group_list_type=1,
    )
    out = moe_ops.npu_moe_token_unpermute(h, row_idx, probs=weights)

    want_ids, want_w = gating_oracle(logits, bias, k, sigmoid=True, renorm=True)
    want = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for e, w in zip(want_ids[t], want_w[t], strict=True):
            g, u = (x[t].double() @ w13[e].double()).chunk(2)
            want[t] += w * ((g * torch.sigmoid(g) * u) @ w2[e].double())
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_expert_ranges_split_the_moe_block_into_partial_sums(gen: torch.Generator) -> None:
    """Expert parallelism's all-gather path (``TokenDispatcherWithAllGather``): each of two ranks
    routes only its experts (``active_expert_range``), runs them and combines with the other
    slots' weights masked to zero; the two partial outputs add up to the oracle's MoE block.
    Before the range routed only in-range slots, the second rank's experts ran on the first
    rank's rows (DP=2 with expert parallelism gave other tokens than DP=1, eager too)."""
    tokens, hidden, inter, experts, k = 6, 8, 6, 8, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, hidden, 2 * inter, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, inter, hidden, generator=gen) / inter**0.5
    ids = torch.tensor([[0, 5], [4, 7], [1, 2], [6, 3], [5, 4], [0, 1]], dtype=torch.int32)
    weights = torch.rand(tokens, k, generator=gen)
    local = experts // 2
    total = torch.zeros(tokens, hidden)
    for rank in (0, 1):
        first, last = rank * local, (rank + 1) * local
        expanded, row_idx, counts, _ = moe_ops.npu_moe_init_routing_v2(
            x,
            ids,
            active_num=tokens * k,
            expert_num=experts,
            expert_tokens_num_type=1,
            active_expert_range=[first, last],
        )
        assert counts.sum() == ((ids >= first) & (ids < last)).sum()
        assert (row_idx < 0).sum() == tokens * k - counts.sum()
        (h,) = moe_ops.npu_grouped_matmul(
            [expanded], [w13[first:last]], group_list=counts, group_type=0, group_list_type=1
        )
        gate, up = h.chunk(2, -1)
        (h,) = moe_ops.npu_grouped_matmul(
            [torch.nn.functional.silu(gate) * up],
            [w2[first:last]],
            group_list=counts,
            group_type=0,
            group_list_type=1,
        )
        mask = (ids >= first) & (ids < last)  # the dispatcher's expert_map mask
        total += moe_ops.npu_moe_token_unpermute(h, row_idx, probs=weights * mask)
    want = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for e, w in zip(ids[t].tolist(), weights[t].tolist(), strict=True):
            g, u = (x[t].double() @ w13[e].double()).chunk(2)
            want[t] += w * ((g * torch.sigmoid(g) * u) @ w2[e].double())
    torch.testing.assert_close(total.double(), want, atol=1e-5, rtol=1e-5)


def test_c_ascend_ops_are_defined_and_run() -> None:
    """The simulator defines the ``_C_ascend`` ops vllm-ascend calls unguarded (and no others)."""
    from torch_npu_sim.engine import ascend_c_ops

    ascend_c_ops.install()
    x = torch.randn(3, 2, 8)
    gamma = 0.1 * torch.randn(8)
    y, _ = torch.ops._C_ascend.npu_gemma_rms_norm(x, gamma, 1e-6)
    x64 = x.double()
    want = x64 / (x64.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (1 + gamma.double())
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    logits = torch.randn(4, 6)
    weights, ids, _ = torch.ops._C_ascend.moe_gating_top_k(
        logits, k=2, renorm=1, norm_type=1, bias_opt=torch.zeros(6)
    )
    assert ids.shape == (4, 2) and weights.sum(-1).allclose(torch.ones(4))
    routed = torch.ops._C_ascend.npu_moe_init_routing_custom(
        torch.randn(4, 5),
        ids,
        active_num=8,
        expert_num=6,
        expert_tokens_num_type=1,
        expert_tokens_num_flag=True,
        active_expert_range=[0, 6],
    )
    assert routed[2].sum() == 8
    # any other op still fails loudly (the GDN ops are engine/gdn_path.py's: test_sim_gdn_ops.py)
    assert not hasattr(torch.ops._C_ascend, "chunk_fwd_o")
