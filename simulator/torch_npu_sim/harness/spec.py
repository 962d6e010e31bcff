"""What a harness workload is made of: layers, graph sizes, runner options, stock behaviour.

Plain data (torch is not even imported), so the scenario tables and the catalogue that names them
load without vLLM: ``ab_worker --list`` stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    #: "attention": the backend's impl (FIA / FIA v2 / PA); "mla": ``AscendMLAImpl``'s decode
    #: (``head_size`` is the latent width, one KV head); "linear": GDN-like layer whose metadata
    #: key sits in attn_metadata
    kind: str = "attention"

    @property
    def captures_task(self) -> bool:
        """Whether the layer's decode captures one attention task group per graph."""
        return self.kind != "linear"


@dataclass(frozen=True)
class Scenario:
    """A target decode workload: layers, graph sizes and the runner options that route stock."""

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
    # "ok", "crash: <ExceptionType>: <message>" or "wrong: <why>" (asserted by the tests).
    stock: str = "ok"
    # Order of the keys in forward_context.attn_metadata: "groups" = the v1 runner's order
    # (KV-cache group by group, KV-sharing layers appended to their target's group);
    # "layers" = model layer order (how hybrid linear-attention keys interleave).
    metadata_order: str = "auto"
    # A hybrid (linear-attention) model with an MTP draft, as the v1 runner of such an engine
    # arranges its target's metadata (the bench's hybrid kind): ``mtp_key`` is the draft layer's
    # key, listed after the attention layers in their one KV-cache group (it captures no target
    # task); the update is called with an MTP speculative config (``harness.stack.mtp_config``).
    # ``linear_kv_groups``: the linear layers' keys split into KV-cache groups as vLLM splits a
    # hybrid's layers (one metadata object per group), instead of one object for all.
    mtp_key: str | None = None
    linear_kv_groups: bool = False

    @property
    def max_num_reqs(self) -> int:
        return max(self.capture_sizes)

    @property
    def has_linear(self) -> bool:
        return any(spec.kind == "linear" for spec in self.layers)

    @property
    def key_order(self) -> str:
        """``metadata_order`` resolved: "auto" is model order only where linear keys sit."""
        if self.metadata_order != "auto":
            return self.metadata_order
        return "layers" if self.has_linear else "groups"


def draft_layer(i: int) -> str:
    """vLLM prefix of an MTP draft layer (it sits after the target's layers)."""
    return f"model.layers.{60 + i}.self_attn.attn"


@dataclass(frozen=True)
class DraftScenario:
    """A v1 merged draft graph workload (MTP / Eagle, all draft steps in one graph)."""

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
        """The model and runner sizes, as a target scenario (the draft's KV groups: group order)."""
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


@dataclass(frozen=True)
class V2Scenario:
    """A model runner v2 graph manager over the toy model of ``base``.

    ``role="target"``: ``ModelAclGraphManager`` (one query token per request).
    ``role="draft_prefill"``: ``PrefillEagleAclGraphManager`` with ``qlen`` > 1 query tokens.
    ``role="draft"``: the same class with one query token (a draft decode manager).
    """

    name: str
    base: Scenario
    role: str = "target"
    qlen: int = 1
    # How stock 0.23.0.post1 behaves on the v2 path (it may differ from v1 on the same model).
    stock: str = "ok"

    @property
    def query_len(self) -> int:
        return self.qlen if self.role == "draft_prefill" else 1
