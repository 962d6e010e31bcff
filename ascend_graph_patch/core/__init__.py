"""The graph model: graphs own their update tasks; no vllm-ascend imports here."""

from ascend_graph_patch.core.graph import OwnedGraph, ResolutionError, ResolvedTask, UpdateTask
from ascend_graph_patch.core.registry import GraphRegistry

__all__ = ["GraphRegistry", "OwnedGraph", "ResolutionError", "ResolvedTask", "UpdateTask"]
