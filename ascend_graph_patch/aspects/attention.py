"""Attention aspects: note each task group the stock capture creates; own them as the graph closes.

The stock capture code runs unchanged. Each call of a capture method (the backend's
``full_graph_fia`` / ``_fia_v2`` / ``_pa``, MLA's ``_forward_decode``) inside a capture scope is
noted with what only that moment knows: the impl making it (whose layer gives the metadata key,
by the line's rule; vLLM registers every attention layer, by name, in the forward context's
``no_compile_layers``, and each layer has its own impl), the size, and in a draft graph the step's
metadata the proposer made current, from which the line's rule recovers the step.

When the graph's capture ends, each call owns the one entry (captured tuple, handle, event) it
appended to a ``GraphParams``, and the notes become tasks (``core.tasks``) in one pass
(:func:`own_tasks`): between two layers of a capture the overlay only appends a note. What a
release captures and how its proposers pass draft metadata is the line's (``lines/``); nothing
here imports vllm-ascend.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch_npu
from vllm.forward_context import get_forward_context

from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.core.graph import CaptureRefused
from ascend_graph_patch.core.kinds import FIA, FIA_V2, MLA, PA, TARGET
from ascend_graph_patch.core.tasks import build_task
from ascend_graph_patch.lines.base import Line, TaskLayout


def _draft_step(role: str, metadata_key: str, seen: tuple[Any, Any] | None = None) -> int:
    """The draft step the task being captured reads (0 for a target graph), by the line's rule.

    ``seen``: (per-step list, current metadata) as the task's capture call saw them (default:
    the forward context's now).
    """
    if role == TARGET:
        return 0
    assert shared.ACTIVE is not None
    per_step, current = _draft_context() if seen is None else seen
    return shared.ACTIVE.line.draft_step(metadata_key, per_step, current)


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


def _module_of(line: Line, layout: TaskLayout) -> Any:
    """The module whose constants a layout's template reads: its capture seam's."""
    return sys.modules[line.seams[layout.capture_seam].module]


def left_to_stock(scope: shared.CaptureScope) -> str | None:
    """Why the graph is stock's, when one of its layers holds an impl the line does not own
    (``Line.refusal``: left to stock, capturing nothing, or unknown to the line); None
    otherwise. Read once per graph, from the layers the forward context registers."""
    assert shared.ACTIVE is not None
    line = shared.ACTIVE.line
    layers = scope.layers
    if layers is None:
        try:
            layers = get_forward_context().no_compile_layers
        except Exception:  # no forward context (a harness): nothing registered to inspect
            return None
    judged: dict[type, str | None] = {}
    for layer in layers.values():
        impl = getattr(layer, "impl", None)
        if impl is None:
            continue
        cls = type(impl)
        if cls not in judged:
            judged[cls] = line.refusal(impl)
        if judged[cls] is not None:
            return judged[cls]
    return None


def own_tasks(scope: shared.CaptureScope) -> None:
    """Turn what the graph's capture appended into its tasks, in one pass after the capture.

    Each attention call was noted (kind, impl, size, draft context); each appended one task
    group, in call order: the n-th call of a size owns the n-th new group of that size.
    ``CaptureRefused`` if anything does not fit: the graph is then left to stock.
    """
    noted, scope.calls = scope.calls, []
    if not noted:
        return
    assert shared.ACTIVE is not None
    line = shared.ACTIVE.line
    graph = scope.graph
    names = layer_names(scope.layers or {})
    modules: dict[str, Any] = {}
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
            metadata_key = line.metadata_key(impl, layer_name)
            module = modules.get(layout.kind)
            if module is None:
                module = modules[layout.kind] = _module_of(line, layout)
            graph.add(
                build_task(
                    layout,
                    captured[index],
                    runtime=torch_npu,
                    attn_module=module,
                    role=graph.role,
                    layer_name=layer_name,
                    metadata_key=metadata_key,
                    step=0 if seen is None else _draft_step(graph.role, metadata_key, seen),
                    handle=handles[index],
                    event=events[index],
                    graph_workspace=workspace,
                    shared=shared_memo,
                    num_tokens=num_tokens,
                    impl=impl,
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
mla_task = _task_aspect(MLA)
