"""The task factory: from the entry the stock capture appended to ``GraphParams`` to a task.

The attention aspect sees one task group being captured: its kind, the captured tuple, its handle
and event, the layer and the draft step. With the line's layout for that kind this builds the
:class:`UpdateTask`: the static relaunch template, the op to relaunch, and the provider that
rebinds what changes per step. Anything that does not fit the layout refuses the whole graph.
"""

from __future__ import annotations

from collections import namedtuple
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
from ascend_graph_patch.lines.base import CaptureContext, TaskLayout


def resolve_path(root: Any, path: str) -> Any:
    """``root.a.b`` for ``path`` ``"a.b"`` (an op handle such as ``"npu_fia.out"``)."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


#: field names -> the named tuple type of a captured tuple with those fields
_RECORDS: dict[tuple[str, ...], Any] = {}


def record_type(fields: tuple[str, ...]) -> Any:
    """The named tuple type reading a captured tuple by the layout's field names."""
    record = _RECORDS.get(fields)
    if record is None:
        record = _RECORDS[fields] = namedtuple("Captured", fields)  # noqa: PYI024
    return record


def fields_of(layout: TaskLayout, captured: Any) -> Any:
    """The captured tuple, its fields named (``fields.query``); a tuple of another shape
    refuses the graph."""
    if not isinstance(captured, tuple) or len(captured) != len(layout.fields):
        size = len(captured) if isinstance(captured, tuple) else type(captured).__name__
        raise CaptureRefused(
            f"tuple arity: {layout.kind} tuple has {size} fields, expected {len(layout.fields)}"
        )
    return tuple.__new__(record_type(layout.fields), captured)  # its ``_make``, without a frame


def make_provider(
    layout: TaskLayout,
    fields: Any,
    template: dict[str, Any],
    role: str,
    runtime: Any,
    graph_workspace: Callable[[], Any],
    shared: dict[tuple, Any] | None = None,
    context: CaptureContext | None = None,
) -> Provider:
    """The provider for one task: what it rebinds follows the layout and the graph role (or
    the layout's own provider factory, given the capture ``context``).

    A graph-workspace provider holds nothing of its task: the tasks of one graph configured
    alike can share one (``shared``, a memo for one graph's tasks built together).
    """
    if layout.provider is not None:
        if context is None:
            raise CaptureRefused(f"{layout.kind}: its provider needs the capture context")
        return layout.provider(layout, fields, template, context)
    table, rule = layout.block_table, layout.rebind_table
    table_rebound = table is not None and rule is not None and rule(fields, role)
    if layout.workspace == "per_lengths":
        keys, attributes = _rebinds(layout, table_rebound)
        if len(keys) != 1 or layout.workspace_getter is None:
            raise CaptureRefused(f"{layout.kind}: a recomputed workspace needs one lengths bind")
        return LengthsWorkspaceProvider(
            kind=layout.kind,
            lengths_key=keys[0],
            attribute=attributes[0],
            workspace_for=resolve_path(runtime, layout.workspace_getter),
            template=template,
            signature=pa_signature(template),
        )
    causal = layout.draft_causal if role in (DRAFT, DRAFT_PREFILL) else None
    sparse_mode = template.get("sparse_mode", 3)
    memo = (layout.kind, table_rebound, id(graph_workspace), causal, sparse_mode)
    provider = None if shared is None else shared.get(memo)
    if provider is None:
        keys, attributes = _rebinds(layout, table_rebound)
        provider = GraphWorkspaceProvider(
            kind=layout.kind,
            keys=keys,
            attributes=attributes,
            workspace=graph_workspace,
            causal=causal,
            sparse_mode=sparse_mode,
        )
        if shared is not None:
            shared[memo] = provider
    return provider


def _rebinds(layout: TaskLayout, table_rebound: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(relaunch keywords, metadata attributes) a task of ``layout`` rebinds per step."""
    binds = (*layout.binds, layout.block_table) if table_rebound else layout.binds
    return tuple(key for key, _ in binds), tuple(attribute for _, attribute in binds)


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
    shared: dict[tuple, Any] | None = None,
    num_tokens: int = 0,
    impl: Any = None,
) -> UpdateTask:
    """One owned task from one captured task group (``CaptureRefused`` if it does not fit).

    ``shared``: a memo for the tasks of one graph built together (their op, and the providers
    they can share), so building a graph's tasks costs little more than its tuples' fields.
    ``num_tokens`` (the graph's size) and ``impl`` (the capturing attention impl) are what a
    layout's own provider factory may read.
    """
    fields = fields_of(layout, captured)
    template = layout.template(fields, attn_module)
    op = None if shared is None else shared.get((layout.op,))
    if op is None:
        op = resolve_path(runtime, layout.op)
        if shared is not None:
            shared[(layout.op,)] = op
    return UpdateTask(  # positional: one task per captured layer, built in a loop
        layout.kind,
        metadata_key,
        step,
        layer_name,
        handle,
        event,
        op,
        template,
        make_provider(
            layout,
            fields,
            template,
            role,
            runtime,
            graph_workspace,
            shared,
            None
            if layout.provider is None
            else CaptureContext(role, num_tokens, impl, graph_workspace),
        ),
    )
