"""Attention aspects: name the layer being captured, and register each task group stock creates.

The stock capture code runs unchanged. After `full_graph_fia` / `full_graph_fia_v2` /
`full_graph_pa` returns, the one entry it appended to a `GraphParams` registry (events, handles,
captured tuple) becomes an `UpdateTask` of the graph being captured, keyed by its layer's metadata
key (`kv_sharing_target_layer_name or layer_name`, as stock's `_graph_metadata_layer_name`) and, in
a draft graph, by the draft step, recovered by identity: `_run_merged_draft` swaps
`forward_context.attn_metadata` to `draft_attn_metadatas[step]` before each step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch_npu
import vllm_ascend.ops  # noqa: F401  (first: attention_v1 first is a circular import)
from vllm.forward_context import get_forward_context
from vllm_ascend.attention import attention_v1

from ascend_graph_patch.aspects import context
from ascend_graph_patch.core.graph import TARGET, ResolutionError, UpdateTask
from ascend_graph_patch.core.providers import (
    FIA,
    FIA_V2,
    PA,
    FIAProvider,
    FIAV2Provider,
    PAProvider,
)


def layer_forward(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if context.CURRENT_SCOPE.get() is None:
        return wrapped(*args, **kwargs)
    token = None
    try:
        layer = args[0] if args else kwargs.get("layer")
        name = getattr(layer, "layer_name", None)
        key = getattr(instance, "kv_sharing_target_layer_name", None) or name
        token = context.CURRENT_LAYER.set((name, key))
    except Exception:
        token = None  # the task registration will then fail cleanly: no layer known
    try:
        return wrapped(*args, **kwargs)
    finally:
        if token is not None:
            context.CURRENT_LAYER.reset(token)


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs[name]


def _fia_bucket_key(args: tuple, kwargs: dict) -> int:
    return _arg(args, kwargs, 3, "attn_metadata").actual_seq_lengths_q[-1]


def _pa_bucket_key(args: tuple, kwargs: dict) -> int:
    return _arg(args, kwargs, 0, "query").shape[0]


def _draft_step(role: str) -> int:
    if role == TARGET:
        return 0
    forward_context = get_forward_context()
    per_step = getattr(forward_context, "draft_attn_metadatas", None)
    if not per_step:
        return 0  # single-step drafts (v2 draft prefill)
    current = forward_context.attn_metadata
    steps = [i for i, metadata in enumerate(per_step) if metadata is current]
    if len(steps) != 1:
        raise ResolutionError(f"draft step not recoverable ({len(steps)} matches)")
    return steps[0]


def _workspace_getter(scope: context.CaptureScope, bucket: Any, num_tokens: int) -> Callable:
    getters = scope.extra.setdefault("workspace_getters", {})
    key = (id(bucket), num_tokens)
    if key not in getters:
        workspaces = bucket.workspaces
        getters[key] = lambda: workspaces.get(num_tokens)
    return getters[key]


def _register(scope: context.CaptureScope, kind: str, num_tokens: int, before: list[int]) -> None:
    bucket = None
    for candidate, n in zip(scope.buckets, before, strict=True):
        if candidate is None:
            continue
        size = len(candidate.handles.get(num_tokens, ()))
        if size == n:
            continue
        if bucket is not None or size != n + 1:
            raise ResolutionError(f"{kind}: expected one new task group")
        bucket = candidate
    if bucket is None:
        return  # nothing captured (e.g. PA outside a capture)
    captured = bucket.attn_params[num_tokens][-1]
    active = context.ACTIVE
    assert active is not None
    arity = active.line.tuple_arity[kind]
    if not isinstance(captured, tuple) or len(captured) != arity:
        size = len(captured) if isinstance(captured, tuple) else type(captured).__name__
        raise ResolutionError(f"tuple arity: {kind} tuple has {size} fields, expected {arity}")
    layer = context.CURRENT_LAYER.get()
    if layer is None or layer[1] is None:
        raise ResolutionError(f"{kind}: layer unknown at capture")
    layer_name, metadata_key = layer
    role = scope.graph.role
    fields = active.line.fields(kind, captured)
    template = active.line.templates[kind](fields, attention_v1)
    if kind == FIA:
        op = torch_npu.npu_fused_infer_attention_score.out
        provider: Any = FIAProvider(
            workspace=_workspace_getter(scope, bucket, num_tokens),
            # stock keeps the captured table on sliding-window layers (rebinding corrupts output)
            rebind_block_table=fields["sliding_window"] is None,
            draft=role != TARGET,
            sparse_mode=template["sparse_mode"],
        )
    elif kind == FIA_V2:
        op = torch_npu.npu_fused_infer_attention_score_v2.out
        provider = FIAV2Provider(workspace=_workspace_getter(scope, bucket, num_tokens))
    else:
        op = torch_npu._npu_paged_attention
        provider = PAProvider(
            workspace_for=torch_npu._npu_paged_attention_get_workspace,
            shape_signature=PAProvider.signature_of(template),
        )
    scope.graph.add(
        UpdateTask(
            kind=kind,
            metadata_key=metadata_key,
            step=_draft_step(role),
            layer_name=layer_name,
            handle=bucket.handles[num_tokens][-1],
            event=bucket.events[num_tokens][-1],
            op=op,
            template=template,
            provider=provider,
        )
    )


def _task_aspect(kind: str, bucket_key: Callable[[tuple, dict], int]) -> Callable:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        scope = context.CURRENT_SCOPE.get()
        if scope is None or scope.failure is not None:
            return wrapped(*args, **kwargs)
        try:
            num_tokens = bucket_key(args, kwargs)
            before = [
                -1 if b is None else len(b.handles.get(num_tokens, ())) for b in scope.buckets
            ]
        except Exception as exc:
            scope.fail(f"{kind}: {exc!r}")
            return wrapped(*args, **kwargs)
        result = wrapped(*args, **kwargs)
        try:
            _register(scope, kind, num_tokens, before)
        except Exception as exc:
            scope.fail(str(exc) if isinstance(exc, ResolutionError) else f"{kind}: {exc!r}")
        return result

    wrapper.__name__ = f"{kind}_task"
    return wrapper


fia_task = _task_aspect(FIA, _fia_bucket_key)
fia_v2_task = _task_aspect(FIA_V2, _fia_bucket_key)
pa_task = _task_aspect(PA, _pa_bucket_key)
