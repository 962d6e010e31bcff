"""Plain-torch reference implementations of the torch_npu attention ops vllm-ascend calls.

These stand in for the NPU kernels so the real vllm-ascend decode / capture / replay code can run on
CPU and produce numerically meaningful results: a replay that launches a task with stale sequence
lengths or block tables must give a *different answer*, not merely "run". The simulator runtime
records these callables as graph tasks and calls them at replay, so every op reads its tensor
arguments (lengths, block tables, caches) at call time.

Names, argument order, keyword-only markers, defaults and returns are those of the schemas
registered by torch-npu 2.10.0.post4 (``tests/fixtures/torch_npu_2.10.0.post4.json``, checked by
``tests/test_torch_npu_conformance.py``); every vllm-ascend 0.23.0.post1 call site binds to them.
Math is computed in float32 and cast to the output dtype.

Modelled: layouts TND / BNSD / BSND / BSH (and split ``IN_OUT`` forms such as ``BNSD_NBSD``,
``BSND_NBSD``, ``TND_NTD``); paged KV through ``block_table`` with caches shaped
``(num_blocks, block_size, num_kv_heads*head_dim)``, ``(num_blocks, block_size, num_kv_heads,
head_dim)``, ``(num_blocks, num_kv_heads, block_size, head_dim)`` or the NZ 5-D view
``(num_blocks, num_kv_heads, head_dim//32, block_size, 32)``; dense (non-paged) KV; GQA; ``scale``;
sparse modes 0 (no mask, or an explicit mask where nonzero/True means "masked out"), 2 (top-left
causal), 3 (bottom-right causal), 4 (bottom-right band via ``pre_tokens``/``next_tokens``);
learnable sinks; per-channel int8 antiquant ((x + offset) * scale); ``query_rope``/``key_rope``
(concatenated to q/k); softmax LSE.

Conventions chosen where the NPU documentation is the only reference:
- TND: ``actual_seq_lengths`` (q) are cumulative ends. ``actual_seq_lengths_kv`` are per-request
  lengths when ``block_table`` is given (paged), cumulative ends otherwise (dense TND).
- Band (mode 4): query at absolute position ``p = kv_len - q_len + i`` attends kv ``j`` with
  ``p - pre_tokens <= j <= p + next_tokens`` (so ``pre_tokens=W, next_tokens=0`` sees W+1 keys).
- In modes 2/3/4 the ``atten_mask`` argument is the NPU's compressed 2048x2048 template: ignored.
  In mode 0 ``pre_tokens``/``next_tokens`` are ignored.
- Batch layouts: per-batch q lengths are clamped to S (vllm-ascend's C8 capture path passes the
  cumulative TND ends with S=1).
- Rows that attend to nothing (kv len 0, q tokens past the last cumulative end, batch rows past
  the given lengths) produce zeros, never NaN. Their LSE is ``-inf``, or the sink logit for a
  row of a request when sinks are given (TND tokens past the last end stay ``-inf``).
- A sink is one extra per-query-head logit in the softmax denominator (GPT-OSS); LSE includes it.
- ``.out`` variants write LSE only if the given tensor has one element per (token, head); the
  1-element placeholder vllm-ascend allocates is left untouched.
- The FIA getters (``*_get_max_workspace``) size a workspace from shapes only (the maximum over
  every sequence length), so the workspace captured once fits every replay of the same shapes.
  The PA getter receives the block table and the context lengths, and its size grows with them
  (batch, longest context, blocks per request) as well as with the query, caches and output: a
  PA workspace computed for one step's lengths may be too small for another step's. Ops given a
  smaller workspace than their own arguments need raise, like a kernel that would overrun it.

What the real ops refuse at launch (a graph relaunch without its workspace, length lists that
do not match the batch, a block table of another shape or dtype, mismatched rope inputs, ...) is
refused too, at every launch and at every task update: ``op_rules.py``.

Not modelled (raise NotImplementedError if given non-None): pse_shift / pse, quantised outputs,
dequant of quantised queries, shared prefixes, per-token antiquant (mode != 0), dropout.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .op_rules import fia_rules, pa_rules

Tensor = torch.Tensor
SeqLens = Sequence[int] | Tensor | None

INT_MAX = 2147483647
_WORKSPACE_ALIGN = 512
_PA_WORKSPACE_ALIGN = 32  # fine enough that every input of the PA size shows in it


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def _lens(x: SeqLens) -> Tensor | None:
    """Host copy (int64, 1-D) of a length list/tensor; the kernels read lengths at launch."""
    if x is None:
        return None
    t = x if isinstance(x, Tensor) else torch.as_tensor(list(x))
    if t.is_floating_point():
        raise TypeError("sequence lengths must be integers")
    return t.detach().to(device="cpu", dtype=torch.long).reshape(-1)


def _fit(t: Tensor, n: int, fill: int) -> Tensor:
    """Truncate or pad a length vector to ``n`` entries (missing requests have length ``fill``)."""
    if t.numel() >= n:
        return t[:n]
    return torch.cat([t, t.new_full((n - t.numel(),), fill)])


def _reject(**kwargs: Any) -> None:
    for name, val in kwargs.items():
        if val is not None:
            raise NotImplementedError(f"sim ops: argument {name!r} is not modelled")


def _workspace_bytes(query: Tensor, *extra: Tensor | None) -> int:
    """Shape-only workspace size: monotone in tokens, heads and head dim."""
    n = query.numel() + sum(t.numel() for t in extra if t is not None)
    size = 4 * n + _WORKSPACE_ALIGN
    return -(-size // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN


def _check_workspace(workspace: Tensor | None, query: Tensor, *extra: Tensor | None) -> None:
    if workspace is None:
        return
    need = _workspace_bytes(query, *extra)
    have = workspace.numel() * workspace.element_size()
    if have < need:
        raise RuntimeError(f"sim ops: workspace of {have} bytes is smaller than the {need} needed")


def _new_workspace(query: Tensor, *extra: Tensor | None) -> Tensor:
    return torch.empty(_workspace_bytes(query, *extra), dtype=torch.uint8, device=query.device)


# --------------------------------------------------------------------------------------------------
# canonical form: queries (B, Q, N, D), keys/values (B, K, Nkv, D), lengths (B,)
# --------------------------------------------------------------------------------------------------


class _QuerySet:
    """Queries padded to ``(B, Q, N, D)`` plus the map back to the caller's layout."""

    def __init__(
        self, query: Tensor, layout: str, num_heads: int, q_lens: SeqLens, rope: Tensor | None
    ):
        self.layout = layout
        self.shape = query.shape
        self.device = query.device
        if layout == "TND":
            if query.dim() != 3:
                raise ValueError(f"TND query must be 3-D, got {tuple(query.shape)}")
            t = query.shape[0]
            ends = _lens(q_lens)
            if ends is None:
                ends = torch.tensor([t])
            starts = torch.cat([ends.new_zeros(1), ends[:-1]])
            self.q_len = (ends - starts).clamp(min=0)
            if ends.numel() and int(ends.max()) > t:
                raise ValueError(f"actual_seq_lengths end {int(ends.max())} exceeds {t} tokens")
            self.batch = ends.numel()
            qmax = max(int(self.q_len.max()) if self.batch else 0, 1)
            pos = torch.arange(qmax)
            self.valid = pos[None, :] < self.q_len[:, None]
            self.index = (starts[:, None] + pos[None, :]).clamp(0, max(t - 1, 0))
            self.tokens = t
            self.q = self._gather_tnd(query)
            self.rope = None if rope is None else self._gather_tnd(rope)
        else:
            self.q = self._to_bsnd(query, num_heads)
            self.rope = None if rope is None else self._to_bsnd(rope, num_heads)
            self.batch, s = self.q.shape[0], self.q.shape[1]
            given = _lens(q_lens)
            self.q_len = (
                torch.full((self.batch,), s) if given is None else _fit(given, self.batch, 0)
            ).clamp(0, s)

    def _gather_tnd(self, x: Tensor) -> Tensor:
        if x.shape[0] == 0:
            return x.new_zeros(self.batch, self.index.shape[1], *x.shape[1:]).float()
        return x[self.index].float()

    def _to_bsnd(self, x: Tensor, num_heads: int) -> Tensor:
        if self.layout == "BNSD":
            return x.permute(0, 2, 1, 3).float()
        if self.layout == "BSND":
            return x.float()
        if self.layout == "BSH":
            b, s, h = x.shape
            return x.reshape(b, s, num_heads, h // num_heads).float()
        raise NotImplementedError(f"sim ops: input_layout {self.layout!r} is not modelled")

    def scatter(self, out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
        """(B, Q, N, Dv) / (B, Q, N) -> caller layout; TND rows no request covers stay zero."""
        b, _, n, dv = out.shape
        if self.layout == "TND":
            flat = out.new_zeros(self.tokens, n, dv)
            flat_lse = lse.new_full((self.tokens, n), float("-inf"))
            idx = self.index[self.valid]
            flat[idx] = out[self.valid]
            flat_lse[idx] = lse[self.valid]
            return flat, flat_lse.unsqueeze(-1)
        lse_bnsd = lse.permute(0, 2, 1).unsqueeze(-1)
        if self.layout == "BNSD":
            return out.permute(0, 2, 1, 3), lse_bnsd
        if self.layout == "BSND":
            return out, lse_bnsd
        return out.reshape(b, out.shape[1], n * dv), lse_bnsd

    def scatter_as(self, out: Tensor, lse: Tensor, out_layout: str) -> tuple[Tensor, Tensor]:
        """Like :meth:`scatter`, for the split ``IN_OUT`` layouts (e.g. MLA's ``BNSD_NBSD``)."""
        if out_layout == self.layout:
            return self.scatter(out, lse)
        res, lse_out = self.scatter(out, lse)
        if self.layout == "TND" and out_layout == "NTD":
            return res.permute(1, 0, 2), lse_out
        if self.layout != "TND":
            bsnd = out
            if out_layout == "NBSD":
                return bsnd.permute(2, 0, 1, 3), lse_out
            if out_layout == "BSND":
                return bsnd, lse_out
            if out_layout == "BNSD":
                return bsnd.permute(0, 2, 1, 3), lse_out
        raise NotImplementedError(f"sim ops: layout {self.layout}_{out_layout} is not modelled")


def _paged_kind(cache: Tensor, block_size: int, num_kv_heads: int) -> tuple[str, int]:
    """Classify a paged cache layout vllm-ascend passes; returns (kind, block_size)."""
    if cache.dim() == 3:
        kind, bs = "BSH", cache.shape[1]
    elif cache.dim() == 4:
        if cache.shape[2] == num_kv_heads and (not block_size or cache.shape[1] == block_size):
            kind, bs = "BSND", cache.shape[1]
        elif cache.shape[1] == num_kv_heads and (not block_size or cache.shape[2] == block_size):
            kind, bs = "BNSD", cache.shape[2]
        else:
            raise ValueError(
                f"4-D cache {tuple(cache.shape)} matches neither (nb, {block_size}, "
                f"{num_kv_heads}, D) nor (nb, {num_kv_heads}, {block_size}, D)"
            )
    elif cache.dim() == 5:
        if cache.shape[1] != num_kv_heads:
            raise ValueError(f"NZ cache has {cache.shape[1]} kv heads, expected {num_kv_heads}")
        kind, bs = "NZ", cache.shape[3]
    else:
        raise ValueError(f"unsupported paged cache rank {cache.dim()}")
    if block_size and bs != block_size:
        raise ValueError(f"cache block size {bs} != block_size {block_size}")
    return kind, bs


def _paged_gather(cache: Tensor, kind: str, blk: Tensor, off: Tensor, nkv: int) -> Tensor:
    """Gather live KV straight into ``(B, K, Nkv, D)``; ``blk``/``off`` are ``(B, K)``.

    Token-major caches (the ones vllm-ascend passes for FIA / PA) are gathered as whole rows by
    flat slot, which is one memcpy-like copy of the live KV; the cache itself is never copied.
    """
    b, k = blk.shape
    if kind in ("BSH", "BSND") and cache.is_contiguous():
        nb, bs = cache.shape[0], cache.shape[1]
        rows = cache.view(nb * bs, -1).index_select(0, (blk * bs + off).reshape(-1))
        return rows.view(b, k, nkv, -1)
    if kind == "BSH":
        nb, bs, h = cache.shape
        view = cache.view(nb, bs, nkv, h // nkv)
    elif kind == "BSND":
        view = cache
    elif kind == "BNSD":
        view = cache.permute(0, 2, 1, 3)
    else:  # NZ (nb, Nkv, D//nz, bs, nz) -> (nb, bs, Nkv, D//nz, nz)
        view = cache.permute(0, 3, 1, 2, 4)
    g = view[blk, off]
    return g if g.dim() == 4 else g.flatten(3)


def _gather_kv(
    tensors: Sequence[Tensor | None],
    *,
    layout: str,
    num_kv_heads: int,
    batch: int,
    block_table: Tensor | None,
    block_size: int,
    kv_lens: SeqLens,
    default_ends: Tensor | None = None,
) -> tuple[list[Tensor | None], Tensor]:
    """Gather keys/values (and key_rope) into ``(B, K, Nkv, D)``; returns them and kv lengths.

    ``default_ends`` are the query's cumulative ends, used for dense TND without kv lengths.
    """
    given = _lens(kv_lens)
    if block_table is not None:
        if given is None:
            raise ValueError("paged attention needs actual_seq_lengths_kv / context_lens")
        kv_len = _fit(given, batch, 0).clone()
        kv_len[block_table.shape[0] :] = 0
        kinds = [None if t is None else _paged_kind(t, block_size, num_kv_heads) for t in tensors]
        bs = next(k for k in kinds if k is not None)[1]
        longest = int(kv_len.max()) if batch else 0
        nblk = -(-max(longest, 1) // bs)
        if nblk > block_table.shape[1]:
            if longest > 0:
                raise ValueError(
                    f"kv length {longest} needs {nblk} blocks, block_table has "
                    f"{block_table.shape[1]}"
                )
            nblk = block_table.shape[1]
        bt = block_table[:batch, :nblk].to(device="cpu", dtype=torch.long)
        if bt.shape[0] < batch:
            bt = torch.cat([bt, bt.new_zeros(batch - bt.shape[0], nblk)])
        used = torch.arange(nblk)[None, :] < (-(-kv_len // bs))[:, None]
        num_blocks = tensors[0].shape[0]
        if used.any() and (int(bt[used].min()) < 0 or int(bt[used].max()) >= num_blocks):
            raise IndexError("block_table references a block outside the cache")
        bt = torch.where(used, bt, torch.zeros_like(bt))
        pos = torch.arange(longest)
        blk = bt[:, pos // bs].to(tensors[0].device)
        off = (pos % bs).expand(batch, longest).to(tensors[0].device)
        out: list[Tensor | None] = []
        for t, kind in zip(tensors, kinds, strict=True):
            if t is None or kind is None:
                out.append(None)
            else:
                out.append(_paged_gather(t, kind[0], blk, off, num_kv_heads))
        return out, kv_len
    if layout == "TND":
        tk = tensors[0].shape[0]
        ends = given if given is not None else default_ends
        if ends is None:
            ends = torch.tensor([tk])
        ends = _fit(ends, batch, int(ends[-1]) if ends.numel() else 0)
        if ends.numel() and int(ends.max()) > tk:
            raise ValueError(f"actual_seq_lengths_kv end {int(ends.max())} exceeds {tk} tokens")
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        kv_len = (ends - starts).clamp(min=0)
        kmax = int(kv_len.max()) if batch else 0
        idx = (starts[:, None] + torch.arange(kmax)[None, :]).clamp(0, max(tk - 1, 0))
        out = []
        for t in tensors:
            if t is None:
                out.append(None)
                continue
            t3 = t if t.dim() == 3 else t.reshape(t.shape[0], num_kv_heads, -1)
            if tk == 0:
                out.append(t3.new_zeros(batch, 0, *t3.shape[1:]))
                continue
            out.append(t3[idx.to(t3.device)])
        return out, kv_len
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
        elif layout == "BNSD":
            out.append(t.permute(0, 2, 1, 3))
        elif layout == "BSND":
            out.append(t)
        elif layout == "BSH":
            out.append(t.reshape(t.shape[0], t.shape[1], num_kv_heads, -1))
        else:
            raise NotImplementedError(f"sim ops: input_layout {layout!r} is not modelled")
    sk = out[0].shape[1]
    if given is None:
        kv_len = torch.full((batch,), sk)
    else:
        kv_len = _fit(given, batch, 0)
        if batch and int(kv_len.max()) > sk:
            raise ValueError(f"actual_seq_lengths_kv exceeds the key sequence length {sk}")
    return out, kv_len.clamp(min=0)


def _dequant(x: Tensor, scale: Tensor | None, offset: Tensor | None, nkv: int) -> Tensor:
    """Per-channel antiquant ``(x + offset) * scale`` over a ``(B, K, Nkv, D)`` tensor."""
    x = x.float()
    if scale is None:
        return x

    def shaped(p: Tensor) -> Tensor:
        p = p.float().to(x.device)
        if p.numel() == 1:
            return p.reshape(1)
        if p.numel() == nkv * x.shape[-1]:
            return p.reshape(1, 1, nkv, x.shape[-1])
        raise NotImplementedError(f"sim ops: antiquant parameter of shape {tuple(p.shape)}")

    if offset is not None:
        x = x + shaped(offset)
    return x * shaped(scale)


def _mask_tensor(mask: Tensor, batch: int, q: int, k: int) -> Tensor:
    """Explicit mode-0 mask -> ``(B or 1, Q, K)`` bool, True meaning 'masked out'."""
    m = mask
    if m.dim() == 4:
        if m.shape[1] != 1:
            raise NotImplementedError("sim ops: per-head attention masks are not modelled")
        m = m[:, 0]
    elif m.dim() == 2:
        m = m.unsqueeze(0)
    elif m.dim() != 3:
        raise ValueError(f"unsupported atten_mask rank {mask.dim()}")
    if m.shape[1] < q or m.shape[2] < k or m.shape[0] not in (1, batch):
        raise ValueError(f"atten_mask {tuple(mask.shape)} too small for (B={batch}, {q}, {k})")
    return m[:, :q, :k].to("cpu") != 0


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_len: Tensor,
    kv_len: Tensor,
    *,
    scale: float,
    sparse_mode: int,
    pre_tokens: int,
    next_tokens: int,
    atten_mask: Tensor | None,
    sinks: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Masked (GQA) softmax attention over ``q (B, Q, N, D)`` and ``k/v (B, K, Nkv, D)``.

    Returns the ``(B, Q, N, Dv)`` output and ``(B, Q, N)`` LSE. Query head ``h`` reads kv head
    ``h // (N // Nkv)``. The bmm loop runs over kv heads so the gathered KV is never permuted.
    """
    b, qn, n, d = q.shape
    kn, nkv = k.shape[1], k.shape[2]
    if n % nkv:
        raise ValueError(f"num_heads {n} is not a multiple of num_key_value_heads {nkv}")
    g = n // nkv
    dv = v.shape[-1]
    sink = None if sinks is None else sinks.float().to(q.device).reshape(1, 1, n, 1)
    if kn == 0 or b == 0:
        lse = (
            q.new_full((b, qn, n), float("-inf"))
            if sink is None
            else sink[..., 0].expand(b, qn, n).clone()
        )
        return q.new_zeros(b, qn, n, dv), lse
    k = k.float()
    v = v.float()
    qg = q.reshape(b, qn, nkv, g, d)
    s = torch.stack(
        [
            torch.matmul(qg[:, :, h].reshape(b, qn * g, d), k[:, :, h].transpose(1, 2))
            for h in range(nkv)
        ],
        dim=2,
    )  # (B, Q*g, Nkv, K)
    s = s.view(b, qn, g, nkv, kn).transpose(2, 3).reshape(b, qn, n, kn).mul_(scale)

    i = torch.arange(qn)[None, :, None]
    j = torch.arange(kn)[None, None, :]
    ql = q_len[:, None, None]
    kl = kv_len[:, None, None]
    allowed = (i < ql) & (j < kl)
    if sparse_mode in (0, 1):
        if atten_mask is not None:
            allowed = allowed & ~_mask_tensor(atten_mask, b, qn, kn)
    elif sparse_mode == 2:
        allowed = allowed & (j <= i)
    elif sparse_mode in (3, 4):
        p = kl - ql + i
        if sparse_mode == 3:
            allowed = allowed & (j <= p)
        else:
            allowed = allowed & (j >= p - int(pre_tokens)) & (j <= p + int(next_tokens))
    else:
        raise NotImplementedError(f"sim ops: sparse_mode {sparse_mode} is not modelled")
    s.masked_fill_(~allowed.to(s.device)[:, :, None], float("-inf"))

    m = s.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - m)
    eg = e.view(b, qn, nkv, g, kn)
    o = torch.stack(
        [
            torch.matmul(eg[:, :, h].reshape(b, qn * g, kn), v[:, :, h]).view(b, qn, g, dv)
            for h in range(nkv)
        ],
        dim=2,
    ).reshape(b, qn, n, dv)
    live = denom > 0
    o = torch.where(live, o / torch.where(live, denom, torch.ones_like(denom)), torch.zeros_like(o))
    lse = torch.where(live, m + torch.log(denom), torch.full_like(m, float("-inf")))
    return o, lse.squeeze(-1)


def _fia(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    layout: str,
    num_heads: int,
    num_kv_heads: int,
    scale: float,
    q_lens: SeqLens,
    kv_lens: SeqLens,
    block_table: Tensor | None,
    block_size: int,
    sparse_mode: int,
    pre_tokens: int,
    next_tokens: int,
    atten_mask: Tensor | None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    k_offset: Tensor | None = None,
    v_scale: Tensor | None = None,
    v_offset: Tensor | None = None,
    query_rope: Tensor | None = None,
    key_rope: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Shared FIA v1/v2 body; returns output and LSE in the caller's layout (float32)."""
    num_kv_heads = num_kv_heads or num_heads
    layout, _, out_layout = layout.partition("_")
    qs = _QuerySet(query, layout, num_heads, q_lens, query_rope)
    (kp, vp, kr), kv_len = _gather_kv(
        [key, value, key_rope],
        layout=layout,
        num_kv_heads=num_kv_heads,
        batch=qs.batch,
        block_table=block_table,
        block_size=block_size,
        kv_lens=kv_lens,
        default_ends=_lens(q_lens) if layout == "TND" else None,
    )
    kp = _dequant(kp, k_scale, k_offset, num_kv_heads)
    vp = _dequant(vp, v_scale, v_offset, num_kv_heads)
    q = qs.q
    if qs.rope is not None or kr is not None:
        if qs.rope is None or kr is None:
            raise ValueError("query_rope and key_rope must be given together")
        q = torch.cat([q, qs.rope], dim=-1)
        kp = torch.cat([kp, kr.float()], dim=-1)
    if q.shape[2] != num_heads:
        raise ValueError(f"query has {q.shape[2]} heads, num_heads={num_heads}")
    out, lse = _attend(
        q,
        kp,
        vp,
        qs.q_len,
        kv_len,
        scale=scale,
        sparse_mode=sparse_mode,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        atten_mask=atten_mask,
        sinks=sinks,
    )
    return qs.scatter_as(out, lse, out_layout or layout)


def _write(dst: Tensor, src: Tensor, what: str) -> None:
    """Copy into a caller-provided buffer that may be a larger (padded) or reshaped view."""
    if dst.numel() == src.numel():
        dst.copy_(src.reshape(dst.shape))
    elif dst.dim() and dst.shape[0] > src.shape[0] and dst[: src.shape[0]].numel() == src.numel():
        dst[: src.shape[0]].copy_(src.reshape(dst[: src.shape[0]].shape))
    else:
        raise ValueError(f"{what} buffer {tuple(dst.shape)} cannot hold {tuple(src.shape)}")


def _write_out(out: Sequence[Tensor], res: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    if len(out) != 2:
        raise ValueError("out must be [attention_out, softmax_lse]")
    attn_out, lse_out = out
    _write(attn_out, res, "attention_out")
    if lse_out is not None and (lse_out.numel() == lse.numel()):
        lse_out.copy_(lse.reshape(lse_out.shape))
    return attn_out, lse_out


def _lse_return(lse: Tensor, flag: bool, like: Tensor) -> Tensor:
    return lse.to(torch.float32) if flag else like.new_zeros(1, dtype=torch.float32)


# --------------------------------------------------------------------------------------------------
# npu_fused_infer_attention_score (v1)
# --------------------------------------------------------------------------------------------------


def _fia_v1_body(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    pse_shift,
    atten_mask,
    actual_seq_lengths,
    actual_seq_lengths_kv,
    dequant_scale1,
    quant_scale1,
    dequant_scale2,
    quant_scale2,
    quant_offset2,
    antiquant_scale,
    antiquant_offset,
    key_antiquant_scale,
    key_antiquant_offset,
    value_antiquant_scale,
    value_antiquant_offset,
    block_table,
    query_padding_size,
    kv_padding_size,
    key_shared_prefix,
    value_shared_prefix,
    actual_shared_prefix_len,
    query_rope,
    key_rope,
    key_rope_antiquant_scale,
    num_heads,
    scale,
    pre_tokens,
    next_tokens,
    input_layout,
    num_key_value_heads,
    sparse_mode,
    block_size,
    antiquant_mode,
    key_antiquant_mode,
    value_antiquant_mode,
) -> tuple[Tensor, Tensor]:
    _reject(
        pse_shift=pse_shift,
        dequant_scale1=dequant_scale1,
        quant_scale1=quant_scale1,
        dequant_scale2=dequant_scale2,
        quant_scale2=quant_scale2,
        quant_offset2=quant_offset2,
        query_padding_size=query_padding_size,
        kv_padding_size=kv_padding_size,
        key_shared_prefix=key_shared_prefix,
        value_shared_prefix=value_shared_prefix,
        actual_shared_prefix_len=actual_shared_prefix_len,
        key_rope_antiquant_scale=key_rope_antiquant_scale,
    )
    if antiquant_scale is not None or antiquant_offset is not None:
        # legacy combined form: dim 0 indexes (key, value)
        if antiquant_mode != 0:
            raise NotImplementedError("sim ops: per-token antiquant is not modelled")
        if key_antiquant_scale is None and antiquant_scale is not None:
            key_antiquant_scale, value_antiquant_scale = antiquant_scale[0], antiquant_scale[1]
        if key_antiquant_offset is None and antiquant_offset is not None:
            key_antiquant_offset, value_antiquant_offset = antiquant_offset[0], antiquant_offset[1]
    if key_antiquant_mode or value_antiquant_mode:
        raise NotImplementedError("sim ops: per-token antiquant is not modelled")
    return _fia(
        query,
        key,
        value,
        layout=input_layout,
        num_heads=num_heads,
        num_kv_heads=num_key_value_heads,
        scale=scale,
        q_lens=actual_seq_lengths,
        kv_lens=actual_seq_lengths_kv,
        block_table=block_table,
        block_size=block_size,
        sparse_mode=sparse_mode,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        atten_mask=atten_mask,
        k_scale=key_antiquant_scale,
        k_offset=key_antiquant_offset,
        v_scale=value_antiquant_scale,
        v_offset=value_antiquant_offset,
        query_rope=query_rope,
        key_rope=key_rope,
    )


def npu_fused_infer_attention_score(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    pse_shift: Tensor | None = None,
    atten_mask: Tensor | None = None,
    actual_seq_lengths: SeqLens = None,
    actual_seq_lengths_kv: SeqLens = None,
    dequant_scale1: Tensor | None = None,
    quant_scale1: Tensor | None = None,
    dequant_scale2: Tensor | None = None,
    quant_scale2: Tensor | None = None,
    quant_offset2: Tensor | None = None,
    antiquant_scale: Tensor | None = None,
    antiquant_offset: Tensor | None = None,
    key_antiquant_scale: Tensor | None = None,
    key_antiquant_offset: Tensor | None = None,
    value_antiquant_scale: Tensor | None = None,
    value_antiquant_offset: Tensor | None = None,
    block_table: Tensor | None = None,
    query_padding_size: Tensor | None = None,
    kv_padding_size: Tensor | None = None,
    key_shared_prefix: Tensor | None = None,
    value_shared_prefix: Tensor | None = None,
    actual_shared_prefix_len: SeqLens = None,
    query_rope: Tensor | None = None,
    key_rope: Tensor | None = None,
    key_rope_antiquant_scale: Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = INT_MAX,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    antiquant_mode: int = 0,
    key_antiquant_mode: int = 0,
    value_antiquant_mode: int = 0,
    softmax_lse_flag: bool = False,
) -> tuple[Tensor, Tensor]:
    """Functional FIA v1: returns ``(attention_out, softmax_lse)`` (LSE only if the flag is set)."""
    fia_rules("npu_fused_infer_attention_score", locals(), v2=False, in_graph=False)
    res, lse = _fia_v1_body(
        query,
        key,
        value,
        pse_shift,
        atten_mask,
        actual_seq_lengths,
        actual_seq_lengths_kv,
        dequant_scale1,
        quant_scale1,
        dequant_scale2,
        quant_scale2,
        quant_offset2,
        antiquant_scale,
        antiquant_offset,
        key_antiquant_scale,
        key_antiquant_offset,
        value_antiquant_scale,
        value_antiquant_offset,
        block_table,
        query_padding_size,
        kv_padding_size,
        key_shared_prefix,
        value_shared_prefix,
        actual_shared_prefix_len,
        query_rope,
        key_rope,
        key_rope_antiquant_scale,
        num_heads,
        scale,
        pre_tokens,
        next_tokens,
        input_layout,
        num_key_value_heads,
        sparse_mode,
        block_size,
        antiquant_mode,
        key_antiquant_mode,
        value_antiquant_mode,
    )
    return res.to(query.dtype), _lse_return(lse, softmax_lse_flag, query)


def npu_fused_infer_attention_score_out(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    pse_shift: Tensor | None = None,
    atten_mask: Tensor | None = None,
    actual_seq_lengths: SeqLens = None,
    actual_seq_lengths_kv: SeqLens = None,
    dequant_scale1: Tensor | None = None,
    quant_scale1: Tensor | None = None,
    dequant_scale2: Tensor | None = None,
    quant_scale2: Tensor | None = None,
    quant_offset2: Tensor | None = None,
    antiquant_scale: Tensor | None = None,
    antiquant_offset: Tensor | None = None,
    key_antiquant_scale: Tensor | None = None,
    key_antiquant_offset: Tensor | None = None,
    value_antiquant_scale: Tensor | None = None,
    value_antiquant_offset: Tensor | None = None,
    block_table: Tensor | None = None,
    query_padding_size: Tensor | None = None,
    kv_padding_size: Tensor | None = None,
    key_shared_prefix: Tensor | None = None,
    value_shared_prefix: Tensor | None = None,
    actual_shared_prefix_len: SeqLens = None,
    query_rope: Tensor | None = None,
    key_rope: Tensor | None = None,
    key_rope_antiquant_scale: Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = INT_MAX,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    antiquant_mode: int = 0,
    key_antiquant_mode: int = 0,
    value_antiquant_mode: int = 0,
    softmax_lse_flag: bool = False,
    workspace: Tensor | None = None,
    out: Sequence[Tensor],
) -> tuple[Tensor, Tensor]:
    """``npu_fused_infer_attention_score.out``: writes ``out=[attention_out, softmax_lse]``."""
    _fia_out_rules(locals(), in_graph=False)
    res, lse = _fia_v1_body(
        query,
        key,
        value,
        pse_shift,
        atten_mask,
        actual_seq_lengths,
        actual_seq_lengths_kv,
        dequant_scale1,
        quant_scale1,
        dequant_scale2,
        quant_scale2,
        quant_offset2,
        antiquant_scale,
        antiquant_offset,
        key_antiquant_scale,
        key_antiquant_offset,
        value_antiquant_scale,
        value_antiquant_offset,
        block_table,
        query_padding_size,
        kv_padding_size,
        key_shared_prefix,
        value_shared_prefix,
        actual_shared_prefix_len,
        query_rope,
        key_rope,
        key_rope_antiquant_scale,
        num_heads,
        scale,
        pre_tokens,
        next_tokens,
        input_layout,
        num_key_value_heads,
        sparse_mode,
        block_size,
        antiquant_mode,
        key_antiquant_mode,
        value_antiquant_mode,
    )
    return _write_out(out, res, lse)


def _npu_fused_infer_attention_score_get_max_workspace(
    query: Tensor, key: Tensor, value: Tensor, **kwargs: Any
) -> Tensor:
    """Host-side workspace getter; the op's parameters (its registered schema), bound as such."""
    _bind(npu_fused_infer_attention_score, query, key, value, kwargs)
    return _new_workspace(query, kwargs.get("query_rope"))


_npu_fused_infer_attention_score_get_max_workspace.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    npu_fused_infer_attention_score
).replace(return_annotation="Tensor")


# --------------------------------------------------------------------------------------------------
# npu_fused_infer_attention_score_v2
# --------------------------------------------------------------------------------------------------


def _fia_v2_body(
    query,
    key,
    value,
    query_rope,
    key_rope,
    pse_shift,
    atten_mask,
    actual_seq_qlen,
    actual_seq_kvlen,
    block_table,
    dequant_scale_query,
    dequant_scale_key,
    dequant_offset_key,
    dequant_scale_value,
    dequant_offset_value,
    dequant_scale_key_rope,
    quant_scale_out,
    quant_offset_out,
    learnable_sink,
    num_query_heads,
    num_key_value_heads,
    softmax_scale,
    pre_tokens,
    next_tokens,
    input_layout,
    sparse_mode,
    block_size,
    query_quant_mode,
    key_quant_mode,
    value_quant_mode,
) -> tuple[Tensor, Tensor]:
    _reject(
        pse_shift=pse_shift,
        dequant_scale_query=dequant_scale_query,
        dequant_scale_key_rope=dequant_scale_key_rope,
        quant_scale_out=quant_scale_out,
        quant_offset_out=quant_offset_out,
    )
    if query_quant_mode or key_quant_mode or value_quant_mode:
        raise NotImplementedError("sim ops: non-per-channel quant modes are not modelled")
    return _fia(
        query,
        key,
        value,
        layout=input_layout,
        num_heads=num_query_heads,
        num_kv_heads=num_key_value_heads,
        scale=softmax_scale,
        q_lens=actual_seq_qlen,
        kv_lens=actual_seq_kvlen,
        block_table=block_table,
        block_size=block_size,
        sparse_mode=sparse_mode,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        atten_mask=atten_mask,
        sinks=learnable_sink,
        k_scale=dequant_scale_key,
        k_offset=dequant_offset_key,
        v_scale=dequant_scale_value,
        v_offset=dequant_offset_value,
        query_rope=query_rope,
        key_rope=key_rope,
    )


def npu_fused_infer_attention_score_v2(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    query_rope: Tensor | None = None,
    key_rope: Tensor | None = None,
    pse_shift: Tensor | None = None,
    atten_mask: Tensor | None = None,
    actual_seq_qlen: SeqLens = None,
    actual_seq_kvlen: SeqLens = None,
    block_table: Tensor | None = None,
    dequant_scale_query: Tensor | None = None,
    dequant_scale_key: Tensor | None = None,
    dequant_offset_key: Tensor | None = None,
    dequant_scale_value: Tensor | None = None,
    dequant_offset_value: Tensor | None = None,
    dequant_scale_key_rope: Tensor | None = None,
    quant_scale_out: Tensor | None = None,
    quant_offset_out: Tensor | None = None,
    quant_scale_p: Tensor | None = None,
    learnable_sink: Tensor | None = None,
    num_query_heads: int = 1,
    num_key_value_heads: int = 0,
    softmax_scale: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = INT_MAX,
    input_layout: str = "BSH",
    sparse_mode: int = 0,
    block_size: int = 0,
    query_quant_mode: int = 0,
    key_quant_mode: int = 0,
    value_quant_mode: int = 0,
    inner_precise: int = 0,
    return_softmax_lse: bool = False,
    query_dtype: Any = None,
    key_dtype: Any = None,
    value_dtype: Any = None,
    query_rope_dtype: Any = None,
    key_rope_dtype: Any = None,
    key_shared_prefix_dtype: Any = None,
    value_shared_prefix_dtype: Any = None,
    dequant_scale_query_dtype: Any = None,
    dequant_scale_key_dtype: Any = None,
    dequant_scale_value_dtype: Any = None,
    dequant_scale_key_rope_dtype: Any = None,
    out_dtype: Any = None,
) -> tuple[Tensor, Tensor]:
    """Functional FIA v2 (``learnable_sink`` = GPT-OSS sinks); returns ``(out, softmax_lse)``."""
    fia_rules("npu_fused_infer_attention_score_v2", locals(), v2=True, in_graph=False)
    _reject(quant_scale_p=quant_scale_p, out_dtype=out_dtype)
    res, lse = _fia_v2_body(
        query,
        key,
        value,
        query_rope,
        key_rope,
        pse_shift,
        atten_mask,
        actual_seq_qlen,
        actual_seq_kvlen,
        block_table,
        dequant_scale_query,
        dequant_scale_key,
        dequant_offset_key,
        dequant_scale_value,
        dequant_offset_value,
        dequant_scale_key_rope,
        quant_scale_out,
        quant_offset_out,
        learnable_sink,
        num_query_heads,
        num_key_value_heads,
        softmax_scale,
        pre_tokens,
        next_tokens,
        input_layout,
        sparse_mode,
        block_size,
        query_quant_mode,
        key_quant_mode,
        value_quant_mode,
    )
    return res.to(query.dtype), _lse_return(lse, return_softmax_lse, query)


def npu_fused_infer_attention_score_v2_out(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    query_rope: Tensor | None = None,
    key_rope: Tensor | None = None,
    pse_shift: Tensor | None = None,
    atten_mask: Tensor | None = None,
    actual_seq_qlen: SeqLens = None,
    actual_seq_kvlen: SeqLens = None,
    block_table: Tensor | None = None,
    dequant_scale_query: Tensor | None = None,
    dequant_scale_key: Tensor | None = None,
    dequant_offset_key: Tensor | None = None,
    dequant_scale_value: Tensor | None = None,
    dequant_offset_value: Tensor | None = None,
    dequant_scale_key_rope: Tensor | None = None,
    quant_scale_out: Tensor | None = None,
    quant_offset_out: Tensor | None = None,
    quant_scale_p: Tensor | None = None,
    learnable_sink: Tensor | None = None,
    num_query_heads: int = 1,
    num_key_value_heads: int = 0,
    softmax_scale: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = INT_MAX,
    input_layout: str = "BSH",
    sparse_mode: int = 0,
    block_size: int = 0,
    query_quant_mode: int = 0,
    key_quant_mode: int = 0,
    value_quant_mode: int = 0,
    inner_precise: int = 0,
    return_softmax_lse: bool = False,
    query_dtype: Any = None,
    key_dtype: Any = None,
    value_dtype: Any = None,
    query_rope_dtype: Any = None,
    key_rope_dtype: Any = None,
    key_shared_prefix_dtype: Any = None,
    value_shared_prefix_dtype: Any = None,
    dequant_scale_query_dtype: Any = None,
    dequant_scale_key_dtype: Any = None,
    dequant_scale_value_dtype: Any = None,
    dequant_scale_key_rope_dtype: Any = None,
    out_dtype: Any = None,
    workspace: Tensor | None = None,
    out: Sequence[Tensor],
) -> tuple[Tensor, Tensor]:
    """``npu_fused_infer_attention_score_v2.out``: writes ``out=[attention_out, softmax_lse]``."""
    _reject(quant_scale_p=quant_scale_p, out_dtype=out_dtype)
    _fia_v2_out_rules(locals(), in_graph=False)
    res, lse = _fia_v2_body(
        query,
        key,
        value,
        query_rope,
        key_rope,
        pse_shift,
        atten_mask,
        actual_seq_qlen,
        actual_seq_kvlen,
        block_table,
        dequant_scale_query,
        dequant_scale_key,
        dequant_offset_key,
        dequant_scale_value,
        dequant_offset_value,
        dequant_scale_key_rope,
        quant_scale_out,
        quant_offset_out,
        learnable_sink,
        num_query_heads,
        num_key_value_heads,
        softmax_scale,
        pre_tokens,
        next_tokens,
        input_layout,
        sparse_mode,
        block_size,
        query_quant_mode,
        key_quant_mode,
        value_quant_mode,
    )
    return _write_out(out, res, lse)


def _npu_fused_infer_attention_score_v2_get_max_workspace(
    query: Tensor, key: Tensor, value: Tensor, **kwargs: Any
) -> Tensor:
    """Host-side v2 workspace getter; the op's parameters (its registered schema), bound as such."""
    _bind(npu_fused_infer_attention_score_v2, query, key, value, kwargs)
    return _new_workspace(query, kwargs.get("query_rope"))


_npu_fused_infer_attention_score_v2_get_max_workspace.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    npu_fused_infer_attention_score_v2
).replace(return_annotation="Tensor")


def _fia_out_rules(a: dict[str, Any], in_graph: bool) -> None:
    fia_rules("npu_fused_infer_attention_score.out", a, v2=False, in_graph=in_graph)
    _check_workspace(a["workspace"], a["query"], a["query_rope"])


def _fia_v2_out_rules(a: dict[str, Any], in_graph: bool) -> None:
    fia_rules("npu_fused_infer_attention_score_v2.out", a, v2=True, in_graph=in_graph)
    _check_workspace(a["workspace"], a["query"], a["query_rope"])


def _bind(fn: Callable[..., Any], query: Tensor, key: Tensor, value: Tensor, kw: dict) -> None:
    """Reject keywords the op itself would reject (a getter typo should fail like the op)."""
    inspect.signature(fn).bind(query, key, value, **kw)


# --------------------------------------------------------------------------------------------------
# paged attention (ATB), KV cache writes
# --------------------------------------------------------------------------------------------------


def _pa_compute(
    query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table, context_lens
) -> Tensor:
    t = query.shape[0]
    q3 = query.reshape(t, num_heads, -1)
    lens = _lens(context_lens)
    batch = min(t, lens.numel())
    qp = q3[:batch].unsqueeze(1).float()
    (kp, vp), kv_len = _gather_kv(
        [key_cache, value_cache],
        layout="BSND",
        num_kv_heads=num_kv_heads,
        batch=batch,
        block_table=block_table,
        block_size=key_cache.shape[1],
        kv_lens=lens,
    )
    res, _ = _attend(
        qp,
        kp,
        vp,
        torch.ones(batch, dtype=torch.long),
        kv_len,
        scale=scale_value,
        sparse_mode=0,
        pre_tokens=INT_MAX,
        next_tokens=INT_MAX,
        atten_mask=None,
        sinks=None,
    )
    full = res.new_zeros(t, num_heads, res.shape[-1])
    full[:batch] = res[:, 0]
    return full


def _context_lens_tensor(context_lens: Any, op: str) -> Tensor:
    """The registered schemas type ``context_lens`` as ``Tensor``: a list is a TypeError."""
    if not isinstance(context_lens, Tensor):
        raise TypeError(
            f"{op}(): argument 'context_lens' (position 8) must be Tensor, not "
            f"{type(context_lens).__name__}"
        )
    return context_lens


def _pa_workspace_bytes(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    num_kv_heads: int,
    num_heads: int,
    block_table: Tensor,
    context_lens: Tensor,
    out: Tensor,
) -> int:
    """What a PA launch needs: grows with every argument the real getter can size it from.

    Query and output staging, per (request, head) partial results over the longest context
    (rounded up to a block), one block of each cache, and the block table itself.
    """
    lens = _lens(context_lens)
    batch = lens.numel()
    block_size = key_cache.shape[1] if key_cache.dim() >= 2 else 1
    longest = int(lens.max()) if batch else 0
    span = -(-max(longest, 1) // block_size) * block_size
    per_block = max(key_cache[0].numel(), 1) if key_cache.shape[0] else 1
    size = (
        4 * query.numel()
        + out.element_size() * out.numel()
        + 4 * batch * max(num_heads, 1) * span
        + key_cache.element_size() * per_block
        + value_cache.element_size() * max(value_cache[0].numel() if value_cache.shape[0] else 1, 1)
        + 8 * block_table.numel()
        + 4 * max(num_kv_heads, 1)
    )
    return -(-size // _PA_WORKSPACE_ALIGN) * _PA_WORKSPACE_ALIGN


def _npu_paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: Tensor,
    context_lens: Tensor,
    out: Tensor,
    *,
    workspace: Tensor | None = None,
) -> None:
    """ATB paged decode attention: one query token per request, ``len(context_lens)`` requests.

    Caches are ``(num_blocks, block_size, num_kv_heads, head_dim)``; rows of ``out`` past the
    last request are zeroed. Writes ``out`` and returns nothing (``-> ()``).
    """
    _context_lens_tensor(context_lens, "_npu_paged_attention")
    _pa_launch_rules(locals(), in_graph=False)
    res = _pa_compute(
        query,
        key_cache,
        value_cache,
        num_kv_heads,
        num_heads,
        scale_value,
        block_table,
        context_lens,
    )
    _write(out, res, "out")


def _pa_launch_rules(a: dict[str, Any], in_graph: bool) -> None:
    """What a PA launch is refused for: ``op_rules.pa_rules``, and a workspace too small.

    The workspace's size is checked where the launch runs (eagerly, and at replay, when the task
    runs this body with the arguments its update gave it), not for a launch recorded into a
    graph or a relaunch being recorded: the release captures every PA layer of a size with the
    workspace it cached for the first one (``full_graph_pa``, ``graph_params.workspaces``), which
    a later, larger layer outgrows (Gemma4's global layers); that captured launch never runs as
    captured, since every replay is preceded by the update that sizes the workspace afresh."""
    pa_rules("_npu_paged_attention", a, in_graph=in_graph)
    workspace = a["workspace"]
    if workspace is not None and not in_graph:
        need = _pa_workspace_bytes(
            a["query"],
            a["key_cache"],
            a["value_cache"],
            a["num_kv_heads"],
            a["num_heads"],
            a["block_table"],
            a["context_lens"],
            a["out"],
        )
        have = workspace.numel() * workspace.element_size()
        if have < need:
            raise RuntimeError(
                f"sim ops: PA workspace of {have} bytes is smaller than the {need} this launch "
                "needs (it was sized for other lengths, block table or shapes)"
            )


def _npu_paged_attention_get_workspace(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: Tensor,
    context_lens: Tensor,
    out: Tensor,
) -> Tensor:
    """Host-side PA workspace getter: sized from the shapes, the block table and the lengths."""
    _context_lens_tensor(context_lens, "_npu_paged_attention_get_workspace")
    size = _pa_workspace_bytes(
        query, key_cache, value_cache, num_kv_heads, num_heads, block_table, context_lens, out
    )
    return torch.empty(size, dtype=torch.uint8, device=query.device)


def _slots(slot_mapping: Tensor, n: int) -> tuple[Tensor, Tensor]:
    slots = slot_mapping.reshape(-1)[:n].to(torch.long)
    keep = slots >= 0
    return slots, keep


def _npu_reshape_and_cache(
    key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_indices: Tensor
) -> None:
    """Scatter tokens into ``(num_blocks, block_size, ...)`` caches by flat slot; skip slot < 0."""
    n = key.shape[0]
    if slot_indices.numel() < n:
        raise ValueError(f"{slot_indices.numel()} slots for {n} tokens")
    slots, keep = _slots(slot_indices, n)
    bs = key_cache.shape[1]
    slots = slots[keep].to(key_cache.device)
    blk, off = slots // bs, slots % bs
    for src, cache in ((key, key_cache), (value, value_cache)):
        vals = src[keep.to(src.device)].reshape(-1, *cache.shape[2:]).to(cache.dtype)
        cache[blk, off] = vals


def npu_scatter_pa_kv_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    *,
    compress_lens: Tensor | None = None,
    compress_seq_offsets: Tensor | None = None,
    seq_lens: Tensor | None = None,
    cache_mode: str | None = "PA_NZ",
) -> None:
    """KV cache scatter: ``PA_NZ`` (the default, the C8 path) writes the NZ 5-D cache view,
    ``Norm`` (the A5 path) a ``(num_blocks, block_size, ...)`` cache."""
    _reject(compress_lens=compress_lens, compress_seq_offsets=compress_seq_offsets)
    mode = cache_mode or "PA_NZ"
    if mode not in ("PA_NZ", "Norm"):
        raise NotImplementedError(f"sim ops: cache_mode {cache_mode!r} is not modelled")
    if any((cache.dim() == 5) != (mode == "PA_NZ") for cache in (key_cache, value_cache)):
        raise ValueError(
            f"cache_mode {mode!r} needs {'NZ 5-D' if mode == 'PA_NZ' else 'ND'} caches, got "
            f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    n = key.shape[0]
    if slot_mapping.numel() < n:
        raise ValueError(f"{slot_mapping.numel()} slots for {n} tokens")
    slots, keep = _slots(slot_mapping, n)
    slots = slots[keep]
    for src, cache in ((key, key_cache), (value, value_cache)):
        if cache.dim() == 5:
            nb, nkv, d1, bs, nz = cache.shape
            view = cache.permute(0, 3, 1, 2, 4)  # (nb, bs, nkv, d1, nz), same storage
        else:
            bs = cache.shape[1]
            view = cache
        vals = src[keep.to(src.device)].reshape(-1, *view.shape[2:]).to(cache.dtype)
        s = slots.to(cache.device)
        view[s // bs, s % bs] = vals


# --------------------------------------------------------------------------------------------------
# npu_fusion_attention (training-style FA; pooling / encoder and large-head prefill paths)
# --------------------------------------------------------------------------------------------------


def npu_fusion_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    head_num: int,
    input_layout: str,
    pse: Tensor | None = None,
    padding_mask: Tensor | None = None,
    atten_mask: Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = INT_MAX,
    next_tockens: int = INT_MAX,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: SeqLens = None,
    actual_seq_kvlen: SeqLens = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: Tensor | None = None,
    dropout_mask: Tensor | None = None,
    seed: int = 0,
    offset: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor, int, int, int]:
    """Dense FA: TND lengths are cumulative for both q and kv.

    Returns ``(out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)`` where the
    max/sum pair is ``(lse, 1)`` broadcast to ``(..., 8)``: equivalent for recombination.
    """
    _reject(pse=pse, padding_mask=padding_mask, prefix=prefix, sink=sink, dropout_mask=dropout_mask)
    if softmax_layout:
        raise NotImplementedError("sim ops: softmax_layout is not modelled")
    if keep_prob != 1.0:
        raise NotImplementedError("sim ops: dropout (keep_prob < 1) is not modelled")
    nkv = head_num
    if input_layout in ("TND", "BNSD"):
        nkv = key.shape[1]
    elif input_layout == "BSND":
        nkv = key.shape[2]
    elif input_layout == "BSH":
        nkv = key.shape[2] * head_num // query.shape[2]
    res, lse = _fia(
        query,
        key,
        value,
        layout=input_layout,
        num_heads=head_num,
        num_kv_heads=nkv,
        scale=scale,
        q_lens=actual_seq_qlen,
        kv_lens=actual_seq_kvlen,
        block_table=None,
        block_size=0,
        sparse_mode=sparse_mode,
        pre_tokens=pre_tockens,
        next_tokens=next_tockens,
        atten_mask=atten_mask,
    )
    smax = lse.expand(*lse.shape[:-1], 8).contiguous()
    ssum = torch.ones_like(smax)
    return res.to(query.dtype), smax, ssum, query.new_zeros(0), 0, 0, 0


# --------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------

npu_fused_infer_attention_score.out = npu_fused_infer_attention_score_out  # type: ignore[attr-defined]
npu_fused_infer_attention_score_v2.out = npu_fused_infer_attention_score_v2_out  # type: ignore[attr-defined]

# What each op refuses at launch, with every parameter bound: ``runtime.SimOp`` runs these at a
# capture inside a task group and at every relaunch inside a task update (``in_graph``), where
# the op body itself does not run until replay.
npu_fused_infer_attention_score.launch_rules = lambda a, in_graph: fia_rules(  # type: ignore[attr-defined]
    "npu_fused_infer_attention_score", a, v2=False, in_graph=in_graph
)
npu_fused_infer_attention_score_out.launch_rules = _fia_out_rules  # type: ignore[attr-defined]
npu_fused_infer_attention_score_v2.launch_rules = lambda a, in_graph: fia_rules(  # type: ignore[attr-defined]
    "npu_fused_infer_attention_score_v2", a, v2=True, in_graph=in_graph
)
npu_fused_infer_attention_score_v2_out.launch_rules = _fia_v2_out_rules  # type: ignore[attr-defined]
_npu_paged_attention.launch_rules = _pa_launch_rules  # type: ignore[attr-defined]

REFERENCE_OPS: dict[str, Callable[..., Any]] = {
    "npu_fused_infer_attention_score": npu_fused_infer_attention_score,
    "npu_fused_infer_attention_score.out": npu_fused_infer_attention_score_out,
    "_npu_fused_infer_attention_score_get_max_workspace": (
        _npu_fused_infer_attention_score_get_max_workspace
    ),
    "npu_fused_infer_attention_score_v2": npu_fused_infer_attention_score_v2,
    "npu_fused_infer_attention_score_v2.out": npu_fused_infer_attention_score_v2_out,
    "_npu_fused_infer_attention_score_v2_get_max_workspace": (
        _npu_fused_infer_attention_score_v2_get_max_workspace
    ),
    "_npu_paged_attention": _npu_paged_attention,
    "_npu_paged_attention_get_workspace": _npu_paged_attention_get_workspace,
    "_npu_reshape_and_cache": _npu_reshape_and_cache,
    "npu_scatter_pa_kv_cache": npu_scatter_pa_kv_cache,
    "npu_fusion_attention": npu_fusion_attention,
}

HOST_FUNCTIONS: frozenset[str] = frozenset(
    {
        "_npu_fused_infer_attention_score_get_max_workspace",
        "_npu_fused_infer_attention_score_v2_get_max_workspace",
        "_npu_paged_attention_get_workspace",
    }
)

__all__ = ["HOST_FUNCTIONS", "INT_MAX", "REFERENCE_OPS"]
