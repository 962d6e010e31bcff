"""The aspect registry: every wrapper the overlay installs, one entry each, as data.

Each entry says what it wraps (module + qualname; a class attribute wherever possible, because
five vllm-ascend modules import `update_full_graph_params` by name), its group (installed only
when all the group's modules have loaded and the gate passed), the modes that need it, and why it
exists. Like vllm-ascend's own patch registry: what, why, how, and when it can go (when upstream's
UpdatableGraph lands for the line).
"""

from __future__ import annotations

from ascend_graph_patch.aspects.spec import (
    ACL,
    ALL_MODES,
    ATTN,
    OBSERVE,
    ON,
    VERIFY,
    Aspect,
)
from ascend_graph_patch.aspects.v2_registry import V2_ASPECTS

V1_ASPECTS: tuple[Aspect, ...] = (
    Aspect(
        "capture.v1",
        "v1",
        ACL,
        "ACLGraphWrapper.__call__",
        "ascend_graph_patch.aspects.capture:acl_graph_call",
        "know which FULL graph (role, batch descriptor) is being captured; own it afterwards",
    ),
    Aspect(
        "attention.layer",
        "v1",
        ATTN,
        "AscendAttentionBackendImpl.forward",
        "ascend_graph_patch.aspects.attention:layer_forward",
        "layer name and metadata key (KV sharing) of the op about to be captured",
    ),
    Aspect(
        "attention.layer_c8",
        "v1",
        ATTN,
        "AscendC8AttentionBackendImpl.forward",
        "ascend_graph_patch.aspects.attention:layer_forward",
        "same for the INT8-KV impl, which overrides forward",
    ),
    Aspect(
        "attention.fia",
        "v1",
        ATTN,
        "AscendAttentionBackendImpl.full_graph_fia",
        "ascend_graph_patch.aspects.attention:fia_task",
        "register the FIA task group the stock capture just created",
    ),
    Aspect(
        "attention.fia_v2",
        "v1",
        ATTN,
        "AscendAttentionBackendImpl.full_graph_fia_v2",
        "ascend_graph_patch.aspects.attention:fia_v2_task",
        "register the FIA-v2 (sinks) task group the stock capture just created",
    ),
    Aspect(
        "attention.pa",
        "v1",
        ATTN,
        "AscendAttentionBackendImpl.full_graph_pa",
        "ascend_graph_patch.aspects.attention:pa_task",
        "register the PA task group the stock capture just created",
    ),
    Aspect(
        "replay.update",
        "v1",
        ATTN,
        "AscendAttentionBackendImpl.update_graph_params",
        "ascend_graph_patch.aspects.replay:update_graph_params",
        "update owned graphs from their own tasks; everything else goes to stock",
    ),
)

ASPECTS: tuple[Aspect, ...] = V1_ASPECTS + V2_ASPECTS

GROUPS: dict[str, tuple[str, ...]] = {}
for _aspect in ASPECTS:
    mods = GROUPS.setdefault(_aspect.group, ())
    if _aspect.module not in mods:
        GROUPS[_aspect.group] = (*mods, _aspect.module)

__all__ = ["ACL", "ALL_MODES", "ASPECTS", "ATTN", "GROUPS", "OBSERVE", "ON", "VERIFY", "Aspect"]
