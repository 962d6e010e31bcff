"""Model runner v2: target (`ModelAclGraphManager`) and draft prefill
(`PrefillEagleAclGraphManager`) graphs owned by the overlay through the v2 seams, keyed by their
`BatchExecutionDescriptor`.

Each arm builds a fresh `V2Engine` (same seed: same batches, weights, KV history); eager runs
inside each arm on a KV snapshot. The overlay is enabled before the engine is built, as in a real
process (the post-import hook fires when the v2 modules load, before the runner's
`torch_cuda_wrapper` copies `torch_npu_graph_wrapper` into `torch.cuda.graph`).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ascend_graph_patch.sim.harness import LayerSpec, Scenario

STEPS = 24
TOL = 1e-4
V2_MODULES = (
    "vllm_ascend.ops",
    "vllm_ascend.attention.attention_v1",
    "vllm_ascend.compilation.acl_graph",
    "vllm_ascend.worker.v2.aclgraph_utils",
    "vllm_ascend.worker.v2.utils",
    "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph",
)
DRAFT = Scenario(
    "v2_draft",
    layers=(LayerSpec("model.layers.60.self_attn.attn"),
            LayerSpec("model.layers.61.self_attn.attn")),
    capture_sizes=(4, 8),
    max_kv_len=384,
)


@dataclass
class Arm:
    outputs: list[torch.Tensor] = field(default_factory=list)
    eager_err: list[float] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    owned: dict[Any, list[tuple]] = field(default_factory=dict)  # descriptor -> task keys
    refused: dict[Any, str] = field(default_factory=dict)
    descs: list[Any] = field(default_factory=list)

    @property
    def max_err(self) -> float:
        return max(self.eager_err)


@pytest.fixture
def overlay() -> Iterator[Callable[[str], None]]:
    from ascend_graph_patch import activation

    for name in V2_MODULES:
        importlib.import_module(name)

    def on(mode: str) -> None:
        from ascend_graph_patch import state

        activation.enable(mode)
        assert state.STATE.gate["v2"]["verdict"] == "supported", state.STATE.gate
        assert "capture.v2.graph" in activation.installed()

    yield on
    activation.disable()


def run_arm(scenario: Scenario, role: str = "target", qlen: int = 1, steps: int = STEPS,
            *, before_capture: Callable[[], None] | None = None,
            after_capture: Callable[[], None] | None = None) -> Arm:
    from ascend_graph_patch import state
    from ascend_graph_patch.core.registry import REGISTRY
    from ascend_graph_patch.sim.v2_harness import V2Engine

    arm = Arm()
    engine = V2Engine(scenario, role, qlen)
    try:
        if before_capture is not None:
            before_capture()
        engine.capture_all()
        if after_capture is not None:
            after_capture()
        arm.descs = list(engine.manager.graphs)
        rng = random.Random(99)
        for _ in range(steps):
            batch = engine.v2_batch(rng)
            snap = engine.snapshot_kv()
            eager = engine.run_v2_eager(batch)
            engine.restore_kv(snap)
            out = engine.run_v2_graph(batch)
            arm.outputs.append(out)
            arm.eager_err.append((out - eager).abs().max().item())
        arm.counters = dict(state.STATE.counters)
        arm.owned = {g.descriptor: [t.key for t in g.tasks] for g in REGISTRY.graphs()}
        arm.refused = {desc: why for (_, desc), why in REGISTRY.refused.items()}
    finally:
        engine.close()
    return arm


def assert_bitwise(a: Arm, b: Arm) -> None:
    for i, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=True)):
        assert torch.equal(x, y), f"step {i}: max diff {(x - y).abs().max().item()}"


def test_release_model_manager_cannot_be_built_on_vllm_0_23() -> None:
    """Evidence for the harness shim: stock v2 target capture cannot even start on vLLM 0.23.0."""
    from ascend_graph_patch.sim.scenarios import SCENARIOS
    from ascend_graph_patch.sim.v2_harness import V2Engine, stock_model_manager_error

    for name in V2_MODULES:
        importlib.import_module(name)
    engine = V2Engine(SCENARIOS["dense_gqa"], "target")
    try:
        error = stock_model_manager_error(engine.vllm_config, engine.runner)
    finally:
        engine.close()
    assert isinstance(error, TypeError)
    assert "lora_capture_cases" in str(error)


@pytest.mark.parametrize("name", ["dense_gqa", "sliding_window"])
def test_v2_target_overlay_equals_stock_equals_eager(
    name: str, overlay: Callable[[str], None]
) -> None:
    from ascend_graph_patch.sim.scenarios import SCENARIOS

    sc = SCENARIOS[name]
    stock = run_arm(sc)
    assert stock.max_err < TOL
    overlay("on")
    ours = run_arm(sc)
    assert_bitwise(ours, stock)
    assert ours.max_err < TOL
    # every FULL graph owned, keyed by its BatchExecutionDescriptor, one task per layer
    assert set(ours.owned) == set(ours.descs) and len(ours.descs) == len(sc.capture_sizes)
    for keys in ours.owned.values():
        assert [k[1] for k in keys] == [spec.name for spec in sc.layers]
    assert ours.counters["updates.owned"] == STEPS
    assert "updates.stock.unowned" not in ours.counters


def test_v2_draft_prefill_overlay_equals_stock_equals_eager(
    overlay: Callable[[str], None],
) -> None:
    stock = run_arm(DRAFT, "draft_prefill", qlen=2)
    assert stock.max_err < TOL
    overlay("on")
    ours = run_arm(DRAFT, "draft_prefill", qlen=2)
    assert_bitwise(ours, stock)
    assert ours.max_err < TOL
    assert set(ours.owned) == set(ours.descs)
    assert all(d.uniform_token_count == 2 for d in ours.descs)
    assert ours.counters["tasks.updated"] == STEPS * len(DRAFT.layers)


@pytest.mark.parametrize(("scenario", "role", "qlen"),
                         [("dense_gqa", "target", 1), ("v2_draft", "draft_prefill", 2)])
def test_v2_verify_zero_mismatches(
    scenario: str, role: str, qlen: int, overlay: Callable[[str], None]
) -> None:
    from ascend_graph_patch.sim.scenarios import SCENARIOS

    sc = DRAFT if scenario == "v2_draft" else SCENARIOS[scenario]
    overlay("verify")
    arm = run_arm(sc, role, qlen, steps=12)
    assert arm.counters["verify.updates"] == 12
    assert arm.counters["verify.tasks"] == 12 * len(sc.layers)
    assert arm.counters.get("verify.mismatches", 0) == 0
    assert arm.max_err < TOL


def _shift_first_task() -> None:
    """A deliberately wrong binding: the first task of every owned graph reads the KV lengths of
    the neighbouring request (as a task bound to the wrong batch row or step would)."""
    from ascend_graph_patch.core.registry import REGISTRY

    @dataclass(frozen=True)
    class Shifted:
        original: Any

        @property
        def kind(self) -> str:
            return self.original.kind

        def bind(self, metadata: Any, launch: dict, cache: dict) -> None:
            self.original.bind(metadata, launch, cache)
            kv = list(launch["actual_seq_lengths_kv"])
            launch["actual_seq_lengths_kv"] = kv[1:] + kv[:1]

    for graph in REGISTRY.graphs():
        graph.tasks[0].provider = Shifted(graph.tasks[0].provider)


def test_v2_wrong_binding_caught_by_verify_and_eager(overlay: Callable[[str], None]) -> None:
    from ascend_graph_patch import activation

    overlay("verify")
    checked = run_arm(DRAFT, "draft_prefill", qlen=2, steps=8, after_capture=_shift_first_task)
    assert checked.counters["verify.mismatches"] == 8  # one wrong task per update
    activation.disable()
    overlay("on")
    wrong = run_arm(DRAFT, "draft_prefill", qlen=2, steps=8, after_capture=_shift_first_task)
    assert wrong.max_err > 1e-2


def test_v2_draft_decode_graphs_refused_with_reason(overlay: Callable[[str], None]) -> None:
    from ascend_graph_patch import status
    from ascend_graph_patch.aspects.capture_v2 import DECODE
    from ascend_graph_patch.sim.v2_harness import V2Engine

    overlay("on")
    engine = V2Engine(DRAFT, "draft", 1)
    try:
        engine.capture_all()
        descs = list(engine.manager.graphs)
        snap = status.snapshot()
    finally:
        engine.close()
    assert descs and snap["graphs_owned"] == 0
    refused = snap["graphs_refused"]
    assert len(refused) == len(descs)
    assert all(v == DECODE for v in refused.values())
    assert all("'draft'" in k for k in refused)


def test_upstream_decode_manager_capture_is_refused_per_graph(
    overlay: Callable[[str], None],
) -> None:
    """The aspect on upstream's DecodeSpeculatorCudaGraphManager.capture (unit level)."""
    from ascend_graph_patch.aspects import capture_v2
    from ascend_graph_patch.core.registry import REGISTRY

    overlay("on")
    manager = SimpleNamespace(graphs={"old": object()})

    def stock_capture(*args: Any, **kwargs: Any) -> str:
        assert capture_v2.SESSION.get() is None  # nothing captured here can be owned
        manager.graphs["d4"] = object()
        manager.graphs["d8"] = object()
        return "done"

    assert capture_v2.decode_capture(stock_capture, manager, (), {}) == "done"
    assert REGISTRY.refused == {("draft", "d4"): capture_v2.DECODE,
                                ("draft", "d8"): capture_v2.DECODE}


def test_v2_late_enable_refuses_and_stays_stock(overlay: Callable[[str], None]) -> None:
    """Overlay enabled after the runner bound torch.cuda.graph: refused per graph, stock runs."""
    from ascend_graph_patch.aspects.capture_v2 import UNSEEN
    from ascend_graph_patch.sim.scenarios import SCENARIOS

    sc = SCENARIOS["dense_gqa"]
    arm = run_arm(sc, steps=6, before_capture=lambda: overlay("on"))
    assert arm.owned == {}
    assert set(arm.refused) == set(arm.descs) and set(arm.refused.values()) == {UNSEEN}
    assert arm.counters["updates.stock.unowned"] == 6
    assert arm.max_err < TOL
