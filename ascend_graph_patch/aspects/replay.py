"""Replay aspect: ``AscendAttentionBackendImpl.update_graph_params``, the one stock update seam.

Every v1/v2 target and draft update reaches this staticmethod through ``update_full_graph_params``.
For a graph the overlay owns, its own tasks are resolved (all of them, before any update-scope
runtime call) and applied; the stock body is not run. Any other graph goes to stock. Never both
for one graph in one step.

Under a fault the step is never worse than stock (``docs/design.md``, "Faults"):

- the overlay could not resolve a task (a bug of ours): stock, reading the same intact metadata,
  updates that step;
- the step's metadata cannot be read the way stock reads it, or a runtime call fails: the step
  raises that error into the engine, as stock would, after recording the events a launched
  replay still waits on (so, unlike stock, it cannot hang). Falling back to stock here would be
  worse: stock's own key cache is cold for a graph it never updated, and it would update some
  tasks and leave the rest waiting.

Updates are serialised per process (CANN is reported to fail with two threads updating at once).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ascend_graph_patch import fail_fast, state
from ascend_graph_patch.aspects import OBSERVE, ON, VERIFY, replay_order, verify
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.aspects.capture import current_role
from ascend_graph_patch.aspects.guard import aspect_error
from ascend_graph_patch.core.graph import (
    MetadataFault,
    OwnedGraph,
    Resolution,
    ResolutionError,
    StepFault,
)
from ascend_graph_patch.core.kinds import TARGET
from ascend_graph_patch.core.registry import REGISTRY

ASPECT = "replay.update"
_SKIP = object()


class _Propagate(Exception):
    """Carries an error the step must raise into the engine (past the containment below)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


#: One overlay update at a time in a process.
_UPDATE_LOCK = threading.RLock()


def _arguments(active: shared.Active, args: tuple, kwargs: dict) -> tuple[Any, Any, Any]:
    """(update_stream, forward_context, draft_attn_metadatas) of a stock update call."""
    params = active.line.update_params
    if not kwargs and len(args) == len(params):  # how update_full_graph_params calls it
        return args[0], args[1], args[-1]
    values = dict(zip(params, args, strict=False))
    values.update(kwargs)
    return values["update_stream"], values["forward_context"], values.get("draft_attn_metadatas")


_current_replay = shared.CURRENT_REPLAY.get


def _unowned(role: str, descriptor: Any) -> None:
    state.count("updates.stock.unowned")
    reason = REGISTRY.refused.get((role, descriptor))
    if reason is not None:
        state.warn_once(f"unowned:{role}:{reason}", f"{role} graph left to stock: {reason}")


def _plan(active: shared.Active, args: tuple, kwargs: dict) -> Any:
    if not kwargs and len(args) == len(active.line.update_params):  # the runner's call
        update_stream, forward_context, draft_attn_metadatas = args[0], args[1], args[-1]
    else:
        update_stream, forward_context, draft_attn_metadatas = _arguments(active, args, kwargs)
    # Which graph: v2's manager names the one it replays; v1 takes the wrapper that just replayed.
    replay = _current_replay()
    if replay is not None:
        role, descriptor, owner = replay
    else:
        role = current_role(forward_context)
        descriptor = forward_context.batch_descriptor
        owner = shared.take_replay(role, descriptor)
    if active.stream_order:
        replay_order.note_update_stream(active.update_streams, update_stream)
    # with the owner known, only its graph will do: another live engine's is not this update's
    owned = REGISTRY.lookup(role, descriptor, owner)
    if owned is None:
        _unowned(role, descriptor)
        return None
    if not owned.tasks:
        state.count("updates.skipped_empty")
        return _SKIP
    owned.update_stream = update_stream
    try:
        if role == TARGET:
            values = owned.values_target(forward_context.attn_metadata)
        else:
            values = owned.values_draft(draft_attn_metadatas)
    except StepFault as fault:
        if active.mode != ON:  # observe / verify: stock updates every step, let it meet the fault
            return None
        raise _Propagate(_step_fault(owned, fault, update_stream)) from None
    except ResolutionError as exc:
        state.count("fallback.resolution")
        state.warn_once(
            f"resolve:{type(exc.__cause__).__name__}",
            f"{role} graph: the overlay could not resolve a task ({exc}); the stock update "
            "took this step",
        )
        return None
    if active.mode == OBSERVE:
        state.count("updates.observed")
        return None
    return owned, values, update_stream


def _step_fault(owned: OwnedGraph, fault: StepFault, update_stream: Any) -> BaseException:
    """The step is broken as stock would find it broken: its error, with nothing left waiting."""
    kind = "metadata" if isinstance(fault, MetadataFault) else "runtime"
    state.count(f"faults.{kind}")
    released = owned.release(update_stream)
    error = fault.error
    message = (
        f"{owned.role} graph: {fault}; raised {type(error).__name__} to the engine, as stock "
        f"would, after recording {released} pending event(s) so the replay cannot hang"
    )
    state.warn_once(f"fault:{kind}:{type(error).__name__}", message)
    error.add_note(f"ascend-graph-patch: {message}")
    fail_fast.raised(error, owned.role, owned.descriptor, str(fault))
    return error


def _apply(owned: OwnedGraph, values: list[dict[str, Any]], update_stream: Any) -> None:
    try:
        owned.apply_values(values, update_stream, torch.npu)
    except Exception as exc:  # the runtime failed part way: stock would raise it too
        state.count("faults.apply")
        where = " ".join(n for n in getattr(exc, "__notes__", []) if "ascend-graph-patch" in n)
        state.warn_once(
            f"fault:apply:{type(exc).__name__}",
            f"{owned.role} graph: {type(exc).__name__}: {exc}; raised to the engine, as stock "
            f"would. {where.removeprefix('ascend-graph-patch: ')}",
        )
        fail_fast.raised(
            exc, owned.role, owned.descriptor, where.removeprefix("ascend-graph-patch: ")
        )
        raise
    state.count_update(len(owned.tasks))
    if ASPECT not in state.STATE.aspects_effective:
        state.mark_effective(ASPECT)


def _verify(
    active: shared.Active,
    stock: Any,
    args: tuple,
    kwargs: dict,
    owned: OwnedGraph,
    values: list[dict[str, Any]],
    update_stream: Any,
) -> None:
    dry, error = verify.dry_run(stock, args, kwargs, active.line.verify_interceptors)
    state.count("verify.updates")
    if error is not None:
        # Stock cannot update this graph at all (it would raise into the engine): apply ours.
        state.count("verify.stock_failed")
        state.warn_once(
            f"verify-stock:{type(error).__name__}",
            f"stock update failed in the dry run ({type(error).__name__}: {error}); "
            "applying the overlay's update instead",
        )
        _apply(owned, values, update_stream)
        return
    resolved = Resolution(owned.tasks, values)
    try:
        problems = verify.compare(resolved, dry, active.line.layouts)
    except Exception as exc:  # a comparison bug of ours: stock still updates this step
        aspect_error(ASPECT + ".verify", exc)
        problems = []
    state.count("verify.tasks", len(resolved))
    if problems:
        state.count("verify.mismatches", len(problems))
        state.warn_once("verify-mismatch", f"verify: overlay differs from stock: {problems[0]}")
    stock(*args, **kwargs)
    state.mark_effective(ASPECT)
    if problems and active.strict:
        raise verify.VerifyMismatch("overlay differs from stock:\n  " + "\n  ".join(problems))


def update_graph_params(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    active = shared.ACTIVE
    if active is None:
        return wrapped(*args, **kwargs)
    with _UPDATE_LOCK:
        try:
            plan = _plan(active, args, kwargs)
        except _Propagate as step:
            raise step.error from None
        except Exception as exc:
            aspect_error(ASPECT, exc)
            plan = None
        if plan is None:
            return wrapped(*args, **kwargs)
        if plan is _SKIP:
            return None
        owned, values, update_stream = plan
        if active.mode == VERIFY:
            return _verify(active, wrapped, args, kwargs, owned, values, update_stream)
        assert active.mode == ON
        _apply(owned, values, update_stream)
        return None
