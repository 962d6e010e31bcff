"""Per-task providers: the launch arguments that change per step, from one step's metadata.

What each one rebinds comes from the line's layout (relaunch keyword <- metadata attribute), so the
overlay relaunches exactly what stock relaunches. The two shapes differ only in the workspace:

- :class:`GraphWorkspaceProvider` (FIA, FIA v2): the graph's captured workspace (a *steady*
  value: read from the graph once per step, not from the metadata, and written into the tasks'
  templates only when it changes, see ``OwnedGraph``); FIA also rebinds the block table where
  stock does, and drops a draft step that is not causal to sparse mode 0, as stock does;
- :class:`LengthsWorkspaceProvider` (PA): a workspace recomputed from the fresh context lengths.

A provider computes its fresh values for one metadata object (``values``). The layers of a KV-cache
group share one metadata object, and tasks with the same provider configuration (``group``)
share the values too: the graph computes them once per (group, metadata object) and each task's
relaunch adds them to its static arguments (``OwnedGraph.values_target``). For PA that shares one
workspace between tasks reading the same lengths with the same ``pa_signature``; why that key is
enough: ``docs/design.md``, "PA workspace sharing". Reading a metadata object that lacks what stock
reads is a :class:`MetadataFault`; a failing workspace getter a :class:`RuntimeFault`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ascend_graph_patch.core.graph import MetadataFault, RuntimeFault

#: What reading a metadata object that is None, of another type or lacking a field raises.
_UNREADABLE = (AttributeError, TypeError)

#: Provider configurations, interned to small ints: tasks of one group share their values.
_GROUPS: dict[tuple, int] = {}


def group_of(config: tuple) -> int:
    return _GROUPS.setdefault(config, len(_GROUPS))


def reader(attributes: tuple[str, ...]) -> Callable[[Any], tuple]:
    """One C call reading every attribute of a metadata object, always as a tuple."""
    if len(attributes) == 1:
        single = attrgetter(attributes[0])
        return lambda metadata: (single(metadata),)
    return attrgetter(*attributes)


@dataclass(slots=True)
class GraphWorkspaceProvider:
    """FIA / FIA v2: fresh lengths (and block table), the graph's captured workspace."""

    kind: str
    keys: tuple[str, ...]  # relaunch keywords, in the order ``read`` returns their values
    attributes: tuple[str, ...]  # the metadata attributes ``read`` reads
    workspace: Callable[[], Any]  # the graph's captured workspace (one getter per graph)
    causal: str | None = None  # drafts: the metadata attribute saying whether a step is causal
    sparse_mode: int = 3  # the captured sparse mode (a non-causal draft step uses 0)
    read: Callable[[Any], tuple] = field(init=False)
    group: int = field(init=False)
    value_keys: tuple[str, ...] = field(init=False)
    steady: tuple[str, Callable[[], Any]] = field(init=False)

    def __post_init__(self) -> None:
        attributes = self.attributes + ((self.causal,) if self.causal is not None else ())
        self.read = reader(attributes)
        self.value_keys = (*self.keys, "workspace") + (
            ("sparse_mode",) if self.causal is not None else ()
        )
        self.steady = ("workspace", self.workspace)
        self.group = group_of(
            (
                self.kind,
                self.keys,
                attributes,
                id(self.workspace),
                self.sparse_mode if self.causal is not None else None,
            )
        )

    def values(self, metadata: Any) -> dict[str, Any]:
        try:
            read = self.read(metadata)
        except _UNREADABLE as exc:
            raise MetadataFault(f"metadata unreadable: {exc!r}", exc) from exc
        values = dict(zip(self.keys, read))  # noqa: B905 - a causal flag read last is left out
        if self.causal is not None:
            values["sparse_mode"] = self.sparse_mode if read[-1] else 0
        return values


#: Static shape signatures, interned to small ints.
_SHAPE_KEYS: dict[tuple, int] = {}


def shape_key(signature: tuple) -> int:
    return _SHAPE_KEYS.setdefault(signature, len(_SHAPE_KEYS))


#: The PA getter's device tensors: their shapes and dtypes may size a workspace, their values
#: cannot (the host-side getter does not read device memory).
PA_SHAPED = ("query", "key_cache", "value_cache", "block_table", "out")


def pa_signature(template: dict[str, Any], shaped: tuple[str, ...] = PA_SHAPED) -> int:
    """Everything besides the lengths that a PA workspace can depend on.

    The real getter receives query, caches, head counts, scale, block table, context lengths and
    the output: the lengths are host data (read from the same metadata object, they are the same
    object), the tensors count by shape and dtype, the head counts by value; the scale does not
    size memory. Tasks reading one metadata object with equal signatures share one workspace.
    """
    parts = tuple((tuple(template[n].shape), template[n].dtype) for n in shaped)
    return shape_key((*parts, template["num_kv_heads"], template["num_heads"]))


@dataclass(slots=True)
class LengthsWorkspaceProvider:
    """PA: fresh context lengths and a workspace recomputed from them."""

    kind: str
    lengths_key: str  # the relaunch keyword of the context lengths
    attribute: str  # the metadata attribute holding them
    workspace_for: Callable[..., Any]  # torch_npu's workspace getter for this op
    template: dict[str, Any]  # the getter's other arguments: the task's static ones
    signature: int = 0  # pa_signature() of the task's static arguments
    lengths: Callable[[Any], Any] = field(init=False)
    static: dict[str, Any] = field(init=False)  # the getter's other arguments, set once
    group: int = field(init=False)
    value_keys: tuple[str, ...] = field(init=False)
    _getter_kwargs: dict[str, Any] = field(init=False)  # ``static`` + the lengths last passed
    steady = None  # its workspace follows the lengths: computed per step, with them

    def __post_init__(self) -> None:
        self.lengths = attrgetter(self.attribute)
        self.value_keys = (self.lengths_key, "workspace")
        self.static = {k: v for k, v in self.template.items() if k not in self.value_keys}
        self.group = group_of((self.kind, self.lengths_key, self.attribute, self.signature))
        self._getter_kwargs = dict(self.static)

    def values(self, metadata: Any) -> dict[str, Any]:
        try:
            lengths = self.lengths(metadata)
        except _UNREADABLE as exc:
            raise MetadataFault(f"metadata unreadable: {exc!r}", exc) from exc
        kwargs = self._getter_kwargs
        kwargs[self.lengths_key] = lengths
        try:  # stock calls the same getter with the same arguments
            workspace = self.workspace_for(**kwargs)
        except Exception as exc:
            raise RuntimeFault(f"workspace getter failed: {exc!r}", exc) from exc
        return {self.lengths_key: lengths, "workspace": workspace}


Provider = GraphWorkspaceProvider | LengthsWorkspaceProvider
