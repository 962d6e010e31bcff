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


def _memory(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s memory from its first element on, one dimension: what a kernel's pointer
    arithmetic (``ptr + row * stride + column``) addresses, whatever the view's strides."""
    size = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    return tensor.as_strided((size,), (1,), tensor.storage_offset())


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
    flat = _memory(output)
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
    tokens = _memory(all_token_ids)
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
    drafts = _memory(draft_tokens)
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
    sampled_flat, all_flat = _memory(sampled_tokens), _memory(all_token_ids)
    counts = None if output_bin_counts is None else _memory(output_bin_counts)
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
    counts = _memory(num_blocks)
    for group in range(groups):
        stride = int(block_table_strides[group])
        src = _memory(tensor_at(src_block_table_ptrs, group))
        dst = _memory(tensor_at(dst_block_table_ptrs, group))
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
    flat = _memory(slot_mappings)
    real = int(query_start_loc[num_reqs])
    for group in range(groups):
        out = flat[group * slot_mappings_stride :][:max_num_tokens]
        out[real:] = PAD_ID
        if not num_reqs:
            continue
        table = _memory(tensor_at(block_table_ptrs, group))
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
    reference does not reproduce. It reads device values on the host, so it is right only where
    it is launched outside a graph: the samplers' launches here (the EAGLE draft's greedy
    sampling inside the draft graphs is ``argmax``, not this kernel)."""
    num_tokens, num_blocks = grid
    reqs = expanded_idx_mapping[:num_tokens].long()
    _greedy_only("_gumbel_sample_kernel", temp[reqs])
    rows = logits[:num_tokens, :vocab_size].to(torch.float32)
    if processed_logits is not None:
        col = 0 if processed_logits_col is None else int(processed_logits_col)
        flat = _memory(processed_logits)
        for token in range(num_tokens):
            at = int(reqs[token]) * processed_logits_stride + col * vocab_size
            flat[at : at + vocab_size] = rows[token].to(flat.dtype)
    values, tokens = _block_max(rows, vocab_size, BLOCK_SIZE)  # num_blocks blocks, as launched
    _memory(local_argmax)[
        (torch.arange(num_tokens)[:, None] * local_argmax_stride + torch.arange(num_blocks))
    ] = tokens.to(local_argmax.dtype)
    _memory(local_max)[
        (torch.arange(num_tokens)[:, None] * local_max_stride + torch.arange(num_blocks))
    ] = values.to(torch.float64 if USE_FP64 else torch.float32).to(local_max.dtype)


def topk_log_softmax(
    grid: tuple[int, ...],
    output: torch.Tensor,
    logits: torch.Tensor,
    logits_stride: int,
    topk_ids: torch.Tensor,
    topk: int,
    vocab_size: int,
    **_constexprs: Any,
) -> None:
    """``sample/logprob._topk_log_softmax_kernel``: each row's log-softmax (float32) at its
    ``topk`` token ids (the sampled token, then the top ones), without the full log-softmax."""
    rows = logits[: grid[0], :vocab_size].to(torch.float32)
    peak = rows.max(dim=-1, keepdim=True).values
    lse = torch.log(torch.exp(rows - peak).sum(dim=-1, keepdim=True))
    ids = _memory(topk_ids)[: grid[0] * topk].view(grid[0], topk).long()
    values = rows.gather(1, ids) - peak - lse
    _memory(output)[: grid[0] * topk] = values.reshape(-1).to(output.dtype)


def ranks(
    grid: tuple[int, ...],
    output: torch.Tensor,
    logits: torch.Tensor,
    logits_stride: int,
    token_ids: torch.Tensor,
    vocab_size: int,
    **_constexprs: Any,
) -> None:
    """``sample/logprob._ranks_kernel``: a token's rank, the number of logits at least its own."""
    rows = logits[: grid[0], :vocab_size]
    chosen = rows.gather(1, token_ids[: grid[0]].long().view(-1, 1))
    output[: grid[0]] = (rows >= chosen).sum(dim=-1).to(output.dtype)


#: The v2 references by kernel (``KernelStub.key``): what a greedy decode launches.
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
#: Logprobs (a request asking for them: ``ab``'s worker asks one per token).
V2_LOGPROB_REFERENCES: dict[str, Reference] = {
    "vllm.v1.worker.gpu.sample.logprob._topk_log_softmax_kernel": topk_log_softmax,
    "vllm.v1.worker.gpu.sample.logprob._ranks_kernel": ranks,
}

# --------------------------------------------------------------------------------------------
# Model runner v2 speculative decoding (EAGLE / MTP through vLLM's autoregressive speculator and
# its rejection sampler): greedy requests only, as the sampling above.


def _greedy_only(kernel: str, temperatures: torch.Tensor) -> None:
    if bool((temperatures != 0).any()):
        raise SimulatorError(
            f"Triton kernel {kernel}: the torch reference samples greedily only (temperature "
            "0); a request here has a temperature"
        )


def _block_max(rows: torch.Tensor, width: int, block_size: int) -> tuple[torch.Tensor, ...]:
    """Per vocabulary block of ``rows`` (``[n, >= width]``, float32): the largest value and its
    token id (the first on ties, as ``tl.max(..., return_indices=True)``)."""
    blocks = -(-width // block_size)
    padded = rows.new_full((rows.shape[0], blocks * block_size), float("-inf"))
    padded[:, :width] = rows[:, :width]
    values, indices = padded.view(rows.shape[0], blocks, block_size).max(dim=-1)
    return values, indices + torch.arange(blocks) * block_size


def spec_prepare_prefill_inputs(
    grid: tuple[int, ...],
    last_token_indices: torch.Tensor,
    draft_current_step: torch.Tensor,
    draft_input_ids: torch.Tensor,
    draft_positions: torch.Tensor,
    draft_query_start_loc: torch.Tensor,
    draft_seq_lens: torch.Tensor,
    target_input_ids: torch.Tensor,
    target_positions: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled: torch.Tensor,
    next_prefill_tokens: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_num_reqs: int,
    **_constexprs: Any,
) -> None:
    """``autoregressive/speculator._prepare_prefill_inputs_kernel``: the draft's inputs are the
    target's shifted by one (less the rejected tokens) then the next token (the last sampled
    one, or a chunked prefill's next prompt token); positions, query starts and sequence lengths
    copied; the last program resets the draft step and pads for full graphs."""
    num_reqs = grid[0]
    for req in range(num_reqs):
        state = int(idx_mapping[req])
        start, end = int(query_start_loc[req]), int(query_start_loc[req + 1])
        length = end - start - int(num_rejected[req])
        if int(num_sampled[req]) > 0:
            following = last_sampled[state].to(torch.int32)
        else:
            following = next_prefill_tokens[state]
        if length > 1:
            draft_input_ids[start : start + length - 1] = target_input_ids[
                start + 1 : start + length
            ]
        last = start + length - 1
        last_token_indices[req] = last
        draft_input_ids[last] = following.to(draft_input_ids.dtype)
        if length > 0:
            draft_positions[start : start + length] = target_positions[start : start + length]
        draft_query_start_loc[req] = start
        draft_seq_lens[req] = seq_lens[req]
        if req == num_reqs - 1:
            draft_current_step.fill_(0)
            draft_query_start_loc[num_reqs : max_num_reqs + 1] = end
            draft_seq_lens[num_reqs:max_num_reqs] = 0
            last_token_indices[num_reqs:max_num_reqs] = 0


def spec_prepare_decode_inputs(
    grid: tuple[int, ...],
    draft_tokens: torch.Tensor,
    draft_tokens_stride: int,
    target_seq_lens: torch.Tensor,
    num_rejected: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    *,
    ADVANCE_DRAFT_POSITIONS: bool,  # noqa: N803 - the kernel's constexpr name
    **_constexprs: Any,
) -> None:
    """``autoregressive/speculator._prepare_decode_inputs_kernel``: each request's first draft
    token becomes its one input id, its position and sequence length advance by one (clamped to
    the model length); the last program writes query starts ``0..n`` (padded with ``n``) and
    zeroes the padded sequence lengths."""
    n = grid[0] - 1
    query_start_loc[: max_num_reqs + 1] = torch.clamp(torch.arange(max_num_reqs + 1), max=n).to(
        query_start_loc.dtype
    )
    seq_lens[n:max_num_reqs] = 0
    if not n:
        return
    input_ids[:n] = _memory(draft_tokens)[torch.arange(n) * draft_tokens_stride].to(input_ids.dtype)
    if ADVANCE_DRAFT_POSITIONS:
        positions[:n] = torch.clamp(positions[:n] + 1, max=max_model_len - 1)
        advanced = target_seq_lens[:n].long() - num_rejected[:n].long() + 1
        seq_lens[:n] = torch.clamp(advanced, max=max_model_len).to(seq_lens.dtype)


def spec_update_draft_inputs(
    grid: tuple[int, ...],
    output_draft_tokens: torch.Tensor,
    output_draft_tokens_stride: int,
    next_input_hidden_states: torch.Tensor,
    next_input_hidden_states_stride: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    draft_tokens: torch.Tensor,
    current_draft_step: torch.Tensor,
    hidden_states: torch.Tensor,
    hidden_states_stride: int,
    hidden_size: int,
    max_model_len: int,
    num_speculative_steps: int,
    *,
    ADVANCE_DRAFT_POSITIONS: bool,  # noqa: N803 - the kernel's constexpr name
    **_constexprs: Any,
) -> None:
    """``autoregressive/speculator._update_draft_inputs_kernel``: store each request's sampled
    draft token at the current step; unless it is the last step, feed it (and the hidden state)
    to the next step and advance positions and sequence lengths.

    Launched inside the draft decode graph: no host read of a device value (the step is a
    device tensor the runner fills before each replay), so every write is a tensor op whose
    choice is made on the device (``torch.where``), as the kernel's branch is."""
    n = grid[0]
    rows = torch.arange(n)
    step = current_draft_step.reshape(-1)[:1].long()
    out = _memory(output_draft_tokens)
    out.index_put_((rows * output_draft_tokens_stride + step,), draft_tokens[:n].to(out.dtype))
    go = step < num_speculative_steps - 1
    input_ids[:n] = torch.where(go, draft_tokens[:n].to(input_ids.dtype), input_ids[:n])
    hidden = hidden_states.as_strided((n, hidden_size), (hidden_states_stride, 1))
    target = next_input_hidden_states.as_strided(
        (n, hidden_size), (next_input_hidden_states_stride, 1)
    )
    target.copy_(torch.where(go, hidden.to(target.dtype), target))
    if ADVANCE_DRAFT_POSITIONS:
        positions[:n] = torch.where(
            go, torch.clamp(positions[:n] + 1, max=max_model_len - 1), positions[:n]
        )
        seq_lens[:n] = torch.where(
            go, torch.clamp(seq_lens[:n] + 1, max=max_model_len), seq_lens[:n]
        )


def rejection_block_stats(
    grid: tuple[int, ...],
    target_local_argmax: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_local_max: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp: torch.Tensor,
    draft_local_sumexp_stride: int,
    target_logits: torch.Tensor,
    target_logits_stride: int,
    draft_logits: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temp: torch.Tensor,
    vocab_size: int,
    num_speculative_steps: int,
    *,
    BLOCK_SIZE: int,  # noqa: N803 - the kernel's constexpr names
    **_constexprs: Any,
) -> None:
    """``rejection_sampler_utils._compute_block_stats_kernel``, greedy: for each draft position
    (local position below the number of speculative steps), the target logits' largest value
    and its token id per vocabulary block; bonus positions are left alone."""
    num_logits, blocks = grid
    drafted = [i for i in range(num_logits) if int(expanded_local_pos[i]) < num_speculative_steps]
    if not drafted:
        return
    index = torch.tensor(drafted)
    _greedy_only("_compute_block_stats_kernel", temp[expanded_idx_mapping[index].long()])
    values, tokens = _block_max(target_logits[index].to(torch.float32), vocab_size, BLOCK_SIZE)
    for row, i in enumerate(drafted):
        at = i * target_local_argmax_stride
        _memory(target_local_argmax)[at : at + blocks] = tokens[row]
        at = i * target_local_max_stride
        _memory(target_local_max)[at : at + blocks] = values[row]


def rejection_rejection(
    grid: tuple[int, ...],
    sampled: torch.Tensor,
    sampled_stride: int,
    rejected_steps: torch.Tensor,
    target_rejected_logsumexp: torch.Tensor,
    draft_rejected_logsumexp: torch.Tensor,
    target_logits: torch.Tensor,
    target_logits_stride: int,
    target_local_argmax: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    temp: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    synthetic_conditional_rates: torch.Tensor | None,
    vocab_num_blocks: int,
    *,
    SYNTHETIC_MODE: bool,  # noqa: N803 - the kernel's constexpr names
    **_constexprs: Any,
) -> None:
    """``rejection_sampler_utils._rejection_kernel``, greedy: walk each request's draft tokens
    while accepted; a draft token is accepted when it is the target's argmax (over the blocks'
    maxima, then that block's token), and the first rejected one is replaced by the target's
    argmax. Stores how many were accepted; the log-sum-exps stay 0 (greedy)."""
    num_reqs = grid[0]
    if SYNTHETIC_MODE:
        raise SimulatorError("Triton kernel _rejection_kernel: synthetic mode has no reference")
    _greedy_only("_rejection_kernel", temp[idx_mapping[:num_reqs].long()])
    flat_sampled = _memory(sampled)
    for req in range(num_reqs):
        start, end = int(cu_num_logits[req]), int(cu_num_logits[req + 1])
        accepted = 0
        for i in range(end - start - 1):
            logit = start + i
            maxima = _memory(target_local_max)[logit * target_local_max_stride :][:vocab_num_blocks]
            block = int(torch.argmax(maxima))
            argmax = int(_memory(target_local_argmax)[logit * target_local_argmax_stride + block])
            draft = int(draft_sampled[logit + 1])
            flat_sampled[req * sampled_stride + i] = draft if draft == argmax else argmax
            if draft != argmax:
                break
            accepted += 1
        rejected_steps[req] = accepted
        target_rejected_logsumexp[req] = 0.0
        draft_rejected_logsumexp[req] = 0.0


def rejection_resample(
    grid: tuple[int, ...],
    resampled_local_argmax: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max: torch.Tensor,
    resampled_local_max_stride: int,
    target_logits: torch.Tensor,
    target_logits_stride: int,
    target_rejected_logsumexp: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_rejected_logsumexp: torch.Tensor,
    rejected_step: torch.Tensor,
    cu_num_logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    draft_sampled: torch.Tensor,
    temp: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    vocab_size: int,
    *,
    BLOCK_SIZE: int,  # noqa: N803 - the kernel's constexpr names
    USE_FP64: bool,  # noqa: N803
    **_constexprs: Any,
) -> None:
    """``rejection_sampler_utils._resample_kernel``, greedy: only a request whose every draft
    token was accepted samples its bonus token, the target's largest logit per block (no noise
    at temperature 0); a rejected greedy request has its token already."""
    num_reqs, blocks = grid
    for req in range(num_reqs):
        token = int(cu_num_logits[req]) + int(rejected_step[req])
        state = int(expanded_idx_mapping[token])
        bonus = token == int(cu_num_logits[req + 1]) - 1
        if float(temp[state]) == 0.0 and not bonus:
            continue
        _greedy_only("_resample_kernel", temp[state : state + 1])
        values, tokens = _block_max(
            target_logits[token : token + 1].float(), vocab_size, BLOCK_SIZE
        )
        at = req * resampled_local_argmax_stride
        _memory(resampled_local_argmax)[at : at + blocks] = tokens[0]
        at = req * resampled_local_max_stride
        _memory(resampled_local_max)[at : at + blocks] = values[0].to(
            torch.float64 if USE_FP64 else torch.float32
        )


def rejection_insert_resampled(
    grid: tuple[int, ...],
    sampled: torch.Tensor,
    sampled_stride: int,
    num_sampled: torch.Tensor,
    resampled_local_argmax: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max: torch.Tensor,
    resampled_local_max_stride: int,
    resample_num_blocks: int,
    cu_num_logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temp: torch.Tensor,
    **_constexprs: Any,
) -> None:
    """``rejection_sampler_utils._insert_resampled_kernel``: one more token sampled per request;
    where the resample kernel ran (a bonus token, or a request with a temperature), the token of
    the largest block maximum goes after the accepted ones."""
    for req in range(grid[0]):
        count = int(num_sampled[req])
        token = int(cu_num_logits[req]) + count
        state = int(expanded_idx_mapping[token])
        num_sampled[req] = count + 1
        bonus = token == int(cu_num_logits[req + 1]) - 1
        if float(temp[state]) == 0.0 and not bonus:
            continue
        maxima = _memory(resampled_local_max)[req * resampled_local_max_stride :][
            :resample_num_blocks
        ]
        block = int(torch.argmax(maxima))
        chosen = _memory(resampled_local_argmax)[req * resampled_local_argmax_stride + block]
        _memory(sampled)[req * sampled_stride + count] = chosen


def expand_idx_mapping(
    grid: tuple[int, ...],
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    cu_num_logits: torch.Tensor,
    *,
    BLOCK_SIZE: int,  # noqa: N803 - the kernel's constexpr name
) -> None:
    """``input_batch._expand_idx_mapping_kernel``: each of a request's logits (at most
    ``BLOCK_SIZE``) gets the request's state row and its local position ``0..``."""
    for req in range(grid[0]):
        start = int(cu_num_logits[req])
        count = min(int(cu_num_logits[req + 1]) - start, BLOCK_SIZE)
        expanded_idx_mapping[start : start + count] = idx_mapping[req]
        expanded_local_pos[start : start + count] = torch.arange(count)


#: The v2 speculative-decoding references by kernel (``KernelStub.key``).
V2_SPEC_REFERENCES: dict[str, Reference] = {
    "vllm.v1.worker.gpu.input_batch._expand_idx_mapping_kernel": expand_idx_mapping,
    "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator._prepare_prefill_inputs_kernel": (
        spec_prepare_prefill_inputs
    ),
    "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator._prepare_decode_inputs_kernel": (
        spec_prepare_decode_inputs
    ),
    "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator._update_draft_inputs_kernel": (
        spec_update_draft_inputs
    ),
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._compute_block_stats_kernel": (
        rejection_block_stats
    ),
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._rejection_kernel": (
        rejection_rejection
    ),
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._resample_kernel": (rejection_resample),
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._insert_resampled_kernel": (
        rejection_insert_resampled
    ),
}

REFERENCES: dict[str, Reference] = {
    "vllm.v1.worker.block_table._compute_slot_mapping_kernel": compute_slot_mapping,
    **V2_REFERENCES,
    **V2_LOGPROB_REFERENCES,
    **V2_SPEC_REFERENCES,
}

__all__ = ["REFERENCES", "KernelStub", "install"]
