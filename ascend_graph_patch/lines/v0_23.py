"""vllm-ascend 0.23.0 / 0.23.0.post1 with vLLM 0.23.0 (research/hook_points.md, R columns).

Everything the overlay knows about this release: the seams, the three attention layouts (the tuple
the stock capture appends to ``GraphParams.attn_params``, the relaunch the stock
``update_graph_params`` performs, the metadata it rebinds), verify's interceptors and the
fingerprints. The templates rebuild, from the captured tuple, the static keyword arguments of the
stock relaunch; the providers (``core.providers``) write what changes per step.
"""

from __future__ import annotations

from typing import Any

from ascend_graph_patch.core.kinds import FIA, FIA_V2, PA, TARGET
from ascend_graph_patch.lines.base import Check, Interceptor, Line, Seam, TaskLayout

ACL = "vllm_ascend.compilation.acl_graph"
ATTN = "vllm_ascend.attention.attention_v1"
ATTN_UTILS = "vllm_ascend.attention.utils"
IMPL = "AscendAttentionBackendImpl"
V2_ACL = "vllm_ascend.worker.v2.aclgraph_utils"
V2_UTILS = "vllm_ascend.worker.v2.utils"
V2_EAGLE = "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph"
V2_CG = "vllm.v1.worker.gpu.cudagraph_utils"

UPDATE_PARAMS = tuple(
    "update_stream forward_context num_tokens vllm_config speculative_config num_dcp_pcp_tokens "
    "draft_attn_metadatas".split()
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
    # a staticmethod reached through update_full_graph_params, which five modules import by name:
    # the class attribute is the one place every caller goes through
    "attention.update_graph_params": Seam(ATTN, f"{IMPL}.update_graph_params", UPDATE_PARAMS),
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


def fia_rebinds_table(fields: Any, role: str) -> bool:
    """Stock keeps the captured table on sliding-window target layers (rebinding it there
    corrupts output on the device); drafts always rebind it."""
    return role != TARGET or fields.sliding_window is None


def _query_ends_last(metadata: Any) -> int:
    return metadata.actual_seq_lengths_q[-1]


def _rows(query: Any) -> int:
    return query.shape[0]


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
    ),
}

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
    fingerprints={"v1": V1_FINGERPRINTS, "v2": V2_FINGERPRINTS},
    layouts=LAYOUTS,
    update_params=UPDATE_PARAMS,
    graph_params=(
        (ACL, "get_graph_params"),
        (ACL, "get_draft_graph_params"),
        (ACL, "get_draft_graph_prefill_params"),
    ),
    verify_interceptors=VERIFY_INTERCEPTORS,
)
