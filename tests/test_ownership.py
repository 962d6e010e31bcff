"""Ownership is exact: a rebuilt engine's graphs are owned and updated, never an old one's.

vllm-ascend's proposer holds a reference cycle to its graph wrapper, so a dropped drafter's graphs
live until the cyclic garbage collector runs; RL and evaluation loops rebuild engines in one
process. The update seam names only (role, batch descriptor): both engines' graphs answer to it.
Each test keeps the first engine's graphs alive (as the cycle would, or the collector has not run
yet) while a second engine with the same shapes runs.
"""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest

from ascend_graph_patch import activation, state
from ascend_graph_patch.core.registry import REGISTRY

STEPS = 10
TOL = 1e-4


def target_steps(engine: Any, steps: int = STEPS) -> list[float]:
    rng = random.Random(3)
    errors = []
    for _ in range(steps):
        batch = engine.random_batch(rng)
        eager = engine.run_eager(batch)
        errors.append(float((engine.run_graph(batch) - eager).abs().max()))
    return errors


@pytest.fixture
def overlay_on() -> Any:
    activation.enable("on")
    yield
    activation.disable()


@pytest.mark.parametrize("collect", [False, True], ids=["old-graphs-alive", "after-gc"])
def test_a_rebuilt_target_engine_is_owned_and_updated(engine_factory, overlay_on, collect):
    first = engine_factory("dense_gqa")
    target_steps(first, 3)
    kept = first.wrapper  # its graphs stay alive, as a reference cycle would keep them
    first.close()
    if collect:
        del kept
        gc.collect()
    owned_before = state.STATE.counters["updates.owned"]
    second = engine_factory("dense_gqa")
    errors = target_steps(second)
    assert max(errors) < TOL  # equal to eager: the second engine's tasks were updated
    assert state.STATE.counters["updates.owned"] - owned_before == STEPS
    assert state.STATE.counters.get("updates.stock.unowned", 0) == 0
    if not collect:
        live = [REGISTRY.live_owners("target", g.descriptor) for g in REGISTRY.graphs()]
        assert max(live) == 2  # the old engine's graphs really were alive meanwhile
        del kept


def test_update_first_order_takes_the_newest_engine_s_graph(engine_factory, overlay_on):
    """ENPU / 310P: the update comes before the replay, so no replay names the graph."""
    first = engine_factory("dense_enpu")
    target_steps(first, 3)
    kept = first.wrapper
    first.close()
    second = engine_factory("dense_enpu")
    assert max(target_steps(second)) < TOL
    assert state.STATE.counters.get("updates.stock.unowned", 0) == 0
    del kept


def draft_steps(engine: Any, steps: int = STEPS) -> list[float]:
    rng = random.Random(5)
    errors = []
    for _ in range(steps):
        batch = engine.draft_batch(rng)
        snap = engine.snapshot_kv()
        eager = engine.run_draft_eager(batch)
        engine.restore_kv(snap)
        out = engine.run_draft_graph(batch)
        errors.append(float((out["hidden"] - eager["hidden"]).abs().max()))
    return errors


@pytest.mark.parametrize("collect", [False, True], ids=["old-drafter-alive", "after-gc"])
def test_a_rebuilt_drafter_is_owned_and_updated(overlay_on, collect):
    from torch_npu_sim.harness.draft import DRAFT_SCENARIOS, DraftEngine

    scenario = DRAFT_SCENARIOS["mtp_2layers_k3"]
    first = DraftEngine(scenario)
    draft_steps(first, 2)
    proposer = first.proposer  # proposer._runnable -> wrapper -> proposer._run_merged_draft
    first.close()
    del first
    if collect:
        del proposer
        gc.collect()
    second = DraftEngine(scenario)
    try:
        owned_before = state.STATE.counters["updates.owned"]
        assert max(draft_steps(second)) < TOL
        if not collect:  # the old drafter's graphs really were alive meanwhile
            drafts = [g for g in REGISTRY.graphs() if g.role == "draft"]
            assert max(REGISTRY.live_owners("draft", g.descriptor) for g in drafts) == 2
        assert state.STATE.counters["updates.owned"] - owned_before == STEPS
        assert state.STATE.counters.get("updates.stock.unowned", 0) == 0
    finally:
        second.close()
    if not collect:
        del proposer


def test_the_old_registry_rule_would_have_given_these_graphs_to_stock(engine_factory, overlay_on):
    """Negative control: with the owner unknown and the newest ignored (the rule before: two
    live owners meant stock), the rebuilt engine's updates go to stock."""
    original = REGISTRY.lookup

    def ambiguous_is_stock(role: str, descriptor: Any, owner: Any = None) -> Any:
        return None if REGISTRY.live_owners(role, descriptor) > 1 else original(role, descriptor)

    first = engine_factory("dense_gqa")
    target_steps(first, 3)
    kept = first.wrapper
    first.close()
    second = engine_factory("dense_gqa")
    REGISTRY.lookup = ambiguous_is_stock  # type: ignore[method-assign]
    try:
        target_steps(second, 4)
    finally:
        del REGISTRY.lookup
    assert state.STATE.counters["updates.stock.unowned"] > 0
    del kept
