"""Attention aspects: name the layer being captured, and register each task group stock creates.

The stock capture code runs unchanged. After a backend capture method (``full_graph_fia`` /
``_fia_v2`` / ``_pa``) returns, the one entry it appended to a ``GraphParams`` (event, handle,
captured tuple) becomes an ``UpdateTask`` of the graph being captured (``core.tasks``), keyed by
its layer's metadata key (``kv_sharing_target_layer_name or layer_name``, as stock's
``_graph_metadata_layer_name``) and, in a draft graph, by the draft step, recovered by identity:
the proposer sets ``forward_context.attn_metadata`` to ``draft_attn_metadatas[step]`` before each
step, and the shape of that entry is checked at capture (``_draft_step``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch_npu
import vllm_ascend.ops  # noqa: F401  (first: attention_v1 first is a circular import)
from vllm.forward_context import get_forward_context
from vllm_ascend.attention import attention_v1

from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.core.graph import CaptureRefused
from ascend_graph_patch.core.kinds import FIA, FIA_V2, PA, TARGET
from ascend_graph_patch.core.tasks import build_task
from ascend_graph_patch.lines.base import TaskLayout


def layer_forward(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if shared.CURRENT_SCOPE.get() is None:
        return wrapped(*args, **kwargs)
    token = None
    try:
        layer = args[0] if args else kwargs.get("layer")
        name = getattr(layer, "layer_name", None)
        key = getattr(instance, "kv_sharing_target_layer_name", None) or name
        token = shared.CURRENT_LAYER.set((name, key))
    except Exception:
        token = None  # the task registration will then fail cleanly: no layer known
    try:
        return wrapped(*args, **kwargs)
    finally:
        if token is not None:
            shared.CURRENT_LAYER.reset(token)


def _draft_step(role: str, metadata_key: str) -> int:
    """The draft step whose metadata the task being captured reads, checked against what the
    proposer passes (``draft_attn_metadatas``, one dict per step).

    Both shapes the proposers of this line pass are understood: the generic proposer's (each
    step's dict maps every draft layer to one metadata object) and Step3.5 MTP's (one dict per
    KV-cache group, the group whose layer runs at that step, mapping its layers to the group's
    object). In both, the layer reads the dict the proposer made current for the step
    (``forward_context.attn_metadata``), which lists the layer's key, with one metadata object.
    Anything else (a step's dict holding several objects, the key absent) is a shape no proposer
    of this line produces: the graph is refused, and so left to stock, with the reason.
    """
    if role == TARGET:
        return 0
    forward_context = get_forward_context()
    per_step = getattr(forward_context, "draft_attn_metadatas", None)
    if not per_step:
        return 0  # single-step drafts (v2 draft prefill)
    current = forward_context.attn_metadata
    steps = [i for i, metadata in enumerate(per_step) if metadata is current]
    if len(steps) != 1:
        raise CaptureRefused(f"draft step not recoverable ({len(steps)} matches)")
    step = steps[0]
    if not isinstance(current, dict) or metadata_key not in current:
        raise CaptureRefused(
            f"draft metadata shape not understood: step {step} does not list {metadata_key!r}"
        )
    objects = len({id(metadata) for metadata in current.values()})
    if objects != 1:
        raise CaptureRefused(
            f"draft metadata shape not understood: step {step} holds {objects} metadata objects "
            "(each proposer of this line passes one per step)"
        )
    return step


def _bucket_key(layout: TaskLayout, args: tuple, kwargs: dict) -> int:
    index, name = layout.key_arg
    return layout.key_of(args[index] if len(args) > index else kwargs[name])


def _register(
    scope: shared.CaptureScope, layout: TaskLayout, num_tokens: int, before: list[int]
) -> None:
    """Turn the one task group the stock capture just appended into a task of the graph."""
    params = None
    for candidate, n in zip(scope.graph_params, before, strict=True):
        if candidate is None:
            continue
        size = len(candidate.handles.get(num_tokens, ()))
        if size == n:
            continue
        if params is not None or size != n + 1:
            raise CaptureRefused(f"{layout.kind}: expected one new task group")
        params = candidate
    if params is None:
        return  # nothing captured (e.g. PA outside a capture)
    layer = shared.CURRENT_LAYER.get()
    if layer is None or layer[1] is None:
        raise CaptureRefused(f"{layout.kind}: layer unknown at capture")
    layer_name, metadata_key = layer
    role = scope.graph.role
    scope.graph.add(
        build_task(
            layout,
            params.attn_params[num_tokens][-1],
            runtime=torch_npu,
            attn_module=attention_v1,
            role=role,
            layer_name=layer_name,
            metadata_key=metadata_key,
            step=_draft_step(role, metadata_key),
            handle=params.handles[num_tokens][-1],
            event=params.events[num_tokens][-1],
            graph_workspace=scope.workspace_getter(params, num_tokens),
        )
    )


def _task_aspect(kind: str) -> Callable:
    """The wrapper of one backend capture method: stock runs, then its task group is owned."""

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        scope = shared.CURRENT_SCOPE.get()
        if scope is None or scope.failure is not None:
            return wrapped(*args, **kwargs)
        try:
            assert shared.ACTIVE is not None
            layout = shared.ACTIVE.line.layouts[kind]
            num_tokens = _bucket_key(layout, args, kwargs)
            before = [
                -1 if p is None else len(p.handles.get(num_tokens, ())) for p in scope.graph_params
            ]
        except Exception as exc:
            scope.fail(f"{kind}: {exc!r}")
            return wrapped(*args, **kwargs)
        result = wrapped(*args, **kwargs)
        try:
            _register(scope, layout, num_tokens, before)
        except Exception as exc:
            scope.fail(str(exc) if isinstance(exc, CaptureRefused) else f"{kind}: {exc!r}")
        return result

    wrapper.__name__ = f"{kind}_task"
    return wrapper


fia_task = _task_aspect(FIA)
fia_v2_task = _task_aspect(FIA_V2)
pa_task = _task_aspect(PA)
