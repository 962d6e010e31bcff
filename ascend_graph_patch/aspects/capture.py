"""Capture aspect (v1): `ACLGraphWrapper.__call__` in FULL mode opens a capture scope.

Tasks registered inside the scope belong to the graph being captured. At the end the graph is owned
only if every task group the stock capture appended to `GraphParams` was registered; anything else
(an op the overlay does not know) leaves the whole graph to stock, and a graph holding an impl the
line leaves to stock (context-parallel, SFA, DSA) is refused with the line's reason. PIECEWISE
wrappers also set `forward_context.capturing`, hence the explicit FULL filter.
"""

from __future__ import annotations

from typing import Any

from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context

from ascend_graph_patch import state
from ascend_graph_patch.aspects import replay_order, stale
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.aspects.attention import left_to_stock, own_tasks
from ascend_graph_patch.aspects.guard import aspect_error
from ascend_graph_patch.core.graph import CaptureRefused, OwnedGraph
from ascend_graph_patch.core.kinds import DRAFT, DRAFT_PREFILL, TARGET
from ascend_graph_patch.core.registry import REGISTRY

ASPECT = "capture.v1"


_MISSING = object()


def current_role(forward_context: Any = None) -> str:
    """Target / draft / draft prefill, read where vllm-ascend's ``_EXTRA_CTX`` proxy reads it.

    The proxy reads the flags from forward-context attributes with model runner v1 and from
    ``additional_kwargs`` with v2 (deciding by the environment on every access); v1 always sets
    the attributes and v2 never does, so their presence decides here, at no cost.
    """
    fc = forward_context if forward_context is not None else get_forward_context()
    draft = getattr(fc, "is_draft_model", _MISSING)
    if draft is _MISSING:  # model runner v2
        extra = fc.additional_kwargs
        draft, prefill = extra.get("is_draft_model"), extra.get("is_draft_model_prefill")
    else:
        prefill = getattr(fc, "is_draft_model_prefill", None)
    if draft:
        return DRAFT_PREFILL if prefill else DRAFT
    return TARGET


def open_scope(owner: Any, role: str, descriptor: Any) -> shared.CaptureScope:
    assert shared.ACTIVE is not None
    graph_params = shared.stock_graph_params(shared.ACTIVE.line)
    # v1 wrappers built for ENPU / 310P update before they replay; everything else replays first
    replay_first = not getattr(owner, "enable_enpu", False)
    return shared.CaptureScope(
        owner=owner,
        graph=OwnedGraph(role=role, descriptor=descriptor, replay_first=replay_first),
        graph_params=graph_params,
        handles_before=shared.total_handles(graph_params),
        lengths_before=shared.lengths(graph_params),
    )


def own_captured(scope: shared.CaptureScope, runner: str = "v1") -> None:
    """Turn the attention calls the capture noted into the graph's tasks, as it ends (any
    misfit or error refuses the graph, with the reason; a stale graph raises ``StaleGraph``)."""
    if scope.failure is None:
        try:
            reason = left_to_stock(scope)
            if reason is not None:
                scope.fail(reason)
                return
            stale.check(scope, runner)  # attention ran outside its graph path: never silent
            if scope.failure is None:
                own_tasks(scope)
        except stale.StaleGraph:
            raise
        except Exception as exc:  # CaptureRefused, or a bug of ours: either way, stock keeps it
            scope.fail(str(exc) if isinstance(exc, CaptureRefused) else f"tasks: {exc!r}")


def close_scope(scope: shared.CaptureScope, graph: Any, aspect: str) -> None:
    """Own `graph` if every task group its capture created became one of its tasks."""
    owned = scope.graph
    if graph is None:
        return
    own_captured(scope)
    grown = shared.total_handles(scope.graph_params) - scope.handles_before
    reason = scope.failure
    if reason is None and grown != len(owned.tasks):
        reason = (
            f"{grown - len(owned.tasks)} captured task group(s) not registered by the overlay "
            "(an attention kind it does not own)"
        )
    if reason is not None:
        REGISTRY.refuse(scope.owner, owned.role, owned.descriptor, reason)
        state.count("graphs.refused")
        return
    REGISTRY.register(scope.owner, graph, owned)
    state.count("graphs.owned")
    state.mark_effective(aspect)


_CAPTURE, _REPLAY = "capture", "replay"


def _classify(instance: Any) -> tuple[str, Any, Any] | None:
    """("capture" | "replay", forward context, descriptor) of a FULL call; None otherwise."""
    if shared.ACTIVE is None or instance.runtime_mode != CUDAGraphMode.FULL:
        return None
    forward_context = get_forward_context()
    if forward_context.cudagraph_runtime_mode != CUDAGraphMode.FULL:
        return None
    descriptor = forward_context.batch_descriptor
    entry = instance.concrete_aclgraph_entries.get(descriptor)
    if entry is not None and entry.aclgraph is not None:
        return _REPLAY, forward_context, descriptor
    return _CAPTURE, forward_context, descriptor


def acl_graph_call(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    try:
        call = _classify(instance)
    except Exception as exc:
        aspect_error(ASPECT, exc)
        call = None
    if call is None:
        return wrapped(*args, **kwargs)
    what, forward_context, descriptor = call
    if what == _REPLAY:
        active, ordered, role = shared.ACTIVE, False, None
        if active is not None and active.stream_order:
            try:
                role = current_role(forward_context)
                streams = active.update_streams
                ordered = replay_order.prepare_v1(instance, role, descriptor, streams)
            except Exception as exc:  # stock's barrier, then
                aspect_error(ASPECT, exc)
        if ordered:
            output = replay_order.without_barrier(wrapped, instance, args, kwargs)
        else:
            output = wrapped(*args, **kwargs)
        try:  # the update that follows is this wrapper's graph's (unless it updates first)
            if not getattr(instance, "enable_enpu", False):
                role = role or current_role(forward_context)
                shared.note_replay(role, instance, descriptor)
        except Exception as exc:
            aspect_error(ASPECT, exc)
        return output
    try:
        scope = open_scope(instance, current_role(forward_context), descriptor)
    except Exception as exc:
        aspect_error(ASPECT, exc)
        return wrapped(*args, **kwargs)
    token = shared.CURRENT_SCOPE.set(scope)
    try:
        output = wrapped(*args, **kwargs)
    finally:
        shared.CURRENT_SCOPE.reset(token)
    try:
        entry = instance.concrete_aclgraph_entries.get(descriptor)
        close_scope(scope, getattr(entry, "aclgraph", None), ASPECT)
    except stale.StaleGraph:
        raise  # the engine must not start with it (``aspects/stale.py``)
    except Exception as exc:
        aspect_error(ASPECT, exc)
    return output
