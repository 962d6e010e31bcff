"""The task factory: from the entry the stock capture appended to ``GraphParams`` to a task.

The attention aspect sees one task group being captured: its kind, the captured tuple, its handle
and event, the layer and the draft step. With the line's layout for that kind this builds the
:class:`UpdateTask`: the static relaunch template, the op to relaunch, and the provider that
rebinds what changes per step. Anything that does not fit the layout refuses the whole graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ascend_graph_patch.core.graph import CaptureRefused, UpdateTask
from ascend_graph_patch.core.kinds import DRAFT, DRAFT_PREFILL
from ascend_graph_patch.core.providers import (
    GraphWorkspaceProvider,
    LengthsWorkspaceProvider,
    Provider,
    pa_signature,
)
from ascend_graph_patch.lines.base import TaskLayout


def resolve_path(root: Any, path: str) -> Any:
    """``root.a.b`` for ``path`` ``"a.b"`` (an op handle such as ``"npu_fia.out"``)."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def fields_of(layout: TaskLayout, captured: Any) -> dict[str, Any]:
    """The captured tuple by field name; a tuple of another shape refuses the graph."""
    if not isinstance(captured, tuple) or len(captured) != len(layout.fields):
        size = len(captured) if isinstance(captured, tuple) else type(captured).__name__
        raise CaptureRefused(
            f"tuple arity: {layout.kind} tuple has {size} fields, expected {len(layout.fields)}"
        )
    return dict(zip(layout.fields, captured, strict=True))


def make_provider(
    layout: TaskLayout,
    fields: dict[str, Any],
    template: dict[str, Any],
    role: str,
    runtime: Any,
    graph_workspace: Callable[[], Any],
) -> Provider:
    """The provider for one task: what it rebinds follows the layout and the graph role."""
    binds = list(layout.binds)
    table, rule = layout.block_table, layout.rebind_table
    if table is not None and rule is not None and rule(fields, role):
        binds.append(table)
    keys = tuple(key for key, _ in binds)
    attributes = tuple(attribute for _, attribute in binds)
    if layout.workspace == "per_lengths":
        if len(binds) != 1 or layout.workspace_getter is None:
            raise CaptureRefused(f"{layout.kind}: a recomputed workspace needs one lengths bind")
        return LengthsWorkspaceProvider(
            kind=layout.kind,
            lengths_key=keys[0],
            attribute=attributes[0],
            workspace_for=resolve_path(runtime, layout.workspace_getter),
            template=template,
            signature=pa_signature(template),
        )
    draft = role in (DRAFT, DRAFT_PREFILL)
    return GraphWorkspaceProvider(
        kind=layout.kind,
        keys=keys,
        attributes=attributes,
        workspace=graph_workspace,
        causal=layout.draft_causal if draft else None,
        sparse_mode=template.get("sparse_mode", 3),
    )


def build_task(
    layout: TaskLayout,
    captured: Any,
    *,
    runtime: Any,
    attn_module: Any,
    role: str,
    layer_name: str | None,
    metadata_key: str,
    step: int,
    handle: Any,
    event: Any,
    graph_workspace: Callable[[], Any],
) -> UpdateTask:
    """One owned task from one captured task group (``CaptureRefused`` if it does not fit)."""
    fields = fields_of(layout, captured)
    template = layout.template(fields, attn_module)
    return UpdateTask(
        kind=layout.kind,
        metadata_key=metadata_key,
        step=step,
        layer_name=layer_name,
        handle=handle,
        event=event,
        op=resolve_path(runtime, layout.op),
        template=template,
        provider=make_provider(layout, fields, template, role, runtime, graph_workspace),
    )
