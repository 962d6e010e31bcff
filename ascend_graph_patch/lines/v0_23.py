"""vllm-ascend 0.23.0 / 0.23.0.post1 with vLLM 0.23.0 (research/hook_points.md, R columns).

Everything the overlay knows about this release: the seams, the three attention layouts (the tuple
the stock capture appends to ``GraphParams.attn_params``, the relaunch the stock
``update_graph_params`` performs, the metadata it rebinds), verify's interceptors and the
fingerprints. The templates rebuild, from the captured tuple, the static keyword arguments of the
stock relaunch; the providers (``core.providers``) write what changes per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ascend_graph_patch.core.graph import CaptureRefused, MetadataFault
from ascend_graph_patch.core.kinds import DRAFT, DRAFT_PREFILL, FIA, FIA_V2, MLA, PA, TARGET
from ascend_graph_patch.core.providers import group_of
from ascend_graph_patch.lines.base import (
    NOTHING,
    OWNED,
    STOCK,
    CaptureContext,
    Check,
    ImplFate,
    Interceptor,
    Line,
    Seam,
    TaskLayout,
)

ACL = "vllm_ascend.compilation.acl_graph"
ATTN = "vllm_ascend.attention.attention_v1"
ATTN_UTILS = "vllm_ascend.attention.utils"
IMPL = "AscendAttentionBackendImpl"
MLA_MODULE = "vllm_ascend.attention.mla_v1"
MLA_IMPL = "AscendMLAImpl"
CP = "vllm_ascend.attention.context_parallel"
V2_ACL = "vllm_ascend.worker.v2.aclgraph_utils"
V2_UTILS = "vllm_ascend.worker.v2.utils"
V2_EAGLE = "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph"
V2_CG = "vllm.v1.worker.gpu.cudagraph_utils"

UPDATE_PARAMS = tuple(
    "update_stream forward_context num_tokens vllm_config speculative_config num_dcp_pcp_tokens "
    "draft_attn_metadatas".split()
)

#: The parameters of an attention impl's ``forward`` (the base's and the INT8-KV subclass's own).
FORWARD_PARAMS = tuple(
    "self layer query key value kv_cache attn_metadata output output_scale "
    "output_block_scale".split()
)

SEAMS: dict[str, Seam] = {
    # v1: the graph wrapper (capture + replay of target and merged draft graphs) and the backend
    "acl_graph.call": Seam(ACL, "ACLGraphWrapper.__call__", ("self", "args", "kwargs")),
    "attention.full_graph_fia": Seam(
        ATTN,
        f"{IMPL}.full_graph_fia",
        ("self", "query", "key", "value", "attn_metadata", "output", "layer"),
    ),
    "attention.full_graph_fia_v2": Seam(
        ATTN,
        f"{IMPL}.full_graph_fia_v2",
        ("self", "query", "key", "value", "attn_metadata", "output"),
    ),
    "attention.full_graph_pa": Seam(
        ATTN, f"{IMPL}.full_graph_pa", ("self", "query", "attn_metadata", "output")
    ),
    # every FIA / FIA v2 / PA layer's forward: the graph path or not is decided inside it
    "attention.forward": Seam(
        ATTN,
        f"{IMPL}.forward",
        FORWARD_PARAMS,
    ),
    # the INT8-KV subclass decides its graph path in a forward of its own (never the base's)
    "attention.forward_c8": Seam(
        ATTN,
        "AscendC8AttentionBackendImpl.forward",
        FORWARD_PARAMS,
    ),
    # a staticmethod reached through update_full_graph_params, which five modules import by name:
    # the class attribute is the one place every caller goes through
    "attention.update_graph_params": Seam(ATTN, f"{IMPL}.update_graph_params", UPDATE_PARAMS),
    # MLA (DeepSeek V3 / R1, Kimi K2, GLM-4.7-Flash): its decode captures its task group inline,
    # and its update is the MLA backend's own staticmethod (``get_impl_cls()`` of the MLA backend)
    "mla.forward_decode": Seam(
        MLA_MODULE,
        f"{MLA_IMPL}._forward_decode",
        (
            "self",
            "q_nope",
            "q_pe",
            "k_nope",
            "k_pe",
            "block_size",
            "attn_metadata",
            "dequant_scale_q_nope",
        ),
    ),
    "mla.update_graph_params": Seam(MLA_MODULE, f"{MLA_IMPL}.update_graph_params", UPDATE_PARAMS),
    # v2: graph managers and the graph context torch_cuda_wrapper installs as torch.cuda.graph
    "v2.graph_context": Seam(V2_UTILS, "torch_npu_graph_wrapper", ("args", "kwargs")),
    "v2.model.capture": Seam(V2_ACL, "ModelAclGraphManager.capture"),
    "v2.model.run_fullgraph": Seam(V2_ACL, "ModelAclGraphManager.run_fullgraph", ("self", "desc")),
    "v2.prefill.capture": Seam(
        V2_EAGLE,
        "PrefillEagleAclGraphManager.capture",
        ("self", "forward_fn", "attn_states", "progress_bar_desc"),
    ),
    "v2.prefill.run_fullgraph": Seam(
        V2_EAGLE, "PrefillEagleAclGraphManager.run_fullgraph", ("self", "desc")
    ),
    "v2.decode.capture": Seam(V2_EAGLE, "DecodeEagleCudaGraphManager.capture"),
}

FIA_FIELDS = tuple(
    "query key value block_table attn_mask block_size actual_seq_lengths_kv actual_seq_lengths_q "
    "num_kv_heads num_heads scale output softmax_lse sparse_mode pre_tokens next_tokens "
    "sliding_window c8_k_aq_scale c8_k_aq_offset c8_v_aq_scale c8_v_aq_offset layer_name".split()
)
FIA_V2_FIELDS = tuple(
    "query key value block_table attn_mask block_size actual_seq_lengths_kv num_kv_heads "
    "num_heads scale sliding_window sinks output softmax_lse layer_name".split()
)
PA_FIELDS = tuple(
    "query key_cache value_cache num_kv_heads num_heads scale block_tables seq_lens output".split()
)
#: ``AscendMLAImpl._forward_decode``'s tuple (no layer name: the capture aspect finds the layer).
MLA_FIELDS = tuple(
    "q_nope k_nope q_pe k_pe num_heads num_kv_heads input_layout attn_mask sparse_mode scale "
    "block_table block_size seq_lens_list actual_seq_lengths attn_output softmax_lse "
    "dequant_scale_q_nope fak_descale".split()
)


def fia_template(f: Any, attn_module: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "query": f.query,
        "key": f.key,
        "value": f.value,
        "block_table": f.block_table,
        "atten_mask": f.attn_mask,
        "input_layout": "TND",
        "block_size": f.block_size,
        "actual_seq_lengths": f.actual_seq_lengths_q,
        "actual_seq_lengths_kv": f.actual_seq_lengths_kv,
        "num_key_value_heads": f.num_kv_heads,
        "num_heads": f.num_heads,
        "scale": f.scale,
        "sparse_mode": f.sparse_mode,
        "pre_tokens": f.pre_tokens,
        "next_tokens": f.next_tokens,
        "workspace": None,
        "out": [f.output, f.softmax_lse],
    }
    if f.c8_k_aq_scale is not None:  # INT8 KV cache: BNSD with antiquant, as stock relaunches
        kwargs.update(
            key_antiquant_scale=f.c8_k_aq_scale,
            value_antiquant_scale=f.c8_v_aq_scale,
            key_antiquant_mode=0,
            value_antiquant_mode=0,
            inner_precise=1,
            input_layout="BNSD",
            sparse_mode=0,
        )
    return kwargs


def fia_v2_template(f: Any, attn_module: Any) -> dict[str, Any]:
    window = f.sliding_window
    return {
        "query": f.query,
        "key": f.key,
        "value": f.value,
        "block_table": f.block_table,
        "atten_mask": f.attn_mask,
        "input_layout": "TND",
        "block_size": f.block_size,
        "actual_seq_qlen": None,
        "actual_seq_kvlen": f.actual_seq_lengths_kv,
        "num_key_value_heads": f.num_kv_heads,
        "num_query_heads": f.num_heads,
        "sparse_mode": 4 if window is not None else 3,
        "pre_tokens": window if window is not None else attn_module.SWA_INT_MAX,
        "next_tokens": 0,
        "softmax_scale": f.scale,
        "learnable_sink": f.sinks,
        "workspace": None,
        "out": [f.output, f.softmax_lse],
    }


def pa_template(f: Any, attn_module: Any) -> dict[str, Any]:
    return {
        "query": f.query,
        "key_cache": f.key_cache,
        "value_cache": f.value_cache,
        "num_kv_heads": f.num_kv_heads,
        "num_heads": f.num_heads,
        "scale_value": f.scale,
        "block_table": f.block_tables,
        "context_lens": f.seq_lens,
        "out": f.output,
        "workspace": None,
    }


def mla_template(f: Any, attn_module: Any) -> dict[str, Any]:
    """MLA's relaunch: FIA v2 over the latent cache (key = value = ``k_nope``) with the rope
    split (``query_rope`` / ``key_rope``); quantised layers add the dequant scales, as stock."""
    kwargs: dict[str, Any] = {
        "query": f.q_nope,
        "key": f.k_nope,
        "value": f.k_nope,
        "query_rope": f.q_pe,
        "key_rope": f.k_pe,
        "num_query_heads": f.num_heads,
        "num_key_value_heads": f.num_kv_heads,
        "input_layout": f.input_layout,
        "atten_mask": f.attn_mask,
        "sparse_mode": f.sparse_mode,
        "softmax_scale": f.scale,
        "block_table": f.block_table,
        "block_size": f.block_size,
        "actual_seq_kvlen": f.seq_lens_list,
        "actual_seq_qlen": f.actual_seq_lengths,
        "workspace": None,
        "out": [f.attn_output, f.softmax_lse],
    }
    if f.dequant_scale_q_nope is not None:  # FA-quant layers (A5), as stock relaunches them
        kwargs.update(
            query_quant_mode=3,
            key_quant_mode=0,
            value_quant_mode=0,
            dequant_scale_query=f.dequant_scale_q_nope,
            dequant_scale_key=f.fak_descale,
            dequant_scale_value=f.fak_descale,
        )
    return kwargs


#: How an MLA task's lengths are rebuilt each step, as ``AscendMLAImpl.update_graph_params``
#: chooses: a draft task reads its step's query ends and block table; a target task of an
#: Eagle / MTP engine gets synthetic query ends (every request ``k + 1`` tokens); any other
#: target task only its KV lengths.
MLA_TARGET, MLA_SPEC_TARGET, MLA_DRAFT = "target", "spec_target", "draft"


@dataclass(slots=True)
class MLAProvider:
    """The fresh values of one MLA task, read from a step's ``AscendMLAMetadata``.

    Mirrors the stock update per task: ``decode.seq_lens_list`` padded with zeros to the graph's
    request count (target: ``num_tokens``; Eagle / MTP target: ``num_tokens // (k + 1)``, with
    query ends ``[(k + 1) * (i + 1)]``; draft: the step's ``decode.actual_seq_lengths_q``, whose
    length also bounds ``decode.block_table`` when the drafter's batch is not padded). The
    graph's captured workspace, read per step as stock reads it, is a steady value (``steady``:
    the graph writes it into the templates when it changes).
    """

    kind: str
    mode: str  # MLA_TARGET / MLA_SPEC_TARGET / MLA_DRAFT
    num_tokens: int
    spec_multiple: int  # k + 1 (Eagle / MTP engines), else 1
    slice_table: bool  # drafts with ``disable_padded_drafter_batch``
    workspace: Callable[[], Any]
    group: int = field(init=False)
    value_keys: tuple[str, ...] = field(init=False)
    steady: tuple[str, Callable[[], Any]] = field(init=False)  # the graph's workspace
    _query_ends: list[int] | None = field(init=False)

    def __post_init__(self) -> None:
        keys = {
            MLA_TARGET: ("actual_seq_kvlen",),
            MLA_SPEC_TARGET: ("actual_seq_kvlen", "actual_seq_qlen"),
            MLA_DRAFT: ("actual_seq_kvlen", "actual_seq_qlen", "block_table"),
        }[self.mode]
        self.value_keys = (*keys, "workspace")
        self.steady = ("workspace", self.workspace)
        config = (self.kind, self.mode, self.num_tokens, self.spec_multiple, self.slice_table)
        self.group = group_of((*config, id(self.workspace)))
        requests = self.num_tokens // self.spec_multiple
        # the synthetic query ends of an Eagle / MTP target: the same every step
        self._query_ends = (
            [self.spec_multiple * (i + 1) for i in range(requests)]
            if self.mode == MLA_SPEC_TARGET
            else None
        )

    def values(self, metadata: Any) -> dict[str, Any]:
        try:
            decode = metadata.decode
            lengths = decode.seq_lens_list
            if self.mode == MLA_DRAFT:
                query_ends = decode.actual_seq_lengths_q
                table = decode.block_table
                if self.slice_table:
                    table = table[: len(query_ends)]
                return {
                    "actual_seq_kvlen": lengths + [0] * (len(query_ends) - len(lengths)),
                    "actual_seq_qlen": query_ends,
                    "block_table": table,
                }
            padded = lengths + [0] * (self.num_tokens // self.spec_multiple - len(lengths))
        except (AttributeError, TypeError) as exc:  # stock reads the same fields and raises
            raise MetadataFault(f"metadata unreadable: {exc!r}", exc) from exc
        if self._query_ends is not None:
            return {"actual_seq_kvlen": padded, "actual_seq_qlen": self._query_ends}
        return {"actual_seq_kvlen": padded}


def mla_provider(
    layout: TaskLayout, fields: Any, template: dict[str, Any], context: CaptureContext
) -> MLAProvider:
    """The MLA task's provider, configured as the stock update would treat its graph: the
    speculative config is the engine's (the impl's; the runner and the proposers pass the same
    ``vllm_config.speculative_config`` to the update)."""
    spec = context.impl.speculative_config
    draft = context.role in (DRAFT, DRAFT_PREFILL)
    if draft:
        mode, multiple = MLA_DRAFT, 1
    elif spec is not None and spec.use_eagle():
        mode, multiple = MLA_SPEC_TARGET, spec.num_speculative_tokens + 1
    else:
        mode, multiple = MLA_TARGET, 1
    return MLAProvider(
        kind=layout.kind,
        mode=mode,
        num_tokens=context.num_tokens,
        spec_multiple=multiple,
        slice_table=bool(draft and spec is not None and spec.disable_padded_drafter_batch),
        workspace=context.workspace,
    )


def fia_rebinds_table(fields: Any, role: str) -> bool:
    """Stock keeps the captured table on sliding-window target layers (rebinding it there
    corrupts output on the device); drafts always rebind it."""
    return role != TARGET or fields.sliding_window is None


def _q_nope_rows(q_nope: Any) -> int:
    return q_nope.size(0)


def _query_ends_last(metadata: Any) -> int:
    return metadata.actual_seq_lengths_q[-1]


def _rows(query: Any) -> int:
    return query.shape[0]


#: The leading parameters of the ops' schemas (torch-npu 2.10.0.post4): FIA and FIA v2 (``.out``)
#: take ``query, key, value`` by position, then keywords only; PA takes all but its workspace.
FIA_OP_POSITIONAL = ("query", "key", "value")
PA_OP_POSITIONAL = tuple(
    "query key_cache value_cache num_kv_heads num_heads scale_value block_table context_lens "
    "out".split()
)


LAYOUTS: dict[str, TaskLayout] = {
    FIA: TaskLayout(
        kind=FIA,
        capture_seam="attention.full_graph_fia",
        fields=FIA_FIELDS,
        op="npu_fused_infer_attention_score.out",
        template=fia_template,
        key_arg=(3, "attn_metadata"),
        key_of=_query_ends_last,
        binds=(
            ("actual_seq_lengths", "actual_seq_lengths_q"),
            ("actual_seq_lengths_kv", "seq_lens_list"),
        ),
        block_table=("block_table", "block_tables"),
        rebind_table=fia_rebinds_table,
        draft_causal="causal",
        dynamic_args=("actual_seq_lengths", "actual_seq_lengths_kv", "block_table", "sparse_mode"),
        positional=FIA_OP_POSITIONAL,
    ),
    FIA_V2: TaskLayout(
        kind=FIA_V2,
        capture_seam="attention.full_graph_fia_v2",
        fields=FIA_V2_FIELDS,
        op="npu_fused_infer_attention_score_v2.out",
        template=fia_v2_template,
        key_arg=(3, "attn_metadata"),
        key_of=_query_ends_last,
        binds=(("actual_seq_qlen", "actual_seq_lengths_q"), ("actual_seq_kvlen", "seq_lens_list")),
        dynamic_args=("actual_seq_qlen", "actual_seq_kvlen", "block_table"),
        positional=FIA_OP_POSITIONAL,
    ),
    PA: TaskLayout(
        kind=PA,
        capture_seam="attention.full_graph_pa",
        fields=PA_FIELDS,
        op="_npu_paged_attention",
        template=pa_template,
        key_arg=(0, "query"),
        key_of=_rows,
        binds=(("context_lens", "seq_lens"),),
        workspace="per_lengths",
        workspace_getter="_npu_paged_attention_get_workspace",
        dynamic_args=("context_lens", "block_table"),
        positional=PA_OP_POSITIONAL,
        scratch=("workspace",),
    ),
    MLA: TaskLayout(
        kind=MLA,
        capture_seam="mla.forward_decode",
        fields=MLA_FIELDS,
        op="npu_fused_infer_attention_score_v2.out",
        template=mla_template,
        key_arg=(0, "q_nope"),
        key_of=_q_nope_rows,
        binds=(),  # its own provider reads the nested decode fields
        provider=mla_provider,
        dynamic_args=("actual_seq_kvlen", "actual_seq_qlen", "block_table"),
        # stock passes ``q_nope, k_nope, k_nope`` by position: query, key, value
        positional=FIA_OP_POSITIONAL,
    ),
}


def draft_step(metadata_key: str, per_step: Any, current: Any) -> int:
    """The draft step whose metadata a draft task reads, checked against what the proposers of
    this line pass (``draft_attn_metadatas``, one dict per step).

    Both shapes the proposers of this line pass are understood: the generic proposer's (each
    step's dict maps every draft layer to one metadata object; MTP and Eagle drafts, MLA ones
    included) and Step3.5 MTP's (one dict per KV-cache group, the group whose layer runs at
    that step, mapping its layers to the group's object). In both, the layer reads the dict the
    proposer made current for the step (``forward_context.attn_metadata``), which lists the
    layer's key, with one metadata object. Anything else (a step's dict holding several objects,
    the key absent) is a shape no proposer of this line produces: ``CaptureRefused``.
    """
    if not per_step:
        return 0  # single-step drafts (v2 draft prefill)
    steps = [i for i, metadata in enumerate(per_step) if metadata is current]
    if len(steps) != 1:
        raise CaptureRefused(f"draft step not recoverable ({len(steps)} matches)")
    step = steps[0]
    if not isinstance(current, dict) or metadata_key not in current:
        raise CaptureRefused(
            f"draft metadata shape not understood: step {step} does not list {metadata_key!r}"
        )
    objects = len({id(metadata) for metadata in current.values()})
    if objects != 1:
        raise CaptureRefused(
            f"draft metadata shape not understood: step {step} holds {objects} metadata objects "
            "(each proposer of this line passes one per step)"
        )
    return step


def metadata_key(impl: Any, layer_name: str) -> str:
    """As stock's ``_graph_metadata_layer_name``: a KV-sharing layer reads its target layer's
    metadata. (``AscendMLAImpl`` keeps no ``kv_sharing_target_layer_name``: its own name.)"""
    return getattr(impl, "kv_sharing_target_layer_name", None) or layer_name


#: Why attention may run outside its graph path during a FULL capture on this release (the
#: stale-graph error names it): research/hybrid_and_v2_on_engine.md, section 1.
V2_FALLBACK_STALE = (
    "VLLM_USE_V2_MODEL_RUNNER is set, but vllm-ascend 0.23.0.post1 does not run model runner "
    "v2 on vLLM 0.23.0: it falls back to the v1 runner, whose graph wrapper sets the capture "
    "flag as a forward-context attribute, while attention, with the variable set, reads it from "
    "the forward context's additional_kwargs, where it is always false. Unset "
    "VLLM_USE_V2_MODEL_RUNNER: this release runs the v1 runner either way"
)


def stale_cause(runner: str) -> str | None:
    """The v2 variable on the v1 fallback (``worker/worker.py``, ``_ExtraForwardContextProxy``
    in ``ascend_forward_context.py``), when it is set now; else no cause this line knows."""
    if runner != "v1":
        return None
    try:
        import vllm.envs as envs

        return V2_FALLBACK_STALE if envs.VLLM_USE_V2_MODEL_RUNNER else None
    except Exception:  # a value vLLM itself cannot read: no cause to name
        return None


ATTN_310P = "vllm_ascend._310p.attention.attention_v1"

#: Every attention impl class of the release, and its fate (``tests/test_lines.py`` enumerates
#: the classes from the installed modules and checks each one's). Owned: captured through the
#: FIA / FIA v2 / PA seams of ``AscendAttentionBackendImpl`` or MLA's ``_forward_decode``. A
#: graph holding any other is refused at capture with the reason here, shown in ``status``.
IMPLS = (
    ImplFate(
        ATTN,
        IMPL,
        OWNED,
        "FIA, FIA v2 (sinks) and PA task groups, captured by its full_graph_fia / _fia_v2 / _pa",
    ),
    ImplFate(
        ATTN,
        "AscendC8AttentionBackendImpl",
        OWNED,
        "its graph path is the backend's "
        "full_graph_fia (INT8 KV: the antiquant scales ride in the captured tuple)",
    ),
    ImplFate(MLA_MODULE, MLA_IMPL, OWNED, "MLA task groups, captured by its _forward_decode"),
    ImplFate(
        f"{CP}.mla_cp",
        "AscendMlaCPImpl",
        STOCK,
        "context-parallel MLA (AscendMlaCPImpl, DCP/PCP > 1): its own capture and update "
        "(cp_seq_len per rank) are not modelled by the overlay",
    ),
    ImplFate(
        f"{CP}.attention_cp",
        "AscendAttentionCPImpl",
        STOCK,
        "context-parallel attention (AscendAttentionCPImpl, DCP/PCP > 1): its own capture and "
        "update (per-rank computed tokens) are not modelled by the overlay",
    ),
    ImplFate(
        "vllm_ascend.attention.sfa_v1",
        "AscendSFAImpl",
        NOTHING,
        "sparse MLA (AscendSFAImpl, DeepSeek V3.2 / GLM-5): captures no task groups and its "
        "update does nothing: nothing to own",
    ),
    ImplFate(
        f"{CP}.sfa_cp",
        "AscendSFACPImpl",
        NOTHING,
        "context-parallel sparse MLA (AscendSFACPImpl): captures no task groups and its update "
        "(SFA's) does nothing: nothing to own",
    ),
    ImplFate(
        f"{CP}.sfa_cp",
        "AscendSFADCPImpl",
        NOTHING,
        "decode-context-parallel sparse MLA (AscendSFADCPImpl): captures no task groups and its "
        "update (SFA's) does nothing: nothing to own",
    ),
    ImplFate(
        "vllm_ascend.attention.dsa_v1",
        "AscendDSAImpl",
        NOTHING,
        "DSA (AscendDSAImpl, DeepSeek V4): captures no task groups and the runner never updates "
        "its graphs: nothing to own",
    ),
    ImplFate(
        f"{CP}.dsa_cp",
        "AscendDSACPImpl",
        NOTHING,
        "context-parallel DSA (AscendDSACPImpl, DeepSeek V4 with DCP/PCP): captures no task "
        "groups and has no update of its own: nothing to own",
    ),
    ImplFate(
        "vllm_ascend.attention.fa3_v1",
        "AscendFAImpl",
        NOTHING,
        "FA3 (AscendFAImpl): its forward_impl launches flash attention directly, never the "
        "backend's full_graph_* task groups: nothing to own",
    ),
    ImplFate(
        ATTN_310P,
        "AscendAttentionBackendImpl310",
        NOTHING,
        "310P attention (AscendAttentionBackendImpl310): its forward_impl and "
        "forward_paged_attention launch their ops directly, never a task group: nothing to own",
    ),
)

V1_FINGERPRINTS = (
    Check("signature", ACL, "update_full_graph_params", ("attn_backend", *UPDATE_PARAMS)),
    Check("fields", ACL, "GraphParams", ("events", "workspaces", "handles", "attn_params")),
    Check(
        "has",
        ACL,
        "",
        (
            "get_graph_params",
            "get_draft_graph_params",
            "get_draft_graph_prefill_params",
            "ACLGraphWrapper",
        ),
    ),
    Check(
        "source",
        ACL,
        "ACLGraphWrapper.__call__",
        ("concrete_aclgraph_entries", "entry.aclgraph", "replay()"),
    ),
    Check("has", ATTN, IMPL, ("_graph_metadata_layer_name",)),
    Check("has", ATTN, "", ("SWA_INT_MAX", "AscendMetadata")),
    Check("absent", ATTN_UTILS, "PagedAttentionGraphParam"),
)

#: What ``MLAProvider`` mirrors must still be what the stock MLA update does.
MLA_FINGERPRINTS = (
    Check(
        "source",
        MLA_MODULE,
        f"{MLA_IMPL}.update_graph_params",
        (
            "attn_metadata_current[key].decode.seq_lens_list",
            "speculative_config.use_eagle()",
            "spec_multiple = speculative_config.num_speculative_tokens + 1",
            "[spec_multiple * (i + 1) for i in range(num_tokens // spec_multiple)]",
            "attn_metadata_current[key].decode.block_table",
            "block_table = block_table[: len(actual_seq_lengths)]",
            "workspace=graph_params.workspaces.get(num_tokens)",
        ),
    ),
    Check(
        "source",
        MLA_MODULE,
        f"{MLA_IMPL}._forward_decode",
        ("graph_params.attn_params[num_tokens].append(attn_params)", "num_tokens = q_nope.size(0)"),
    ),
    Check(
        "fields",
        MLA_MODULE,
        "AscendMLADecodeMetadata",
        (
            "input_positions",
            "block_table",
            "seq_lens",
            "max_seq_lens",
            "seq_lens_list",
            "actual_seq_lengths_q",
            "attn_mask",
            "sin",
            "cos",
            "cp_seq_len",
            "dcp_mtp_attn_mask",
        ),
    ),
)

V2_FINGERPRINTS = (
    Check("has", V2_ACL, "", ("ModelWithContext",)),
    Check("has", V2_UTILS, "", ("torch_cuda_wrapper",)),
    Check(
        "source", V2_UTILS, "torch_cuda_wrapper", ("torch.cuda.graph = torch_npu_graph_wrapper",)
    ),
    Check(
        "source",
        V2_ACL,
        "ModelAclGraphManager.run_fullgraph",
        ("super().run_fullgraph(desc)", "update_full_graph_params", "batch_descriptor=None"),
    ),
    Check(
        "source",
        V2_EAGLE,
        "PrefillEagleAclGraphManager.run_fullgraph",
        (
            "build_draft_attn_metadatas",
            "super().run_fullgraph(desc)",
            "draft_attn_metadatas=draft_attn_metadatas",
        ),
    ),
    Check(
        "source",
        V2_CG,
        "CudaGraphManager.capture",
        ("torch.cuda.CUDAGraph()", "torch.cuda.graph(graph", "self.graphs[desc] = graph"),
    ),
    Check(
        "fields",
        V2_CG,
        "BatchExecutionDescriptor",
        ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count"),
    ),
)

VERIFY_INTERCEPTORS = (
    Interceptor("verify.update_begin", "torch_npu", "npu.graph_task_update_begin", "update_begin"),
    Interceptor("verify.update_end", "torch_npu", "npu.graph_task_update_end", "update_end"),
    Interceptor("verify.event_record", "torch_npu", "npu.ExternalEvent.record", "event_record"),
    Interceptor("verify.fia", "torch_npu", "npu_fused_infer_attention_score.out", "fia_out"),
    # FIA v2 (sinks) and MLA relaunch the same op: one interceptor serves both kinds
    Interceptor(
        "verify.fia_v2", "torch_npu", "npu_fused_infer_attention_score_v2.out", "fia_v2_out"
    ),
    Interceptor("verify.pa", "torch_npu", "_npu_paged_attention", "paged_attention"),
)

LINE = Line(
    name="0.23",
    vllm_ascend_versions=frozenset({"0.23.0", "0.23.0.post1"}),
    vllm_versions=frozenset({"0.23.0"}),
    seams=SEAMS,
    fingerprints={"v1": V1_FINGERPRINTS, "v2": V2_FINGERPRINTS, "mla": MLA_FINGERPRINTS},
    layouts=LAYOUTS,
    update_params=UPDATE_PARAMS,
    graph_params=(
        (ACL, "get_graph_params"),
        (ACL, "get_draft_graph_params"),
        (ACL, "get_draft_graph_prefill_params"),
    ),
    draft_step=draft_step,
    metadata_key=metadata_key,
    verify_interceptors=VERIFY_INTERCEPTORS,
    impls=IMPLS,
    # every module that imported ``update_full_graph_params`` by name and calls it
    update_entry_points=(
        "vllm_ascend.worker.model_runner_v1:update_full_graph_params",
        "vllm_ascend.spec_decode.llm_base_proposer:update_full_graph_params",
        "vllm_ascend.worker.v2.aclgraph_utils:update_full_graph_params",
        "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph:update_full_graph_params",
    ),
    counted_entry_points={
        # what vLLM's DP engine core asks an idle rank's worker for (core.py: execute_dummy_batch)
        "dummy_batches": "vllm_ascend.worker.worker:NPUWorker.execute_dummy_batch",
        # the drafter's part of every dummy run (capture, profile, an idle DP rank's batch)
        "draft_dummy_runs": (
            "vllm_ascend.spec_decode.llm_base_proposer:AscendSpecDecodeBaseProposer.dummy_run"
        ),
    },
    # vllm_ascend.ops first: importing attention_v1 first is a circular import
    check_imports=("vllm_ascend.ops", ATTN, ACL, MLA_MODULE),
    stale_cause=stale_cause,
)
