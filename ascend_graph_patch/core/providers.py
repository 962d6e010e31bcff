"""Per-task providers: which metadata fields feed which launch arguments, per attention kind.

They mirror what the stock update rebinds, so the overlay launches exactly what stock would:
- FIA: query ends and KV lengths; the block table too, except on sliding-window target layers
  (rebinding it there corrupts output upstream); drafts always rebind it and drop to sparse mode 0
  when the step is not causal. The workspace is the graph's captured one, read once per pass.
- FIA v2 (sinks): query ends and KV lengths; the captured workspace.
- PA: context lengths, and a workspace recomputed from them, shared within one pass by tasks with
  the same signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FIA = "fia"
FIA_V2 = "fia_v2"
PA = "pa"
KINDS = (FIA, FIA_V2, PA)


def _graph_workspace(getter: Callable[[], Any], cache: dict) -> Any:
    """The graph's captured workspace, read once per pass (all tasks of a graph share it)."""
    key = id(getter)
    try:
        return cache[key]
    except KeyError:
        workspace = cache[key] = getter()
        return workspace


@dataclass(slots=True)
class FIAProvider:
    workspace: Callable[[], Any]
    rebind_block_table: bool = True
    draft: bool = False
    sparse_mode: int = 3  # the captured one; drafts drop to 0 on non-causal steps
    kind: str = FIA

    def bind(self, metadata: Any, launch: dict[str, Any], cache: dict) -> None:
        launch["actual_seq_lengths"] = metadata.actual_seq_lengths_q
        launch["actual_seq_lengths_kv"] = metadata.seq_lens_list
        launch["workspace"] = _graph_workspace(self.workspace, cache)
        if self.draft or self.rebind_block_table:
            launch["block_table"] = metadata.block_tables
        if self.draft:
            launch["sparse_mode"] = self.sparse_mode if metadata.causal else 0


@dataclass(slots=True)
class FIAV2Provider:
    workspace: Callable[[], Any]
    kind: str = FIA_V2

    def bind(self, metadata: Any, launch: dict[str, Any], cache: dict) -> None:
        launch["actual_seq_qlen"] = metadata.actual_seq_lengths_q
        launch["actual_seq_kvlen"] = metadata.seq_lens_list
        launch["workspace"] = _graph_workspace(self.workspace, cache)


_SHAPE_KEYS: dict[tuple, int] = {}


def shape_key(signature: tuple) -> int:
    """A small int standing for a static shape signature: cheap to hash once per task per step."""
    return _SHAPE_KEYS.setdefault(signature, len(_SHAPE_KEYS))


@dataclass(slots=True)
class PAProvider:
    workspace_for: Callable[..., Any]  # torch_npu._npu_paged_attention_get_workspace
    shape_signature: int = 0  # shape_key() of what else the workspace size depends on
    kind: str = PA

    @staticmethod
    def signature_of(template: dict[str, Any]) -> int:
        query, key_cache = template["query"], template["key_cache"]
        return shape_key(
            (
                tuple(query.shape),
                query.dtype,
                tuple(key_cache.shape),
                template["num_kv_heads"],
                template["num_heads"],
            )
        )

    def bind(self, metadata: Any, launch: dict[str, Any], cache: dict) -> None:
        context_lens = metadata.seq_lens
        signature = (id(context_lens), self.shape_signature)
        workspace = cache.get(signature)
        if workspace is None:
            args = {k: v for k, v in launch.items() if k != "workspace"}
            args["context_lens"] = context_lens
            workspace = self.workspace_for(**args)
            cache[signature] = workspace
        launch["context_lens"] = context_lens
        launch["workspace"] = workspace
