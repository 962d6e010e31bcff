"""A simulated decode workload that drives the REAL vllm-ascend graph code on CPU.

A toy multi-layer decoder whose attention is the real ``AscendAttentionBackendImpl.forward``
runs inside a real ``ACLGraphWrapper`` (runtime mode FULL) under the real
``set_ascend_forward_context``, with attention metadata built by the real
``AscendAttentionMetadataBuilder`` from the same persistent buffers and padding rules the v1
``NPUModelRunner`` uses. After each replay the engine calls the stock update exactly as
``NPUModelRunner._update_full_graph_params_if_needed`` does, resolved through the
``vllm_ascend.compilation.acl_graph`` module attribute at call time, so whatever is installed on the
seams (the overlay, or nothing) is what gets measured.

This module deliberately imports nothing from the overlay (``ascend_graph_patch``): it
is the stock workload the overlay is installed onto, so one harness measures both arms.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from torch_npu_sim.harness.process import Lease
from torch_npu_sim.harness.spec import Scenario
from torch_npu_sim.harness.stack import PA_CAPTURE_SEQ_LEN, OpenStep, Stack
from torch_npu_sim.harness.toy import ToyDecoder, random_ids
from torch_npu_sim.workload import StepOutput

__all__ = ["DecodeBatch", "TargetEngine"]


@dataclass
class DecodeBatch:
    """One decode step: ``num_reqs`` real requests (one token each) padded to a capture size."""

    step: int
    req_slots: list[int]  # request slot per batch row (the slot owns a fixed set of KV blocks)
    seq_lens: list[int]  # kv length per request, including this step's token
    input_ids: torch.Tensor  # (num_reqs,) int64
    positions: torch.Tensor  # (num_reqs,) int64
    slot_mapping: torch.Tensor  # (num_reqs,) int64, flat KV slot this step's token is written to
    block_rows: torch.Tensor  # (num_reqs, max_blocks_per_req) int32
    num_tokens_padded: int  # smallest capture size >= num_reqs (the runner's padding)

    @property
    def num_reqs(self) -> int:
        return len(self.req_slots)


@dataclass
class _Request:
    slot: int
    num_computed: int  # tokens already in the KV cache


class TargetEngine:
    """Builds the real vllm-ascend stack for one scenario and runs decode steps through it.

    Comparability: an eager run writes this step's token KV before any layer reads it and puts
    the slots back afterwards, so ``run(batch, graph=False)`` leaves the caches as it found them
    and the graph run of the same batch, before or after it, sees the same cache. History KV is
    random (seeded), never prefilled.
    """

    def __init__(self, scenario: Scenario, *, num_threads: int | None = 1) -> None:
        self.name, self.stock, self.scenario = scenario.name, scenario.stock, scenario
        self.lease = Lease(scenario.name, num_threads)
        try:
            from vllm.config import CUDAGraphMode, set_current_vllm_config
            from vllm_ascend.compilation.acl_graph import ACLGraphWrapper

            self.stack = Stack(scenario)
            self.vllm_config = self.stack.vllm_config
            self.model = ToyDecoder(self.stack.layers, self.stack.gen)
            self._full, self._none = CUDAGraphMode.FULL, CUDAGraphMode.NONE
            with set_current_vllm_config(self.vllm_config):
                enpu = scenario.update_order == "update_then_replay"
                self.wrapper = ACLGraphWrapper(
                    self.model, self.vllm_config, self._full, enable_enpu=enpu
                )
            self.update_stream = torch.npu.Stream()
        except BaseException:
            self.close()  # a half-built engine must not block the next one
            raise
        self.last_metadata: dict[str, Any] | None = None
        self._step = 0
        self._captured: set[int] = set()
        rng = random.Random(scenario.seed)
        self._reqs = [
            _Request(slot=i, num_computed=rng.randrange(0, scenario.max_kv_len - 1))
            for i in range(self.stack.max_num_reqs)
        ]

    @property
    def layers(self) -> list[Any]:
        return self.stack.layers

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the graphs and reset the vllm-ascend globals (so the next engine starts clean)."""
        self.lease.release(self._drop_graphs)

    def _drop_graphs(self) -> None:
        self.wrapper = self.model = self.stack = None

    # ---- workload --------------------------------------------------------------------------

    def next_batch(self, rng: random.Random) -> DecodeBatch:
        """A decode step: a random subset of requests, in random order; each grows by one token."""
        stack = self.stack
        n = rng.randint(1, stack.max_num_reqs)
        chosen = rng.sample(self._reqs, n)
        slots, seq_lens, positions, rows = [], [], [], []
        for req in chosen:
            if req.num_computed + 1 > self.scenario.max_kv_len:  # finished: a new request
                req.num_computed = rng.randrange(0, self.scenario.max_kv_len // 2)
            slots.append(req.slot)
            seq_lens.append(req.num_computed + 1)
            positions.append(req.num_computed)
            rows.append(stack.block_row(req.slot))
            req.num_computed += 1
        self._step += 1
        block_rows = torch.tensor(rows, dtype=torch.int32)
        pos = torch.tensor(positions, dtype=torch.int64)
        return DecodeBatch(
            step=self._step,
            req_slots=slots,
            seq_lens=seq_lens,
            input_ids=random_ids(rng, n),
            positions=pos,
            slot_mapping=stack.token_slots(block_rows, pos),
            block_rows=block_rows,
            num_tokens_padded=self.stack.padded_size(n),
        )

    def capture(self) -> None:
        """Capture every graph size (the runner's capture at start-up)."""
        for size in self.scenario.capture_sizes:
            self.capture_size(size)

    def run(self, batch: DecodeBatch, *, graph: bool = True) -> StepOutput:
        """Replay + update as the v1 runner does (capturing the size on first use), or eagerly."""
        if graph:
            return self._output(self._run_full(batch, "update"))
        with self.stack.kv_restored([batch.slot_mapping] * len(self.stack.groups)):
            return self._output(self._run_eager(batch))

    def run_without_update(self, batch: DecodeBatch, *, record: bool = True) -> StepOutput:
        """Negative control: replay, then release every captured event WITHOUT the update.

        With ``record=False`` the events are not recorded either, so the replay stays blocked and
        the simulator must raise ``SimulatorError`` at the synchronisation (on hardware: a hang).
        """
        return self._output(self._run_full(batch, "record" if record else "none"))

    def _output(self, hidden: torch.Tensor) -> StepOutput:
        logits = self.model.logits(hidden)
        return StepOutput(
            values=hidden,
            tokens=logits.argmax(-1).unsqueeze(1).tolist(),
            logits=logits.unsqueeze(1),
        )

    # ---- metadata, as NPUModelRunner builds it ---------------------------------------------

    def _metadata(
        self,
        *,
        num_reqs: int,
        num_tokens_padded: int,
        seq_lens: list[int],
        mode: Any,
        capturing: bool,
    ) -> dict[str, Any]:
        """Metadata as ``_dummy_run`` / ``execute_model`` build it.

        Padding follows ``NPUModelRunner._pad_query_start_loc_for_fia``: FULL_DECODE_ONLY pads with
        one-token dummy requests (kv length 0) up to the capture size; FULL (and eager) add ONE
        dummy request holding every padding token. Padded block-table rows point at block 0,
        padded slots are -1 (no KV write).
        """
        stack, n, padded = self.stack, num_reqs, num_tokens_padded
        seq = stack.seq
        full_full = mode == self._full and self.scenario.compilation_mode == "FULL"
        if mode == self._full and not full_full:
            num_reqs_padded = padded  # uniform decode: one dummy 1-token request per pad token
            seq.set_queries(padded)
        else:
            num_reqs_padded = n
            seq.set_queries(n)
            if padded > n:  # FULL/FULL or eager padded: one dummy request holds the padding
                seq.query_start_loc[n + 1] = padded
                num_reqs_padded = n + 1
        seq.set_seq_lens(seq_lens)
        per_layer: dict[str, Any] = {}
        for group in stack.groups:
            group.block_table[n:num_reqs_padded].fill_(0)
            group.slot_mapping[n:padded].fill_(-1)
            common = seq.common(
                num_reqs=num_reqs_padded,
                num_actual_tokens=n,
                num_input_tokens=padded,
                max_seq_len=stack.max_model_len if capturing else max(seq_lens),
                block_table=group.block_table,
                slot_mapping=group.slot_mapping[:padded],
                positions=stack.positions,
            )
            md = group.build(common, capturing)
            for name in group.layer_names:
                per_layer[name] = md
        return stack.with_linear_keys(per_layer, stack.linear_metadata(num_reqs_padded, n))

    def _load_inputs(self, batch: DecodeBatch | None, padded: int) -> None:
        """Copy a step's inputs into the persistent buffers the graph captured."""
        stack = self.stack
        stack.input_ids[:padded].zero_()
        stack.positions[:padded].zero_()
        if batch is None:
            return
        n = batch.num_reqs
        stack.input_ids[:n] = batch.input_ids
        stack.positions[:n] = batch.positions
        for group in stack.groups:
            group.block_table[:n] = batch.block_rows
            group.slot_mapping[:n] = batch.slot_mapping

    def _context(self, metadata: dict[str, Any], num_tokens: int, mode: Any, bd: Any) -> Any:
        from vllm_ascend.ascend_forward_context import set_ascend_forward_context

        return set_ascend_forward_context(
            metadata,
            self.vllm_config,
            num_tokens=num_tokens,
            num_actual_tokens=num_tokens,
            aclgraph_runtime_mode=mode,
            batch_descriptor=bd,
            has_sinks=self.stack.has_sinks,
        )

    def _args(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.stack.input_ids[:num_tokens], self.stack.positions[:num_tokens]

    # ---- runs ------------------------------------------------------------------------------

    def capture_size(self, num_tokens: int) -> None:
        """The runner's dummy-run capture for one size: dummy metadata, ``capturing=True``."""
        import vllm_ascend.compilation.acl_graph as acl_graph
        from vllm.config import set_current_vllm_config
        from vllm_ascend.attention.utils import using_paged_attention

        if num_tokens in self._captured:
            return
        if acl_graph.get_graph_params() is None:
            acl_graph.set_graph_params(list(self.scenario.capture_sizes))
        with set_current_vllm_config(self.vllm_config):
            seq_len = (
                PA_CAPTURE_SEQ_LEN if using_paged_attention(num_tokens, self.vllm_config) else 1
            )
            self._load_inputs(None, num_tokens)
            for group in self.stack.groups:
                # Capture is warmed up once on the simulator: point it at no KV slot.
                group.slot_mapping[:num_tokens].fill_(-1)
            md = self._metadata(
                num_reqs=num_tokens,
                num_tokens_padded=num_tokens,
                seq_lens=[seq_len] * num_tokens,
                mode=self._full,
                capturing=True,
            )
            bd = self.stack.batch_descriptor(num_tokens)
            with self._context(md, num_tokens, self._full, bd):
                self.wrapper(*self._args(num_tokens))
            torch.npu.synchronize()
        self._captured.add(num_tokens)

    @contextmanager
    def open_step(self, batch: DecodeBatch) -> Iterator[OpenStep]:
        """Load ``batch`` for its graph size and hold its forward context open; synchronise
        after it closes (normally: an error inside propagates at once, as from the runner)."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import get_forward_context

        padded = batch.num_tokens_padded
        self.capture_size(padded)
        with set_current_vllm_config(self.vllm_config):
            self._load_inputs(batch, padded)
            md = self._metadata(
                num_reqs=batch.num_reqs,
                num_tokens_padded=padded,
                seq_lens=batch.seq_lens,
                mode=self._full,
                capturing=False,
            )
            self.last_metadata = md
            with self._context(md, padded, self._full, self.stack.batch_descriptor(padded)):
                fc = get_forward_context()
                args = (
                    self.update_stream,
                    fc,
                    padded,
                    self.vllm_config,
                    self.stack.speculative_config,
                    padded,
                    None,
                )
                yield OpenStep(fc, padded, args)
            torch.npu.current_stream().synchronize()

    def _update(self, step: OpenStep) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph

        # Resolved through the module attribute at call time (the overlay may wrap the class
        # attribute AscendAttentionBackendImpl.update_graph_params underneath).
        acl_graph.update_full_graph_params(
            self.stack.attn_backend,
            self.update_stream,
            step.forward_context,
            step.num_tokens,
            self.vllm_config,
            self.stack.speculative_config,
            self.stack.positions[: step.num_tokens].shape[0],
        )

    def _run_full(self, batch: DecodeBatch, release: str) -> torch.Tensor:
        with self.open_step(batch) as step:
            args = self._args(step.num_tokens)
            if release == "update" and self.scenario.update_order == "update_then_replay":
                torch.npu.current_stream().synchronize()  # ENPU: sync inside the update path
                self._update(step)
                out = self.wrapper(*args)
            else:
                out = self.wrapper(*args)
                if release == "update":
                    self._update(step)
                elif release == "record":
                    self._record_all(step.num_tokens)
        return out[: batch.num_reqs].clone()

    def _record_all(self, padded: int) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph

        for event in acl_graph.get_graph_params().events[padded]:
            event.record(self.update_stream)

    def _run_eager(self, batch: DecodeBatch) -> torch.Tensor:
        """The same real code without a graph (runtime mode NONE), unpadded as the eager runner."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import BatchDescriptor

        n = batch.num_reqs
        with set_current_vllm_config(self.vllm_config):
            self._load_inputs(batch, n)
            md = self._metadata(
                num_reqs=n,
                num_tokens_padded=n,
                seq_lens=batch.seq_lens,
                mode=self._none,
                capturing=False,
            )
            with self._context(md, n, self._none, BatchDescriptor(n)):
                out = self.wrapper(*self._args(n))
            torch.npu.current_stream().synchronize()
        return out[:n].clone()
