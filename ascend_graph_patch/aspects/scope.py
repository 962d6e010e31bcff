"""What the aspects of one process share: the active line and mode, and the capture scope.

The capture scope is a context variable the capture aspects set around a FULL graph capture; the
attention aspects register tasks into it. Outside a capture it is None, and every attention aspect
returns to the stock code after one context-variable read.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ascend_graph_patch.core.graph import OwnedGraph
from ascend_graph_patch.lines.base import Line


@dataclass
class Active:
    """The installed overlay: the release line it matched, the mode, strict verify."""

    line: Line
    mode: str
    strict: bool = False
    #: ``ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream``: owned FULL graphs replay ordered by streams
    #: instead of stock's barrier (``aspects/replay_order.py``)
    stream_order: bool = False
    #: the update streams seen while stream order is on (the runner's, a drafter's)
    update_streams: list[Any] = field(default_factory=list)


ACTIVE: Active | None = None


def stock_graph_params(line: Line) -> tuple[Any, ...]:
    """The stock per-role ``GraphParams`` (target, draft, draft prefill), each possibly None."""
    import importlib

    return tuple(
        getattr(importlib.import_module(module), name)() for module, name in line.graph_params
    )


def lengths(graph_params: tuple[Any, ...]) -> list[dict[Any, int]]:
    """Per GraphParams, num_tokens -> how many task groups the stock capture appended so far."""
    return [{} if p is None else {n: len(v) for n, v in p.handles.items()} for p in graph_params]


def total_handles(graph_params: tuple[Any, ...]) -> int:
    """How many task groups the stock capture has appended to these ``GraphParams`` so far."""
    return sum(len(v) for p in graph_params if p is not None for v in p.handles.values())


@dataclass(eq=False)
class CaptureScope:
    """One graph being captured: who captures it, what it owns, what the stock code appended."""

    owner: Any  # the ACLGraphWrapper (v1) or graph manager (v2)
    graph: OwnedGraph
    graph_params: tuple[Any, ...]  # the stock GraphParams the capture may append to
    handles_before: int  # their task groups before this capture
    failure: str | None = None  # why the graph cannot be owned (first reason wins)
    #: (GraphParams identity, num_tokens) -> the getter of that graph's captured workspace
    workspace_getters: dict[tuple[int, int], Callable[[], Any]] = field(default_factory=dict)
    #: v2: task groups this graph's capture appended (later graphs of one session add theirs)
    grown: int = 0
    #: per GraphParams: num_tokens -> its task groups before this capture
    lengths_before: list[dict[Any, int]] = field(default_factory=list)
    #: the attention calls captured so far (layout, impl, num_tokens, draft context), owned as
    #: tasks when the capture ends (``attention.own_tasks``)
    calls: list[tuple] = field(default_factory=list)
    #: the forward context's registered layers (name -> layer, whose ``impl`` captures)
    layers: Any = None
    #: id -> impl of each attention impl whose forward ran in this capture (``aspects/stale``)
    ran: dict[int, Any] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason

    def workspace_getter(self, params: Any, num_tokens: int) -> Callable[[], Any]:
        """One getter per (GraphParams, size): tasks of a graph share its captured workspace."""
        key = (id(params), num_tokens)
        getter = self.workspace_getters.get(key)
        if getter is None:
            # ``workspaces.get(num_tokens)`` per step, as stock reads it, called in C
            getter = self.workspace_getters[key] = partial(params.workspaces.get, num_tokens)
        return getter


CURRENT_SCOPE: contextvars.ContextVar[CaptureScope | None] = contextvars.ContextVar(
    "ascend_graph_patch_capture_scope", default=None
)
# v2 replays update inside run_fullgraph with batch_descriptor=None: (role, descriptor, manager).
CURRENT_REPLAY: contextvars.ContextVar[tuple[str, Any, Any] | None] = contextvars.ContextVar(
    "ascend_graph_patch_replay", default=None
)

# v1: role -> (weakref(wrapper), descriptor) of the last graph a replay-first wrapper replayed;
# the update that follows it (the runner's order) takes it, so it updates exactly that graph.
_LAST_REPLAY: dict[str, tuple[Any, Any]] = {}


def note_replay(role: str, owner: Any, descriptor: Any) -> None:
    _LAST_REPLAY[role] = (weakref.ref(owner), descriptor)


def take_replay(role: str, descriptor: Any) -> Any:
    """The owner that just replayed ``(role, descriptor)``, or None (consumed either way)."""
    noted = _LAST_REPLAY.pop(role, None)
    if noted is None or (noted[1] is not descriptor and noted[1] != descriptor):
        return None
    return noted[0]()
