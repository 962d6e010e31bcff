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

The engine reuses ``SimEngine``'s configuration, process set-up and layer construction (it is a
subclass) but replaces the model, the wrapper and the runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from torch_npu_sim.harness.target import (
    _D_MODEL,
    _VOCAB,
    LayerSpec,
    Scenario,
    SimEngine,
    _rms,
    _shallow_copy,
    _ToyLayer,
)

__all__ = ["DRAFT_SCENARIOS", "DraftBatch", "DraftEngine", "DraftScenario", "draft_layer"]


def draft_layer(i: int) -> str:
    """vLLM prefix of an MTP draft layer (it sits after the target's layers)."""
    return f"model.layers.{60 + i}.self_attn.attn"


@dataclass(frozen=True)
class DraftScenario:
    """A merged draft graph workload."""

    name: str
    layers: tuple[LayerSpec, ...]
    num_speculative_tokens: int = 2
    capture_sizes: tuple[int, ...] = (4, 8)
    max_kv_len: int = 384
    # per draft step: is the step causal? (non-causal steps relaunch FIA with sparse_mode 0)
    causal_steps: tuple[bool, ...] | None = None
    # "distinct": each KV-cache group has its own block table rows (Gemma4 MTP); "same": shared
    distinct_tables: bool = True
    update_order: str = "replay_then_update"  # or "update_then_replay" (ENPU / 310P)
    method: str = "mtp"
    seed: int = 0
    # observed behaviour of the stock 0.23.0.post1 update on this workload
    stock: str = "ok"

    def base(self) -> Scenario:
        return Scenario(
            name=self.name,
            layers=self.layers,
            capture_sizes=self.capture_sizes,
            max_kv_len=self.max_kv_len,
            update_order=self.update_order,
            seed=self.seed,
            metadata_order="groups",
        )

    def causal(self, step: int) -> bool:
        return True if self.causal_steps is None else self.causal_steps[step]


def _scenarios() -> dict[str, DraftScenario]:
    one = (LayerSpec(draft_layer(0)),)
    two = (LayerSpec(draft_layer(0)), LayerSpec(draft_layer(1)))
    out: dict[str, DraftScenario] = {}
    for k in (1, 2, 3, 4):
        out[f"mtp_k{k}"] = DraftScenario(f"mtp_k{k}", one, num_speculative_tokens=k)
    out["mtp_2layers_k3"] = DraftScenario("mtp_2layers_k3", two, num_speculative_tokens=3)
    out["eagle_2layers_k2"] = DraftScenario(
        "eagle_2layers_k2", two, num_speculative_tokens=2, method="eagle"
    )
    # Gemma4-MTP-like: draft layers 0 and 2 in the full-attention group, layer 1 in a sliding
    # group with its own block table. Each step's dict lists group A (0, 2) then group B (1):
    # the captured (model) order is 0, 1, 2, so a positional zip pairs layer 1 with layer 2's
    # metadata and block table.
    out["mtp_two_kv_groups"] = DraftScenario(
        "mtp_two_kv_groups",
        (
            LayerSpec(draft_layer(0)),
            LayerSpec(draft_layer(1), sliding_window=64),
            LayerSpec(draft_layer(2)),
        ),
        num_speculative_tokens=3,
        stock="wrong: positional pairing binds layer 61 to layer 62's block table",
    )
    # two KV groups whose dict order happens to be the model order: stock pairs them right
    out["mtp_two_kv_groups_ordered"] = DraftScenario(
        "mtp_two_kv_groups_ordered",
        (LayerSpec(draft_layer(0)), LayerSpec(draft_layer(1), sliding_window=64)),
        num_speculative_tokens=2,
    )
    out["mtp_non_causal"] = DraftScenario(
        "mtp_non_causal", two, num_speculative_tokens=3, causal_steps=(True, False, False)
    )
    out["mtp_enpu_k3"] = DraftScenario(
        "mtp_enpu_k3", two, num_speculative_tokens=3, update_order="update_then_replay"
    )
    return out


DRAFT_SCENARIOS: dict[str, DraftScenario] = _scenarios()


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


class _ToyDraft:
    """The draft network: every call is one draft step; it records its output per step."""

    def __init__(self, layers: list[_ToyLayer], gen: torch.Generator, steps: int, tokens: int):
        self.layers = layers
        self.embed = torch.randn(_VOCAB, _D_MODEL, generator=gen)
        self.w_hidden = torch.randn(_D_MODEL, _D_MODEL, generator=gen) / _D_MODEL**0.5
        self.lm_head = torch.randn(_D_MODEL, _VOCAB, generator=gen) / _D_MODEL**0.5
        self.freqs = torch.linspace(0.01, 1.0, _D_MODEL)
        self.step_out = torch.zeros(steps, tokens, _D_MODEL)

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
            spec = layer.spec
            h = _rms(x)
            t = h.shape[0]
            q = (h @ layer.wq).view(t, spec.num_heads, spec.head_size)
            k = (h @ layer.wk).view(t, spec.num_kv_heads, spec.head_size)
            v = (h @ layer.wv).view(t, spec.num_kv_heads, spec.head_size)
            out = torch.empty(t, spec.num_heads, spec.head_size, dtype=x.dtype)
            attn_md = metadata[spec.name] if metadata is not None else None
            layer.impl.forward(layer.shim, q, k, v, layer.kv_cache, attn_md, out)
            x = x + out.view(t, -1) @ layer.wo
        out = _rms(x)
        self.step_out[step, :t] = out
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.lm_head


@dataclass
class _StepBuffers:
    """Persistent per-step inputs of the draft metadata (the proposer's *_group buffers)."""

    query_start_loc: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_dev: torch.Tensor
    slot_mapping: list[torch.Tensor] = field(default_factory=list)  # per KV group


def make_proposer(engine: DraftEngine) -> Any:
    """The proposer stand-in: what ``_run_merged_draft`` / ``_update_full_graph_params`` read."""
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend
    from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer

    sc = engine.draft
    n = engine.max_tokens
    p = object.__new__(AscendEagleProposer)
    p.__dict__.update(
        method=sc.method,
        vllm_config=engine.vllm_config,
        device=torch.device("cpu"),
        num_speculative_tokens=sc.num_speculative_tokens,
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
        hidden_states=torch.zeros(n, _D_MODEL),
        arange=torch.arange(n + 1, dtype=torch.int64),
        token_indices_to_sample=torch.arange(n, dtype=torch.int64),
        draft_attn_groups=[SimpleNamespace(backend=AscendAttentionBackend)],
        update_stream=torch.npu.Stream(),
        model=engine.model,
    )
    if sc.method == "eagle":  # eagle returns (last_hidden, hidden): wrap the toy output
        toy = engine.model

        class _Tuple:
            def __call__(self, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
                out = toy(**kw)
                return out, out

            def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
                return toy.compute_logits(h)

        p.model = _Tuple()
    return p


class DraftEngine(SimEngine):
    """The merged draft graph of one draft scenario, captured and replayed on the simulator."""

    def __init__(self, draft: DraftScenario) -> None:
        self.draft = draft
        super().__init__(draft.base())

    def close(self) -> None:
        """Also drop the proposer: it holds the draft wrapper, and with it the captured graphs."""
        self.proposer = None
        super().close()

    # ---- construction (overrides) ------------------------------------------------------------

    def _build_model(self, gen: torch.Generator) -> None:
        super()._build_model(gen)
        self.model = _ToyDraft(
            self.layers, gen, self.draft.num_speculative_tokens, max(self.scenario.capture_sizes)
        )

    def _build_wrapper(self) -> None:
        import vllm_ascend.utils as va_utils
        from vllm_ascend.compilation.acl_graph import ACLGraphWrapper

        # No SpeculativeConfig (it needs a draft checkpoint): the drafter is not MoE.
        va_utils._IS_DRAFTER_MOE_MODEL = False
        k = self.draft.num_speculative_tokens
        self.proposer = make_proposer(self)
        self.wrapper = ACLGraphWrapper(
            self.proposer._run_merged_draft,
            self.vllm_config,
            self._full,
            use_eagle=True,
            enable_enpu=self.draft.update_order == "update_then_replay",
        )
        self.proposer._runnable = self.wrapper
        self.update_stream = self.proposer.update_stream
        n = self.max_tokens
        self.bufs = []
        for _ in range(k):
            b = _StepBuffers(
                query_start_loc=torch.zeros(self.max_num_reqs + 2, dtype=torch.int32),
                seq_lens_cpu=torch.zeros(self.max_num_reqs + 1, dtype=torch.int32),
                seq_lens_dev=torch.zeros(self.max_num_reqs + 1, dtype=torch.int32),
            )
            b.slot_mapping = [torch.full((n,), -1, dtype=torch.int64) for _ in self.groups]
            self.bufs.append(b)
        self._draft_rng = random.Random(self.draft.seed)
        self._computed = [
            self._draft_rng.randrange(0, self.scenario.max_kv_len - k - 1)
            for _ in range(self.max_num_reqs)
        ]

    # ---- workload ----------------------------------------------------------------------------

    def _row(self, slot: int, group: int) -> list[int]:
        first = 1 + slot * self.blocks_per_req
        row = [0] * self.max_blocks
        for b in range(self.blocks_per_req):
            # group 1+ walks the request's blocks backwards: a different block table
            j = self.blocks_per_req - 1 - b if (group and self.draft.distinct_tables) else b
            row[b] = first + j
        return row

    def draft_batch(self, rng: random.Random) -> DraftBatch:
        k = self.draft.num_speculative_tokens
        n = rng.randint(1, self.max_num_reqs)
        slots = rng.sample(range(self.max_num_reqs), n)
        seq_lens, positions = [], []
        for s in slots:
            if self._computed[s] + k + 1 > self.scenario.max_kv_len:
                self._computed[s] = rng.randrange(0, self.scenario.max_kv_len // 2)
            positions.append(self._computed[s])
            seq_lens.append(self._computed[s] + 1)
            self._computed[s] += 1
        self._step += 1
        rows = [
            torch.tensor([self._row(s, g) for s in slots], dtype=torch.int32)
            for g in range(len(self.groups))
        ]
        return DraftBatch(
            step=self._step,
            seq_lens=seq_lens,
            input_ids=torch.tensor([rng.randrange(_VOCAB) for _ in range(n)], dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            hidden=torch.randn(n, _D_MODEL, generator=torch.Generator().manual_seed(self._step)),
            rows=rows,
            num_tokens_padded=self.padded_size(n),
        )

    def _draft_metadata(
        self, batch: DraftBatch | None, num_tokens: int, padded: bool, capturing: bool
    ) -> list[dict[str, Any]]:
        """Per-step metadata, per KV group, listed group by group (the v1 runner's order)."""
        from vllm_ascend.attention.attention_v1 import AscendAttentionState
        from vllm_ascend.attention.utils import AscendCommonAttentionMetadata

        bs = self.block_size
        n = num_tokens if batch is None else batch.num_reqs
        total = num_tokens
        nr = total if padded else n  # FULL_DECODE_ONLY: one 1-token dummy request per pad token
        per_step: list[dict[str, Any]] = []
        for step, buf in enumerate(self.bufs):
            qsl = buf.query_start_loc
            qsl.zero_()
            qsl[1 : nr + 1] = torch.arange(1, nr + 1, dtype=torch.int32)
            buf.seq_lens_cpu.zero_()
            if batch is None:
                buf.seq_lens_cpu[:n] = 1
            else:
                buf.seq_lens_cpu[:n] = torch.tensor(batch.seq_lens, dtype=torch.int32) + step
            buf.seq_lens_dev.copy_(buf.seq_lens_cpu)
            md_by_group = []
            for g, group in enumerate(self.groups):
                slot = buf.slot_mapping[g]
                slot.fill_(-1)
                if batch is not None:
                    pos = batch.positions + step
                    blk = batch.rows[g].gather(1, (pos // bs).unsqueeze(1).to(torch.int64))
                    slot[:n] = blk.squeeze(1).to(torch.int64) * bs + pos % bs
                cm = AscendCommonAttentionMetadata(
                    query_start_loc=qsl[: nr + 1],
                    query_start_loc_cpu=qsl[: nr + 1],
                    seq_lens=buf.seq_lens_dev[:nr],
                    _seq_lens_cpu=buf.seq_lens_cpu[:nr],
                    seq_lens_cpu_upper_bound=buf.seq_lens_cpu[:nr],
                    seq_lens_cpu=buf.seq_lens_cpu[:nr],
                    num_reqs=nr,
                    num_actual_tokens=n,
                    max_query_len=1,
                    max_seq_len=self.max_model_len if capturing else int(buf.seq_lens_cpu.max()),
                    block_table_tensor=group.block_table[:nr],
                    slot_mapping=slot[:total],
                    causal=self.draft.causal(step),
                    num_input_tokens=total,
                    positions=self.proposer.positions,
                    attn_state=AscendAttentionState.DecodeOnly,
                    decode_token_per_req=1,
                )
                md_by_group.append(
                    group.builder.build_for_cudagraph_capture(_shallow_copy(cm))
                    if capturing
                    else group.builder.build(
                        common_prefix_len=0, common_attn_metadata=_shallow_copy(cm)
                    )
                )
            per_step.append(
                {
                    name: md
                    for group, md in zip(self.groups, md_by_group, strict=True)
                    for name in group.layer_names
                }
            )
        return per_step

    def _load(self, batch: DraftBatch | None, num_tokens: int) -> None:
        p = self.proposer
        p.input_ids[:num_tokens].zero_()
        p.positions[:num_tokens].zero_()
        p.hidden_states[:num_tokens].zero_()
        self.model.step_out.zero_()
        for group in self.groups:
            group.block_table.zero_()
        if batch is None:
            return
        n = batch.num_reqs
        p.input_ids[:n] = batch.input_ids
        p.positions[:n] = batch.positions
        p.hidden_states[:n] = batch.hidden
        for g, group in enumerate(self.groups):
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

    def _ensure_graph_params(self) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph

        if acl_graph.get_draft_graph_params() is None:
            acl_graph.set_draft_graph_params(list(self.scenario.capture_sizes))
        if acl_graph.get_graph_params() is None:
            acl_graph.set_graph_params(list(self.scenario.capture_sizes))

    def capture(self, num_tokens: int) -> None:
        from vllm.config import set_current_vllm_config

        if num_tokens in self._captured:
            return
        self._ensure_graph_params()
        with set_current_vllm_config(self.vllm_config):
            self._load(None, num_tokens)
            per_step = self._draft_metadata(None, num_tokens, True, True)
            bd = self._batch_descriptor(num_tokens)
            with self._draft_context(per_step, num_tokens, self._full, bd):
                self._call(num_tokens, per_step)
            torch.npu.synchronize()
        self._captured.add(num_tokens)

    def _outputs(self, n: int, tokens: Any) -> dict[str, torch.Tensor]:
        return {
            "hidden": self.model.step_out[:, :n].clone(),
            "tokens": torch.as_tensor(tokens)
            .reshape(-1, self.draft.num_speculative_tokens)[:n]
            .clone(),
        }

    def run_draft_graph(self, batch: DraftBatch, *, update: bool = True) -> dict[str, torch.Tensor]:
        """Replay the merged draft graph and update it as ``_propose`` does (ENPU: update first)."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import get_forward_context

        padded = batch.num_tokens_padded
        self.capture(padded)
        with set_current_vllm_config(self.vllm_config):
            self._load(batch, padded)
            per_step = self._draft_metadata(batch, padded, True, False)
            self.last_metadata = per_step
            bd = self._batch_descriptor(padded)
            with self._draft_context(per_step, padded, self._full, bd):
                fc = get_forward_context()
                if self.draft.update_order == "update_then_replay":
                    torch.npu.current_stream().synchronize()
                    if update:
                        self.proposer._update_full_graph_params(fc, padded, per_step)
                    tokens = self._call(padded, per_step)
                else:
                    tokens = self._call(padded, per_step)
                    if update:
                        self.proposer._update_full_graph_params(fc, padded, per_step)
            torch.npu.current_stream().synchronize()
        return self._outputs(batch.num_reqs, tokens)

    def run_draft_eager(self, batch: DraftBatch) -> dict[str, torch.Tensor]:
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
        return self._outputs(n, tokens)

    def restore_kv(self, snapshot: dict[str, torch.Tensor]) -> None:
        for layer in self.layers:
            if layer.spec.name in snapshot:
                layer.kv_cache.copy_(snapshot[layer.spec.name])
