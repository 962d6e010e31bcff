"""Plain-torch references of the torch_npu ops vllm-ascend's MLA and DeepSeek MoE paths call.

``AscendMLAImpl`` (``attention/mla_v1.py``) writes the KV cache with ``npu_kv_rmsnorm_rope_cache``
(RMSNorm of the latent, interleaved RoPE of the key's rope part, both scattered into the paged
caches), rotates the query's rope part with ``npu_interleave_rope``, projects the attention's
latent output back per head with ``npu_transpose_batchmatmul``, and merges the chunks of a long
prefill's context with ``npu_attention_update``, each context chunk loaded from the paged caches
by ATB's ``npu_paged_cache_load`` (``DeviceOperator.kv_cache_load`` on an A2 device); its decode
attention is FIA v2 with the rope split (``ops.py``). The MoE router of an A5 device is
``npu_moe_gating_top_k`` (an A2 device reaches the ``_C_ascend`` one, ``engine/ascend_c_ops.py``,
with the same math). They join the simulator's op table (one task each under capture, re-run at
replay).

Formulas are CANN's as torch-npu documents them; math in float32, cast back to the input dtype.
The interleaved RoPE reads the rope part as pairs ``(x[2i], x[2i+1])`` and writes it in halves:
``y = cat(x_even, x_odd) * cos + cat(-x_odd, x_even) * sin``. Signatures are torch-npu
2.10.0.post4's registered schemas (``tests/test_torch_npu_conformance.py``).

More lenient than hardware: the kernels only accept the real model's widths (latent 512, rope 64,
K and N of the batched matmul multiples of 128) and half-precision caches; the references take any
width and float32, so the tiny DeepSeek of the engine tests runs. Quantised variants (scales,
offsets, the separate ``v`` input, the NZ cache modes) are named, not simulated: they raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import moe_ops

Tensor = torch.Tensor


def _interleaved_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """CANN's interleaved RoPE in float32: pairs in, halves out."""
    x = x.float()
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.cat((even, odd), -1) * cos.float() + torch.cat((-odd, even), -1) * sin.float()


def npu_interleave_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE of ``x`` ``(B, N, S, D)`` whose channels come in pairs; ``cos`` / ``sin``
    ``(B, 1, S or 1, D)`` broadcast over heads. Returns the rotated tensor, channels in halves."""
    if x.dim() != 4 or cos.dim() != 4 or cos.shape != sin.shape:
        raise ValueError(f"npu_interleave_rope: x {tuple(x.shape)}, cos {tuple(cos.shape)}")
    return _interleaved_rope(x, cos, sin).to(x.dtype)


def _rms(x: Tensor, gamma: Tensor, epsilon: float) -> Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon) * gamma.float()


def npu_kv_rmsnorm_rope_cache(
    kv: Tensor,
    gamma: Tensor,
    cos: Tensor,
    sin: Tensor,
    index: Tensor,
    k_cache: Tensor,
    ckv_cache: Tensor,
    *,
    k_rope_scale: Tensor | None = None,
    c_kv_scale: Tensor | None = None,
    k_rope_offset: Tensor | None = None,
    c_kv_offset: Tensor | None = None,
    v: Tensor | None = None,
    epsilon: float = 1e-5,
    cache_mode: str = "Norm",
    is_output_kv: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """MLA's KV write: ``kv`` ``(B, N, S, Dv + Dk)`` splits into the latent (RMSNorm by ``gamma``,
    into ``ckv_cache``) and the key's rope part (interleaved RoPE, into ``k_cache``).

    ``PA`` / ``PA_BNSD``: caches ``(blocks, block_size, N, D)``, ``index`` one flat slot per token
    (a negative slot is a padded token: not written). ``Norm``: caches ``(B, N, length, D)``,
    ``index`` ``(B, S)`` offsets per batch row. Returns ``(k_cache, ckv_cache, k_rope, c_kv)``:
    the caches (updated in place) and, with ``is_output_kv``, the rotated key rope and the normed
    latent as ``(B, N, S, D)`` (empty otherwise)."""
    quantised = (k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v)
    if any(t is not None for t in quantised):
        raise NotImplementedError("sim npu_kv_rmsnorm_rope_cache: quantised caches, separate v")
    if kv.dim() != 4:
        raise ValueError(f"kv must be (B, N, S, D), got {tuple(kv.shape)}")
    rms_size = gamma.shape[-1]
    latent = _rms(kv[..., :rms_size], gamma, epsilon)
    rope = _interleaved_rope(kv[..., rms_size:], cos, sin)
    b, n, s, _ = kv.shape
    if cache_mode in ("PA", "PA_BNSD"):
        slots = index.reshape(-1).to(device="cpu", dtype=torch.long)
        if slots.numel() != b * s:
            raise ValueError(f"{slots.numel()} slots for {b * s} tokens")
        keep = slots >= 0
        for values, cache in ((rope, k_cache), (latent, ckv_cache)):
            rows = cache.view(-1, *cache.shape[2:])  # (blocks * block_size, N, D)
            if keep.any() and int(slots[keep].max()) >= rows.shape[0]:
                raise IndexError("npu_kv_rmsnorm_rope_cache: slot outside the cache")
            tokens = values.permute(0, 2, 1, 3).reshape(b * s, n, -1)  # token-major
            rows[slots[keep].to(rows.device)] = tokens[keep.to(tokens.device)].to(cache.dtype)
    elif cache_mode == "Norm":
        offsets = index.reshape(b, s).to(device="cpu", dtype=torch.long)
        for values, cache in ((rope, k_cache), (latent, ckv_cache)):
            for row in range(b):
                cache[row, :, offsets[row].to(cache.device)] = values[row].to(cache.dtype)
    else:
        raise NotImplementedError(f"sim npu_kv_rmsnorm_rope_cache: cache_mode {cache_mode!r}")
    if not is_output_kv:
        return k_cache, ckv_cache, kv.new_empty(0), kv.new_empty(0)
    return k_cache, ckv_cache, rope.to(kv.dtype), latent.to(kv.dtype)


def npu_transpose_batchmatmul(
    input: Tensor,  # noqa: A002 - the registered schema's name
    weight: Tensor,
    *,
    bias: Tensor | None = None,
    scale: Tensor | None = None,
    perm_x1: Sequence[int] | None = None,
    perm_x2: Sequence[int] | None = None,
    perm_y: Sequence[int] | None = None,
    batch_split_factor: int | None = 1,
) -> Tensor:
    """``permute(bmm(permute(input, perm_x1), permute(weight, perm_x2)), perm_y)``; the batch is
    dim 0 after ``perm_x1``. Defaults ``[0, 1, 2]``, ``[0, 1, 2]``, ``[1, 0, 2]`` (the kernel's).
    ``batch_split_factor`` f > 1 returns ``(f, M, B*N/f)``."""
    if bias is not None or scale is not None:
        raise NotImplementedError("sim npu_transpose_batchmatmul: bias / quantised output")
    x = input.float().permute(*(perm_x1 or (0, 1, 2)))
    w = weight.float().permute(*(perm_x2 or (0, 1, 2)))
    y = torch.bmm(x, w).permute(*(perm_y or (1, 0, 2)))
    factor = batch_split_factor or 1
    if factor > 1:
        m = y.shape[0]
        y = y.reshape(m, factor, -1).transpose(0, 1)
    return y.contiguous().to(input.dtype)


def npu_attention_update(
    lse: list[Tensor], local_out: list[Tensor], update_type: int
) -> tuple[Tensor, Tensor]:
    """Merge partial attention results: ``lse_m = log(sum_i exp(lse_i))``,
    ``O = sum_i O_i * exp(lse_i - lse_m)``; ``lse_i`` one per row of ``O_i``. Returns
    ``(O, lse_m)`` (``O`` in the dtype of the first partial output)."""
    if update_type not in (0, 1):
        raise NotImplementedError(f"sim npu_attention_update: update_type {update_type}")
    if len(lse) != len(local_out) or not lse:
        raise ValueError("npu_attention_update: one lse per partial output")
    stacked = torch.stack([t.float().reshape(-1) for t in lse])  # (parts, rows)
    total = torch.logsumexp(stacked, 0)
    weights = torch.exp(stacked - total).nan_to_num(0.0)  # a row no part attended: zeros
    outs = torch.stack([o.float().reshape(stacked.shape[1], -1) for o in local_out])
    merged = (outs * weights.unsqueeze(-1)).sum(0)
    return merged.to(local_out[0].dtype).reshape(local_out[0].shape), total


def _cache_rows(
    block_table: Tensor, context_lens: Tensor, seq_starts: Tensor | None, cumsum: bool, size: int
) -> Tensor:
    """The flat cache row (``block * block_size + offset``) of every token to load, sequence
    after sequence: sequence ``b``'s tokens ``seq_starts[b] ..`` for ``context_lens[b]`` tokens
    (``context_lens`` cumulative with ``cumsum``), each found through ``block_table[b]``."""
    lens = context_lens.to(device="cpu", dtype=torch.long).reshape(-1)
    if cumsum:
        lens = lens[1:] - lens[:-1]
    batch = lens.numel()
    if block_table.shape[0] < batch:
        raise ValueError(f"npu_paged_cache_load: {block_table.shape[0]} table rows, {batch} lens")
    starts = (
        torch.zeros(batch, dtype=torch.long)
        if seq_starts is None
        else seq_starts.to(device="cpu", dtype=torch.long).reshape(-1)
    )
    table = block_table.to(device="cpu", dtype=torch.long)
    rows = []
    for b in range(batch):
        positions = starts[b] + torch.arange(int(lens[b]))
        if positions.numel() and int(positions[-1]) >= table.shape[1] * size:
            raise IndexError("npu_paged_cache_load: a token beyond the sequence's block table")
        rows.append(table[b, positions // size] * size + positions % size)
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


def npu_paged_cache_load(
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    *,
    seq_starts: Tensor | None = None,
    cumsum: bool = False,
) -> tuple[Tensor, Tensor]:
    """ATB's PagedCacheLoad (ND caches ``(blocks, block_size, N, D)``): the tokens of each
    sequence gathered from the paged caches into contiguous ``(tokens, N, D)`` key and value,
    sequence after sequence. ``seq_starts`` (default 0): the first token of each sequence to load,
    an offset into its block-table row (vllm-ascend's context chunks pass multiples of the block
    size). Returns new tensors (the ``.out`` overload writes into given ones)."""
    rows = _cache_rows(block_table, context_lens, seq_starts, cumsum, key_cache.shape[1])
    keys = key_cache.reshape(-1, *key_cache.shape[2:])
    values = value_cache.reshape(-1, *value_cache.shape[2:])
    return keys[rows.to(keys.device)].clone(), values[rows.to(values.device)].clone()


def npu_paged_cache_load_out(
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    *,
    seq_starts: Tensor | None = None,
    cumsum: bool = False,
    key: Tensor,
    value: Tensor,
) -> tuple[Tensor, Tensor]:
    """:func:`npu_paged_cache_load` into ``key`` and ``value`` (as many rows as tokens loaded;
    ``AscendMLAImpl._compute_prefill_context`` passes them, one context chunk at a time)."""
    loaded = npu_paged_cache_load(
        key_cache, value_cache, block_table, context_lens, seq_starts=seq_starts, cumsum=cumsum
    )
    for given, got in zip((key, value), loaded, strict=True):
        if given.shape[0] != got.shape[0]:
            raise ValueError(f"npu_paged_cache_load: {got.shape[0]} tokens into {given.shape[0]}")
        given.copy_(got.reshape(given.shape))
    return key, value


def npu_moe_gating_top_k(
    x: Tensor,
    k: int,
    *,
    bias: Tensor | None = None,
    k_group: int = 1,
    group_count: int = 1,
    group_select_mode: int = 0,
    renorm: int = 0,
    norm_type: int = 0,
    out_flag: bool = False,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
) -> tuple[Tensor, Tensor, Tensor]:
    """DeepSeek's grouped router (``moe_ops.moe_gating_top_k``'s math): scores by softmax
    (``norm_type`` 0) or sigmoid (1), experts chosen from the best ``k_group`` of ``group_count``
    groups by ``scores + bias``; the sigmoid weights are renormalised to sum 1, as the kernel does
    (``renorm`` 0, the only value it takes, means norm before top-k). Returns (weights, ids
    int32, the float32 scores or an empty float32 tensor)."""
    if renorm != 0:
        raise NotImplementedError("sim npu_moe_gating_top_k: renorm must be 0, as on the kernel")
    weights, ids, _ = moe_ops.moe_gating_top_k(
        x,
        k,
        k_group,
        group_count,
        group_select_mode,
        renorm=1 if norm_type == 1 else 0,
        norm_type=norm_type,
        routed_scaling_factor=routed_scaling_factor,
        eps=eps,
        bias_opt=bias,
    )
    scores = torch.softmax(x.float(), -1) if norm_type == 0 else torch.sigmoid(x.float())
    return weights, ids, scores if out_flag else scores.new_empty(0)


REFERENCE_OPS: dict[str, Callable[..., Any]] = {
    "npu_kv_rmsnorm_rope_cache": npu_kv_rmsnorm_rope_cache,
    "npu_interleave_rope": npu_interleave_rope,
    "npu_transpose_batchmatmul": npu_transpose_batchmatmul,
    "npu_attention_update": npu_attention_update,
    "npu_moe_gating_top_k": npu_moe_gating_top_k,
    # ATB (``torch_npu.atb``): the functional overload and the one into given outputs
    "npu_paged_cache_load": npu_paged_cache_load,
    "npu_paged_cache_load.out": npu_paged_cache_load_out,
}

__all__ = ["REFERENCE_OPS"]
