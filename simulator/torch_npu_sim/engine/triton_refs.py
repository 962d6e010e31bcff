"""Torch references behind the Triton kernel launches the engine makes on a host without Triton.

Without Triton, vLLM's ``triton.jit`` placeholder returns the kernel's Python function, and a
launch ``kernel[grid](...)`` fails ("'function' object is not subscriptable"). On the NPU,
triton-ascend compiles and runs these kernels. Here the placeholder's decorators return a
:class:`KernelStub`: ``stub[grid](*args, **kwargs)`` runs the kernel's torch reference from
:data:`REFERENCES` (keyed by the kernel's module and name), and a kernel without one raises
naming it, so a missing reference is loud. vLLM's choice of code paths (``HAS_TRITON``) is left as
it is: only kernels launched whatever ``HAS_TRITON`` says need a reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..runtime import SimulatorError

Reference = Callable[..., None]

#: Launches per kernel in this process (``module.name``): which kernels a case ran.
LAUNCHES: dict[str, int] = {}


class KernelStub:
    """A jitted kernel's stand-in: ``stub[grid](...)`` runs its torch reference."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.key = f"{fn.__module__}.{fn.__qualname__}"
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        reference = REFERENCES.get(self.key)
        if reference is None:
            raise SimulatorError(
                f"Triton kernel {self.key} has no torch reference in the simulator"
            )
        LAUNCHES[self.key] = LAUNCHES.get(self.key, 0) + 1
        return functools.partial(
            reference, tuple(grid) if isinstance(grid, (tuple, list)) else grid
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise SimulatorError(f"Triton kernel {self.key} called without a launch grid")

    def __repr__(self) -> str:
        return f"<triton kernel stub {self.key}>"


def _decorator(*args: Any, **kwargs: Any) -> Any:
    """``triton.jit`` / ``autotune`` / ``heuristics``, bare or with arguments."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        fn = args[0]
        return fn if isinstance(fn, KernelStub) else KernelStub(fn)
    return _decorator


def install(triton_utils: Any) -> None:
    """Point the Triton placeholder's decorators at :class:`KernelStub` (never a real Triton)."""
    from vllm.triton_utils.importing import TritonPlaceholder

    placeholder = triton_utils.triton
    if not isinstance(placeholder, TritonPlaceholder):
        return
    for name in ("jit", "autotune", "heuristics"):
        setattr(placeholder, name, _decorator)


# --------------------------------------------------------------------------------------------
# References, one per kernel: ``reference(grid, *launch args, **launch kwargs)``.


def compute_slot_mapping(
    grid: tuple[int, ...],
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_table_stride: int,
    block_size: int,
    slot_mapping: torch.Tensor,
    *,
    TOTAL_CP_WORLD_SIZE: int,  # noqa: N803 - the kernel's constexpr names
    TOTAL_CP_RANK: int,  # noqa: N803
    CP_KV_CACHE_INTERLEAVE_SIZE: int,  # noqa: N803
    PAD_ID: int,  # noqa: N803
    BLOCK_SIZE: int,  # noqa: N803
) -> None:
    """vLLM's ``_compute_slot_mapping_kernel``: one program per request plus one that pads.

    Token ``t`` of request ``r`` (``query_start_loc[r] <= t < query_start_loc[r + 1]``) gets slot
    ``block_table[r, pos // vbs] * block_size + local offset`` when this context-parallel rank holds
    it, else ``PAD_ID``; slots ``num_tokens .. max_num_tokens`` get ``PAD_ID``.
    """
    num_reqs = grid[0] - 1
    starts = query_start_loc[: num_reqs + 1].long()
    counts = starts[1:] - starts[:-1]
    req = torch.repeat_interleave(torch.arange(num_reqs), counts)  # the ranges tile the tokens
    tokens = torch.arange(int(starts[0]), int(starts[-1]))
    world, rank, interleave = TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK, CP_KV_CACHE_INTERLEAVE_SIZE
    pos = positions[tokens].long()
    virtual = block_size * world
    index = pos // virtual
    numbers = block_table.reshape(-1)[req * block_table_stride + index].long()
    offsets = pos - index * virtual
    local = (offsets // interleave) % world == rank
    local_offsets = (offsets // (world * interleave)) * interleave + offsets % interleave
    slots = torch.where(local, numbers * block_size + local_offsets, PAD_ID)
    slot_mapping[tokens] = slots.to(slot_mapping.dtype)
    slot_mapping[num_tokens:max_num_tokens] = PAD_ID


# --------------------------------------------------------------------------------------------
# Model runner v2 (vllm/v1/worker/gpu, vllm_ascend/worker/v2): the input preparation, block
# tables and greedy sampling kernels a decode launches. Each reference follows its kernel program
# by program (``grid``), on the launch's own tensors; the unit tests check each against a
# plain-Python oracle written from the kernel's source (tests/test_triton_refs_v2.py).

#: Tensors by ``data_ptr()``: v2's block tables hand kernels tables of addresses
#: (``BlockTables._make_ptr_tensor``, recorded by a shim); a reference resolves them here.
POINTED: dict[int, torch.Tensor] = {}


def tensor_at(pointers: torch.Tensor, index: int) -> torch.Tensor:
    """The tensor whose address is ``pointers[index]`` (Triton's ``_load_ptr``)."""
    address = int(pointers[index])
    tensor = POINTED.get(address)
    if tensor is None:
        raise SimulatorError(f"no tensor recorded at address {address:#x} (a pointer table)")
    return tensor


def _ints(tensor: torch.Tensor) -> list[int]:
    return [int(v) for v in tensor.tolist()]


def apply_write(
    grid: tuple[int, ...],
    output: torch.Tensor,
    output_stride: int,
    write_indices: torch.Tensor,
    write_starts: torch.Tensor,
    write_contents: torch.Tensor,
    write_cu_lens: torch.Tensor,
    **_constexprs: Any,
) -> None:
    """``buffer_utils._apply_write_kernel``: write ``pid``'s content (``write_cu_lens`` ends,
    cumulative) into row ``write_indices[pid]`` of ``output`` from ``write_starts[pid]`` on."""
    flat = output.view(-1)
    ends = write_cu_lens[: grid[0]].long()
    begins = torch.cat([ends.new_zeros(1), ends[:-1]])
    for pid in range(grid[0]):
        at = int(write_indices[pid]) * output_stride + int(write_starts[pid])
        length = int(ends[pid] - begins[pid])
        flat[at : at + length] = write_contents[int(begins[pid]) : int(ends[pid])].to(flat.dtype)


def prepare_prefill_inputs(
    grid: tuple[int, ...],
    input_ids: torch.Tensor,
    next_prefill_tokens: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    all_token_ids: torch.Tensor,
    all_token_ids_stride: int,
    prefill_lens: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    **_constexprs: Any,
) -> None:
    """``input_batch._prepare_prefill_inputs_kernel``: a prefilling request's query tokens from
    its prompt (``all_token_ids`` from ``num_computed``), and the token after the chunk."""
    tokens = all_token_ids.view(-1)
    for batch in range(grid[0]):
        req = int(idx_mapping[batch])
        prefill_len, computed = int(prefill_lens[req]), int(num_computed_tokens[req])
        if computed >= prefill_len:
            continue
        start, end = int(query_start_loc[batch]), int(query_start_loc[batch + 1])
        row = req * all_token_ids_stride
        input_ids[start:end] = tokens[row + computed : row + computed + end - start].to(
            input_ids.dtype
        )
        following = computed + end - start
        if following < prefill_len:
            next_prefill_tokens[req] = tokens[row + following]


def prepare_pos_seq_lens(
    grid: tuple[int, ...],
    pos: torch.Tensor,
    seq_lens: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    max_num_reqs: int,
    **_constexprs: Any,
) -> None:
    """``input_batch._prepare_pos_seq_lens_kernel``: each request's positions and sequence
    length; the last program zeroes the sequence lengths of unused rows (full graphs)."""
    num_reqs = grid[0] - 1
    seq_lens[num_reqs:max_num_reqs] = 0
    if not num_reqs:
        return
    starts = query_start_loc[: num_reqs + 1].long()
    computed = num_computed_tokens[idx_mapping[:num_reqs].long()].long()
    lengths = starts[1:] - starts[:-1]
    seq_lens[:num_reqs] = (computed + lengths).to(seq_lens.dtype)
    tokens = torch.arange(int(starts[0]), int(starts[-1]))
    req = torch.repeat_interleave(torch.arange(num_reqs), lengths)
    pos[tokens] = (computed[req] + tokens - starts[req]).to(pos.dtype)


def combine_sampled_and_draft_tokens(
    grid: tuple[int, ...],
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_tokens_stride: int,
    cu_num_logits: torch.Tensor,
    logits_indices: torch.Tensor,
    *,
    BLOCK_SIZE: int,  # noqa: N803 - the kernel's constexpr name
) -> None:
    """``input_batch._combine_sampled_and_draft_tokens_kernel``: the logits' indices (the query's
    last ``num_logits`` tokens), and for a decoding request its last sampled token followed by
    its draft tokens as the query's last tokens."""
    drafts = draft_tokens.view(-1)
    for batch in range(grid[0]):
        req = int(idx_mapping[batch])
        first, last = int(cu_num_logits[batch]), int(cu_num_logits[batch + 1])
        num_logits = min(last - first, BLOCK_SIZE)
        query_end = int(query_start_loc[batch + 1])
        start = query_end - (last - first)
        logits_indices[first : first + num_logits] = torch.arange(start, start + num_logits)
        if int(seq_lens[batch]) <= int(prefill_len[req]):
            continue
        input_ids[start] = last_sampled_tokens[req]
        num_drafts = min(last - first - 1, BLOCK_SIZE)
        if num_drafts > 0:
            row = req * draft_tokens_stride
            input_ids[query_end - (last - first - 1) :][:num_drafts] = drafts[
                row : row + num_drafts
            ].to(input_ids.dtype)


def get_num_sampled_and_rejected(
    grid: tuple[int, ...],
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    prefill_len: torch.Tensor,
    **_constexprs: Any,
) -> None:
    """``input_batch._get_num_sampled_and_rejected_kernel``: a request still prefilling in
    chunks samples and rejects nothing; otherwise rejected = logits - sampled."""
    n = grid[0]
    chunked = seq_lens[:n].long() < prefill_len[idx_mapping[:n].long()].long()
    logits = (cu_num_logits[1 : n + 1] - cu_num_logits[:n]).long()
    sampled = torch.where(chunked, 0, num_sampled[:n].long())
    num_sampled[:n] = sampled.to(num_sampled.dtype)
    num_rejected[:n] = torch.where(chunked, 0, logits - sampled).to(num_rejected.dtype)


def post_update(
    grid: tuple[int, ...],
    idx_mapping: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    output_bin_counts: torch.Tensor | None,
    output_bin_counts_stride: int,
    sampled_tokens: torch.Tensor,
    sampled_tokens_stride: int,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    query_start_loc: torch.Tensor | None,
    all_token_ids: torch.Tensor,
    all_token_ids_stride: int,
    total_len: torch.Tensor,
    **_launch: Any,
) -> None:
    """``input_batch._post_update_kernel``: append each request's sampled tokens to its token
    ids (and output counts), remember the last one, advance its computed tokens by the query's
    length less the rejected tokens."""
    sampled_flat, all_flat = sampled_tokens.view(-1), all_token_ids.view(-1)
    counts = None if output_bin_counts is None else output_bin_counts.view(-1)
    for batch in range(grid[0]):
        req = int(idx_mapping[batch])
        if req < 0:
            continue
        length, n = int(total_len[req]), int(num_sampled[batch])
        tokens = sampled_flat[batch * sampled_tokens_stride :][:n]
        if n > 0:
            last_sampled_tokens[req] = tokens[-1]
            total_len[req] = length + n
        at = req * all_token_ids_stride + length
        all_flat[at : at + n] = tokens.to(all_flat.dtype)
        if counts is not None:
            for token in _ints(tokens):
                counts[req * output_bin_counts_stride + token] += 1
        query = 0
        if query_start_loc is not None:
            query = int(query_start_loc[batch + 1]) - int(query_start_loc[batch])
        delta = query - int(num_rejected[batch])
        if delta:
            num_computed_tokens[req] += delta


def gather_block_tables(
    grid: tuple[int, ...],
    batch_idx_to_req_idx: torch.Tensor,
    src_block_table_ptrs: torch.Tensor,
    dst_block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    num_blocks: torch.Tensor,
    num_blocks_stride: int,
    num_reqs: int,
    **_constexprs: Any,
) -> None:
    """``block_table._gather_block_tables_kernel``: per KV-cache group, copy each request's
    used blocks into the batch's row; zero the padded rows."""
    groups, padded = grid
    counts = num_blocks.view(-1)
    for group in range(groups):
        stride = int(block_table_strides[group])
        src = tensor_at(src_block_table_ptrs, group).view(-1)
        dst = tensor_at(dst_block_table_ptrs, group).view(-1)
        for batch in range(padded):
            row = batch * stride
            if batch >= num_reqs:
                dst[row : row + stride] = 0
                continue
            req = int(batch_idx_to_req_idx[batch])
            used = int(counts[group * num_blocks_stride + req])
            dst[row : row + used] = src[req * stride : req * stride + used]


def ascend_compute_slot_mappings(
    grid: tuple[int, ...],
    max_num_tokens: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    pos: torch.Tensor,
    block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    block_sizes: torch.Tensor,
    slot_mappings: torch.Tensor,
    slot_mappings_stride: int,
    cp_rank: int,
    *,
    CP_SIZE: int,  # noqa: N803 - the kernel's constexpr names
    CP_INTERLEAVE: int,  # noqa: N803
    PAD_ID: int,  # noqa: N803
    **_constexprs: Any,
) -> None:
    """vllm-ascend's ``worker/v2/block_table._compute_slot_mappings_kernel``: per KV-cache group,
    each token's slot from its request's block table (block numbers go through float32, as the
    kernel's gather does); the last program pads from the real token count on."""
    groups, programs = grid
    num_reqs = programs - 1
    flat = slot_mappings.view(-1)
    real = int(query_start_loc[num_reqs])
    for group in range(groups):
        out = flat[group * slot_mappings_stride :][:max_num_tokens]
        out[real:] = PAD_ID
        if not num_reqs:
            continue
        table = tensor_at(block_table_ptrs, group).view(-1)
        stride, size = int(block_table_strides[group]), int(block_sizes[group])
        starts = query_start_loc[: num_reqs + 1].long()
        lengths = starts[1:] - starts[:-1]
        tokens = torch.arange(int(starts[0]), int(starts[-1]))
        req = idx_mapping[:num_reqs].long()[
            torch.repeat_interleave(torch.arange(num_reqs), lengths)
        ]
        position = pos[tokens].to(torch.int32).long()
        index = position // (size * CP_SIZE)
        offset = position - size * CP_SIZE * index
        numbers = table[req * stride + index].to(torch.float32)
        if CP_SIZE == 1:
            slots = numbers * size + offset
        else:
            local = (offset // CP_INTERLEAVE) % CP_SIZE == cp_rank
            local_offset = (offset // (CP_INTERLEAVE * CP_SIZE)) * CP_INTERLEAVE
            slots = numbers * size + local_offset + offset % CP_INTERLEAVE
            slots = torch.where(local, slots, float(PAD_ID))
        out[tokens] = slots.to(out.dtype)


def gumbel_sample(
    grid: tuple[int, ...],
    local_argmax: torch.Tensor,
    local_argmax_stride: int,
    local_max: torch.Tensor,
    local_max_stride: int,
    processed_logits: torch.Tensor | None,
    processed_logits_stride: int,
    processed_logits_col: torch.Tensor | None,
    logits: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping: torch.Tensor,
    seeds: torch.Tensor,
    pos: torch.Tensor,
    temp: torch.Tensor,
    vocab_size: int,
    *,
    BLOCK_SIZE: int,  # noqa: N803 - the kernel's constexpr names
    APPLY_TEMPERATURE: bool,  # noqa: N803
    USE_FP64: bool,  # noqa: N803
) -> None:
    """``sample/gumbel._gumbel_sample_kernel``, greedy requests only (temperature 0: no Gumbel
    noise, no temperature): per vocabulary block, the largest logit (float32) and its index.
    A request with a temperature raises: its noise comes from Triton's Philox stream, which this
    reference does not reproduce."""
    num_tokens, num_blocks = grid
    reqs = expanded_idx_mapping[:num_tokens].long()
    if bool((temp[reqs] != 0).any()):
        raise SimulatorError(
            "Triton kernel _gumbel_sample_kernel: the torch reference samples greedily only "
            "(temperature 0); a request here has a temperature"
        )
    rows = logits[:num_tokens, :vocab_size].to(torch.float32)
    if processed_logits is not None:
        col = 0 if processed_logits_col is None else int(processed_logits_col)
        flat = processed_logits.view(-1)
        for token in range(num_tokens):
            at = int(reqs[token]) * processed_logits_stride + col * vocab_size
            flat[at : at + vocab_size] = rows[token].to(flat.dtype)
    padded = rows.new_full((num_tokens, num_blocks * BLOCK_SIZE), float("-inf"))
    padded[:, :vocab_size] = rows
    values, indices = padded.view(num_tokens, num_blocks, BLOCK_SIZE).max(dim=-1)
    blocks = torch.arange(num_blocks) * BLOCK_SIZE
    local_argmax.view(-1)[
        (torch.arange(num_tokens)[:, None] * local_argmax_stride + torch.arange(num_blocks))
    ] = (indices + blocks).to(local_argmax.dtype)
    local_max.view(-1)[
        (torch.arange(num_tokens)[:, None] * local_max_stride + torch.arange(num_blocks))
    ] = values.to(torch.float64 if USE_FP64 else torch.float32).to(local_max.dtype)


#: The v2 references by kernel (``KernelStub.key``).
V2_REFERENCES: dict[str, Reference] = {
    "vllm.v1.worker.gpu.buffer_utils._apply_write_kernel": apply_write,
    "vllm.v1.worker.gpu.input_batch._prepare_prefill_inputs_kernel": prepare_prefill_inputs,
    "vllm.v1.worker.gpu.input_batch._prepare_pos_seq_lens_kernel": prepare_pos_seq_lens,
    "vllm.v1.worker.gpu.input_batch._combine_sampled_and_draft_tokens_kernel": (
        combine_sampled_and_draft_tokens
    ),
    "vllm.v1.worker.gpu.input_batch._get_num_sampled_and_rejected_kernel": (
        get_num_sampled_and_rejected
    ),
    "vllm.v1.worker.gpu.input_batch._post_update_kernel": post_update,
    "vllm.v1.worker.gpu.block_table._gather_block_tables_kernel": gather_block_tables,
    "vllm_ascend.worker.v2.block_table._compute_slot_mappings_kernel": (
        ascend_compute_slot_mappings
    ),
    "vllm.v1.worker.gpu.sample.gumbel._gumbel_sample_kernel": gumbel_sample,
}

REFERENCES: dict[str, Reference] = {
    "vllm.v1.worker.block_table._compute_slot_mapping_kernel": compute_slot_mapping,
    **V2_REFERENCES,
}

__all__ = ["REFERENCES", "KernelStub", "install"]
