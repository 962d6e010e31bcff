"""The overlay keeps nothing alive: no captured tensor, no graph, once the runner lets go."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from ascend_graph_patch import activation
from ascend_graph_patch.core.registry import REGISTRY
from torch_npu_sim.harness import scenarios
from torch_npu_sim.workload import run_arm


def test_owned_graphs_and_captured_tensors_die_with_the_engine() -> None:
    refs: list[weakref.ref] = []

    def watch(workload: Any) -> None:  # before close: what the overlay holds of the engine
        graphs = REGISTRY.graphs()
        assert graphs and all(g.tasks for g in graphs)
        task = graphs[0].tasks[0]
        refs.extend(weakref.ref(g) for g in graphs)
        refs.extend([weakref.ref(task.template["query"]), weakref.ref(task.template["out"][0])])

    activation.enable("on")
    try:
        arm = run_arm(lambda: scenarios.build("dense_gqa"), 5, 3, eager=False, after_steps=watch)
        assert arm.ok and arm.steps == 5, arm.error
        gc.collect()  # run_arm has closed the engine and let go of it
        assert REGISTRY.graphs() == []
        assert len(refs) > 2 and all(ref() is None for ref in refs)  # nothing of ours remains
    finally:
        activation.disable()
