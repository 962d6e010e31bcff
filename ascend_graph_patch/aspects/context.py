"""State shared by the aspects of one process: the active line and mode, and the capture scope.

The capture scope is a context variable set by the capture aspect around a FULL graph capture; the
attention aspects register tasks into it. Outside a capture it is None, and every attention aspect
returns to the stock code after one context-variable read.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from ascend_graph_patch.core.graph import OwnedGraph
from ascend_graph_patch.lines.base import Line


@dataclass
class Active:
    line: Line
    mode: str
    strict: bool = False


ACTIVE: Active | None = None


@dataclass(eq=False)
class CaptureScope:
    owner: Any  # the ACLGraphWrapper (v1) or graph manager (v2)
    graph: OwnedGraph
    buckets: tuple[Any, ...]  # the GraphParams registries the stock capture may append to
    handles_before: int
    failure: str | None = None
    registered: int = 0
    extra: dict = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason


CURRENT_SCOPE: contextvars.ContextVar[CaptureScope | None] = contextvars.ContextVar(
    "ascend_graph_patch_capture_scope", default=None
)
# (layer name, metadata key) of the attention layer whose forward is running during capture.
LayerIdentity = tuple[str | None, str | None]
CURRENT_LAYER: contextvars.ContextVar[LayerIdentity | None] = contextvars.ContextVar(
    "ascend_graph_patch_layer", default=None
)
# v2 replays update inside run_fullgraph with batch_descriptor=None: the manager's descriptor.
CURRENT_REPLAY: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "ascend_graph_patch_replay", default=None
)


def total_handles(buckets: tuple[Any, ...]) -> int:
    return sum(len(v) for b in buckets if b is not None for v in b.handles.values())
