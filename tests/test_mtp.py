"""v1 MTP / Eagle merged draft graphs: the overlay against stock and eager, on the real proposer.

Each arm builds a fresh `DraftEngine` with the same seed, so the same batches, weights and KV
history reach stock and overlay; eager runs inside each arm on a KV snapshot. Draft tasks must be
keyed by (metadata key, step): one task per layer per step, all distinct.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import torch

from torch_npu_sim.harness.draft import DRAFT_SCENARIOS, DraftEngine, DraftScenario

STEPS = 16
TOL = 1e-4


@dataclass
class Arm:
    hidden: list[torch.Tensor] = field(default_factory=list)
    tokens: list[torch.Tensor] = field(default_factory=list)
    eager_err: list[float] = field(default_factory=list)  # max |graph - eager| per propose call
    counters: dict[str, int] = field(default_factory=dict)
    keys: list[list[tuple]] = field(default_factory=list)  # task keys per owned draft graph

    @property
    def max_err(self) -> float:
        return max(self.eager_err)


@pytest.fixture
def overlay() -> Iterator[Callable[[str], None]]:
    """Enable the overlay in-process (after the vllm_ascend imports), always disabled after."""
    import importlib

    from ascend_graph_patch import activation

    for name in (
        "vllm_ascend.ops",
        "vllm_ascend.attention.attention_v1",
        "vllm_ascend.compilation.acl_graph",
    ):
        importlib.import_module(name)

    def on(mode: str) -> None:
        activation.enable(mode)
        from ascend_graph_patch import state

        assert state.STATE.gate["v1"]["verdict"] == "supported", state.STATE.gate

    yield on
    activation.disable()


def run_arm(
    scenario: DraftScenario,
    steps: int = STEPS,
    *,
    tamper: Callable[[], None] | None = None,
) -> Arm:
    """Capture both sizes, optionally tamper with the owned graphs, then propose `steps` times."""
    from ascend_graph_patch import state
    from ascend_graph_patch.core.registry import REGISTRY

    arm = Arm()
    engine = DraftEngine(scenario)
    try:
        for size in scenario.capture_sizes:
            engine.capture(size)
        if tamper is not None:
            tamper()
        rng = random.Random(1234)
        for _ in range(steps):
            batch = engine.draft_batch(rng)
            snap = engine.snapshot_kv()
            eager = engine.run_draft_eager(batch)
            engine.restore_kv(snap)
            out = engine.run_draft_graph(batch)
            arm.hidden.append(out["hidden"])
            arm.tokens.append(out["tokens"])
            arm.eager_err.append((out["hidden"] - eager["hidden"]).abs().max().item())
        arm.counters = dict(state.STATE.counters)
        arm.keys = [[t.key for t in g.tasks] for g in REGISTRY.graphs() if g.role == "draft"]
    finally:
        engine.close()
    return arm


def assert_bitwise(a: Arm, b: Arm) -> None:
    for i, (x, y) in enumerate(zip(a.hidden, b.hidden, strict=True)):
        assert torch.equal(x, y), f"propose call {i}: max diff {(x - y).abs().max().item()}"
    for x, y in zip(a.tokens, b.tokens, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize(
    "name",
    [
        "mtp_k1",
        "mtp_k2",
        "mtp_k3",
        "mtp_k4",
        "mtp_2layers_k3",
        "eagle_2layers_k2",
        "mtp_two_kv_groups_ordered",
        "mtp_enpu_k3",
    ],
)
def test_overlay_equals_stock_equals_eager(name: str, overlay: Callable[[str], None]) -> None:
    sc = DRAFT_SCENARIOS[name]
    stock = run_arm(sc)
    assert stock.max_err < TOL  # stock is right here: the reference for bitwise equality
    overlay("on")
    ours = run_arm(sc)
    assert_bitwise(ours, stock)
    assert ours.max_err < TOL
    k, layers = sc.num_speculative_tokens, len(sc.layers)
    # every draft step of every layer is one task, keyed by (kind, layer, step)
    assert len(ours.keys) == len(sc.capture_sizes)
    for keys in ours.keys:
        assert len(keys) == len(set(keys)) == k * layers
        assert sorted({step for *_, step in keys}) == list(range(k))
    assert ours.counters["updates.owned"] == STEPS
    assert ours.counters["tasks.updated"] == STEPS * k * layers
    assert not any(c.startswith(("fallback", "errors")) for c in ours.counters)


@pytest.mark.parametrize(
    "name", ["mtp_k1", "mtp_k4", "mtp_2layers_k3", "mtp_two_kv_groups_ordered", "mtp_non_causal"]
)
def test_verify_has_no_mismatch_where_stock_is_right(
    name: str, overlay: Callable[[str], None]
) -> None:
    sc = DRAFT_SCENARIOS[name]
    overlay("verify")
    arm = run_arm(sc, steps=8)
    assert arm.counters["verify.updates"] == 8
    assert arm.counters["verify.tasks"] == 8 * sc.num_speculative_tokens * len(sc.layers)
    assert arm.counters.get("verify.mismatches", 0) == 0


def test_non_causal_steps_follow_stock(overlay: Callable[[str], None]) -> None:
    """Non-causal steps relaunch with sparse_mode 0, as stock does: bitwise equal to stock.

    Stock itself differs from eager here: eager's non-causal FIA passes no mask, the captured
    graph task keeps the causal split-fuse mask under sparse_mode 0 (applied top-left). The overlay
    reproduces stock on purpose (owning the update must not change what the kernel computes).
    """
    from ascend_graph_patch.core.providers import GraphWorkspaceProvider

    sc = DRAFT_SCENARIOS["mtp_non_causal"]
    stock = run_arm(sc, steps=8)
    overlay("on")
    seen: list[int] = []
    original = GraphWorkspaceProvider.values

    def spy(self: GraphWorkspaceProvider, metadata, cache):  # noqa: ANN001
        values = original(self, metadata, cache)
        seen.append(values["sparse_mode"])
        return values

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GraphWorkspaceProvider, "values", spy)
        ours = run_arm(sc, steps=8)
    assert_bitwise(ours, stock)
    assert 0 in seen and 3 in seen  # step 0 causal (3), steps 1-2 non-causal (0)
    assert stock.max_err > 0.1  # the stock graph-vs-eager gap described above


def test_two_kv_groups_stock_wrong_overlay_right(overlay: Callable[[str], None]) -> None:
    sc = DRAFT_SCENARIOS["mtp_two_kv_groups"]
    stock = run_arm(sc, steps=8)
    assert stock.max_err > 0.5, "stock pairs layer 61 with layer 62's block table by position"
    overlay("on")
    ours = run_arm(sc, steps=8)
    assert ours.max_err < TOL
    pairs = zip(ours.hidden, stock.hidden, strict=True)
    assert max((a - b).abs().max().item() for a, b in pairs) > 0.5


def test_two_kv_groups_verify_flags_stock(overlay: Callable[[str], None]) -> None:
    sc = DRAFT_SCENARIOS["mtp_two_kv_groups"]
    overlay("verify")
    arm = run_arm(sc, steps=4)
    # layers 61 and 62 swap block tables at each of the 3 steps: 6 mismatching tasks per update
    assert arm.counters["verify.mismatches"] == 4 * 6
    assert arm.max_err > 0.5  # verify applies stock: stock's wrong output


def _swap(field_name: str, i: int, j: int) -> Callable[[], None]:
    """Swap one binding between two tasks of every owned draft graph (a deliberate bug)."""

    def tamper() -> None:
        from ascend_graph_patch.core.registry import REGISTRY

        for graph in REGISTRY.graphs():
            a, b = graph.tasks[i], graph.tasks[j]
            assert getattr(a, field_name) != getattr(b, field_name)
            va, vb = getattr(a, field_name), getattr(b, field_name)
            setattr(a, field_name, vb)
            setattr(b, field_name, va)

    return tamper


@pytest.mark.parametrize(
    ("field_name", "i", "j"),
    [("step", 0, -1), ("metadata_key", 0, 1)],  # tasks: (60, s0), (61, s0), (60, s1), (61, s1)
)
def test_wrong_binding_is_caught(
    field_name: str, i: int, j: int, overlay: Callable[[str], None]
) -> None:
    from ascend_graph_patch import activation

    sc = DRAFT_SCENARIOS["mtp_two_kv_groups_ordered"]  # stock right: 0 mismatches untampered
    overlay("verify")
    checked = run_arm(sc, steps=4, tamper=_swap(field_name, i, j))
    assert checked.counters["verify.mismatches"] >= 4 * 2  # both swapped tasks, every update
    activation.disable()
    overlay("on")
    wrong = run_arm(sc, steps=4, tamper=_swap(field_name, i, j))
    assert wrong.max_err > 1e-2, "the eager comparison must see the wrong binding"


@pytest.mark.parametrize("mode", [None, "on"])
def test_update_waiting_on_its_own_replay_is_a_deadlock(
    mode: str | None, overlay: Callable[[str], None]
) -> None:
    """Broken ordering on purpose: the update stream waits on the stream holding the replay.

    The simulator reports it as a deadlock (hardware would hang). Stock raises it into the
    caller; so does the overlay (a runtime failure part way through an update cannot go to
    stock), counting it and warning once.
    """
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import get_forward_context

    from ascend_graph_patch import state
    from torch_npu_sim.runtime import SimulatorError

    if mode is not None:
        overlay(mode)
    engine = DraftEngine(DRAFT_SCENARIOS["mtp_k2"])
    try:
        batch = engine.draft_batch(random.Random(5))
        padded = batch.num_tokens_padded
        engine.capture(padded)
        with set_current_vllm_config(engine.vllm_config):
            engine._load(batch, padded)
            per_step = engine._draft_metadata(batch, padded, True, False)
            with engine._draft_context(
                per_step, padded, engine._full, engine._batch_descriptor(padded)
            ):
                fc = get_forward_context()
                engine._call(padded, per_step)  # replay: blocked at the first event
                engine.update_stream.wait_stream(torch.npu.current_stream())
                with pytest.raises(SimulatorError, match="(?i)deadlock"):
                    engine.proposer._update_full_graph_params(fc, padded, per_step)
                    torch.npu.synchronize()
                if mode is not None:  # a runtime failure part way: raised, as stock raises it
                    assert state.STATE.counters["faults.apply"] == 1
                    assert "fault:apply:SimulatorError" in state.STATE.warned
    finally:
        engine.close()
