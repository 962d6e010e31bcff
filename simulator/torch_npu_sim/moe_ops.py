"""Plain-torch references of the MoE kernels vllm-ascend's unquantized fused MoE calls.

The all-gather MoE path of vllm-ascend 0.23.0.post1 (one device, no expert parallelism) routes
with ``_C_ascend.moe_gating_top_k``, permutes with ``_C_ascend.npu_moe_init_routing_custom``
(``npu_moe_init_routing_v2``'s semantics), runs the experts with ``npu_grouped_matmul`` and
``npu_swiglu`` and combines with ``npu_moe_token_unpermute``. The two ``_C_ascend`` ops are
defined by ``engine/ascend_c_ops.py``; the torch_npu ones join the simulator's op table (one
task each under capture; their bodies re-run at replay, so host-side group sizes are fine).

Index conventions (the pair must agree, and does on hardware): ``expanded_row_idx`` maps each
flattened (token, k) slot to its row in the expert-sorted ``expanded_x`` (row_idx_type 0), and
``npu_moe_token_unpermute`` gathers with it: ``out[t] = sum_j probs[t, j] * rows[idx[t*k + j]]``.
Signatures are torch-npu 2.10.0.post4's registered schemas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

Tensor = torch.Tensor


def moe_gating_top_k(
    x: Tensor,
    k: int,
    k_group: int = 1,
    group_count: int = 1,
    group_select_mode: int = 0,
    renorm: int = 0,
    norm_type: int = 0,
    out_flag: bool = False,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
    bias_opt: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Router: scores ``softmax`` (norm_type 0) or ``sigmoid`` (1) of ``x``; experts chosen by
    ``scores + bias`` within the best ``k_group`` of ``group_count`` groups (ranked by their top-2
    sum, mode 1, or their maximum, mode 0); weights are the unbiased scores, renormalised to sum 1
    when ``renorm`` and scaled by ``routed_scaling_factor``.

    Returns (weights, ids int32, scores or an empty tensor)."""
    scores = torch.softmax(x.float(), -1) if norm_type == 0 else torch.sigmoid(x.float())
    choice = scores if bias_opt is None else scores + bias_opt.float()
    if group_count > 1:
        grouped = choice.view(choice.shape[0], group_count, -1)
        rank = grouped.topk(2, -1).values.sum(-1) if group_select_mode == 1 else grouped.amax(-1)
        keep = torch.zeros_like(rank).scatter_(1, rank.topk(k_group, -1).indices, 1.0)
        choice = choice.masked_fill(~keep.bool().repeat_interleave(grouped.shape[-1], 1), -1e30)
    ids = choice.topk(k, -1).indices
    weights = scores.gather(1, ids)
    if renorm:
        weights = weights / (weights.sum(-1, keepdim=True) + eps)
    weights = weights * routed_scaling_factor
    out = scores if out_flag else scores.new_empty(0)
    return weights.to(x.dtype), ids.to(torch.int32), out.to(x.dtype)


def npu_moe_init_routing_v2(
    x: Tensor,
    expert_idx: Tensor,
    *,
    scale: Tensor | None = None,
    offset: Tensor | None = None,
    active_num: int = -1,
    expert_capacity: int = -1,
    expert_num: int = -1,
    drop_pad_mode: int = 0,
    expert_tokens_num_type: int = 0,
    expert_tokens_num_flag: bool = False,
    quant_mode: int = -1,
    active_expert_range: Sequence[int] = (),
    row_idx_type: int = 0,
    x_dtype: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Drop-less permutation: each token copied once per chosen expert, rows sorted by expert
    (stable). Returns (expanded_x, expanded_row_idx int32, tokens per expert, empty scale).

    ``active_expert_range`` ``[first, last)`` (expert parallelism: this rank's experts) routes
    only the slots whose expert is in the range, as the op's documentation counts them (the
    valid rows are the in-range ones): their rows come first, sorted by expert, and the counts
    are the range's; the other slots' rows are left out (zeros here, past the valid rows) and
    their ``expanded_row_idx`` is -1. What hardware writes there is not known; vllm-ascend's
    all-gather dispatcher weighs those slots by zero (its ``expert_map`` mask), so the combine's
    result does not depend on it."""
    if quant_mode != -1 or drop_pad_mode != 0 or row_idx_type != 0:
        raise NotImplementedError("sim moe_init_routing: only unquantized drop-less, row_idx 0")
    top_k = expert_idx.shape[-1]
    flat = expert_idx.reshape(-1).long()
    first, last = active_expert_range if len(active_expert_range) else (0, expert_num)
    active = (flat >= first) & (flat < last)
    # Out-of-range slots sort after every in-range one (row r of expanded_x is slot order[r]).
    key = torch.where(active, flat, torch.full_like(flat, max(expert_num, last, 0) + 1))
    order = torch.sort(key, stable=True).indices
    expanded_x = x.reshape(-1, x.shape[-1]).index_select(0, order // top_k)
    valid = int(active.sum())
    expanded_x[valid:] = 0
    row_idx = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel()))
    row_idx = torch.where(active, row_idx, torch.full_like(row_idx, -1))
    counts = torch.bincount(flat[active], minlength=max(expert_num, last))[first:last]
    if expert_tokens_num_type == 0:  # cumulative sum
        counts = counts.cumsum(0)
    return expanded_x, row_idx.to(torch.int32), counts.to(torch.int64), x.new_empty(0)


def npu_grouped_matmul(
    x: list[Tensor],
    weight: list[Tensor],
    *,
    bias: list[Tensor] | None = None,
    scale: list[Tensor] | None = None,
    offset: list[Tensor] | None = None,
    antiquant_scale: list[Tensor] | None = None,
    antiquant_offset: list[Tensor] | None = None,
    per_token_scale: list[Tensor] | None = None,
    group_list: Tensor | None = None,
    activation_input: list[Tensor] | None = None,
    activation_quant_scale: list[Tensor] | None = None,
    activation_quant_offset: list[Tensor] | None = None,
    split_item: int | None = 0,
    group_type: int | None = None,
    group_list_type: int | None = 0,
    act_type: int | None = 0,
    tuning_config: list[int] | None = None,
    output_dtype: Any = None,
    x_dtype: int | None = None,
    weight_dtype: int | None = None,
    scale_dtype: int | None = None,
    per_token_scale_dtype: int | None = None,
) -> list[Tensor]:
    """Grouped GEMM, the MoE form: one ``x`` (rows grouped by expert), one ``weight``
    ``[experts, in, out]``, ``group_list`` the rows per expert (type 1) or their running sum
    (type 0); rows past the last group stay zero. Returns ``[out]`` (split_item 2 or 3)."""
    if len(x) != 1 or len(weight) != 1 or group_type != 0 or group_list is None:
        raise NotImplementedError("sim grouped_matmul: one x, one stacked weight, M grouping")
    if any(t is not None for t in (scale, offset, antiquant_scale, per_token_scale)):
        raise NotImplementedError("sim grouped_matmul: unquantized only")
    rows, w = x[0], weight[0]
    counts = (
        group_list.long()
        if group_list_type == 1
        else torch.diff(group_list.long(), prepend=group_list.new_zeros(1).long())
    )
    out = rows.new_zeros(rows.shape[0], w.shape[-1])
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count:
            part = rows[start : start + count].float() @ w[expert].float()
            if bias is not None:
                part = part + bias[0][expert].float()
            out[start : start + count] = part.to(out.dtype)
        start += count
    return [out]


def npu_moe_token_unpermute(
    permuted_tokens: Tensor,
    sorted_indices: Tensor,
    probs: Tensor | None = None,
    padded_mode: bool = False,
    restore_shape: list[int] | None = None,
) -> Tensor:
    """Combine: ``out[t] = sum_j probs[t, j] * permuted_tokens[sorted_indices[t * k + j]]``; a
    slot whose index is -1 (left out by an expert range) adds nothing."""
    if padded_mode:
        raise NotImplementedError("sim moe_token_unpermute: padded mode")
    top_k = 1 if probs is None else probs.shape[-1]
    index = sorted_indices.reshape(-1).long()
    rows = permuted_tokens.index_select(0, index.clamp(min=0)).float()
    rows = rows * (index >= 0).unsqueeze(-1)
    rows = rows.view(-1, top_k, permuted_tokens.shape[-1])
    if probs is not None:
        rows = rows * probs.float().unsqueeze(-1)
    return rows.sum(1).to(permuted_tokens.dtype)


REFERENCE_OPS: dict[str, Callable[..., Any]] = {
    "npu_moe_init_routing_v2": npu_moe_init_routing_v2,
    "npu_grouped_matmul": npu_grouped_matmul,
    "npu_moe_token_unpermute": npu_moe_token_unpermute,
}

__all__ = ["REFERENCE_OPS", "moe_gating_top_k"]
