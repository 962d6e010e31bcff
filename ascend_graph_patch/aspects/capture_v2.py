"""Capture and replay identity for model runner v2 (`VLLM_USE_V2_MODEL_RUNNER`).

v2 has no `ACLGraphWrapper`: upstream `CudaGraphManager.capture` loops over its
`BatchExecutionDescriptor`s and, per FULL graph, runs `with torch.cuda.graph(graph, pool):`, where
`torch.cuda.graph` is vllm-ascend's `torch_npu_graph_wrapper` (copied there by `torch_cuda_wrapper`
at runner init, so this module's wrapper of it must be installed before the runner is built; it
is, because the post-import hook fires when the v2 modules load). Three seams, three jobs:

- `ModelAclGraphManager.capture` / `PrefillEagleAclGraphManager.capture` open a capture *session*
  (the owner and role, which are not visible from inside the graph context: `ModelWithContext`
  sets the draft flags only inside the captured forward);
- `torch_npu_graph_wrapper` opens one capture scope per graph (`args[0]` is the graph), into which
  the attention aspects register tasks;
- after the manager's capture returns, `manager.graphs` is inverted (graph -> descriptor) and each
  scope is closed with its descriptor: owned, or refused with the reason.

Replay: the managers' `run_fullgraph` sets `shared.CURRENT_REPLAY = (role, desc)` around the
stock body, because v2 updates run with `batch_descriptor=None`; the replay aspect then finds the
graph by (role, desc). Draft decode graphs (upstream's `DecodeSpeculatorCudaGraphManager`, which
the 0.23 line does not replace) are refused per graph: the stock path never updates them either.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from ascend_graph_patch import state
from ascend_graph_patch.aspects import replay_order, stale
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.aspects.capture import close_scope, open_scope, own_captured
from ascend_graph_patch.aspects.guard import aspect_error
from ascend_graph_patch.core.kinds import DRAFT, DRAFT_PREFILL, TARGET
from ascend_graph_patch.core.registry import REGISTRY

ASPECT = "capture.v2"

UNSEEN = (
    "v2 graph context not seen by the overlay: torch.cuda.graph was bound before the overlay "
    "installed (enable it before the v2 model runner is built)"
)
DECODE = (
    "v2 draft decode graph: captured by upstream DecodeSpeculatorCudaGraphManager, which the "
    "0.23 line leaves unreplaced and never updates; no per-step draft metadata at its replay"
)


@dataclass(eq=False)
class Session:
    """One manager's `capture` call: who captures, for which role, and the scopes per graph."""

    owner: Any
    role: str
    pending: dict[int, tuple[Any, shared.CaptureScope]] = field(default_factory=dict)


SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "ascend_graph_patch_v2_session", default=None
)


def manager_role(manager: Any) -> str:
    """Target for the model manager; draft prefill / draft for the Eagle prefill manager."""
    if not hasattr(manager, "speculator"):
        return TARGET
    return DRAFT_PREFILL if getattr(manager, "is_draft_model_prefill", False) else DRAFT


def _finish(session: Session, before: set[Any]) -> None:
    """Pair each new graph with its descriptor and own it (or refuse it, with the reason)."""
    manager = session.owner
    for desc, graph in list(manager.graphs.items()):
        if desc in before:
            continue
        entry = session.pending.pop(id(graph), None)
        if entry is None or entry[0] is not graph:
            REGISTRY.refuse(manager, session.role, desc, UNSEEN)
            state.count("graphs.refused")
            continue
        scope = entry[1]
        scope.graph.descriptor = desc
        # close_scope counts the task groups created since `handles_before`; later graphs of
        # this session have added theirs since: rebase on what this graph's capture created.
        scope.handles_before = shared.total_handles(scope.graph_params) - scope.grown
        if session.role == DRAFT:
            scope.fail(DECODE)
        close_scope(scope, graph, ASPECT)


def manager_capture(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """`ModelAclGraphManager.capture` / `PrefillEagleAclGraphManager.capture`."""
    session = None
    if shared.ACTIVE is not None:
        try:
            session = Session(owner=instance, role=manager_role(instance))
            before = set(instance.graphs)
        except Exception as exc:
            aspect_error(ASPECT, exc)
            session = None
    if session is None:
        return wrapped(*args, **kwargs)
    token = SESSION.set(session)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        SESSION.reset(token)
    try:
        _finish(session, before)
    except Exception as exc:
        aspect_error(ASPECT, exc)
    return result


def decode_capture(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Upstream draft decode manager: run stock, then refuse each graph it captured."""
    try:
        before = set(instance.graphs)
    except Exception:
        before = None
    token = SESSION.set(None)  # never own anything captured here
    try:
        result = wrapped(*args, **kwargs)
    finally:
        SESSION.reset(token)
    if shared.ACTIVE is not None and before is not None:
        try:
            for desc in instance.graphs:
                if desc not in before:
                    REGISTRY.refuse(instance, DRAFT, desc, DECODE)
                    state.count("graphs.refused")
        except Exception as exc:
            aspect_error(ASPECT, exc)
    return result


class _OwnedCapture:
    """The stock graph context, with a capture scope open around its body."""

    def __init__(self, inner: Any, session: Session, graph: Any) -> None:
        self.inner = inner
        self.session = session
        self.graph = graph
        self.scope: shared.CaptureScope | None = None
        self.token: Any = None

    def __enter__(self) -> Any:
        try:
            self.scope = open_scope(self.session.owner, self.session.role, None)
        except Exception as exc:
            aspect_error(ASPECT, exc)
            self.scope = None
        result = self.inner.__enter__()
        if self.scope is not None:
            self.token = shared.CURRENT_SCOPE.set(self.scope)
        return result

    def __exit__(self, *exc: Any) -> Any:
        if self.token is not None:
            shared.CURRENT_SCOPE.reset(self.token)
            self.token = None
        try:
            return self.inner.__exit__(*exc)
        finally:
            if self.scope is not None and exc[0] is None:
                try:
                    scope = self.scope
                    own_captured(scope, "v2")  # while the lists hold this graph's groups last
                    scope.grown = shared.total_handles(scope.graph_params) - scope.handles_before
                    self.session.pending[id(self.graph)] = (self.graph, scope)
                except stale.StaleGraph:
                    raise
                except Exception as error:  # the graph is then simply not owned
                    aspect_error(ASPECT, error)


def graph_context(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """`torch_npu_graph_wrapper(graph, pool)`: a scope per graph inside a manager session."""
    session = SESSION.get()
    inner = wrapped(*args, **kwargs)
    if session is None or shared.ACTIVE is None or not args:
        return inner
    return _OwnedCapture(inner, session, args[0])


def run_fullgraph(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Both managers' `run_fullgraph(desc)`: name the replayed graph for the update seam."""
    if shared.ACTIVE is None:
        return wrapped(*args, **kwargs)
    try:
        desc = args[0] if args else kwargs["desc"]
        token = shared.CURRENT_REPLAY.set((manager_role(instance), desc, instance))
    except Exception as exc:
        aspect_error(ASPECT, exc)
        return wrapped(*args, **kwargs)
    if shared.ACTIVE.stream_order:
        try:
            replay_order.v2_replay(shared.ACTIVE.update_streams)
        except Exception as exc:  # no wait added: as stock, which has none here
            aspect_error(ASPECT, exc)
    try:
        return wrapped(*args, **kwargs)
    finally:
        shared.CURRENT_REPLAY.reset(token)
