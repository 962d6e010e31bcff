"""The runner side every harness engine shares: vLLM config, KV-cache groups, persistent buffers.

Built for one scenario, as the v1 ``NPUModelRunner`` (and the v2 runner) build it: a ``VllmConfig``
over a toy ``config.json``; the toy layers with their real attention impls and KV caches; one real
``AscendAttentionMetadataBuilder`` per KV-cache group with its persistent block table and slot
mapping; the persistent input and sequence buffers the captured graphs read. The engines add their
model wrapper and runs on top (composition: target, draft and v2 each hold a ``Stack``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from torch_npu_sim.harness import process
from torch_npu_sim.harness.spec import LayerSpec, Scenario
from torch_npu_sim.harness.toy import D_MODEL, VOCAB, ToyLayer, build_layers, register

# vllm-ascend's dummy capture run uses this kv length when PA is chosen for the size
# (model_runner_v1.SEQ_LEN_WITH_MAX_PA_WORKSPACE); the block tables must be able to cover it.
PA_CAPTURE_SEQ_LEN = 6144


@dataclass
class LinearAttnMetadata:
    """Stand-in for a GDN (linear-attention) layer's metadata; it has no FIA fields on purpose."""

    num_prefills: int
    num_decodes: int
    num_actual_tokens: int
    state_indices: torch.Tensor


@dataclass
class SeqBuffers:
    """Persistent query / sequence-length buffers the metadata views (the runner's
    ``query_start_loc`` and ``optimistic_seq_lens_cpu`` / ``seq_lens``)."""

    query_start_loc: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_dev: torch.Tensor

    @classmethod
    def allocate(cls, max_num_reqs: int) -> SeqBuffers:
        return cls(
            query_start_loc=torch.zeros(max_num_reqs + 2, dtype=torch.int32),
            seq_lens_cpu=torch.zeros(max_num_reqs + 1, dtype=torch.int32),
            seq_lens_dev=torch.zeros(max_num_reqs + 1, dtype=torch.int32),
        )

    def set_queries(self, num_reqs: int, query_len: int = 1) -> None:
        """``num_reqs`` requests of ``query_len`` tokens each (cumulative query ends)."""
        qsl = self.query_start_loc
        qsl.zero_()
        qsl[1 : num_reqs + 1] = torch.arange(1, num_reqs + 1, dtype=torch.int32) * query_len

    def set_seq_lens(
        self, seq_lens: torch.Tensor | list[int], *, num_reqs_padded: int = 0, pad: int = 0
    ) -> None:
        """KV lengths of the real requests, ``pad`` for the padding requests up to
        ``num_reqs_padded``, 0 after; host buffer copied to the device one."""
        self.seq_lens_cpu.zero_()
        self.seq_lens_cpu[:num_reqs_padded] = pad
        self.seq_lens_cpu[: len(seq_lens)] = torch.as_tensor(seq_lens, dtype=torch.int32)
        self.seq_lens_dev.copy_(self.seq_lens_cpu)

    def common(
        self,
        *,
        num_reqs: int,
        num_actual_tokens: int,
        num_input_tokens: int,
        max_seq_len: int,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        positions: torch.Tensor,
        query_len: int = 1,
        causal: bool = True,
    ) -> Any:
        """``AscendCommonAttentionMetadata`` over these buffers for ``num_reqs`` (padded) requests
        of ``query_len`` tokens each: decode-only for one token, chunked prefill for more."""
        from vllm_ascend.attention.attention_v1 import AscendAttentionState
        from vllm_ascend.attention.utils import AscendCommonAttentionMetadata

        nr = num_reqs
        state = AscendAttentionState.DecodeOnly
        if query_len > 1:
            state = AscendAttentionState.ChunkedPrefill
        return AscendCommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: nr + 1],
            query_start_loc_cpu=self.query_start_loc[: nr + 1],
            seq_lens=self.seq_lens_dev[:nr],
            _seq_lens_cpu=self.seq_lens_cpu[:nr],
            seq_lens_cpu_upper_bound=self.seq_lens_cpu[:nr],
            seq_lens_cpu=self.seq_lens_cpu[:nr],
            num_reqs=nr,
            num_actual_tokens=num_actual_tokens,
            max_query_len=query_len,
            max_seq_len=max_seq_len,
            block_table_tensor=block_table[:nr],
            slot_mapping=slot_mapping,
            causal=causal,
            num_input_tokens=num_input_tokens,
            positions=positions,
            attn_state=state,
            decode_token_per_req=query_len,
        )


@dataclass
class OpenStep:
    """A graph step's forward context, open: what the update reads (the benchmark times it)."""

    forward_context: Any
    num_tokens: int
    #: The positional arguments ``update_full_graph_params`` hands to ``update_graph_params``.
    update_args: tuple
    #: Per draft step metadata (draft engines), else None.
    draft_metadatas: list[dict[str, Any]] | None = None


@dataclass
class KVGroup:
    """One KV-cache group: a real metadata builder and its persistent block table / slots."""

    layer_names: list[str]
    builder: Any
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    #: MLA layers: the builder's metadata is handed on in ``AscendMLAMetadata``'s shape
    mla: bool = False

    def build(self, common: Any, capturing: bool) -> Any:
        """The builder's metadata: the capture variant for a dummy run, else a real step's."""
        if capturing:
            md = self.builder.build_for_cudagraph_capture(common)
        else:
            md = self.builder.build(common_prefix_len=0, common_attn_metadata=common)
        return mla_metadata(md) if self.mla else md


def mla_metadata(md: Any) -> Any:
    """A decode step's ``AscendMLAMetadata`` over the same buffers as the FIA builder's
    metadata ``md`` (a stand-in for ``AscendMLAMetadataBuilder``, which needs an MLA model
    config): ``decode`` holds the block table, the KV lengths (host list), the cumulative query
    ends; the stock MLA update and ``_forward_decode`` read exactly these."""
    from vllm_ascend.attention.mla_v1 import AscendMLADecodeMetadata, AscendMLAMetadata

    decode = AscendMLADecodeMetadata(
        input_positions=None,
        block_table=md.block_tables,
        seq_lens=md.seq_lens,
        max_seq_lens=max(md.seq_lens_list, default=0),
        seq_lens_list=md.seq_lens_list,
        actual_seq_lengths_q=md.actual_seq_lengths_q,
        attn_mask=md.attn_mask,
    )
    requests = len(md.seq_lens_list)
    return AscendMLAMetadata(
        num_actual_tokens_pcp_padded=md.num_actual_tokens,
        num_actual_tokens=md.num_actual_tokens,
        slot_mapping=md.slot_mapping,
        query_start_loc=md.query_start_loc,
        seq_lens=md.seq_lens,
        seq_lens_cpu=md.seq_lens_cpu,
        block_tables=md.block_tables,
        num_decodes=requests,
        num_decode_tokens=md.num_actual_tokens,
        num_prefills=0,
        attn_state=md.attn_state,
        decode=decode,
    )


class Stack:
    """The runner-side state of one scenario (see the module docstring).

    ``v1_pa_capture``: size the model for v1's PA capture run (kv length 6144) when the scenario
    has PA graph sizes; v2 captures with ``num_tokens // num_reqs`` and needs only ``max_kv_len``.
    The caller holds the process ``Lease`` (a stack resets vllm-ascend's globals it builds on).
    """

    def __init__(self, scenario: Scenario, *, v1_pa_capture: bool = True) -> None:
        from vllm.config import set_current_vllm_config

        self.scenario = scenario
        #: The weight stream: layers and KV history here, then the engine's model weights.
        self.gen = torch.Generator().manual_seed(scenario.seed)
        self.block_size = scenario.block_size
        self.max_num_reqs = scenario.max_num_reqs
        self.max_tokens = max(scenario.capture_sizes)
        self.blocks_per_req = -(-scenario.max_kv_len // self.block_size)
        need = scenario.max_kv_len
        if v1_pa_capture and scenario.pa_shape_list:
            need = max(need, PA_CAPTURE_SEQ_LEN)
        self.max_model_len = -(-need // self.block_size) * self.block_size
        self.max_blocks = self.max_model_len // self.block_size
        self.num_blocks = 1 + self.max_num_reqs * self.blocks_per_req  # block 0: padding rows

        self.vllm_config = self._vllm_config()
        process.ensure_distributed(self.vllm_config)
        with set_current_vllm_config(self.vllm_config):
            self.layers: list[ToyLayer] = build_layers(
                scenario, self.gen, self.num_blocks, self.block_size
            )
            register(self.layers, self.vllm_config)
            self.groups = self._groups()
        self.has_sinks = any(layer.spec.sinks for layer in self.layers)
        # Persistent runner buffers (model_runner_v1: input_ids, positions, query_start_loc,
        # optimistic_seq_lens_cpu / seq_lens).
        self.input_ids = torch.zeros(self.max_tokens, dtype=torch.int64)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int64)
        self.seq = SeqBuffers.allocate(self.max_num_reqs)
        self.linear_state = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32)

    # ---- construction ----------------------------------------------------------------------

    def _vllm_config(self) -> Any:
        from vllm.config import (
            CacheConfig,
            CompilationConfig,
            CUDAGraphMode,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )

        sc = self.scenario
        model_dir = os.path.join(
            process.scratch_dir(), f"{sc.model_type}-{len(sc.layers)}-{self.max_model_len}"
        )
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(_model_config_json(sc, self.max_model_len), f)
        model_config = ModelConfig(
            model=model_dir,
            tokenizer=model_dir,
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=self.max_model_len,
            seed=sc.seed,
        )
        compilation_config = CompilationConfig(
            cudagraph_mode=getattr(CUDAGraphMode, sc.compilation_mode),
            cudagraph_capture_sizes=list(sc.capture_sizes),
        )
        additional: dict[str, Any] = {"refresh": True}
        if sc.pa_shape_list:
            additional["pa_shape_list"] = list(sc.pa_shape_list)
        return VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(block_size=self.block_size),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_reqs,
                max_num_batched_tokens=max(self.max_model_len, 2048),
                max_model_len=self.max_model_len,
                is_encoder_decoder=False,
            ),
            compilation_config=compilation_config,
            additional_config=additional,
        )

    def _groups(self) -> list[KVGroup]:
        """One group per KV spec, as vLLM groups layers; KV-sharing layers join their target's."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
        from vllm_ascend.attention.attention_v1 import AscendAttentionMetadataBuilder

        keyed: dict[tuple, list[str]] = {}
        sharing: list[LayerSpec] = []
        for spec in self.scenario.layers:
            if spec.kind == "linear":
                continue
            if spec.kv_sharing_target is not None:
                sharing.append(spec)
                continue
            key = (spec.num_kv_heads, spec.head_size, spec.sliding_window, spec.kind == "mla")
            keyed.setdefault(key, []).append(spec.name)
        for spec in sharing:
            for names in keyed.values():
                if spec.kv_sharing_target in names:
                    names.append(spec.name)
        groups = []
        for (kv_heads, head_size, window, mla), names in keyed.items():
            kv_spec: Any
            if window is None:
                kv_spec = FullAttentionSpec(
                    block_size=self.block_size,
                    num_kv_heads=kv_heads,
                    head_size=head_size,
                    dtype=torch.float32,
                )
            else:
                kv_spec = SlidingWindowSpec(
                    block_size=self.block_size,
                    num_kv_heads=kv_heads,
                    head_size=head_size,
                    dtype=torch.float32,
                    sliding_window=window,
                )
            builder = AscendAttentionMetadataBuilder(
                kv_spec, names, self.vllm_config, torch.device("cpu")
            )
            groups.append(
                KVGroup(
                    layer_names=names,
                    builder=builder,
                    block_table=torch.zeros(
                        self.max_num_reqs + 1, self.max_blocks, dtype=torch.int32
                    ),
                    slot_mapping=torch.full((self.max_tokens,), -1, dtype=torch.int64),
                    mla=mla,
                )
            )
        return groups

    @property
    def attn_backend(self) -> Any:
        """The backend whose impl's update the runner calls (``update_full_graph_params``)."""
        if any(group.mla for group in self.groups):
            from vllm_ascend.attention.mla_v1 import AscendMLABackend

            return AscendMLABackend
        from vllm_ascend.attention.attention_v1 import AscendAttentionBackend

        return AscendAttentionBackend

    # ---- workload helpers ------------------------------------------------------------------

    def padded_size(self, num_tokens: int) -> int:
        """The smallest capture size that holds ``num_tokens`` (the runner's padding)."""
        return min(s for s in self.scenario.capture_sizes if s >= num_tokens)

    def batch_descriptor(self, num_tokens: int) -> Any:
        """The runner's descriptor of a padded graph batch (uniform under FULL_DECODE_ONLY)."""
        from vllm.forward_context import BatchDescriptor

        uniform = self.scenario.compilation_mode == "FULL_DECODE_ONLY"
        return BatchDescriptor(
            num_tokens=num_tokens, num_reqs=min(num_tokens, self.max_num_reqs), uniform=uniform
        )

    def block_row(self, slot: int, *, reverse: bool = False) -> list[int]:
        """Block-table row of request slot ``slot``: its fixed blocks (walked backwards with
        ``reverse``, for a group with a different table), then padding block 0."""
        first = 1 + slot * self.blocks_per_req
        row = [0] * self.max_blocks
        for b in range(self.blocks_per_req):
            row[b] = first + (self.blocks_per_req - 1 - b if reverse else b)
        return row

    def token_slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The flat KV slot of each token: its block in its row (one row per token), its offset."""
        bs = self.block_size
        blk = rows.gather(1, (positions // bs).unsqueeze(1).to(torch.int64))
        return blk.squeeze(1).to(torch.int64) * bs + positions % bs

    def with_linear_keys(self, per_layer: dict[str, Any], linear_md: Any) -> dict[str, Any]:
        """``attn_metadata`` with the linear layers' keys, in the scenario's key order: model
        layer order, or the attention groups first and the linear keys after (group by group
        with ``linear_kv_groups``); an MTP draft's key in the attention layers' group."""
        sc = self.scenario
        if sc.key_order == "layers":
            if sc.mtp_key is not None:
                raise ValueError("an MTP key sits in its KV-cache group: metadata_order 'groups'")
            return {
                spec.name: (linear_md if spec.kind == "linear" else per_layer[spec.name])
                for spec in sc.layers
            }
        out = dict(per_layer)
        if sc.mtp_key is not None:
            out[sc.mtp_key] = self._mtp_group_metadata(per_layer)
        for index, names in enumerate(self.linear_groups()):
            md = linear_md if index == 0 else dataclasses.replace(linear_md)  # one per group
            out.update(dict.fromkeys(names, md))
        return out

    # ---- hybrid + MTP (the bench's hybrid kind) ----------------------------------------------

    def linear_groups(self) -> list[list[str]]:
        """The linear layers' keys by KV-cache group: one group, or with ``linear_kv_groups``
        vLLM's split (``get_kv_cache_groups``: groups of the smallest layer type's size, layers
        ``[i::n]``; the attention layers, the MTP draft's included, are the smallest here)."""
        linear = [spec.name for spec in self.scenario.layers if spec.kind == "linear"]
        if not self.scenario.linear_kv_groups or not linear:
            return [linear] if linear else []
        attention = sum(spec.captures_task for spec in self.scenario.layers)
        attention += self.scenario.mtp_key is not None
        if not attention or attention > len(linear):
            raise ValueError("linear_kv_groups: the attention layers must be the smaller type")
        size = len(linear) if len(linear) < 1.5 * attention else attention
        count = -(-len(linear) // size)
        return [linear[i::count] for i in range(count)]

    def _mtp_group_metadata(self, per_layer: dict[str, Any]) -> Any:
        if len(self.groups) != 1:
            raise ValueError("mtp_key: the attention layers and the draft share one KV group")
        return per_layer[self.groups[0].layer_names[0]]

    @property
    def speculative_config(self) -> Any:
        """What the runner passes the update as ``speculative_config``: an MTP engine's (see
        :func:`mtp_config`) where the scenario has an MTP key, else the config's own (None)."""
        if self.scenario.mtp_key is not None:
            return mtp_config()
        return self.vllm_config.speculative_config

    def linear_metadata(self, num_reqs_padded: int, num_actual_tokens: int) -> LinearAttnMetadata:
        return LinearAttnMetadata(
            num_prefills=0,
            num_decodes=num_reqs_padded,
            num_actual_tokens=num_actual_tokens,
            state_indices=self.linear_state[:num_reqs_padded],
        )

    @contextmanager
    def kv_restored(self, slots_per_group: list[torch.Tensor]) -> Iterator[None]:
        """Put back, on exit, the KV slots a run writes (``slots_per_group[g]``: the flat slots
        of group ``g``'s layers): an eager run then leaves the caches as it found them."""
        saved = []
        for group, slots in zip(self.groups, slots_per_group, strict=True):
            for layer in self.layers:
                if layer.spec.name in group.layer_names and layer.owns_kv:
                    assert layer.kv_cache is not None
                    caches = layer.kv_cache
                    # (2, blocks, block_size, ...) as one, or MLA's (latent, key rope) caches
                    flats = (
                        [c.view(-1, *c.shape[2:]) for c in caches]
                        if isinstance(caches, tuple)
                        else list(caches.view(2, -1, *caches.shape[3:]))
                    )
                    saved += [(flat, slots, flat[slots].clone()) for flat in flats]
        try:
            yield
        finally:
            for flat, slots, values in saved:
                flat[slots] = values


def mtp_config(num_speculative_tokens: int = 1) -> Any:
    """What vllm-ascend's updates read of an MTP engine's ``SpeculativeConfig`` (a real one
    needs a draft checkpoint): the method, which sends the FIA target update to its ``mtp`` key
    selection (``attention_v1.py``, ``is_direct_target_attn_key``), and k."""
    from types import SimpleNamespace

    return SimpleNamespace(
        method="mtp",
        num_speculative_tokens=num_speculative_tokens,
        disable_padded_drafter_batch=False,
        use_eagle=lambda: True,
    )


def _model_config_json(scenario: Scenario, max_model_len: int) -> dict[str, Any]:
    common = {
        "hidden_size": D_MODEL,
        "intermediate_size": 2 * D_MODEL,
        "num_hidden_layers": len(scenario.layers),
        "num_attention_heads": scenario.layers[0].num_heads,
        "num_key_value_heads": scenario.layers[0].num_kv_heads,
        "head_dim": scenario.layers[0].head_size,
        "vocab_size": VOCAB,
        "max_position_embeddings": max_model_len,
        "torch_dtype": "float32",
        "rms_norm_eps": 1e-6,
    }
    if scenario.model_type == "gemma4":
        return {**common, "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text"}
    return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
