"""Per-task providers: write, from one step's metadata, the launch arguments that change.

What each one rebinds comes from the line's layout (relaunch keyword <- metadata attribute), so the
overlay relaunches exactly what stock relaunches. The two shapes differ only in the workspace:

- :class:`GraphWorkspaceProvider` (FIA, FIA v2): the graph's captured workspace, read once per
  pass; FIA also rebinds the block table where stock does, and drops a draft step that is not
  causal to sparse mode 0, as stock does;
- :class:`LengthsWorkspaceProvider` (PA): a workspace recomputed from the fresh context lengths,
  shared within one pass by tasks whose lengths object and static shapes are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ascend_graph_patch.core.graph import MetadataFault, RuntimeFault

#: What reading a metadata object that is None, of another type or lacking a field raises.
_UNREADABLE = (AttributeError, TypeError)


def reader(attributes: tuple[str, ...]) -> Callable[[Any], tuple]:
    """One C call reading every attribute of a metadata object, always as a tuple."""
    if len(attributes) == 1:
        single = attrgetter(attributes[0])
        return lambda metadata: (single(metadata),)
    return attrgetter(*attributes)


_MISSING = object()


@dataclass(slots=True)
class GraphWorkspaceProvider:
    """FIA / FIA v2: fresh lengths (and block table), the graph's captured workspace."""

    kind: str
    keys: tuple[str, ...]  # relaunch keywords, in the order ``read`` returns their values
    read: Callable[[Any], tuple]
    workspace: Callable[[], Any]  # the graph's captured workspace (one getter per graph)
    causal: Callable[[Any], bool] | None = None  # drafts: is this step causal?
    sparse_mode: int = 3  # the captured sparse mode (a non-causal draft step uses 0)

    def bind(self, metadata: Any, launch: dict[str, Any], cache: dict) -> None:
        try:
            launch.update(zip(self.keys, self.read(metadata), strict=True))
            causal = True if self.causal is None else self.causal(metadata)
        except _UNREADABLE as exc:
            raise MetadataFault(f"metadata unreadable: {exc!r}", exc) from exc
        getter = self.workspace
        workspace = cache.get(getter, _MISSING)
        if workspace is _MISSING:
            workspace = cache[getter] = getter()
        launch["workspace"] = workspace
        if self.causal is not None:
            launch["sparse_mode"] = self.sparse_mode if causal else 0


#: Static shape signatures, interned to small ints: cheap to hash once per task per step.
_SHAPE_KEYS: dict[tuple, int] = {}


def shape_key(signature: tuple) -> int:
    return _SHAPE_KEYS.setdefault(signature, len(_SHAPE_KEYS))


def pa_signature(template: dict[str, Any]) -> int:
    """Everything besides the lengths that a PA workspace can depend on.

    The real getter receives query, caches, head counts, scale, block table and context lengths;
    the values of the caches, query and table do not size a workspace, their shapes and dtypes
    may. Two tasks of one pass with the same lengths object and this signature share one.
    """
    query, key_cache, table = template["query"], template["key_cache"], template["block_table"]
    return shape_key(
        (
            tuple(query.shape),
            query.dtype,
            tuple(key_cache.shape),
            key_cache.dtype,
            tuple(table.shape),
            table.dtype,
            template["num_kv_heads"],
            template["num_heads"],
        )
    )


@dataclass(slots=True)
class LengthsWorkspaceProvider:
    """PA: fresh context lengths and a workspace recomputed from them (shared within a pass)."""

    kind: str
    lengths_key: str  # the relaunch keyword of the context lengths
    lengths: Callable[[Any], Any]  # metadata -> the context lengths
    workspace_for: Callable[..., Any]  # torch_npu's workspace getter for this op
    signature: int = 0  # pa_signature() of the task's static arguments

    def bind(self, metadata: Any, launch: dict[str, Any], cache: dict) -> None:
        try:
            lengths = self.lengths(metadata)
        except _UNREADABLE as exc:
            raise MetadataFault(f"metadata unreadable: {exc!r}", exc) from exc
        key = (id(lengths), self.signature)
        workspace = cache.get(key)
        if workspace is None:
            args = {k: v for k, v in launch.items() if k != "workspace"}
            args[self.lengths_key] = lengths
            try:
                workspace = cache[key] = self.workspace_for(**args)
            except Exception as exc:  # stock calls the same getter with the same arguments
                raise RuntimeFault(f"workspace getter failed: {exc!r}", exc) from exc
        launch[self.lengths_key] = lengths
        launch["workspace"] = workspace


Provider = GraphWorkspaceProvider | LengthsWorkspaceProvider
