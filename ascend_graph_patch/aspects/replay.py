"""Replay aspect: `AscendAttentionBackendImpl.update_graph_params`, the one stock update seam.

Every v1/v2 target and draft update reaches this staticmethod through `update_full_graph_params`.
For a graph the overlay owns, its own tasks are resolved (all of them, before any runtime call) and
applied; the stock body is not run. Any other graph, and any step whose resolution fails, goes to
stock. Never both for one graph in one step.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_graph_patch import state
from ascend_graph_patch.aspects import OBSERVE, ON, VERIFY, verify
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.aspects.capture import current_role
from ascend_graph_patch.aspects.guard import aspect_error
from ascend_graph_patch.core.graph import (
    DraftSource,
    OwnedGraph,
    ResolutionError,
    ResolvedTask,
    TargetSource,
)
from ascend_graph_patch.core.kinds import TARGET
from ascend_graph_patch.core.registry import REGISTRY

ASPECT = "replay.update"
_SKIP = object()


def _arguments(active: shared.Active, args: tuple, kwargs: dict) -> tuple[Any, Any, Any]:
    """(update_stream, forward_context, draft_attn_metadatas) of a stock update call."""
    params = active.line.update_params
    if not kwargs and len(args) == len(params):  # how update_full_graph_params calls it
        return args[0], args[1], args[-1]
    values = dict(zip(params, args, strict=False))
    values.update(kwargs)
    return values["update_stream"], values["forward_context"], values.get("draft_attn_metadatas")


def _plan(active: shared.Active, args: tuple, kwargs: dict) -> Any:
    update_stream, forward_context, draft_attn_metadatas = _arguments(active, args, kwargs)
    role = current_role(forward_context)
    replay = shared.CURRENT_REPLAY.get()
    descriptor = replay[1] if replay is not None else forward_context.batch_descriptor
    owned = REGISTRY.lookup(role, descriptor)
    if owned is None:
        state.count("updates.stock.unowned")
        return None
    if not owned.tasks:
        state.count("updates.skipped_empty")
        return _SKIP
    if role == TARGET:
        source: Any = TargetSource(forward_context.attn_metadata)
    else:
        source = DraftSource(draft_attn_metadatas)
    try:
        resolved = owned.resolve(source)
    except ResolutionError as exc:
        state.count("fallback.resolution")
        state.warn_once(f"resolve:{exc}", f"update left to stock for one step: {exc}")
        return None
    if active.mode == OBSERVE:
        state.count("updates.observed")
        return None
    return owned, resolved, update_stream


def _apply(owned: OwnedGraph, resolved: list[ResolvedTask], update_stream: Any) -> None:
    try:
        owned.apply(resolved, update_stream, torch.npu)
        state.count("updates.owned")
        state.count("tasks.updated", len(resolved))
        state.mark_effective(ASPECT)
    except Exception as exc:
        aspect_error(ASPECT + ".apply", exc)


def _verify(
    active: shared.Active,
    stock: Any,
    args: tuple,
    kwargs: dict,
    owned: OwnedGraph,
    resolved: list[ResolvedTask],
    update_stream: Any,
) -> None:
    dry, error = verify.dry_run(stock, args, kwargs)
    state.count("verify.updates")
    if error is not None:
        # Stock cannot update this graph at all (it would raise into the engine): apply ours.
        state.count("verify.stock_failed")
        state.warn_once(
            f"verify-stock:{type(error).__name__}",
            f"stock update failed in the dry run ({type(error).__name__}: {error}); "
            "applying the overlay's update instead",
        )
        _apply(owned, resolved, update_stream)
        return
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
    try:
        plan = _plan(active, args, kwargs)
    except Exception as exc:
        aspect_error(ASPECT, exc)
        plan = None
    if plan is None:
        return wrapped(*args, **kwargs)
    if plan is _SKIP:
        return None
    owned, resolved, update_stream = plan
    if active.mode == VERIFY:
        return _verify(active, wrapped, args, kwargs, owned, resolved, update_stream)
    assert active.mode == ON
    _apply(owned, resolved, update_stream)
    return None
