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

Process-wide state: the simulator is installed and the (gloo, world size 1) distributed groups are
initialised once per process and reused; the vllm-ascend module globals a graph run fills
(GraphParams, key buffers, lru caches, ascend config, graph pool) are reset on every engine build
and close, so engines with different scenarios can follow each other in one process.
"""

from __future__ import annotations

import json
import os
import random
import socket
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "DecodeBatch",
    "LayerSpec",
    "LinearAttnMetadata",
    "Scenario",
    "SimEngine",
]

_D_MODEL = 128
_VOCAB = 97
# vllm-ascend's dummy capture run uses this kv length when PA is chosen for the size
# (model_runner_v1.SEQ_LEN_WITH_MAX_PA_WORKSPACE); the block tables must be able to cover it.
_PA_CAPTURE_SEQ_LEN = 6144


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: an attention layer driven through the real impl, or a linear one."""

    name: str  # vLLM layer prefix, e.g. "model.layers.0.self_attn.attn"
    num_heads: int = 8
    num_kv_heads: int = 2
    head_size: int = 64
    sliding_window: int | None = None
    sinks: bool = False  # FIA v2 with learnable sinks
    kv_sharing_target: str | None = None
    kind: str = "attention"  # "linear": GDN-like layer whose metadata key sits in attn_metadata


@dataclass(frozen=True)
class Scenario:
    """A workload: layers, graph sizes and the runner options that route the stock code."""

    name: str
    layers: tuple[LayerSpec, ...]
    capture_sizes: tuple[int, ...] = (4, 8, 16)
    block_size: int = 128  # the only kernel block size vllm-ascend's FIA path declares
    max_kv_len: int = 512
    compilation_mode: str = "FULL_DECODE_ONLY"  # or "FULL"
    pa_shape_list: tuple[int, ...] = ()
    model_type: str = "llama"  # "gemma4": turns on vllm-ascend's layer-aware FIA replay
    update_order: str = "replay_then_update"  # or "update_then_replay" (ENPU / 310P)
    seed: int = 0
    # How the stock 0.23.0.post1 update path was observed to behave on this workload:
    # "ok", or "crash: <ExceptionType>: <message>" (asserted by tests/test_real_code.py).
    stock: str = "ok"
    # Order of the keys in forward_context.attn_metadata: "groups" = the v1 runner's order
    # (KV-cache group by group, KV-sharing layers appended to their target's group);
    # "layers" = model layer order (how hybrid linear-attention keys interleave).
    metadata_order: str = "auto"

    @property
    def max_num_reqs(self) -> int:
        return max(self.capture_sizes)

    @property
    def has_linear(self) -> bool:
        return any(spec.kind == "linear" for spec in self.layers)


@dataclass
class LinearAttnMetadata:
    """Stand-in for a GDN (linear-attention) layer's metadata; it has no FIA fields on purpose."""

    num_prefills: int
    num_decodes: int
    num_actual_tokens: int
    state_indices: torch.Tensor


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


# --------------------------------------------------------------------------------------------
# process-wide set-up


class _Process:
    """What is done once per interpreter: simulator install, imports, distributed groups."""

    ready = False
    tmp: tempfile.TemporaryDirectory | None = None

    @classmethod
    def ensure(cls) -> None:
        if cls.ready:
            return
        os.environ.setdefault("VLLM_PLUGINS", "ascend")
        os.environ.setdefault("TORCH_NPU_SIM", "1")
        import importlib

        from torch_npu_sim.install import install

        install()  # before anything imports vllm.config (torch_npu must be the simulator)

        # vllm_ascend.ops first: importing attention_v1 first hits a circular import.
        for module in (
            "vllm_ascend.ops",
            "vllm_ascend.attention.attention_v1",
            "vllm_ascend.compilation.acl_graph",
        ):
            importlib.import_module(module)

        cls.tmp = tempfile.TemporaryDirectory(prefix="agp-harness-")
        cls.ready = True

    @staticmethod
    def ensure_distributed(vllm_config: Any) -> None:
        import torch.distributed as dist
        from vllm.config import set_current_vllm_config
        from vllm.distributed import parallel_state as ps

        with set_current_vllm_config(vllm_config):
            if not dist.is_initialized():
                ps.init_distributed_environment(
                    world_size=1,
                    rank=0,
                    distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                    local_rank=0,
                    backend="gloo",
                )
            if not ps.model_parallel_is_initialized():
                ps.ensure_model_parallel_initialized(1, 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reset_process_state() -> None:
    """Reset the vllm-ascend globals one graph workload fills (real_code_on_cpu.md item 11)."""
    import vllm_ascend.ascend_config as ascend_config
    import vllm_ascend.attention.attention_v1 as attention_v1
    import vllm_ascend.attention.utils as attn_utils
    import vllm_ascend.compilation.acl_graph as acl_graph
    import vllm_ascend.utils as va_utils
    from vllm.platforms import current_platform

    acl_graph._graph_params = None
    acl_graph._draft_graph_params = None
    acl_graph._draft_graph_prefill_params = None
    attention_v1._ATTN_KEYS_BUFFER = None
    attn_utils.needs_layer_aware_fia_graph_replay.cache_clear()
    attn_utils.enable_cp.cache_clear()
    for name in (
        "_IS_MOE_MODEL",
        "_IS_DRAFTER_MOE_MODEL",
        "_IS_VL_MODEL",
        "_ENABLE_SP",
        "_HAS_LAYER_IDX",
        "_HAS_ROPE",
    ):
        if hasattr(va_utils, name):
            setattr(va_utils, name, None)
    ascend_config.clear_ascend_config()
    type(current_platform)._global_graph_pool = None


# --------------------------------------------------------------------------------------------
# model


def _model_config_json(scenario: Scenario, max_model_len: int) -> dict[str, Any]:
    common = {
        "hidden_size": _D_MODEL,
        "intermediate_size": 2 * _D_MODEL,
        "num_hidden_layers": len(scenario.layers),
        "num_attention_heads": scenario.layers[0].num_heads,
        "num_key_value_heads": scenario.layers[0].num_kv_heads,
        "head_dim": scenario.layers[0].head_size,
        "vocab_size": _VOCAB,
        "max_position_embeddings": max_model_len,
        "torch_dtype": "float32",
        "rms_norm_eps": 1e-6,
    }
    if scenario.model_type == "gemma4":
        return {**common, "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text"}
    return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}


class _LayerShim:
    """The ``layer`` argument the impl reads: its name and unit KV scales (no vLLM module)."""

    def __init__(self, name: str) -> None:
        self.layer_name = name
        self._k_scale_float = 1.0
        self._v_scale_float = 1.0


class _ToyLayer:
    """Weights of one layer (+ its real attention impl and KV cache, set by the engine)."""

    def __init__(self, spec: LayerSpec, gen: torch.Generator) -> None:
        self.spec = spec
        self.shim = _LayerShim(spec.name)
        self.impl: Any = None
        self.kv_cache: torch.Tensor | None = None

        def w(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, generator=gen) / rows**0.5

        if spec.kind == "linear":
            self.w1 = w(_D_MODEL, 2 * _D_MODEL)
            self.w2 = w(2 * _D_MODEL, _D_MODEL)
        else:
            q_dim = spec.num_heads * spec.head_size
            kv_dim = spec.num_kv_heads * spec.head_size
            self.wq = w(_D_MODEL, q_dim)
            self.wk = w(_D_MODEL, kv_dim)
            self.wv = w(_D_MODEL, kv_dim)
            self.wo = w(q_dim, _D_MODEL)
            self.sinks = torch.randn(spec.num_heads, generator=gen) if spec.sinks else None


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _ToyDecoder:
    """The runnable: embeds, runs every layer, reads per-layer metadata from the forward context.

    Attention metadata and KV caches are looked up per layer name exactly as vLLM's
    ``unified_attention_with_output`` does, so capture and replay see what the runner's model sees.
    """

    def __init__(self, layers: list[_ToyLayer], gen: torch.Generator) -> None:
        self.layers = layers
        self.embed = torch.randn(_VOCAB, _D_MODEL, generator=gen)
        self.freqs = torch.linspace(0.01, 1.0, _D_MODEL)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        x = torch.nn.functional.embedding(input_ids, self.embed)
        x = x + 0.1 * torch.sin(positions.unsqueeze(-1).to(x.dtype) * self.freqs)
        for layer in self.layers:
            spec = layer.spec
            h = _rms(x)
            if spec.kind == "linear":
                x = x + torch.tanh(h @ layer.w1) @ layer.w2
                continue
            t = h.shape[0]
            q = (h @ layer.wq).view(t, spec.num_heads, spec.head_size)
            k = v = None
            if spec.kv_sharing_target is None:  # KV-sharing layers skip the KV write (vLLM)
                k = (h @ layer.wk).view(t, spec.num_kv_heads, spec.head_size)
                v = (h @ layer.wv).view(t, spec.num_kv_heads, spec.head_size)
            out = torch.empty(t, spec.num_heads, spec.head_size, dtype=x.dtype)
            attn_md = metadata[spec.name] if metadata is not None else None
            layer.impl.forward(layer.shim, q, k, v, layer.kv_cache, attn_md, out)
            x = x + out.view(t, -1) @ layer.wo
        return _rms(x)


@dataclass
class _Group:
    """One KV-cache group: a real metadata builder and its persistent block table / slots."""

    layer_names: list[str]
    builder: Any
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


@dataclass
class _Request:
    slot: int
    num_computed: int  # tokens already in the KV cache


# --------------------------------------------------------------------------------------------
# engine


class SimEngine:
    """Builds the real vllm-ascend stack for one scenario and runs decode steps through it.

    Comparability: ``run_eager`` and ``run_graph`` of one batch read the same inputs and the same
    KV cache. Each run writes this step's token KV (same slots) before any layer reads it, and
    every older slot holds what the last run of its step wrote, so the two runs of a step see
    identical caches; history KV beyond that is random (seeded), never prefilled.
    """

    _alive: SimEngine | None = None  # one engine per process: they share vllm-ascend globals

    def __init__(self, scenario: Scenario, *, num_threads: int | None = 1) -> None:
        """Build the stack for ``scenario``.

        ``num_threads``: torch intra-op threads while the engine is alive (restored by
        ``close``). The default 1 is deliberate: decode-sized ops are latency-bound, and on a
        loaded 2-core host intra-op threads made one FIA call ~40x slower (spin-waiting).
        ``None`` leaves the setting alone.
        """
        if SimEngine._alive is not None and not SimEngine._alive._closed:
            raise RuntimeError(
                "another SimEngine is alive in this process; close() it first (engines share "
                "vllm-ascend's module-level GraphParams)"
            )
        _Process.ensure()
        SimEngine._alive = self
        self._closed = False
        self._threads_before = torch.get_num_threads()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        try:
            self._setup(scenario)
        except BaseException:
            self.close()  # a half-built engine must not block the next one
            raise

    def _setup(self, scenario: Scenario) -> None:
        from vllm.config import CUDAGraphMode

        self.scenario = scenario
        self.last_metadata: dict[str, Any] | None = None
        self._step = 0
        self._captured: set[int] = set()
        reset_process_state()
        gen = torch.Generator().manual_seed(scenario.seed)
        self._rng = random.Random(scenario.seed)

        self.block_size = scenario.block_size
        self.max_num_reqs = scenario.max_num_reqs
        self.max_tokens = max(scenario.capture_sizes)
        self.blocks_per_req = -(-scenario.max_kv_len // self.block_size)
        need = max(scenario.max_kv_len, _PA_CAPTURE_SEQ_LEN if scenario.pa_shape_list else 0)
        self.max_model_len = -(-need // self.block_size) * self.block_size
        self.max_blocks = self.max_model_len // self.block_size
        self.num_blocks = 1 + self.max_num_reqs * self.blocks_per_req  # block 0: padding rows

        self.vllm_config = self._build_vllm_config()
        _Process.ensure_distributed(self.vllm_config)
        self._full = CUDAGraphMode.FULL
        self._none = CUDAGraphMode.NONE

        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            self._build_model(gen)
            self._build_groups()
            self._build_wrapper()
        self._reqs = [
            _Request(slot=i, num_computed=self._rng.randrange(0, scenario.max_kv_len - 1))
            for i in range(self.max_num_reqs)
        ]

    # ---- construction ----------------------------------------------------------------------

    def _build_vllm_config(self) -> Any:
        from vllm.config import (
            CacheConfig,
            CompilationConfig,
            CUDAGraphMode,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )

        sc = self.scenario
        assert _Process.tmp is not None
        model_dir = os.path.join(
            _Process.tmp.name, f"{sc.model_type}-{len(sc.layers)}-{self.max_model_len}"
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

    def _build_model(self, gen: torch.Generator) -> None:
        from vllm.v1.attention.backend import AttentionType
        from vllm_ascend.attention.attention_v1 import AscendAttentionBackendImpl

        layers = [_ToyLayer(spec, gen) for spec in self.scenario.layers]
        by_name = {layer.spec.name: layer for layer in layers}
        for layer in layers:
            spec = layer.spec
            if spec.kind == "linear":
                continue
            layer.impl = AscendAttentionBackendImpl(
                num_heads=spec.num_heads,
                head_size=spec.head_size,
                scale=spec.head_size**-0.5,
                num_kv_heads=spec.num_kv_heads,
                alibi_slopes=None,
                sliding_window=spec.sliding_window,
                kv_cache_dtype="auto",
                logits_soft_cap=None,
                attn_type=AttentionType.DECODER,
                kv_sharing_target_layer_name=spec.kv_sharing_target,
                sinks=layer.sinks,
            )
            if spec.kv_sharing_target is not None:
                continue
            # History content is random: every decode step reads it, never prefills it.
            layer.kv_cache = torch.randn(
                2,
                self.num_blocks,
                self.block_size,
                spec.num_kv_heads,
                spec.head_size,
                generator=gen,
            )
        for layer in layers:
            target = layer.spec.kv_sharing_target
            if target is not None:
                layer.kv_cache = by_name[target].kv_cache
        self.layers = layers
        self.model = _ToyDecoder(layers, gen)
        self.has_sinks = any(layer.spec.sinks for layer in layers)

    def _build_groups(self) -> None:
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
            key = (spec.num_kv_heads, spec.head_size, spec.sliding_window)
            keyed.setdefault(key, []).append(spec.name)
        for spec in sharing:  # vLLM appends KV-sharing layers to their target's group
            for names in keyed.values():
                if spec.kv_sharing_target in names:
                    names.append(spec.name)
        self.groups: list[_Group] = []
        for (kv_heads, head_size, window), names in keyed.items():
            if window is None:
                kv_spec: Any = FullAttentionSpec(
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
            self.groups.append(
                _Group(
                    layer_names=names,
                    builder=builder,
                    block_table=torch.zeros(
                        self.max_num_reqs + 1, self.max_blocks, dtype=torch.int32
                    ),
                    slot_mapping=torch.full((self.max_tokens,), -1, dtype=torch.int64),
                )
            )
        order = self.scenario.metadata_order
        if order == "auto":
            order = "layers" if self.scenario.has_linear else "groups"
        self._metadata_order = order
        # Persistent runner buffers (model_runner_v1: input_ids, positions, query_start_loc,
        # optimistic_seq_lens_cpu / seq_lens).
        self.input_ids = torch.zeros(self.max_tokens, dtype=torch.int64)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int64)
        self.query_start_loc = torch.zeros(self.max_num_reqs + 2, dtype=torch.int32)
        self.seq_lens_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32)
        self.seq_lens_dev = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32)
        self.linear_state = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32)

    def _build_wrapper(self) -> None:
        from vllm_ascend.compilation.acl_graph import ACLGraphWrapper

        enpu = self.scenario.update_order == "update_then_replay"
        self.wrapper = ACLGraphWrapper(self.model, self.vllm_config, self._full, enable_enpu=enpu)
        self.update_stream = torch.npu.Stream()

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the graphs and reset the vllm-ascend globals (so the next engine starts clean)."""
        if self._closed:
            return
        self._closed = True
        try:
            torch.npu.synchronize()
        except Exception:  # a test may leave a deliberately blocked replay behind
            pass
        self.wrapper = None
        self.layers = []
        self.model = None
        try:
            reset_process_state()
        finally:
            _reset_runtime()
            torch.set_num_threads(self._threads_before)

    def __enter__(self) -> SimEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- workload --------------------------------------------------------------------------

    def padded_size(self, num_tokens: int) -> int:
        return min(s for s in self.scenario.capture_sizes if s >= num_tokens)

    def random_batch(self, rng: random.Random) -> DecodeBatch:
        """A decode step: a random subset of requests, in random order; each grows by one token."""
        n = rng.randint(1, self.max_num_reqs)
        chosen = rng.sample(self._reqs, n)
        slots, seq_lens, positions, slot_ids, rows = [], [], [], [], []
        for req in chosen:
            if req.num_computed + 1 > self.scenario.max_kv_len:  # finished: a new request
                req.num_computed = rng.randrange(0, self.scenario.max_kv_len // 2)
            pos = req.num_computed
            first_block = 1 + req.slot * self.blocks_per_req
            row = [0] * self.max_blocks
            for b in range(self.blocks_per_req):
                row[b] = first_block + b
            slots.append(req.slot)
            seq_lens.append(pos + 1)
            positions.append(pos)
            slot_ids.append(
                (first_block + pos // self.block_size) * self.block_size + pos % self.block_size
            )
            rows.append(row)
            req.num_computed += 1
        self._step += 1
        return DecodeBatch(
            step=self._step,
            req_slots=slots,
            seq_lens=seq_lens,
            input_ids=torch.tensor([rng.randrange(_VOCAB) for _ in range(n)], dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            slot_mapping=torch.tensor(slot_ids, dtype=torch.int64),
            block_rows=torch.tensor(rows, dtype=torch.int32),
            num_tokens_padded=self.padded_size(n),
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied-embedding logits of the toy model (for token-level comparisons)."""
        return hidden @ self.model.embed.T

    def snapshot_kv(self) -> dict[str, torch.Tensor]:
        return {
            layer.spec.name: layer.kv_cache.clone()
            for layer in self.layers
            if layer.kv_cache is not None and layer.spec.kv_sharing_target is None
        }

    # ---- metadata, as NPUModelRunner builds it ---------------------------------------------

    def _batch_descriptor(self, num_tokens: int) -> Any:
        from vllm.forward_context import BatchDescriptor

        uniform = self.scenario.compilation_mode == "FULL_DECODE_ONLY"
        return BatchDescriptor(
            num_tokens=num_tokens, num_reqs=min(num_tokens, self.max_num_reqs), uniform=uniform
        )

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
        from vllm_ascend.attention.attention_v1 import AscendAttentionState
        from vllm_ascend.attention.utils import AscendCommonAttentionMetadata

        n, padded = num_reqs, num_tokens_padded
        qsl = self.query_start_loc
        qsl.zero_()
        qsl[1 : n + 1] = torch.arange(1, n + 1, dtype=torch.int32)
        full_full = mode == self._full and self.scenario.compilation_mode == "FULL"
        if mode == self._full and not full_full:
            num_reqs_padded = padded  # uniform decode: one dummy 1-token request per pad token
            qsl[n + 1 : padded + 1] = torch.arange(n + 1, padded + 1, dtype=torch.int32)
        else:
            num_reqs_padded = n
            if padded > n:  # FULL/FULL or eager padded: one dummy request holds the padding
                qsl[n + 1] = padded
                num_reqs_padded = n + 1
        self.seq_lens_cpu.zero_()
        self.seq_lens_cpu[:n] = torch.tensor(seq_lens, dtype=torch.int32)
        self.seq_lens_dev.copy_(self.seq_lens_cpu)
        for group in self.groups:
            group.block_table[n:num_reqs_padded].fill_(0)
            group.slot_mapping[n:padded].fill_(-1)
        common = AscendCommonAttentionMetadata(
            query_start_loc=qsl[: num_reqs_padded + 1],
            query_start_loc_cpu=qsl[: num_reqs_padded + 1],
            seq_lens=self.seq_lens_dev[:num_reqs_padded],
            _seq_lens_cpu=self.seq_lens_cpu[:num_reqs_padded],
            seq_lens_cpu_upper_bound=self.seq_lens_cpu[:num_reqs_padded],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs_padded],
            num_reqs=num_reqs_padded,
            num_actual_tokens=n,
            max_query_len=1,
            max_seq_len=self.max_model_len if capturing else max(seq_lens),
            block_table_tensor=self.groups[0].block_table[:num_reqs_padded],
            slot_mapping=self.groups[0].slot_mapping[:padded],
            causal=True,
            num_input_tokens=padded,
            positions=self.positions,
            attn_state=AscendAttentionState.DecodeOnly,
            decode_token_per_req=1,
        )
        per_group: dict[str, Any] = {}
        for group in self.groups:
            cm = _shallow_copy(common)
            cm.block_table_tensor = group.block_table[:num_reqs_padded]
            cm.slot_mapping = group.slot_mapping[:padded]
            md = (
                group.builder.build_for_cudagraph_capture(cm)
                if capturing
                else group.builder.build(common_prefix_len=0, common_attn_metadata=cm)
            )
            for name in group.layer_names:
                per_group[name] = md
        linear_md = LinearAttnMetadata(
            num_prefills=0,
            num_decodes=num_reqs_padded,
            num_actual_tokens=n,
            state_indices=self.linear_state[:num_reqs_padded],
        )
        if self._metadata_order == "layers":
            return {
                spec.name: (linear_md if spec.kind == "linear" else per_group[spec.name])
                for spec in self.scenario.layers
            }
        out = dict(per_group)
        for spec in self.scenario.layers:
            if spec.kind == "linear":
                out[spec.name] = linear_md
        return out

    def _load_inputs(self, batch: DecodeBatch | None, padded: int) -> None:
        """Copy a step's inputs into the persistent buffers the graph captured."""
        self.input_ids[:padded].zero_()
        self.positions[:padded].zero_()
        if batch is None:
            return
        n = batch.num_reqs
        self.input_ids[:n] = batch.input_ids
        self.positions[:n] = batch.positions
        for group in self.groups:
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
            has_sinks=self.has_sinks,
        )

    # ---- runs ------------------------------------------------------------------------------

    def _ensure_graph_params(self) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph

        if acl_graph.get_graph_params() is None:
            acl_graph.set_graph_params(list(self.scenario.capture_sizes))

    def capture(self, num_tokens: int) -> None:
        """The runner's dummy-run capture for one size: dummy metadata, ``capturing=True``."""
        from vllm.config import set_current_vllm_config
        from vllm_ascend.attention.utils import using_paged_attention

        if num_tokens in self._captured:
            return
        self._ensure_graph_params()
        with set_current_vllm_config(self.vllm_config):
            seq_len = (
                _PA_CAPTURE_SEQ_LEN if using_paged_attention(num_tokens, self.vllm_config) else 1
            )
            self._load_inputs(None, num_tokens)
            for group in self.groups:
                # Capture is warmed up once on the simulator: point it at no KV slot.
                group.slot_mapping[:num_tokens].fill_(-1)
            md = self._metadata(
                num_reqs=num_tokens,
                num_tokens_padded=num_tokens,
                seq_lens=[seq_len] * num_tokens,
                mode=self._full,
                capturing=True,
            )
            bd = self._batch_descriptor(num_tokens)
            with self._context(md, num_tokens, self._full, bd):
                self.wrapper(self.input_ids[:num_tokens], self.positions[:num_tokens])
            torch.npu.synchronize()
        self._captured.add(num_tokens)

    def _update(self, forward_context: Any, padded: int) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph
        from vllm_ascend.attention.attention_v1 import AscendAttentionBackend

        # Resolved through the module attribute at call time (the overlay may wrap the class
        # attribute AscendAttentionBackendImpl.update_graph_params underneath).
        acl_graph.update_full_graph_params(
            AscendAttentionBackend,
            self.update_stream,
            forward_context,
            padded,
            self.vllm_config,
            self.vllm_config.speculative_config,
            self.positions[:padded].shape[0],
        )

    def _run_full(self, batch: DecodeBatch, release: str) -> torch.Tensor:
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import get_forward_context

        padded = batch.num_tokens_padded
        self.capture(padded)
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
            bd = self._batch_descriptor(padded)
            with self._context(md, padded, self._full, bd):
                fc = get_forward_context()
                args = (self.input_ids[:padded], self.positions[:padded])
                if release == "update" and self.scenario.update_order == "update_then_replay":
                    torch.npu.current_stream().synchronize()  # ENPU: sync inside the update path
                    self._update(fc, padded)
                    out = self.wrapper(*args)
                else:
                    out = self.wrapper(*args)
                    if release == "update":
                        self._update(fc, padded)
                    elif release == "record":
                        self._record_all(padded)
            torch.npu.current_stream().synchronize()
        return out[: batch.num_reqs].clone()

    def _record_all(self, padded: int) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph

        for event in acl_graph.get_graph_params().events[padded]:
            event.record(self.update_stream)

    def run_graph(self, batch: DecodeBatch) -> torch.Tensor:
        """Capture on first use of the size, then replay and update as the v1 runner does."""
        return self._run_full(batch, "update")

    def run_graph_without_update(self, batch: DecodeBatch, *, record: bool = True) -> torch.Tensor:
        """Negative control: replay, then release every captured event WITHOUT the update.

        With ``record=False`` the events are not recorded either, so the replay stays blocked and
        the simulator must raise ``SimulatorError`` at the synchronisation (on hardware: a hang).
        """
        return self._run_full(batch, "record" if record else "none")

    def run_eager(self, batch: DecodeBatch, *, padded: bool = False) -> torch.Tensor:
        """The same real code without a graph (runtime mode NONE), unpadded as the eager runner."""
        from vllm.config import set_current_vllm_config

        num_tokens = batch.num_tokens_padded if padded else batch.num_reqs
        with set_current_vllm_config(self.vllm_config):
            self._load_inputs(batch, num_tokens)
            md = self._metadata(
                num_reqs=batch.num_reqs,
                num_tokens_padded=num_tokens,
                seq_lens=batch.seq_lens,
                mode=self._none,
                capturing=False,
            )
            from vllm.forward_context import BatchDescriptor

            with self._context(md, num_tokens, self._none, BatchDescriptor(num_tokens)):
                out = self.wrapper(self.input_ids[:num_tokens], self.positions[:num_tokens])
            torch.npu.current_stream().synchronize()
        return out[: batch.num_reqs].clone()


def _shallow_copy(obj: Any) -> Any:
    from copy import copy

    return copy(obj)


def _reset_runtime() -> None:
    """Reset the simulator runtime's per-test state if it offers a reset."""
    try:
        from torch_npu_sim import runtime
    except ImportError:
        return
    reset = getattr(runtime, "reset", None)
    if callable(reset):
        reset()
