"""vllm-ascend 0.23.0 / 0.23.0.post1 with vLLM 0.23.0 (research/hook_points.md, R columns).

The templates rebuild, from the fields of the tuple the stock capture appended to
`GraphParams.attn_params`, the static keyword arguments of the relaunch the stock
`update_graph_params` performs; the providers in `core.providers` add what changes per step.
"""

from __future__ import annotations

from typing import Any

from ascend_graph_patch.core.providers import FIA, FIA_V2, PA
from ascend_graph_patch.lines.base import Check, Line

ACL = "vllm_ascend.compilation.acl_graph"
ATTN = "vllm_ascend.attention.attention_v1"
ATTN_UTILS = "vllm_ascend.attention.utils"
IMPL = "AscendAttentionBackendImpl"

UPDATE_PARAMS = (
    "update_stream",
    "forward_context",
    "num_tokens",
    "vllm_config",
    "speculative_config",
    "num_dcp_pcp_tokens",
    "draft_attn_metadatas",
)

FIA_FIELDS = (
    "query",
    "key",
    "value",
    "block_table",
    "attn_mask",
    "block_size",
    "actual_seq_lengths_kv",
    "actual_seq_lengths_q",
    "num_kv_heads",
    "num_heads",
    "scale",
    "output",
    "softmax_lse",
    "sparse_mode",
    "pre_tokens",
    "next_tokens",
    "sliding_window",
    "c8_k_aq_scale",
    "c8_k_aq_offset",
    "c8_v_aq_scale",
    "c8_v_aq_offset",
    "layer_name",
)
FIA_V2_FIELDS = (
    "query",
    "key",
    "value",
    "block_table",
    "attn_mask",
    "block_size",
    "actual_seq_lengths_kv",
    "num_kv_heads",
    "num_heads",
    "scale",
    "sliding_window",
    "sinks",
    "output",
    "softmax_lse",
    "layer_name",
)
PA_FIELDS = (
    "query",
    "key_cache",
    "value_cache",
    "num_kv_heads",
    "num_heads",
    "scale",
    "block_tables",
    "seq_lens",
    "output",
)


def fields_of(kind: str, captured: tuple) -> dict[str, Any]:
    names = {FIA: FIA_FIELDS, FIA_V2: FIA_V2_FIELDS, PA: PA_FIELDS}[kind]
    return dict(zip(names, captured, strict=True))


def fia_template(f: dict[str, Any], attn_module: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "query": f["query"],
        "key": f["key"],
        "value": f["value"],
        "block_table": f["block_table"],
        "atten_mask": f["attn_mask"],
        "input_layout": "TND",
        "block_size": f["block_size"],
        "actual_seq_lengths": f["actual_seq_lengths_q"],
        "actual_seq_lengths_kv": f["actual_seq_lengths_kv"],
        "num_key_value_heads": f["num_kv_heads"],
        "num_heads": f["num_heads"],
        "scale": f["scale"],
        "sparse_mode": f["sparse_mode"],
        "pre_tokens": f["pre_tokens"],
        "next_tokens": f["next_tokens"],
        "workspace": None,
        "out": [f["output"], f["softmax_lse"]],
    }
    if f["c8_k_aq_scale"] is not None:  # INT8 KV cache: BNSD with antiquant, as stock relaunches
        kwargs.update(
            key_antiquant_scale=f["c8_k_aq_scale"],
            value_antiquant_scale=f["c8_v_aq_scale"],
            key_antiquant_mode=0,
            value_antiquant_mode=0,
            inner_precise=1,
            input_layout="BNSD",
            sparse_mode=0,
        )
    return kwargs


def fia_v2_template(f: dict[str, Any], attn_module: Any) -> dict[str, Any]:
    window = f["sliding_window"]
    return {
        "query": f["query"],
        "key": f["key"],
        "value": f["value"],
        "block_table": f["block_table"],
        "atten_mask": f["attn_mask"],
        "input_layout": "TND",
        "block_size": f["block_size"],
        "actual_seq_qlen": None,
        "actual_seq_kvlen": f["actual_seq_lengths_kv"],
        "num_key_value_heads": f["num_kv_heads"],
        "num_query_heads": f["num_heads"],
        "sparse_mode": 4 if window is not None else 3,
        "pre_tokens": window if window is not None else attn_module.SWA_INT_MAX,
        "next_tokens": 0,
        "softmax_scale": f["scale"],
        "learnable_sink": f["sinks"],
        "workspace": None,
        "out": [f["output"], f["softmax_lse"]],
    }


def pa_template(f: dict[str, Any], attn_module: Any) -> dict[str, Any]:
    return {
        "query": f["query"],
        "key_cache": f["key_cache"],
        "value_cache": f["value_cache"],
        "num_kv_heads": f["num_kv_heads"],
        "num_heads": f["num_heads"],
        "scale_value": f["scale"],
        "block_table": f["block_tables"],
        "context_lens": f["seq_lens"],
        "out": f["output"],
        "workspace": None,
    }


V1_CHECKS = (
    Check("signature", ACL, "update_full_graph_params", ("attn_backend", *UPDATE_PARAMS)),
    Check("signature", ATTN, f"{IMPL}.update_graph_params", UPDATE_PARAMS),
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
    Check(
        "has",
        ATTN,
        IMPL,
        (
            "full_graph_fia",
            "full_graph_fia_v2",
            "full_graph_pa",
            "_graph_metadata_layer_name",
            "forward",
        ),
    ),
    Check(
        "signature",
        ATTN,
        f"{IMPL}.full_graph_fia",
        ("self", "query", "key", "value", "attn_metadata", "output", "layer"),
    ),
    Check(
        "signature",
        ATTN,
        f"{IMPL}.full_graph_fia_v2",
        ("self", "query", "key", "value", "attn_metadata", "output"),
    ),
    Check("signature", ATTN, f"{IMPL}.full_graph_pa", ("self", "query", "attn_metadata", "output")),
    Check(
        "signature",
        ATTN,
        f"{IMPL}.forward",
        (
            "self",
            "layer",
            "query",
            "key",
            "value",
            "kv_cache",
            "attn_metadata",
            "output",
            "output_scale",
            "output_block_scale",
        ),
    ),
    Check("has", ATTN, "", ("SWA_INT_MAX", "AscendMetadata")),
    Check("absent", ATTN_UTILS, "PagedAttentionGraphParam"),
)

# Model runner v2 (group "v2"; research/hook_points.md 1.4, 1.5, 3.3).
V2_ACL = "vllm_ascend.worker.v2.aclgraph_utils"
V2_UTILS = "vllm_ascend.worker.v2.utils"
V2_EAGLE = "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph"
V2_CG = "vllm.v1.worker.gpu.cudagraph_utils"
V2_CHECKS = (
    Check("has", V2_ACL, "", ("ModelAclGraphManager", "ModelWithContext")),
    Check("has", V2_EAGLE, "", ("PrefillEagleAclGraphManager", "DecodeEagleCudaGraphManager")),
    Check("has", V2_UTILS, "", ("torch_npu_graph_wrapper", "torch_cuda_wrapper")),
    Check("signature", V2_ACL, "ModelAclGraphManager.run_fullgraph", ("self", "desc")),
    Check("signature", V2_EAGLE, "PrefillEagleAclGraphManager.run_fullgraph", ("self", "desc")),
    Check(
        "signature",
        V2_EAGLE,
        "PrefillEagleAclGraphManager.capture",
        ("self", "forward_fn", "attn_states", "progress_bar_desc"),
    ),
    Check("signature", V2_UTILS, "torch_npu_graph_wrapper", ("args", "kwargs")),
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

LINE = Line(
    name="0.23",
    vllm_ascend_versions=frozenset({"0.23.0", "0.23.0.post1"}),
    vllm_versions=frozenset({"0.23.0"}),
    checks={"v1": V1_CHECKS, "v2": V2_CHECKS},
    tuple_arity={FIA: len(FIA_FIELDS), FIA_V2: len(FIA_V2_FIELDS), PA: len(PA_FIELDS)},
    templates={FIA: fia_template, FIA_V2: fia_v2_template, PA: pa_template},
    update_params=UPDATE_PARAMS,
    fields=fields_of,
    dynamic_args={
        FIA: ("actual_seq_lengths", "actual_seq_lengths_kv", "block_table", "sparse_mode"),
        FIA_V2: ("actual_seq_qlen", "actual_seq_kvlen", "block_table"),
        PA: ("context_lens", "block_table"),
    },
)
