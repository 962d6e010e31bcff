"""The shape of one aspect entry (kept apart so per-group registries can import it)."""

from __future__ import annotations

from dataclasses import dataclass

ON, OBSERVE, VERIFY = "on", "observe", "verify"
ALL_MODES = frozenset({ON, OBSERVE, VERIFY})

ACL = "vllm_ascend.compilation.acl_graph"
ATTN = "vllm_ascend.attention.attention_v1"


@dataclass(frozen=True)
class Aspect:
    name: str
    group: str
    module: str
    target: str
    wrapper: str  # "ascend_graph_patch.aspects.<mod>:<function>"
    why: str
    modes: frozenset[str] = ALL_MODES
