"""Aspects for model runner v2 (`VLLM_USE_V2_MODEL_RUNNER`): graph managers and the graph context.

Listed separately so the v1 registry stays readable. One group, "v2": its three modules load
together (the v2 model runner imports all of them), so the gate checks and installs them at once.
The attention and update aspects are shared with v1 (group "v1"): v2 reaches the same
`AscendAttentionBackendImpl` capture and `update_graph_params` seams.
"""

from __future__ import annotations

from ascend_graph_patch.aspects.spec import Aspect

V2_ACL = "vllm_ascend.worker.v2.aclgraph_utils"
V2_UTILS = "vllm_ascend.worker.v2.utils"
V2_EAGLE = "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph"
_CAP = "ascend_graph_patch.aspects.capture_v2"

V2_ASPECTS: tuple[Aspect, ...] = (
    Aspect(
        "capture.v2.graph",
        "v2",
        V2_UTILS,
        "torch_npu_graph_wrapper",
        f"{_CAP}:graph_context",
        "one capture scope per FULL graph (args[0]); must be wrapped before torch_cuda_wrapper "
        "copies it into torch.cuda.graph at runner init",
    ),
    Aspect(
        "capture.v2.model",
        "v2",
        V2_ACL,
        "ModelAclGraphManager.capture",
        f"{_CAP}:manager_capture",
        "target capture session; graphs keyed by BatchExecutionDescriptor (manager.graphs)",
    ),
    Aspect(
        "replay.v2.model",
        "v2",
        V2_ACL,
        "ModelAclGraphManager.run_fullgraph",
        f"{_CAP}:run_fullgraph",
        "v2 updates run with batch_descriptor=None: name (role, desc) for the update seam",
    ),
    Aspect(
        "capture.v2.draft_prefill",
        "v2",
        V2_EAGLE,
        "PrefillEagleAclGraphManager.capture",
        f"{_CAP}:manager_capture",
        "draft prefill capture session",
    ),
    Aspect(
        "replay.v2.draft_prefill",
        "v2",
        V2_EAGLE,
        "PrefillEagleAclGraphManager.run_fullgraph",
        f"{_CAP}:run_fullgraph",
        "name (draft_prefill, desc) for the update seam",
    ),
    Aspect(
        "capture.v2.draft_decode",
        "v2",
        V2_EAGLE,
        "DecodeEagleCudaGraphManager.capture",
        f"{_CAP}:decode_capture",
        "upstream draft decode graphs: left to stock, refused per graph with the reason",
    ),
)
