"""A simulated MTP / Eagle merged draft workload on the REAL vllm-ascend v1 proposer code.

What is real: ``AscendSpecDecodeBaseProposer._run_merged_draft`` (all draft steps in one graph,
``forward_context.attn_metadata`` swapped to ``draft_attn_metadatas[i]`` per step), the
``ACLGraphWrapper(use_eagle=True)`` around it (no pre-replay sync on the merged draft path), the
proposer's ``_update_full_graph_params`` (-> ``update_full_graph_params`` -> the stock
``AscendAttentionBackendImpl.update_graph_params`` draft branch, or whatever is installed on it),
``set_ascend_forward_context(is_draft_model=True, draft_attn_metadatas=...)``, the real
``AscendAttentionBackendImpl.forward`` per draft layer and the real metadata builder.

What is a stand-in (documented deviation): the proposer object is built with ``object.__new__``
and carries only the attributes those three methods read (buffers, method, flags, the draft
model, ``draft_attn_groups``, ``update_stream``); its ``__init__`` needs a whole runner and a
loaded draft model. The draft model is a toy network (embedding + hidden projection + the real
attention layers + an LM head). The per-step metadata is built as a correct proposer would:
per KV-cache group, one metadata object per step (kv length +1 per step, the step's slot mapping),
listed group by group in each step's dict, as the v1 runner lists ``attn_metadata``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from torch_npu_sim.harness.process import Lease
from torch_npu_sim.harness.spec import DraftScenario
from torch_npu_sim.harness.stack import OpenStep, SeqBuffers, Stack
from torch_npu_sim.harness.toy import D_MODEL, VOCAB, ToyLayer, random_ids, rms
from torch_npu_sim.workload import StepOutput

__all__ = ["DraftBatch", "DraftEngine"]


@dataclass
class DraftBatch:
    """One propose call: ``num_reqs`` requests, each drafting ``k`` tokens (one per step)."""

    step: int
    seq_lens: list[int]  # kv length at draft step 0 (including step 0's token)
    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden: torch.Tensor  # (num_reqs, D) target hidden states fed to the draft
    rows: list[torch.Tensor]  # per KV group: (num_reqs, max_blocks) int32
    num_tokens_padded: int

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)


class ToyDraft:
    """The draft network: every call is one draft step; it records its output per step."""

    def __init__(self, layers: list[ToyLayer], gen: torch.Generator, steps: int, tokens: int):
        self.layers = layers
        # The first draw is a target decoder's embedding, unused here: the draft engine once
        # extended the target engine, and the draft's weights stay where they were drawn then.
        torch.randn(VOCAB, D_MODEL, generator=gen)
        self.embed = torch.randn(VOCAB, D_MODEL, generator=gen)
        self.w_hidden = torch.randn(D_MODEL, D_MODEL, generator=gen) / D_MODEL**0.5
        self.lm_head = torch.randn(D_MODEL, VOCAB, generator=gen) / D_MODEL**0.5
        self.freqs = torch.linspace(0.01, 1.0, D_MODEL)
        self.step_out = torch.zeros(steps, tokens, D_MODEL)

    def _step(self) -> int:
        from vllm.forward_context import get_forward_context

        fc = get_forward_context()
        per_step = getattr(fc, "draft_attn_metadatas", None) or []
        for i, md in enumerate(per_step):
            if md is fc.attn_metadata:
                return i
        return 0

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: Any = None,
        hidden_states: Any = None,
    ) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        step = self._step()  # host code: runs at capture (the slice below is then fixed)
        x = torch.nn.functional.embedding(input_ids, self.embed)
        x = x + 0.1 * torch.sin(positions.unsqueeze(-1).to(x.dtype) * self.freqs)
        if hidden_states is not None:
            x = x + hidden_states @ self.w_hidden
        for layer in self.layers:
            x = x + layer.attend(rms(x), metadata)
        out = rms(x)
        self.step_out[step, : out.shape[0]] = out
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.lm_head


class _TupleModel:
    """Eagle's draft model returns (last_hidden, hidden): the toy draft's output twice."""

    def __init__(self, toy: ToyDraft) -> None:
        self.toy = toy

    def __call__(self, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.toy(**kw)
        return out, out

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.toy.compute_logits(h)


class _WithSpeculativeConfig:
    """The engine's ``VllmConfig`` as the proposer reads it, with a speculative config: the MLA
    draft update reads ``speculative_config.disable_padded_drafter_batch``, and a real
    ``SpeculativeConfig`` needs a draft checkpoint. Everything else is the engine's config."""

    def __init__(self, config: Any, speculative_config: Any) -> None:
        self._config = config
        self.speculative_config = speculative_config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def speculative_stand_in(draft: DraftScenario) -> Any:
    """What the MLA draft paths read of vLLM's ``SpeculativeConfig`` (an MTP method: Eagle-like;
    a padded drafter batch, vLLM's default)."""
    return SimpleNamespace(
        method=draft.method,
        num_speculative_tokens=draft.num_speculative_tokens,
        disable_padded_drafter_batch=False,
        use_eagle=lambda: True,
    )


def make_proposer(
    draft: DraftScenario, vllm_config: Any, max_tokens: int, model: ToyDraft, backend: Any = None
) -> Any:
    """The proposer stand-in: what ``_run_merged_draft`` / ``_update_full_graph_params`` read."""
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend
    from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer

    n = max_tokens
    p = object.__new__(AscendEagleProposer)
    p.__dict__.update(
        method=draft.method,
        vllm_config=vllm_config,
        device=torch.device("cpu"),
        num_speculative_tokens=draft.num_speculative_tokens,
        parallel_drafting=False,
        pass_hidden_states_to_model=True,
        _share_mtp_indices=False,
        use_cuda_graph=True,
        supports_mm_inputs=False,
        is_multimodal_model=False,
        enable_shared_expert_dp=False,
        uses_mrope=False,
        uses_xdrope_dim=0,
        draft_uses_xdrope_dim=0,
        pcp_size=1,
        runner=SimpleNamespace(pcp_manager=None),
        input_ids=torch.zeros(n, dtype=torch.int64),
        positions=torch.zeros(n, dtype=torch.int64),
        hidden_states=torch.zeros(n, D_MODEL),
        arange=torch.arange(n + 1, dtype=torch.int64),
        token_indices_to_sample=torch.arange(n, dtype=torch.int64),
        draft_attn_groups=[SimpleNamespace(backend=backend or AscendAttentionBackend)],
        update_stream=torch.npu.Stream(),
        model=_TupleModel(model) if draft.method == "eagle" else model,
    )
    return p


class DraftEngine:
    """The merged draft graph of one draft scenario, captured and replayed on the simulator.

    Comparability: the eager run puts back every KV slot its draft steps wrote, so it leaves the
    caches as it found them and the graph run of the same batch, before or after, sees them too.
    """

    def __init__(self, draft: DraftScenario, *, num_threads: int | None = 1) -> None:
        self.name, self.stock, self.draft = draft.name, draft.stock, draft
        self.scenario = draft.base()
        self.lease = Lease(draft.name, num_threads)
        try:
            from vllm.config import CUDAGraphMode, set_current_vllm_config

            self.stack = Stack(self.scenario)
            self.vllm_config = self.stack.vllm_config
            k, n = draft.num_speculative_tokens, self.stack.max_tokens
            self.model = ToyDraft(self.stack.layers, self.stack.gen, k, n)
            self._full, self._none = CUDAGraphMode.FULL, CUDAGraphMode.NONE
            with set_current_vllm_config(self.vllm_config):
                self._build_wrapper()
        except BaseException:
            self.close()  # a half-built engine must not block the next one
            raise
        #: Per draft step: sequence buffers and, per KV group, the step's slot mapping.
        self.bufs = [SeqBuffers.allocate(self.stack.max_num_reqs) for _ in range(k)]
        self.step_slots = [
            [torch.full((n,), -1, dtype=torch.int64) for _ in self.stack.groups] for _ in range(k)
        ]
        self._step = 0
        self._captured: set[int] = set()
        rng = random.Random(draft.seed)
        max_kv = self.scenario.max_kv_len
        self._computed = [rng.randrange(0, max_kv - k - 1) for _ in range(self.stack.max_num_reqs)]

    def _build_wrapper(self) -> None:
        import vllm_ascend.utils as va_utils
        from vllm_ascend.compilation.acl_graph import ACLGraphWrapper

        # No SpeculativeConfig (it needs a draft checkpoint): the drafter is not MoE.
        va_utils._IS_DRAFTER_MOE_MODEL = False
        config = self.vllm_config
        mla = [layer for layer in self.stack.layers if layer.spec.kind == "mla"]
        if mla:  # the MLA draft paths read a speculative config: the impls' and the update's
            spec = speculative_stand_in(self.draft)
            for layer in mla:
                layer.impl.speculative_config = spec
            config = _WithSpeculativeConfig(config, spec)
        self.proposer = make_proposer(
            self.draft, config, self.stack.max_tokens, self.model, self.stack.attn_backend
        )
        self.wrapper = ACLGraphWrapper(
            self.proposer._run_merged_draft,
            self.vllm_config,
            self._full,
            use_eagle=True,
            enable_enpu=self.draft.update_order == "update_then_replay",
        )
        self.proposer._runnable = self.wrapper
        self.update_stream = self.proposer.update_stream

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the graphs (the proposer holds the wrapper too) and reset the process."""
        self.lease.release(self._drop_graphs)

    def _drop_graphs(self) -> None:
        # The proposer and its wrapper refer to each other (``_runnable``, ``_run_merged_draft``):
        # cut that cycle, or the graphs outlive the engine until a gc pass, and the next draft
        # engine's graphs would share their (role, descriptor) with these.
        if getattr(self, "proposer", None) is not None:
            self.proposer._runnable = None
        self.proposer = self.wrapper = self.model = self.stack = None

    # ---- workload --------------------------------------------------------------------------

    def next_batch(self, rng: random.Random) -> DraftBatch:
        """A propose call for a random subset of requests; each advances by one token."""
        stack, k = self.stack, self.draft.num_speculative_tokens
        n = rng.randint(1, stack.max_num_reqs)
        slots = rng.sample(range(stack.max_num_reqs), n)
        seq_lens, positions = [], []
        for s in slots:
            if self._computed[s] + k + 1 > self.scenario.max_kv_len:
                self._computed[s] = rng.randrange(0, self.scenario.max_kv_len // 2)
            positions.append(self._computed[s])
            seq_lens.append(self._computed[s] + 1)
            self._computed[s] += 1
        self._step += 1
        # group 1+ walks the request's blocks backwards (distinct tables): a different table
        rows = [
            torch.tensor(
                [stack.block_row(s, reverse=bool(g) and self.draft.distinct_tables) for s in slots],
                dtype=torch.int32,
            )
            for g in range(len(stack.groups))
        ]
        return DraftBatch(
            step=self._step,
            seq_lens=seq_lens,
            input_ids=random_ids(rng, n),
            positions=torch.tensor(positions, dtype=torch.int64),
            hidden=torch.randn(n, D_MODEL, generator=torch.Generator().manual_seed(self._step)),
            rows=rows,
            num_tokens_padded=self.stack.padded_size(n),
        )

    def capture(self) -> None:
        for size in self.scenario.capture_sizes:
            self.capture_size(size)

    def run(self, batch: DraftBatch, *, graph: bool = True) -> StepOutput:
        """The propose call through the merged draft graph (replay + update), or eagerly."""
        if graph:
            return self._run_graph(batch, "update")
        k = self.draft.num_speculative_tokens
        slots = [
            torch.cat([self._slots(batch, g, step) for step in range(k)])
            for g in range(len(self.stack.groups))
        ]
        with self.stack.kv_restored(slots):
            return self._run_eager(batch)

    def run_without_update(self, batch: DraftBatch, *, record: bool = True) -> StepOutput:
        """Negative control: replay, then release every captured event WITHOUT the update.

        With ``record=False`` the events are not recorded either, so the replay stays blocked and
        the simulator must raise ``SimulatorError`` at the synchronisation (on hardware: a hang).
        """
        return self._run_graph(batch, "record" if record else "none")

    def _output(self, n: int, tokens: Any) -> StepOutput:
        hidden = self.model.step_out[:, :n].clone()  # (steps, requests, D)
        k = self.draft.num_speculative_tokens
        return StepOutput(
            values=hidden.transpose(0, 1),
            tokens=torch.as_tensor(tokens).reshape(-1, k)[:n].tolist(),
            logits=self.model.compute_logits(hidden).transpose(0, 1),
        )

    # ---- metadata, as a correct proposer builds it -------------------------------------------

    def _slots(self, batch: DraftBatch, group: int, step: int) -> torch.Tensor:
        """The flat KV slot draft step ``step`` writes for each request, in group ``group``."""
        return self.stack.token_slots(batch.rows[group], batch.positions + step)

    def _draft_metadata(
        self, batch: DraftBatch | None, num_tokens: int, padded: bool, capturing: bool
    ) -> list[dict[str, Any]]:
        """Per-step metadata, per KV group, listed group by group (the v1 runner's order)."""
        stack = self.stack
        n = num_tokens if batch is None else batch.num_reqs
        total = num_tokens
        nr = total if padded else n  # FULL_DECODE_ONLY: one 1-token dummy request per pad token
        per_step: list[dict[str, Any]] = []
        for step, (seq, step_slots) in enumerate(zip(self.bufs, self.step_slots, strict=True)):
            seq.set_queries(nr)
            if batch is None:
                seq.set_seq_lens([1] * n)
            else:
                seq.set_seq_lens(torch.tensor(batch.seq_lens, dtype=torch.int32) + step)
            per_layer: dict[str, Any] = {}
            for g, group in enumerate(stack.groups):
                slot = step_slots[g]
                slot.fill_(-1)
                if batch is not None:
                    slot[:n] = self._slots(batch, g, step)
                common = seq.common(
                    num_reqs=nr,
                    num_actual_tokens=n,
                    num_input_tokens=total,
                    max_seq_len=stack.max_model_len if capturing else int(seq.seq_lens_cpu.max()),
                    block_table=group.block_table,
                    slot_mapping=slot[:total],
                    positions=self.proposer.positions,
                    causal=self.draft.causal(step),
                )
                md = group.build(common, capturing)
                for name in group.layer_names:
                    per_layer[name] = md
            per_step.append(per_layer)
        return per_step

    def _load(self, batch: DraftBatch | None, num_tokens: int) -> None:
        p = self.proposer
        p.input_ids[:num_tokens].zero_()
        p.positions[:num_tokens].zero_()
        p.hidden_states[:num_tokens].zero_()
        self.model.step_out.zero_()
        for group in self.stack.groups:
            group.block_table.zero_()
        if batch is None:
            return
        n = batch.num_reqs
        p.input_ids[:n] = batch.input_ids
        p.positions[:n] = batch.positions
        p.hidden_states[:n] = batch.hidden
        for g, group in enumerate(self.stack.groups):
            group.block_table[:n] = batch.rows[g]

    def _draft_context(
        self, per_step: list[dict[str, Any]], num_tokens: int, mode: Any, bd: Any
    ) -> Any:
        from vllm_ascend.ascend_forward_context import set_ascend_forward_context

        return set_ascend_forward_context(
            per_step[0],
            self.vllm_config,
            num_tokens=num_tokens,
            num_actual_tokens=num_tokens,
            aclgraph_runtime_mode=mode,
            batch_descriptor=bd,
            is_draft_model=True,
            draft_attn_metadatas=per_step,
        )

    def _call(self, num_tokens: int, per_step: list[dict[str, Any]]) -> torch.Tensor:
        p = self.proposer
        return self.wrapper(
            num_input_tokens=num_tokens,
            batch_size=num_tokens,
            token_indices_to_sample=p.token_indices_to_sample[:num_tokens],
            target_positions=p._get_positions(num_tokens),
            inputs_embeds=None,
            multi_steps_attn_metadata=per_step,
            num_tokens=num_tokens,
        )

    # ---- runs ------------------------------------------------------------------------------

    def capture_size(self, num_tokens: int) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph
        from vllm.config import set_current_vllm_config

        if num_tokens in self._captured:
            return
        sizes = list(self.scenario.capture_sizes)
        if acl_graph.get_draft_graph_params() is None:
            acl_graph.set_draft_graph_params(sizes)
        if acl_graph.get_graph_params() is None:
            acl_graph.set_graph_params(sizes)
        with set_current_vllm_config(self.vllm_config):
            self._load(None, num_tokens)
            per_step = self._draft_metadata(None, num_tokens, True, True)
            bd = self.stack.batch_descriptor(num_tokens)
            with self._draft_context(per_step, num_tokens, self._full, bd):
                self._call(num_tokens, per_step)
            torch.npu.synchronize()
        self._captured.add(num_tokens)

    @contextmanager
    def open_step(self, batch: DraftBatch) -> Iterator[OpenStep]:
        """Load ``batch`` for its graph size and hold its draft forward context open; synchronise
        after it closes (normally: an error inside propagates at once, as from the proposer)."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import get_forward_context

        padded = batch.num_tokens_padded
        self.capture_size(padded)
        p = self.proposer
        with set_current_vllm_config(self.vllm_config):
            self._load(batch, padded)
            per_step = self._draft_metadata(batch, padded, True, False)
            bd = self.stack.batch_descriptor(padded)
            with self._draft_context(per_step, padded, self._full, bd):
                fc = get_forward_context()
                # what the proposer's _update_full_graph_params hands on (no dcp/pcp tokens)
                args = (
                    p.update_stream,
                    fc,
                    padded,
                    p.vllm_config,
                    p.vllm_config.speculative_config,
                    None,
                    per_step,
                )
                yield OpenStep(fc, padded, args, per_step)
            torch.npu.current_stream().synchronize()

    def replay(self, step: OpenStep) -> Any:
        """Replay the open step's merged draft graph (no update): the proposer's call."""
        return self._call(step.num_tokens, step.draft_metadatas)

    def _run_graph(self, batch: DraftBatch, release: str) -> StepOutput:
        """Replay the merged draft graph and update it as ``_propose`` does (ENPU: update first);
        ``release`` "record" / "none": the negative controls of ``run_without_update``."""
        with self.open_step(batch) as step:
            if self.draft.update_order == "update_then_replay":
                torch.npu.current_stream().synchronize()
                self._release(step, release)
                tokens = self.replay(step)
            else:
                tokens = self.replay(step)
                self._release(step, release)
        return self._output(batch.num_reqs, tokens)

    def _release(self, step: OpenStep, release: str) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph

        if release == "update":
            self.proposer._update_full_graph_params(
                step.forward_context, step.num_tokens, step.draft_metadatas
            )
        elif release == "record":
            for event in acl_graph.get_draft_graph_params().events[step.num_tokens]:
                event.record(self.update_stream)

    def _run_eager(self, batch: DraftBatch) -> StepOutput:
        """The same real ``_run_merged_draft`` without a graph, unpadded."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import BatchDescriptor

        n = batch.num_reqs
        with set_current_vllm_config(self.vllm_config):
            self._load(batch, n)
            per_step = self._draft_metadata(batch, n, False, False)
            with self._draft_context(per_step, n, self._none, BatchDescriptor(n)):
                tokens = self._call(n, per_step)
            torch.npu.current_stream().synchronize()
        return self._output(n, tokens)
