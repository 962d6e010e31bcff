"""Plain-torch references of the ops and kernels vllm-ascend's Gated DeltaNet path calls.

Qwen3.5 / Qwen3-Next interleave Gated DeltaNet (GDN) linear-attention layers with gated full
attention. vllm-ascend's GDN layer (``ops/gdn.py``) runs a causal depthwise convolution with a
state per sequence (``_C_ascend.npu_causal_conv1d_custom``), the gates
(``_C_ascend.npu_fused_gdn_gating``), the gated delta rule over one or a few tokens per sequence
(``_C_ascend.npu_recurrent_gated_delta_rule``, decode and speculative decode) or over a prompt
(``ops/triton/fla/chunk.py``'s chunked prefill), and Triton kernels around them: the q/k L2 norm,
the output's gated RMSNorm, the clearing of fresh sequences' states, and for Qwen3-Next the split
of its fused, per-key-head interleaved ``in_proj_qkvz`` / ``in_proj_ba`` outputs; Qwen3.5's
full-attention layers split q / gate / k / v, normalise q and k and apply the interleaved M-RoPE in
one Triton kernel.

The three ``_C_ascend`` ops are simulated NPU ops (``engine/ascend_c_ops.py``: one task each under
capture, re-run at replay on the tensors' values then, as the device kernel reads its index and
length tensors from device memory). Their semantics follow the AscendC kernels of the release
(``csrc/moe/causal_conv1d/op_kernel/causal_conv1d.h``,
``csrc/attention/recurrent_gated_delta_rule/op_kernel/recurrent_gated_delta_rule.h``): which state
slot a sequence reads and writes, how a speculative step's accepted tokens select it. The Triton
references run as plain torch (recorded op by op under capture, traced by dynamo where the kernel
is launched in compiled code), so they take no decision on tensor values on the host. The chunked
prefill is replaced at function level by the same recurrence token by token (prefill never runs
inside a FULL_DECODE_ONLY graph).

Math in float32 (the kernels' accumulation type), cast back to the output's dtype. Each is checked
against float64 oracles that share no code with it in ``tests/test_sim_gdn_ops.py``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention

Tensor = torch.Tensor


# --------------------------------------------------------------------------------------------
# _C_ascend ops (simulated NPU ops; host reads happen when the task runs, as on the device)


def npu_causal_conv1d_custom(
    output: Tensor,
    x: Tensor,
    weight: Tensor,
    conv_state: Tensor,
    bias_opt: Tensor | None,
    query_start_loc_opt: Tensor | None,
    cache_indices_opt: Tensor | None,
    initial_state_mode_opt: Tensor | None,
    num_accepted_tokens_opt: Tensor | None,
    activation_mode: int,
    pad_slot_id: int,
    run_mode: int,
) -> Tensor:
    """Causal depthwise conv1d over varlen sequences, with a conv state per sequence.

    ``x`` ``(T, dim)``, ``weight`` ``(width, dim)`` (tap ``w`` multiplies the input ``width - 1 -
    w`` tokens back), ``conv_state`` ``(slots, state_len, dim)``; sequence ``s`` is
    ``x[qsl[s]:qsl[s + 1]]`` and uses slot ``cache_indices[s]`` (column 0 when 2-D), skipped when
    that is ``pad_slot_id`` or the sequence is empty. Its history is the ``width - 1`` state
    tokens from offset ``num_accepted_tokens[s] - 1`` (speculative decode, width 4) or 0; prefill
    (``run_mode`` 0) starts from zeros unless ``initial_state_mode[s]``. Output rows get
    ``bias + sum_w weight[w] * seq[t + w]`` (SiLU when ``activation_mode``). State write-back: the
    last ``width - 1`` tokens at offset 0; with accepted tokens, width 4 and room, the history's
    last ``width - 2`` tokens then every token of the step (what the next step's offset selects).
    """
    if query_start_loc_opt is None:
        raise NotImplementedError("npu_causal_conv1d_custom: batch mode (no query_start_loc)")
    width, dim = weight.shape
    keep = width - 1
    state_len = conv_state.shape[1]
    starts = query_start_loc_opt.tolist()
    slots = cache_indices_opt
    if slots is not None and slots.dim() == 2:
        slots = slots[:, 0]
    # The kernel honours accepted tokens for its only specialised width (4).
    spec = run_mode == 1 and num_accepted_tokens_opt is not None and width == 4
    w = weight.float()
    for s in range(len(starts) - 1):
        start, end = int(starts[s]), int(starts[s + 1])
        n = end - start
        if n <= 0:
            continue
        slot = int(slots[s]) if slots is not None else s
        if slot == pad_slot_id or slot < 0:
            continue
        if run_mode == 0:
            has_init = initial_state_mode_opt is not None and bool(initial_state_mode_opt[s])
        else:
            has_init = True
        offset = 0
        if spec:
            offset = min(max(int(num_accepted_tokens_opt[s]) - 1, 0), state_len - keep)
        if has_init:
            history = conv_state[slot, offset : offset + keep].to(x.dtype)
        else:
            history = x.new_zeros(keep, dim)
        seq = torch.cat([history, x[start:end]])  # (keep + n, dim): the state's tokens as given
        windows = seq.float().unfold(0, width, 1)  # (n, dim, width)
        y = (windows * w.t()).sum(-1)
        if bias_opt is not None:
            y = y + bias_opt.float()
        if activation_mode:
            y = F.silu(y)
        output[start:end] = y.to(output.dtype)
        if spec and (width - 2) + n <= state_len:
            conv_state[slot, : width - 2 + n] = seq[1:].to(conv_state.dtype)
        else:
            conv_state[slot, :keep] = seq[-keep:].to(conv_state.dtype)
    return output


def npu_fused_gdn_gating(
    A_log: Tensor,  # noqa: N803 - the schema's name
    a: Tensor,
    b: Tensor,
    dt_bias: Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[Tensor, Tensor]:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` (float32) and ``sigmoid(b)``, each
    ``(1, T, heads)``: the decay's log and the delta rule's write strength per token and head."""
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(x, beta=beta, threshold=threshold)
    return g.unsqueeze(0), torch.sigmoid(b.float()).to(b.dtype).unsqueeze(0)


def _expand_heads(x: Tensor, heads: int) -> Tensor:
    """``(..., H, D)`` to ``(..., heads, D)``: value head ``i`` reads key head ``i // (heads / H)``
    (the kernels' grouped-value layout)."""
    return x if x.shape[-2] == heads else x.repeat_interleave(heads // x.shape[-2], dim=-2)


def npu_recurrent_gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    state: Tensor,
    *,
    beta: Tensor | None = None,
    scale: float | None = None,
    actual_seq_lengths: Tensor | None = None,
    ssm_state_indices: Tensor | None = None,
    num_accepted_tokens: Tensor | None = None,
    g: Tensor | None = None,
    gk: Tensor | None = None,
) -> Tensor:
    """The gated delta rule over a few tokens per sequence (decode, speculative decode).

    ``query`` / ``key`` ``(T, H, K)``, ``value`` ``(T, HV, V)``, ``g`` / ``beta`` ``(T, HV)``,
    ``state`` ``(slots, HV, V, K)`` (written in place). ``actual_seq_lengths`` is
    ``[first token, len_0, len_1, ...]``; an empty sequence is skipped. ``ssm_state_indices``
    names a state slot per token: a sequence starts from the slot of its token
    ``num_accepted_tokens - 1`` (its first token without), and after each token ``t`` the state
    is stored in token ``t``'s slot. Per token: ``S *= exp(g)``; ``S += beta * (v - S k) k^T``;
    ``o = S (scale * q)``. Returns ``(T, HV, V)`` (untouched rows zero).
    """
    if gk is not None:
        raise NotImplementedError("npu_recurrent_gated_delta_rule: per-key gating (gk)")
    if actual_seq_lengths is None or ssm_state_indices is None:
        raise ValueError("npu_recurrent_gated_delta_rule: actual_seq_lengths and indices needed")
    heads = value.shape[1]
    scale = key.shape[-1] ** -0.5 if scale is None else scale
    q = _expand_heads(query.float(), heads) * scale
    k = _expand_heads(key.float(), heads)
    v = value.float()
    out = torch.zeros(value.shape, dtype=value.dtype, device=value.device)
    lengths = actual_seq_lengths.tolist()
    indices = ssm_state_indices.reshape(-1).tolist()
    end = int(lengths[0])
    for seq, length in enumerate(lengths[1:]):
        length = int(length)
        if length <= 0:
            continue
        start, end = end, end + length
        first = start
        if num_accepted_tokens is not None:
            first = start + int(num_accepted_tokens[seq]) - 1
        h = state[indices[first]].float()  # (HV, V, K)
        for t in range(start, end):
            if g is not None:
                h = h * torch.exp(g[t].float())[:, None, None]
            delta = v[t] - (h * k[t][:, None, :]).sum(-1)  # (HV, V)
            if beta is not None:
                delta = delta * beta[t].float()[:, None]
            h = h + delta[:, :, None] * k[t][:, None, :]
            out[t] = (h * q[t][:, None, :]).sum(-1).to(out.dtype)
            if indices[t] >= 0:
                state[indices[t]] = h.to(state.dtype)
    return out


# --------------------------------------------------------------------------------------------
# The chunked prefill, at function level (vllm_ascend.ops.triton.fla.chunk.chunk_gated_delta_rule)


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    prebuilt_meta: Any = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **_: Any,
) -> tuple[Tensor, Tensor | None]:
    """The same recurrence over whole prompts, token by token (the release computes it in chunks
    of 64 with Triton and AscendC kernels; the result is the same up to rounding).

    ``q`` / ``k`` ``(1, T, H, K)``, ``v`` ``(1, T, HV, V)``, ``g`` / ``beta`` ``(1, T, HV)``,
    ``initial_state`` ``(N, HV, K, V)`` (sequence ``i`` of ``cu_seqlens``). Returns ``o``
    ``(1, T, HV, V)`` and the final states ``(N, HV, K, V)`` (float32) when asked.
    """
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule: head_first layout")
    if cu_seqlens is None:
        if q.shape[0] != 1:
            raise NotImplementedError("chunk_gated_delta_rule: batched layout without cu_seqlens")
        cu_seqlens = torch.tensor([0, q.shape[1]])
    heads, dk, dv = v.shape[2], k.shape[-1], v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    qf, kf = q[0].float(), k[0].float()
    if use_qk_l2norm_in_kernel:
        qf, kf = _l2norm(qf, 1e-6), _l2norm(kf, 1e-6)
    qf = _expand_heads(qf, heads) * scale
    kf = _expand_heads(kf, heads)
    vf, gf, bf = v[0].float(), g[0].float(), beta[0].float()
    bounds = cu_seqlens.tolist()
    out = torch.zeros(v.shape[1:], dtype=torch.float32)
    finals = torch.zeros(len(bounds) - 1, heads, dk, dv)
    for i in range(len(bounds) - 1):
        h = torch.zeros(heads, dk, dv) if initial_state is None else initial_state[i].float()
        for t in range(int(bounds[i]), int(bounds[i + 1])):
            h = h * torch.exp(gf[t])[:, None, None]
            delta = (vf[t] - (h * kf[t][:, :, None]).sum(1)) * bf[t][:, None]  # (HV, V)
            h = h + kf[t][:, :, None] * delta[:, None, :]
            out[t] = (h * qf[t][:, :, None]).sum(1)
        finals[i] = h
    return out.unsqueeze(0).to(v.dtype), finals if output_final_state else None


def _l2norm(x: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


# --------------------------------------------------------------------------------------------
# Triton kernels: ``reference(grid, *launch args, **launch kwargs)`` (engine/triton_refs.py)


def split_qkv_rmsnorm_mrope_kernel(
    grid: Any,
    in_qkv: Tensor,
    q_weight: Tensor,
    q_bias: Tensor | None,
    k_weight: Tensor,
    k_bias: Tensor | None,
    cos_sin: Tensor,
    out_q: Tensor,
    out_k: Tensor,
    out_v: Tensor,
    out_gate: Tensor,
    num_tokens: int,
    _front_core_num: int,
    _num_tokens_each_front_core: int,
    _num_tokens_each_tail_core: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    q_size: int,
    kv_size: int,
    eps: float,
    mrope_section_t: int,
    mrope_section_h: int,
    mrope_section_w: int,
    has_bias: bool,
    is_interleaved: bool,
    rope_dim: int,
    half_rope_dim: int,
    _is_partial_rope: bool,
    gate_size: int,
) -> None:
    """vllm-ascend's ``split_qkv_rmsnorm_mrope_kernel``: split each token's row into q (and its
    gate, interleaved per head), k, v; RMSNorm q and k per head (weight, optional bias); rotate the
    first ``rope_dim`` channels (halves, NeoX style) with the multimodal cos / sin, each channel
    pair's frequency from section t, h or w (``cos_sin`` ``(3, T, rope_dim)``: cos then sin)."""
    n = num_tokens
    row = in_qkv[:n].float()
    if gate_size > 0:
        q_gate = row[:, : q_size + gate_size].reshape(n, num_q_heads, 2 * head_size)
        q, gate = q_gate[..., :head_size], q_gate[..., head_size:].reshape(n, q_size)
        out_gate[:n].copy_(gate.to(out_gate.dtype))
    else:
        q = row[:, :q_size].reshape(n, num_q_heads, head_size)
    k_start = q_size + gate_size
    k = row[:, k_start : k_start + kv_size].reshape(n, num_kv_heads, head_size)
    out_v[:n].copy_(in_qkv[:n, k_start + kv_size : k_start + 2 * kv_size])

    i = torch.arange(half_rope_dim, device=in_qkv.device)
    if is_interleaved:
        h_mask = (i % 3 == 1) & (i <= 3 * mrope_section_h)
        w_mask = (i % 3 == 2) & (i <= 3 * mrope_section_w)
        t_mask = ~(h_mask | w_mask)
    else:
        t_mask = i < mrope_section_t
        h_mask = (i >= mrope_section_t) & (i < mrope_section_t + mrope_section_h)
        w_mask = (i >= mrope_section_t + mrope_section_h) & (
            i < mrope_section_t + mrope_section_h + mrope_section_w
        )
    sections = cos_sin.reshape(-1)[: 3 * n * rope_dim].reshape(3, n, rope_dim).float()
    masks = torch.stack([t_mask, h_mask, w_mask]).to(sections.dtype)[:, None, :]  # (3, 1, half)
    cos = (sections[..., :half_rope_dim] * masks).sum(0)  # (n, half)
    sin = (sections[..., half_rope_dim:] * masks).sum(0)
    cos, sin = torch.cat([cos, cos], -1)[:, None, :], torch.cat([sin, sin], -1)[:, None, :]

    def norm_rope(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight.float()
        if has_bias and bias is not None:
            y = y + bias.float()
        part = y[..., :rope_dim]
        x1, x2 = part[..., :half_rope_dim], part[..., half_rope_dim:]
        roped = torch.cat([-x2, x1], -1) * sin + part * cos
        return torch.cat([roped, y[..., rope_dim:]], -1)

    out_q[:n].copy_(norm_rope(q, q_weight, q_bias).reshape(n, q_size).to(out_q.dtype))
    out_k[:n].copy_(norm_rope(k, k_weight, k_bias).reshape(n, kv_size).to(out_k.dtype))


def layer_norm_fwd_1pass_kernel(
    grid: Any,
    X: Tensor,  # noqa: N803 - the kernel's names
    Y: Tensor,  # noqa: N803
    W: Tensor,  # noqa: N803
    B: Tensor | None,  # noqa: N803
    Z: Tensor | None,  # noqa: N803
    Mean: Tensor | None,  # noqa: N803
    Rstd: Tensor,  # noqa: N803
    stride_x_row: int,
    stride_y_row: int,
    stride_z_row: int,
    M: int,  # noqa: N803
    N: int,  # noqa: N803
    eps: float,
    *,
    NORM_BEFORE_GATE: bool,  # noqa: N803
    IS_RMS_NORM: bool,  # noqa: N803
    **_: Any,
) -> None:
    """vllm-ascend's gated (RMS) LayerNorm, groups of ``N`` channels (``grid[1]`` of them):
    ``y = norm(x) * w + b``, gated by ``z * sigmoid(z)`` after the norm (``NORM_BEFORE_GATE``) or
    before it. Writes ``Y``, ``Rstd`` (and ``Mean``) per group-major row, as the kernel does."""
    groups = grid[1]
    x = X[:M].float().reshape(M, groups, N)
    z = None if Z is None else Z[:M].float().reshape(M, groups, N)
    if z is not None and not NORM_BEFORE_GATE:
        x = x * (z * torch.sigmoid(z))
    if IS_RMS_NORM:
        centred = x
    else:
        mean = x.mean(-1, keepdim=True)
        centred = x - mean
        Mean[: groups * M].copy_(mean.squeeze(-1).t().reshape(-1))
    rstd = torch.rsqrt((centred * centred).mean(-1, keepdim=True) + eps)
    Rstd[: groups * M].copy_(rstd.squeeze(-1).t().reshape(-1))
    y = centred * rstd * W.float().reshape(groups, N)
    if B is not None:
        y = y + B.float().reshape(groups, N)
    if z is not None and NORM_BEFORE_GATE:
        y = y * (z * torch.sigmoid(z))
    Y[:M].copy_(y.reshape(M, groups * N).to(Y.dtype))


def l2norm_fwd_kernel2(
    grid: Any,
    X: Tensor,  # noqa: N803 - the kernel's names
    Y: Tensor,  # noqa: N803
    eps: float,
    M: int,  # noqa: N803
    *_: Any,
) -> None:
    """vLLM's FLA ``l2norm_fwd_kernel2``: each row of ``X`` ``(M, N)`` over its L2 norm
    (``rsqrt(sum x^2 + eps)``), the q / k normalisation before the decode recurrence."""
    x = X[:M].float()
    Y[:M].copy_(_l2norm(x, eps).to(Y.dtype))


def clear_ssm_states_kernel(
    grid: Any,
    states: Tensor,
    has_initial_state: Tensor,
    inner_size: int,
    row_stride: int,
    **_: Any,
) -> None:
    """Zero the state rows of sequences without an initial state (a fresh prompt's slot still
    holds a finished request's state)."""
    rows = states.reshape(states.shape[0], -1)[:, :inner_size]
    keep = has_initial_state.reshape(-1, 1).to(torch.bool)
    rows.copy_(torch.where(keep, rows, torch.zeros((), dtype=rows.dtype)))


def fused_qkvzba_split_reshape_cat_kernel(
    grid: Any,
    mixed_qkv: Tensor,
    z: Tensor,
    b: Tensor,
    a: Tensor,
    mixed_qkvz: Tensor,
    mixed_ba: Tensor,
    NUM_HEADS_QK: int,  # noqa: N803 - the kernel's names
    NUM_HEADS_V: int,  # noqa: N803
    HEAD_QK: int,  # noqa: N803
    HEAD_V: int,  # noqa: N803
    total_rows: int,
    *_: Any,
    **__: Any,
) -> None:
    """vllm-ascend's ``fused_qkvzba_split_reshape_cat_kernel`` (Qwen3-Next's GDN input split):
    each row of ``mixed_qkvz`` holds, per key head ``g``, ``[q_g, k_g, v_g, z_g]`` (``HEAD_QK``,
    ``HEAD_QK`` and ``NUM_HEADS_V / NUM_HEADS_QK`` value heads of ``HEAD_V`` each), and each row
    of ``mixed_ba`` per key head ``[b_g, a_g]`` (that many value heads each). Writes
    ``mixed_qkv`` as all q, then all k, then all v heads, ``z`` ``(rows, NUM_HEADS_V, HEAD_V)``,
    ``b`` and ``a`` ``(rows, NUM_HEADS_V)``, for the first ``total_rows`` rows (a copy: no math)."""
    n, g = total_rows, NUM_HEADS_QK
    per_v = NUM_HEADS_V // NUM_HEADS_QK * HEAD_V
    per_ba = NUM_HEADS_V // NUM_HEADS_QK
    groups = mixed_qkvz[:n].reshape(n, g, 2 * HEAD_QK + 2 * per_v)
    q, k, v, zz = groups.split([HEAD_QK, HEAD_QK, per_v, per_v], dim=-1)
    mixed_qkv[:n].copy_(torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], -1))
    z[:n].copy_(zz.reshape(n, NUM_HEADS_V, HEAD_V))
    ba = mixed_ba[:n].reshape(n, g, 2 * per_ba)
    b[:n].copy_(ba[..., :per_ba].reshape(n, NUM_HEADS_V))
    a[:n].copy_(ba[..., per_ba:].reshape(n, NUM_HEADS_V))
