"""The overlay keeps nothing alive: no captured tensor, no graph, once the runner lets go."""

from __future__ import annotations

import gc
import random
import weakref

from ascend_graph_patch import activation
from ascend_graph_patch.core.registry import REGISTRY
from torch_npu_sim.harness.scenarios import SCENARIOS
from torch_npu_sim.harness.target import SimEngine


def test_owned_graphs_and_captured_tensors_die_with_the_engine() -> None:
    activation.enable("on")
    try:
        engine = SimEngine(SCENARIOS["dense_gqa"])
        rng = random.Random(3)
        for _ in range(5):
            engine.run_graph(engine.random_batch(rng))
        graphs = REGISTRY.graphs()
        assert graphs and all(g.tasks for g in graphs)
        task = graphs[0].tasks[0]
        captured = [weakref.ref(task.template["query"]), weakref.ref(task.template["out"][0])]
        graph_refs = [weakref.ref(g) for g in graphs]
        del graphs, task
        engine.close()
        del engine
        gc.collect()
        assert REGISTRY.graphs() == []
        assert all(ref() is None for ref in graph_refs)
        assert all(ref() is None for ref in captured)  # no strong reference of ours remains
    finally:
        activation.disable()
