"""The torch references of the Triton kernels model runner v2 launches (``triton_refs``), each
checked against an oracle that shares none of its code: a plain-Python loop over lists written
from the kernel's source (program by program, element by element), or vLLM's own torch path where
it has one (greedy sampling: ``Sampler.greedy_sample``). Each launch goes through vLLM's own
launcher where it has a plain-tensor one (so the kernel's name and launch arguments are vLLM's),
else through the kernel's stub with the launcher's arguments.

Negative control: the same checks with a deliberately broken reference (its last program
dropped, as a wrong grid reading would) must fail, for every kernel; outputs are pre-filled with
sentinels so a skipped write shows.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from torch_npu_sim.engine import triton_refs

SENTINEL = -7


def _last_program_dropped(reference: Callable[..., None]) -> Callable[..., None]:
    """The broken reference: the grid's first dimension one short."""

    @functools.wraps(reference)
    def broken(grid: Any, *args: Any, **kwargs: Any) -> None:
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        return reference((grid[0] - 1, *grid[1:]), *args, **kwargs)

    return broken


def _use(monkeypatch: pytest.MonkeyPatch, key: str, broken: bool) -> None:
    reference = ALL_V2[key]
    if broken:
        reference = _last_program_dropped(reference)
    monkeypatch.setitem(triton_refs.REFERENCES, key, reference)


def _full(n: int, dtype: torch.dtype = torch.int32, value: int = SENTINEL) -> torch.Tensor:
    return torch.full((n,), value, dtype=dtype)


# --- one check per kernel: the launch's outputs equal the oracle's (True) or not (False) -------


def check_apply_write() -> bool:
    from vllm.v1.worker.gpu import buffer_utils

    rows, width = 4, 8
    writes = [(2, 1, [5, 6, 7]), (0, 0, [9]), (3, 5, [1, 2, 3]), (2, 6, [4, 4])]
    output = torch.full((rows, width), SENTINEL, dtype=torch.int32)
    contents = [v for _, _, c in writes for v in c]
    ends, total = [], 0
    for _, _, c in writes:
        total += len(c)
        ends.append(total)
    buffer_utils._apply_write_kernel[(len(writes),)](
        output,
        output.stride(0),
        torch.tensor([r for r, _, _ in writes], dtype=torch.int32),
        torch.tensor([s for _, s, _ in writes], dtype=torch.int32),
        torch.tensor(contents, dtype=torch.int32),
        torch.tensor(ends, dtype=torch.int32),
        BLOCK_SIZE=1024,
    )
    want = [[SENTINEL] * width for _ in range(rows)]
    for row, start, content in writes:
        for i, value in enumerate(content):
            want[row][start + i] = value
    return output.tolist() == want


def check_prepare_prefill_inputs() -> bool:
    from vllm.v1.worker.gpu.input_batch import prepare_prefill_inputs

    # Three requests in state rows 2, 0, 1: a first chunk, a decode, a last chunk.
    prompts = {0: [11, 12, 13], 1: [21, 22, 23, 24, 25, 26], 2: [31, 32, 33, 34, 35, 36, 37]}
    prefill_len = [3, 6, 7]
    computed = [3, 2, 0]  # row 0 decodes; row 1 from token 2; row 2 from the start
    idx_mapping = [2, 0, 1]
    query_lens = [4, 1, 4]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    all_token_ids = torch.zeros((3, 16), dtype=torch.int32)
    for row, tokens in prompts.items():
        all_token_ids[row, : len(tokens)] = torch.tensor(tokens)
    input_ids = _full(12)
    next_prefill = _full(3)
    prepare_prefill_inputs(
        input_ids,
        next_prefill,
        torch.tensor(idx_mapping, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        all_token_ids,
        torch.tensor(prefill_len, dtype=torch.int32),
        torch.tensor(computed, dtype=torch.int32),
    )
    want_ids, want_next = [SENTINEL] * 12, [SENTINEL] * 3
    for batch, row in enumerate(idx_mapping):
        if computed[row] >= prefill_len[row]:
            continue
        for i in range(query_lens[batch]):
            want_ids[starts[batch] + i] = prompts[row][computed[row] + i]
        following = computed[row] + query_lens[batch]
        if following < prefill_len[row]:
            want_next[row] = prompts[row][following]
    return input_ids.tolist() == want_ids and next_prefill.tolist() == want_next


def check_prepare_pos_seq_lens() -> bool:
    from vllm.v1.worker.gpu.input_batch import prepare_pos_seq_lens

    idx_mapping, query_lens, computed = [1, 3, 0], [1, 5, 2], [7, 0, 4, 9]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    pos, seq_lens = _full(10, torch.int64), _full(6)
    prepare_pos_seq_lens(
        torch.tensor(idx_mapping, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(computed, dtype=torch.int32),
        pos,
        seq_lens,
    )
    want_pos, want_lens = [SENTINEL] * 10, [0] * 6
    for batch, row in enumerate(idx_mapping):
        want_lens[batch] = computed[row] + query_lens[batch]
        for i in range(query_lens[batch]):
            want_pos[starts[batch] + i] = computed[row] + i
    return pos.tolist() == want_pos and seq_lens.tolist() == want_lens


def check_combine_sampled_and_draft_tokens() -> bool:
    from vllm.v1.worker.gpu.input_batch import combine_sampled_and_draft_tokens

    # Rows 0, 2: decoding with 2 drafts each; row 1: prefilling (seq_len <= prefill_len).
    idx_mapping, query_lens, num_logits = [2, 1, 0], [3, 4, 3], [3, 1, 3]
    prefill_len, seq_lens = [5, 20, 6], [9, 8, 12]
    last_sampled = [101, 102, 103]
    drafts = [[201, 202], [211, 212], [221, 222]]
    starts, cu = [0], [0]
    for q, n in zip(query_lens, num_logits, strict=True):
        starts.append(starts[-1] + q)
        cu.append(cu[-1] + n)
    input_ids = _full(12)
    indices = combine_sampled_and_draft_tokens(
        input_ids,
        torch.tensor(idx_mapping, dtype=torch.int32),
        torch.tensor(last_sampled, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        torch.tensor(prefill_len, dtype=torch.int32),
        torch.tensor(drafts, dtype=torch.int32),
        torch.tensor(cu, dtype=torch.int32),
        cu[-1],
    )
    want_ids, want_indices = [SENTINEL] * 12, []
    for batch, row in enumerate(idx_mapping):
        end, n = starts[batch + 1], num_logits[batch]
        want_indices += [end - n + i for i in range(n)]
        if seq_lens[batch] <= prefill_len[row]:
            continue
        want_ids[end - n] = last_sampled[row]
        for i in range(n - 1):
            want_ids[end - (n - 1) + i] = drafts[row][i]
    return input_ids.tolist() == want_ids and indices.tolist() == want_indices


def check_get_num_sampled_and_rejected() -> bool:
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected

    idx_mapping, seq_lens, prefill_len = [1, 0, 2], [10, 4, 30], [5, 8, 12]
    sampled, cu = [2, 1, 3], [0, 3, 4, 7]
    got_sampled, got_rejected = get_num_sampled_and_rejected(
        torch.tensor(sampled, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(idx_mapping, dtype=torch.int32),
        torch.tensor(prefill_len, dtype=torch.int32),
    )
    want_sampled, want_rejected = [], []
    for batch, row in enumerate(idx_mapping):
        chunked = seq_lens[batch] < prefill_len[row]
        want_sampled.append(0 if chunked else sampled[batch])
        logits = cu[batch + 1] - cu[batch]
        want_rejected.append(0 if chunked else logits - want_sampled[-1])
    return got_sampled.tolist() == want_sampled and got_rejected.tolist() == want_rejected


def check_post_update() -> bool:
    from vllm.v1.worker.gpu.input_batch import post_update

    idx_mapping = [2, -1, 0, 1]
    computed, total, last = [5, 7, 3, 0], [6, 7, 4, 0], [SENTINEL] * 4
    sampled = [[41, 42, 43], [51, 0, 0], [61, 62, 0], [71, 0, 0]]
    num_sampled, num_rejected = [3, 1, 0, 1], [0, 0, 2, 1]
    starts = [0, 3, 4, 6, 7]
    vocab = 100
    all_ids = torch.full((4, 12), SENTINEL, dtype=torch.int32)
    counts = torch.zeros((4, vocab), dtype=torch.int32)
    args = (
        torch.tensor(computed, dtype=torch.int32),
        torch.tensor(last, dtype=torch.int32),
        counts,
        torch.tensor(sampled, dtype=torch.int64),
        torch.tensor(num_sampled, dtype=torch.int32),
        torch.tensor(num_rejected, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        all_ids,
        torch.tensor(total, dtype=torch.int32),
    )
    post_update(torch.tensor(idx_mapping, dtype=torch.int32), *args)
    want_ids = [[SENTINEL] * 12 for _ in range(4)]
    want_counts = [[0] * vocab for _ in range(4)]
    want_computed, want_total, want_last = list(computed), list(total), list(last)
    for batch, row in enumerate(idx_mapping):
        if row < 0:
            continue
        n = num_sampled[batch]
        for i in range(n):
            want_ids[row][total[row] + i] = sampled[batch][i]
            want_counts[row][sampled[batch][i]] += 1
        if n:
            want_last[row] = sampled[batch][n - 1]
            want_total[row] = total[row] + n
        want_computed[row] += starts[batch + 1] - starts[batch] - num_rejected[batch]
    return (
        args[0].tolist() == want_computed
        and args[1].tolist() == want_last
        and args[8].tolist() == want_total
        and all_ids.tolist() == want_ids
        and counts.tolist() == want_counts
    )


def _pointers(tensors: list[torch.Tensor]) -> torch.Tensor:
    for tensor in tensors:
        triton_refs.POINTED[tensor.data_ptr()] = tensor
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64)


def check_gather_block_tables() -> bool:
    from vllm.v1.worker.gpu import block_table

    # Two KV-cache groups of different widths; 3 requests padded to 4 rows.
    widths, max_reqs = [5, 3], 4
    rng = random.Random(1)
    src = [[[rng.randrange(1, 50) for _ in range(w)] for _ in range(max_reqs)] for w in widths]
    used = [[3, 5, 1, 2], [2, 0, 3, 1]]
    idx_mapping, num_reqs, padded = [3, 0, 2], 3, 4
    sources = [torch.tensor(s, dtype=torch.int32) for s in src]
    dests = [torch.full((max_reqs, w), SENTINEL, dtype=torch.int32) for w in widths]
    block_table._gather_block_tables_kernel[(len(widths), padded)](
        torch.tensor(idx_mapping, dtype=torch.int32),
        _pointers(sources),
        _pointers(dests),
        torch.tensor(widths, dtype=torch.int64),
        torch.tensor(used, dtype=torch.int32),
        max_reqs,
        num_reqs,
        BLOCK_SIZE=1024,
    )
    for group, width in enumerate(widths):
        want = [[SENTINEL] * width for _ in range(max_reqs)]
        for batch in range(padded):
            if batch >= num_reqs:
                want[batch] = [0] * width
                continue
            req = idx_mapping[batch]
            for i in range(used[group][req]):
                want[batch][i] = src[group][req][i]
        if dests[group].tolist() != want:
            return False
    return True


def check_ascend_compute_slot_mappings() -> bool:
    from vllm_ascend.worker.v2 import block_table

    # Two groups (block sizes 4 and 8); 3 requests in state rows 1, 2, 0; 16 token slots.
    sizes, max_tokens = [4, 8], 16
    tables = [
        [[3, 9, 2, 7], [5, 1, 8, 6], [4, 0, 11, 10]],
        [[2, 6, 0, 0], [7, 3, 0, 0], [1, 9, 0, 0]],
    ]
    idx_mapping, starts = [1, 2, 0], [0, 1, 5, 7]
    pos = [6, 0, 1, 2, 9, 13, 14, 99, 99]
    slots = torch.full((2, max_tokens), SENTINEL, dtype=torch.int32)
    block_table._compute_slot_mappings_kernel[(2, len(idx_mapping) + 1)](
        max_tokens,
        torch.tensor(idx_mapping, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(pos, dtype=torch.int64),
        _pointers([torch.tensor(t, dtype=torch.int32) for t in tables]),
        torch.tensor([4, 4], dtype=torch.int64),
        torch.tensor(sizes, dtype=torch.int32),
        slots,
        slots.stride(0),
        0,
        CP_SIZE=1,
        CP_INTERLEAVE=1,
        PAD_ID=-1,
        TRITON_BLOCK_SIZE=1024,
        TOTAL_BLOCK_SIZE=4096,
    )
    for group, size in enumerate(sizes):
        want = [SENTINEL] * max_tokens
        for batch, row in enumerate(idx_mapping):
            for t in range(starts[batch], starts[batch + 1]):
                want[t] = tables[group][row][pos[t] // size] * size + pos[t] % size
        for t in range(starts[-1], max_tokens):
            want[t] = -1
        if slots[group].tolist() != want:
            return False
    return True


def check_gumbel_sample() -> bool:
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    generator = torch.Generator().manual_seed(0)
    vocab = 2500  # three vocabulary blocks of 1024, the last one partial
    logits = torch.randn((5, vocab), generator=generator)
    logits[1, 2400] = 50.0  # in the partial block
    logits[3, 1030] = 50.0
    processed = torch.full((5, vocab), float(SENTINEL))
    idx_mapping = torch.tensor([3, 0, 4, 1, 2], dtype=torch.int32)
    sampled = gumbel_sample(
        logits,
        idx_mapping,
        torch.zeros(5),
        torch.arange(5, dtype=torch.int64),
        torch.arange(5, dtype=torch.int64),
        apply_temperature=True,
        output_processed_logits=processed,
    )
    want = Sampler.greedy_sample(logits)  # vLLM's own greedy path
    # temperature 0: the processed logits are the logits, in each token's request row
    rows_written = all(
        torch.equal(processed[row], logits[token]) for token, row in enumerate(idx_mapping.tolist())
    )
    return torch.equal(sampled, want) and rows_written


def check_topk_log_softmax() -> bool:
    """vLLM's own torch path is the oracle: v1's sampler takes ``logits.log_softmax`` and
    gathers (``Sampler.compute_logprobs``)."""
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu.sample.logprob import compute_token_logprobs

    logits = torch.randn((3, 2500), generator=torch.Generator().manual_seed(5)) * 4
    ids = torch.tensor([[7, 2499, 0], [1024, 5, 5], [2048, 100, 1]], dtype=torch.int64)
    got = compute_token_logprobs(logits, ids)
    want = Sampler.compute_logprobs(logits).gather(1, ids)
    return torch.allclose(got, want, rtol=0, atol=1e-5)


def check_ranks() -> bool:
    """vLLM's own torch path is the oracle: v1's ``batched_count_greater_than``."""
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than
    from vllm.v1.worker.gpu.sample.logprob import compute_topk_logprobs

    logits = torch.randn((4, 9000), generator=torch.Generator().manual_seed(6))
    logits[2, 10:20] = 5.0  # ties count as at least the token's own
    sampled = torch.tensor([3, 8999, 15, 4096], dtype=torch.int64)
    got = compute_topk_logprobs(logits, 0, sampled).selected_token_ranks
    want = batched_count_greater_than(logits, logits.gather(1, sampled.view(-1, 1)))
    return got.tolist() == want.tolist()


# --- speculative decoding (EAGLE / MTP on v2): the speculator's and the rejection sampler's ----


SPEC = "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator"
REJECTION = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"


def _stub(key: str) -> Any:
    import importlib

    module, _, name = key.rpartition(".")
    return getattr(importlib.import_module(module), name)


def check_expand_idx_mapping() -> bool:
    from vllm.v1.worker.gpu.input_batch import expand_idx_mapping

    idx_mapping, cu = [2, 0, 3], [0, 3, 4, 7]
    mapping, local = expand_idx_mapping(
        torch.tensor(idx_mapping, dtype=torch.int32), 7, torch.tensor(cu, dtype=torch.int32), 3
    )
    want_mapping, want_local = [], []
    for req, row in enumerate(idx_mapping):
        for i in range(cu[req + 1] - cu[req]):
            want_mapping.append(row)
            want_local.append(i)
    return mapping.tolist() == want_mapping and local.tolist() == want_local


def check_spec_prepare_prefill_inputs() -> bool:
    # Request 0 decoded with 1 rejected token, request 1 is a chunked prefill, request 2 decoded.
    idx_mapping, starts = [1, 2, 0], [0, 3, 7, 10]
    target_ids = list(range(100, 110))
    target_pos = [5, 6, 7, 0, 1, 2, 3, 8, 9, 10]
    seq_lens = [8, 4, 11]
    num_sampled, num_rejected = [2, 0, 3], [1, 0, 0]
    last_sampled, next_prefill = [901, 902, 903], [801, 802, 803]
    max_reqs = 5
    last = _full(max_reqs)
    step = torch.tensor([3], dtype=torch.int32)
    ids, positions = _full(10), _full(10, torch.int64)
    qsl, lens = _full(max_reqs + 1), _full(max_reqs)
    _stub(f"{SPEC}._prepare_prefill_inputs_kernel")[(3,)](
        last,
        step,
        ids,
        positions,
        qsl,
        lens,
        torch.tensor(target_ids, dtype=torch.int32),
        torch.tensor(target_pos, dtype=torch.int64),
        torch.tensor(idx_mapping, dtype=torch.int32),
        torch.tensor(last_sampled, dtype=torch.int64),
        torch.tensor(next_prefill, dtype=torch.int32),
        torch.tensor(num_sampled, dtype=torch.int32),
        torch.tensor(num_rejected, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        max_reqs,
        BLOCK_SIZE=1024,
    )
    want_ids, want_pos = [SENTINEL] * 10, [SENTINEL] * 10
    want_last, want_qsl, want_lens = [SENTINEL] * max_reqs, [SENTINEL] * 6, [SENTINEL] * 5
    for req, row in enumerate(idx_mapping):
        start = starts[req]
        length = starts[req + 1] - start - num_rejected[req]
        for i in range(1, length):
            want_ids[start + i - 1] = target_ids[start + i]
        nxt = last_sampled[row] if num_sampled[req] > 0 else next_prefill[row]
        want_ids[start + length - 1] = nxt
        want_last[req] = start + length - 1
        for i in range(length):
            want_pos[start + i] = target_pos[start + i]
        want_qsl[req] = start
        want_lens[req] = seq_lens[req]
    for i in range(3, max_reqs + 1):
        want_qsl[i] = starts[3]
    for i in range(3, max_reqs):
        want_lens[i] = 0
        want_last[i] = 0
    return (
        ids.tolist() == want_ids
        and positions.tolist() == want_pos
        and last.tolist() == want_last
        and qsl.tolist() == want_qsl
        and lens.tolist() == want_lens
        and step.tolist() == [0]
    )


def check_spec_prepare_decode_inputs() -> bool:
    from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import prepare_decode_inputs

    drafts = torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33]], dtype=torch.int64)
    target_lens, rejected = [9, 30, 4], [1, 0, 2]
    max_model_len, max_reqs = 31, 5
    buffers = types_ns(
        input_ids=_full(8),
        positions=torch.tensor([3, 29, 1, 0, 0, 0, 0, 0], dtype=torch.int64),
        query_start_loc=_full(max_reqs + 1),
        seq_lens=_full(max_reqs),
    )
    positions_before = buffers.positions.tolist()
    prepare_decode_inputs(
        drafts[:, 0],
        torch.tensor(target_lens, dtype=torch.int32),
        torch.tensor(rejected, dtype=torch.int32),
        buffers,
        max_model_len,
        max_reqs,
    )
    want_ids, want_pos = [SENTINEL] * 8, list(positions_before)
    want_lens = [0] * max_reqs
    for req in range(3):
        want_ids[req] = int(drafts[req, 0])
        want_pos[req] = min(positions_before[req] + 1, max_model_len - 1)
        want_lens[req] = min(target_lens[req] - rejected[req] + 1, max_model_len)
    want_qsl = [min(i, 3) for i in range(max_reqs + 1)]
    return (
        buffers.input_ids.tolist() == want_ids
        and buffers.positions.tolist() == want_pos
        and buffers.seq_lens.tolist() == want_lens
        and buffers.query_start_loc.tolist() == want_qsl
    )


def types_ns(**kwargs: Any) -> Any:
    import types

    return types.SimpleNamespace(**kwargs)


def check_spec_update_draft_inputs(step: int = 1) -> bool:
    from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import update_draft_inputs

    n, k, hidden, max_model_len = 3, 3, 5, 10
    sampled = torch.tensor([41, 42, 43], dtype=torch.int64)
    out = torch.full((4, k), SENTINEL, dtype=torch.int64)
    states = torch.arange(n * hidden, dtype=torch.float32).view(n, hidden) + 0.5
    next_states = torch.full((4, hidden), float(SENTINEL))
    buffers = types_ns(
        input_ids=_full(4),
        positions=torch.tensor([2, 9, 4, 0], dtype=torch.int64),
        seq_lens=torch.tensor([3, 10, 5, 0], dtype=torch.int32),
    )
    before_pos, before_lens = buffers.positions.tolist(), buffers.seq_lens.tolist()
    update_draft_inputs(
        sampled,
        torch.tensor([step], dtype=torch.int32),
        states,
        out,
        next_states,
        buffers,
        n,
        max_model_len,
        k,
    )
    want_out = [[SENTINEL] * k for _ in range(4)]
    want_ids, want_next = [SENTINEL] * 4, [[float(SENTINEL)] * hidden for _ in range(4)]
    want_pos, want_lens = list(before_pos), list(before_lens)
    for req in range(n):
        want_out[req][step] = int(sampled[req])
        if step >= k - 1:
            continue
        want_ids[req] = int(sampled[req])
        want_next[req] = states[req].tolist()
        want_pos[req] = min(before_pos[req] + 1, max_model_len - 1)
        want_lens[req] = min(before_lens[req] + 1, max_model_len)
    return (
        out.tolist() == want_out
        and buffers.input_ids.tolist() == want_ids
        and next_states.tolist() == want_next
        and buffers.positions.tolist() == want_pos
        and buffers.seq_lens.tolist() == want_lens
    )


def _greedy_rejection_inputs() -> dict[str, Any]:
    """Two requests, k = 2: logits rows 0-2 (request 0: drafts 7 then 9, bonus row 2), rows
    3-5 (request 1). Target argmaxes: row 0 -> 7 (accept), row 1 -> 4 (reject 9), row 3 -> 5
    (reject), row 2 / 5 bonus rows. Vocabulary 20 in blocks of 8 (the last partial)."""
    vocab = 20
    logits = torch.randn((6, vocab), generator=torch.Generator().manual_seed(3))
    for row, token in ((0, 7), (1, 4), (2, 17), (3, 5), (4, 2), (5, 11)):
        logits[row, token] = 9.0
    draft_sampled = torch.tensor([0, 7, 9, 0, 6, 2], dtype=torch.int64)  # index logit + 1
    return {
        "vocab": vocab,
        "logits": logits,
        "draft_sampled": draft_sampled,
        "cu": [0, 3, 6],
        "local_pos": [0, 1, 2, 0, 1, 2],
        "mapping": [1, 1, 1, 0, 0, 0],
        "k": 2,
    }


def check_rejection_block_stats() -> bool:
    # The kernel skips bonus rows; here only draft rows (the last program matters).
    data = _greedy_rejection_inputs()
    rows = [0, 1, 3, 4]
    logits = data["logits"][rows]
    block, blocks = 8, 3
    argmax = torch.full((4, blocks), SENTINEL, dtype=torch.int64)
    maxima = torch.full((4, blocks), float(SENTINEL))
    spare = torch.zeros((4, blocks))
    _stub(f"{REJECTION}._compute_block_stats_kernel")[(4, blocks)](
        argmax, blocks, maxima, blocks, spare, blocks, spare, blocks, spare, blocks,
        logits, logits.stride(0), logits.new_empty(1, 1, 1), 1, 1,
        torch.tensor([1, 1, 0, 0], dtype=torch.int32),
        torch.tensor([0, 1, 0, 1], dtype=torch.int32),
        torch.zeros(2), data["vocab"], data["k"], BLOCK_SIZE=block, HAS_DRAFT_LOGITS=False,
    )  # fmt: skip
    want_argmax, want_max = [], []
    for row in logits.tolist():
        tokens, values = [], []
        for b in range(blocks):
            best = None
            for t in range(b * block, min((b + 1) * block, data["vocab"])):
                if best is None or row[t] > row[best]:
                    best = t
            tokens.append(best)
            values.append(row[best])
        want_argmax.append(tokens)
        want_max.append(values)
    return argmax.tolist() == want_argmax and maxima.tolist() == want_max


def _target_argmax(row: list[float]) -> int:
    best = 0
    for t, value in enumerate(row):
        if value > row[best]:
            best = t
    return best


def check_rejection_rejection() -> bool:
    data = _greedy_rejection_inputs()
    logits, vocab, cu = data["logits"], data["vocab"], data["cu"]
    block, blocks = 8, 3
    local_max = torch.full((6, blocks), float("-inf"))
    local_argmax = torch.zeros((6, blocks), dtype=torch.int64)
    for row in range(6):  # the block stats' output, built here by hand
        for b in range(blocks):
            span = logits[row, b * block : min((b + 1) * block, vocab)]
            local_max[row, b] = span.max()
            local_argmax[row, b] = b * block + int(span.argmax())
    sampled = torch.full((2, 3), SENTINEL, dtype=torch.int64)
    accepted = _full(2)
    lses = torch.full((2,), 5.0), torch.full((2,), 5.0)
    spare = torch.zeros((6, blocks))
    _stub(f"{REJECTION}._rejection_kernel")[(2,)](
        sampled, 3, accepted, *lses, logits, vocab, local_argmax, blocks, local_max, blocks,
        spare, blocks, data["draft_sampled"], logits.new_empty(1, 1, 1), 1, 1,
        spare, blocks, spare, blocks, torch.tensor(cu, dtype=torch.int32),
        torch.tensor([1, 0], dtype=torch.int32), torch.zeros(2), torch.zeros(2, dtype=torch.int64),
        torch.zeros(6, dtype=torch.int64), None, blocks,
        PADDED_VOCAB_NUM_BLOCKS=4, HAS_DRAFT_LOGITS=False, SYNTHETIC_MODE=False,
    )  # fmt: skip
    want_sampled = [[SENTINEL] * 3 for _ in range(2)]
    want_accepted = []
    for req in range(2):
        count = 0
        for i in range(cu[req + 1] - cu[req] - 1):
            best = _target_argmax(logits[cu[req] + i].tolist())
            draft = int(data["draft_sampled"][cu[req] + i + 1])
            if draft == best:
                want_sampled[req][i] = draft
                count += 1
            else:
                want_sampled[req][i] = best
                break
        want_accepted.append(count)
    return (
        sampled.tolist() == want_sampled
        and accepted.tolist() == want_accepted
        and lses[0].tolist() == [0.0, 0.0]
        and lses[1].tolist() == [0.0, 0.0]
    )


def check_rejection_resample() -> bool:
    # Request 0 rejected (nothing to resample, greedy), request 1 accepted all: its bonus.
    data = _greedy_rejection_inputs()
    logits, vocab = data["logits"], data["vocab"]
    blocks, block = 3, 8
    argmax = torch.full((2, blocks), SENTINEL, dtype=torch.int64)
    maxima = torch.full((2, blocks), float(SENTINEL))
    accepted = [1, 2]
    cu = data["cu"]
    _stub(f"{REJECTION}._resample_kernel")[(2, blocks)](
        argmax, blocks, maxima, blocks, logits, vocab, torch.zeros(2), logits.new_empty(1, 1, 1),
        1, 1, torch.zeros(2), torch.tensor(accepted, dtype=torch.int32),
        torch.tensor(cu, dtype=torch.int32), torch.tensor(data["mapping"], dtype=torch.int32),
        data["draft_sampled"], torch.zeros(2), torch.zeros(2, dtype=torch.int64),
        torch.zeros(6, dtype=torch.int64), vocab, BLOCK_SIZE=block, HAS_DRAFT_LOGITS=False,
        USE_FP64=False,
    )  # fmt: skip
    want_argmax = [[SENTINEL] * blocks for _ in range(2)]
    want_max = [[float(SENTINEL)] * blocks for _ in range(2)]
    for req in range(2):
        token = cu[req] + accepted[req]
        if token != cu[req + 1] - 1:
            continue  # greedy and rejected: the rejection kernel wrote its token
        row = logits[token].tolist()
        for b in range(blocks):
            span = range(b * block, min((b + 1) * block, vocab))
            best = max(span, key=lambda t: (row[t], -t))
            want_argmax[req][b] = best
            want_max[req][b] = row[best]
    return argmax.tolist() == want_argmax and maxima.tolist() == want_max


def check_rejection_insert_resampled() -> bool:
    data = _greedy_rejection_inputs()
    cu, blocks = data["cu"], 3
    sampled = torch.full((2, 3), SENTINEL, dtype=torch.int64)
    counts = [1, 2]
    num_sampled = torch.tensor(counts, dtype=torch.int32)
    local_argmax = torch.tensor([[1, 9, 17], [3, 12, 19]], dtype=torch.int64)
    local_max = torch.tensor([[0.5, 2.0, 1.0], [0.1, 0.2, 3.0]])
    _stub(f"{REJECTION}._insert_resampled_kernel")[(2,)](
        sampled, 3, num_sampled, local_argmax, blocks, local_max, blocks, blocks,
        torch.tensor(cu, dtype=torch.int32), torch.tensor(data["mapping"], dtype=torch.int32),
        torch.zeros(2), PADDED_RESAMPLE_NUM_BLOCKS=4,
    )  # fmt: skip
    want_sampled = [[SENTINEL] * 3 for _ in range(2)]
    for req in range(2):
        token = cu[req] + counts[req]
        if token == cu[req + 1] - 1:  # the bonus token: the best block's token
            maxima = local_max[req].tolist()
            best = maxima.index(max(maxima))
            want_sampled[req][counts[req]] = int(local_argmax[req, best])
    return sampled.tolist() == want_sampled and num_sampled.tolist() == [c + 1 for c in counts]


SPEC_CHECKS: dict[str, Callable[[], bool]] = {
    "vllm.v1.worker.gpu.input_batch._expand_idx_mapping_kernel": check_expand_idx_mapping,
    f"{SPEC}._prepare_prefill_inputs_kernel": check_spec_prepare_prefill_inputs,
    f"{SPEC}._prepare_decode_inputs_kernel": check_spec_prepare_decode_inputs,
    f"{SPEC}._update_draft_inputs_kernel": check_spec_update_draft_inputs,
    f"{REJECTION}._compute_block_stats_kernel": check_rejection_block_stats,
    f"{REJECTION}._rejection_kernel": check_rejection_rejection,
    f"{REJECTION}._resample_kernel": check_rejection_resample,
    f"{REJECTION}._insert_resampled_kernel": check_rejection_insert_resampled,
}


CHECKS: dict[str, Callable[[], bool]] = {
    "vllm.v1.worker.gpu.buffer_utils._apply_write_kernel": check_apply_write,
    "vllm.v1.worker.gpu.input_batch._prepare_prefill_inputs_kernel": check_prepare_prefill_inputs,
    "vllm.v1.worker.gpu.input_batch._prepare_pos_seq_lens_kernel": check_prepare_pos_seq_lens,
    "vllm.v1.worker.gpu.input_batch._combine_sampled_and_draft_tokens_kernel": (
        check_combine_sampled_and_draft_tokens
    ),
    "vllm.v1.worker.gpu.input_batch._get_num_sampled_and_rejected_kernel": (
        check_get_num_sampled_and_rejected
    ),
    "vllm.v1.worker.gpu.input_batch._post_update_kernel": check_post_update,
    "vllm.v1.worker.gpu.block_table._gather_block_tables_kernel": check_gather_block_tables,
    "vllm_ascend.worker.v2.block_table._compute_slot_mappings_kernel": (
        check_ascend_compute_slot_mappings
    ),
    "vllm.v1.worker.gpu.sample.gumbel._gumbel_sample_kernel": check_gumbel_sample,
    "vllm.v1.worker.gpu.sample.logprob._topk_log_softmax_kernel": check_topk_log_softmax,
    "vllm.v1.worker.gpu.sample.logprob._ranks_kernel": check_ranks,
}


CHECKS.update(SPEC_CHECKS)
ALL_V2 = {
    **triton_refs.V2_REFERENCES,
    **triton_refs.V2_LOGPROB_REFERENCES,
    **triton_refs.V2_SPEC_REFERENCES,
}


def test_every_v2_reference_has_a_check() -> None:
    assert set(CHECKS) == set(ALL_V2)


def test_update_draft_inputs_last_step_only_stores_the_token() -> None:
    """The final draft step stores the sampled token and feeds nothing forward (the kernel's
    early return, which the reference takes on the device with ``torch.where``)."""
    assert check_spec_update_draft_inputs(step=2)


@pytest.mark.parametrize("key", sorted(CHECKS))
def test_reference_equals_its_oracle(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    _use(monkeypatch, key, broken=False)
    assert CHECKS[key]()


@pytest.mark.parametrize("key", sorted(CHECKS))
def test_negative_control_a_broken_reference_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    _use(monkeypatch, key, broken=True)
    assert not CHECKS[key]()  # a wrong result, not a crash: the comparison itself catches it


def test_gumbel_reference_refuses_a_temperature() -> None:
    """Only greedy sampling is referenced: a request with a temperature fails loudly (its
    noise would come from Triton's Philox stream)."""
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    from torch_npu_sim.runtime import SimulatorError

    with pytest.raises(SimulatorError, match="greedily only"):
        gumbel_sample(
            torch.randn((2, 10)),
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([0.0, 0.7]),
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64),
            apply_temperature=True,
        )
