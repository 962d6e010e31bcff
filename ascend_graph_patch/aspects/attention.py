"""Attention aspects: note each task group the stock capture creates; own them as the graph closes.

The stock capture code runs unchanged. Each call of a backend capture method (``full_graph_fia``
/ ``_fia_v2`` / ``_pa``) inside a capture scope is noted with what only that moment knows: the
impl making it (whose layer gives the metadata key, ``kv_sharing_target_layer_name or
layer_name``, as stock's ``_graph_metadata_layer_name``; vLLM registers every attention layer, by
name, in the forward context's ``no_compile_layers``, and each layer has its own impl), the size,
and in a draft graph the step, recovered by identity: the proposer sets
``forward_context.attn_metadata`` to ``draft_attn_metadatas[step]`` before each step, and the
shape of that entry is checked (``_draft_step``).

When the graph's capture ends, each call owns the one entry (captured tuple, handle, event) it
appended to a ``GraphParams``, and the notes become tasks (``core.tasks``) in one pass
(:func:`own_tasks`): between two layers of a capture the overlay only appends a note.
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


def _draft_step(role: str, metadata_key: str, seen: tuple[Any, Any] | None = None) -> int:
    """The draft step whose metadata the task being captured reads, checked against what the
    proposer passes (``draft_attn_metadatas``, one dict per step).

    Both shapes the proposers of this line pass are understood: the generic proposer's (each
    step's dict maps every draft layer to one metadata object) and Step3.5 MTP's (one dict per
    KV-cache group, the group whose layer runs at that step, mapping its layers to the group's
    object). In both, the layer reads the dict the proposer made current for the step
    (``forward_context.attn_metadata``), which lists the layer's key, with one metadata object.
    Anything else (a step's dict holding several objects, the key absent) is a shape no proposer
    of this line produces: the graph is refused, and so left to stock, with the reason.

    ``seen``: (per-step list, current metadata) as the task's capture call saw them (default:
    the forward context's now).
    """
    if role == TARGET:
        return 0
    per_step, current = _draft_context() if seen is None else seen
    if not per_step:
        return 0  # single-step drafts (v2 draft prefill)
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


def _draft_context() -> tuple[Any, Any]:
    """What a draft step is recovered from: (``draft_attn_metadatas``, current metadata)."""
    forward_context = get_forward_context()
    return getattr(forward_context, "draft_attn_metadatas", None), forward_context.attn_metadata


def _bucket_key(layout: TaskLayout, args: tuple, kwargs: dict) -> int:
    index, name = layout.key_arg
    return layout.key_of(args[index] if len(args) > index else kwargs[name])


def layer_names(layers: Any) -> dict[int, str | None]:
    """``id(impl)`` -> the name of the one layer holding it (None if several hold it)."""
    names: dict[int, str | None] = {}
    for name, layer in layers.items():
        impl = getattr(layer, "impl", None)
        if impl is not None:
            key = id(impl)
            names[key] = None if key in names else name
    return names


def _unknown_layer(names: dict[int, str | None], impl: Any) -> str:
    where = "held by several layers" if id(impl) in names else "in no registered layer"
    return f"layer unknown at capture: the capturing impl is {where}"


def _appended(scope: shared.CaptureScope, num_tokens: int, calls: int) -> tuple[Any, int]:
    """(GraphParams, index of the first) of the ``calls`` task groups the capture appended
    under ``num_tokens``: one per call, in call order, all to one ``GraphParams``."""
    found = []
    for params, before in zip(scope.graph_params, scope.lengths_before, strict=True):
        if params is None:
            continue
        start = before.get(num_tokens, 0)
        lists = (params.handles, params.events, params.attn_params)
        grown = {len(entries.get(num_tokens, ())) - start for entries in lists}
        if grown != {0}:
            found.append((params, start, grown))
    if len(found) == 1 and found[0][2] == {calls}:
        return found[0][0], found[0][1]
    if len(found) == 1 and len(found[0][2]) == 1 and min(found[0][2]) > calls:
        raise CaptureRefused(
            f"{min(found[0][2]) - calls} captured task group(s) not registered by the overlay "
            "(an attention kind it does not own)"
        )
    made = sorted(n for _, _, grown in found for n in grown)
    raise CaptureRefused(
        f"{calls} attention call(s) of size {num_tokens} appended {made or 0} task group(s)"
        " (expected one each, in one GraphParams)"
    )


def own_tasks(scope: shared.CaptureScope) -> None:
    """Turn what the graph's capture appended into its tasks, in one pass after the capture.

    Each attention call was noted (kind, impl, size, draft context); each appended one task
    group, in call order: the n-th call of a size owns the n-th new group of that size.
    ``CaptureRefused`` if anything does not fit: the graph is then left to stock.
    """
    noted, scope.calls = scope.calls, []
    if not noted:
        return
    graph = scope.graph
    names = layer_names(scope.layers or {})
    by_size: dict[int, list[tuple]] = {}
    for call in noted:
        by_size.setdefault(call[2], []).append(call)
    shared_memo: dict[tuple, Any] = {}
    for num_tokens, calls in by_size.items():
        params, first = _appended(scope, num_tokens, len(calls))
        workspace = scope.workspace_getter(params, num_tokens)
        captured = params.attn_params[num_tokens]
        handles, events = params.handles[num_tokens], params.events[num_tokens]
        for index, (layout, impl, _, seen) in enumerate(calls, first):
            layer_name = names.get(id(impl))
            if layer_name is None:
                raise CaptureRefused(_unknown_layer(names, impl))
            metadata_key = impl.kv_sharing_target_layer_name or layer_name
            graph.add(
                build_task(
                    layout,
                    captured[index],
                    runtime=torch_npu,
                    attn_module=attention_v1,
                    role=graph.role,
                    layer_name=layer_name,
                    metadata_key=metadata_key,
                    step=0 if seen is None else _draft_step(graph.role, metadata_key, seen),
                    handle=handles[index],
                    event=events[index],
                    graph_workspace=workspace,
                    shared=shared_memo,
                )
            )


def _task_aspect(kind: str) -> Callable:
    """The wrapper of one backend capture method: the call is noted, then stock runs."""

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        scope = shared.CURRENT_SCOPE.get()
        if scope is None or scope.failure is not None:
            return wrapped(*args, **kwargs)
        try:
            assert shared.ACTIVE is not None
            layout = shared.ACTIVE.line.layouts[kind]
            seen = None
            if scope.layers is None or scope.graph.role != TARGET:
                if scope.layers is None:
                    scope.layers = get_forward_context().no_compile_layers
                if scope.graph.role != TARGET:
                    seen = _draft_context()
            scope.calls.append((layout, instance, _bucket_key(layout, args, kwargs), seen))
        except Exception as exc:
            scope.fail(f"{kind}: {exc!r}")
        return wrapped(*args, **kwargs)

    wrapper.__name__ = f"{kind}_task"
    return wrapper


fia_task = _task_aspect(FIA)
fia_v2_task = _task_aspect(FIA_V2)
pa_task = _task_aspect(PA)
