"""The REAL vllm-ascend 0.23.0.post1 capture -> replay -> stock update path, run on the simulator.

Every test drives ``torch_npu_sim.harness.target.TargetEngine`` (mostly through ``run_arm``):
real ``AscendAttentionBackendImpl`` layers inside a real ``ACLGraphWrapper``, metadata from the
real builder, the stock ``update_full_graph_params`` after each replay. The reference is the
same real code run eagerly (runtime mode NONE, unpadded, as the eager runner runs it).

Tolerance: fp32 throughout; replay must equal eager within ``ATOL`` = 1e-5 absolute (observed
<= 1.2e-6: the two runs differ in padding, hence in matmul blocking, and for ``paged_attention`` in
the op: graphs of pa_shape_list sizes run PA, the unpadded eager run mostly FIA). Stale outputs
differ by O(0.1-1), so the bound separates the two by four orders of magnitude.

Stock-broken scenarios (``Scenario.stock`` starts with "crash:") are asserted to fail exactly as
recorded, so the evidence stays current.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from torch_npu_sim.harness import scenarios
from torch_npu_sim.workload import StepHook, StepOutput, Workload, bitwise_equal, run_arm

ATOL = 1e-5
STEPS = 40
STALE = 1e-3  # a run without the update must differ from eager by more than this

#: Every catalogued scenario where stock is right, and every one where it crashes (as recorded):
#: read from the catalogue, so a scenario added there is checked here.
CORRECT = [name for name, sc in scenarios.SCENARIOS.items() if sc.stock == "ok"]
CRASHING = [name for name, sc in scenarios.SCENARIOS.items() if sc.stock.startswith("crash: ")]


def _stats() -> dict[str, int]:
    from torch_npu_sim import runtime

    return runtime.stats()


def _graph_params():
    import vllm_ascend.compilation.acl_graph as acl_graph

    return acl_graph.get_graph_params()


@dataclass
class Seen:
    """What an arm's batches and the simulator runtime went through during the steps."""

    padded: set[int] = field(default_factory=set)  # graph sizes replayed
    sizes: set[int] = field(default_factory=set)  # real batch sizes
    stats: dict[str, int] = field(default_factory=dict)  # runtime counters over the steps


def _arm(name: str, seed: int, steps: int, on_step: StepHook | None = None) -> tuple[Any, Seen]:
    """A stock arm, eager vs replay each step; it must run every step."""
    seen, before = Seen(), {}

    def start(workload: Workload) -> None:
        before.update(_stats())

    def step(workload: Workload, index: int, batch: Any, out: StepOutput) -> None:
        assert out.values is not None and out.values.shape[0] == batch.num_reqs
        assert torch.isfinite(out.values).all()
        seen.padded.add(batch.num_tokens_padded)
        seen.sizes.add(batch.num_reqs)
        if on_step is not None:
            on_step(workload, index, batch, out)

    def end(workload: Workload) -> None:
        after = _stats()
        seen.stats = {k: v - before.get(k, 0) for k, v in after.items()}

    result = run_arm(
        lambda: scenarios.build(name),
        steps,
        seed,
        before_steps=start,
        on_step=step,
        after_steps=end,
    )
    assert result.ok and result.steps == steps, result.traceback
    return result, seen


@pytest.mark.parametrize("name", CORRECT)
def test_replay_matches_eager(seed, name):
    result, seen = _arm(name, seed, STEPS)
    worst = result.max_eager_error

    assert worst <= ATOL, f"{name}: replay differs from eager by {worst:.3g}"
    # The workload really changed shape and really went through graphs and the stock update.
    assert len(seen.padded) >= 2 and len(seen.sizes) >= 8
    n_attn = sum(spec.captures_task for spec in scenarios.SCENARIOS[name].layers)
    assert seen.stats["replays"] == STEPS
    assert seen.stats["updates"] == STEPS * n_attn
    assert seen.stats["records"] == STEPS * n_attn


def test_metadata_is_padded_like_the_runner(build, rng):
    engine = build("dense_gqa")
    batch = next(
        b for b in iter(lambda: engine.next_batch(rng), None) if b.num_reqs < b.num_tokens_padded
    )
    engine.run(batch)
    md = engine.last_metadata[engine.scenario.layers[0].name]
    n, padded = batch.num_reqs, batch.num_tokens_padded
    # FULL_DECODE_ONLY: one-token dummy requests with kv length 0 up to the capture size; the
    # last cumulative query end is the GraphParams key the update is called with.
    assert md.actual_seq_lengths_q == list(range(1, padded + 1))
    assert md.seq_lens_list == batch.seq_lens + [0] * (padded - n)
    assert md.num_actual_tokens == n
    assert (md.block_tables[n:] == 0).all()
    assert (md.slot_mapping[n:padded] == -1).all()


def test_capture_records_the_expected_task_kinds(build):
    """Each scenario reaches the branch it is named after (tuple layouts of hook_points.md)."""
    sizes, params = {}, {}
    for name in ("dense_gqa", "sliding_window", "sinks", "paged_attention", "gemma4_mixed"):
        engine = build(name)
        engine.capture()
        params[name] = {s: list(p) for s, p in _graph_params().attn_params.items()}
        sizes[name] = {s: [len(t) for t in p] for s, p in params[name].items()}
    assert sizes["dense_gqa"][8] == [22] * 4  # FIA
    assert [p[21] for p in params["dense_gqa"][8]] == [None] * 4  # not layer-aware
    assert [p[16] for p in params["sliding_window"][8]] == [None, 64, None]
    assert sizes["sinks"][8] == [15] * 3  # FIA v2
    # pa_shape_list=(4, 16): PA there, FIA at 8.
    assert sizes["paged_attention"] == {4: [9] * 3, 8: [22] * 3, 16: [9] * 3}
    # Gemma4: head-512 layers (0, 3, 5) are PA, sliding layers FIA with their layer names
    # (layer-aware replay is on), in capture (= layer) order.
    assert sizes["gemma4_mixed"][8] == [9, 22, 22, 9, 22, 9]
    fia_names = [p[21] for p in params["gemma4_mixed"][8] if len(p) == 22]
    assert fia_names == [f"model.layers.{i}.self_attn.attn" for i in (1, 2, 4)]
    # KV sharing: layer 5 attends over layer 0's cache (the same tensor).
    assert engine.layers[5].kv_cache is engine.layers[0].kv_cache


@pytest.mark.parametrize("name", ["dense_gqa", "sliding_window", "sinks", "paged_attention"])
def test_skipping_update_is_stale(seed, name):
    """Negative control: replay with every event recorded but no update reads captured lengths."""
    extra, stale = random.Random(seed + 1), []

    def without_update(workload: Any, index: int, batch: Any, out: StepOutput) -> None:
        if index in (2, 3, 4):  # after three updated steps: three extra steps without the update
            extra_batch = workload.next_batch(extra)
            eager = workload.run(extra_batch, graph=False).values
            missed = workload.run_without_update(extra_batch).values
            stale.append((missed - eager).abs().max().item())

    result, _ = _arm(name, seed, 7, on_step=without_update)
    assert len(stale) == 3 and max(stale) > STALE, (
        f"{name}: output without the update equals eager ({max(stale):.3g})"
    )
    # And the graph recovers at the next properly updated step (every step is within ATOL).
    assert result.max_eager_error <= ATOL


def test_unrecorded_event_raises_at_sync(seed):
    from torch_npu_sim import SimulatorError

    extra, raised = random.Random(seed + 1), []

    def blocked(workload: Any, index: int, batch: Any, out: StepOutput) -> None:
        if index == 1:  # after two updated steps
            with pytest.raises(SimulatorError, match="blocked"):
                workload.run_without_update(workload.next_batch(extra), record=False)
            raised.append(index)

    result, _ = _arm("dense_gqa", seed, 4, on_step=blocked)
    assert raised == [1]
    # No hang and no poisoned state: the next steps replay and update correctly.
    assert max(result.eager_max_abs[2:]) <= ATOL


def test_update_then_replay_order(seed):
    """ENPU / 310P order: update (records every event) before the replay queues its waits."""
    result, _ = _arm("dense_enpu", seed, 20)
    assert result.max_eager_error <= ATOL


def test_engines_are_deterministic_and_rebuildable():
    """Weights and workload follow the seed; a second engine in the process starts clean."""
    arms = [run_arm(lambda: scenarios.build("sliding_window"), 4, 7, eager=False) for _ in range(2)]
    assert all(arm.ok and arm.steps == 4 for arm in arms)
    equal, why = bitwise_equal(*arms)
    assert equal, why


def _expected_failure(stock: str) -> tuple[type[BaseException], str]:
    import builtins

    match = re.fullmatch(r"crash: (\w+): (.*)", stock)
    assert match, stock
    return getattr(builtins, match.group(1)), match.group(2)


def test_the_catalogue_records_every_scenario_as_right_or_crashing() -> None:
    assert sorted(CORRECT + CRASHING) == sorted(scenarios.SCENARIOS)
    assert {"gemma4_mixed", "hybrid_linear"} <= set(CRASHING)  # the known stock bugs


@pytest.mark.parametrize("name", CRASHING)
def test_stock_update_fails_on(build, rng, name):
    """Evidence, not a skip: the stock update crashes exactly as the scenario records.

    gemma4_mixed: the head-512 PA tuples are unpacked as 22-field FIA tuples (the update picks
    its branch without head_size). hybrid_linear: positional pairing hands an attention task
    the linear-attention layer's metadata.
    """
    engine = build(name)
    assert engine.stock.startswith("crash: ")
    exc_type, message = _expected_failure(engine.stock)
    batch = engine.next_batch(rng)
    eager = engine.run(batch, graph=False)  # the same real layers run fine without graphs
    assert torch.isfinite(eager.values).all()
    with pytest.raises(exc_type, match=re.escape(message)):
        engine.run(batch)


def test_simulator_and_harnesses_do_not_import_the_overlay():
    """The runtime, the ops and the harnesses are the STOCK world the overlay is installed onto:
    they may not import it, so one harness measures every arm. Only the tools that drive the
    overlay (its A/B worker, the soak, the benchmark, the real engine's arm processes and their
    launcher, which stops them with the overlay's supervisor) do."""
    import ast
    from pathlib import Path

    import torch_npu_sim as sim

    root = Path(sim.__file__).parent
    tools = {("ab_worker.py",), ("soak.py",), ("bench",), ("engine", "arm.py")}
    tools.add(("engine", "arms.py"))
    checked = 0
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if any(parts[: len(tool)] == tool for tool in tools):
            continue
        checked += 1
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert not module.startswith("ascend_graph_patch"), (str(path), module)
    assert checked >= 8  # runtime, ops, install, finder, harnesses...
