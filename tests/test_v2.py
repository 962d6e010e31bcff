"""Model runner v2: target (`ModelAclGraphManager`) and draft prefill
(`PrefillEagleAclGraphManager`) graphs owned by the overlay through the v2 seams, keyed by their
`BatchExecutionDescriptor`.

Each arm builds a fresh `V2Engine` (same seed: same batches, weights, KV history); eager runs
inside each arm on a KV snapshot. The overlay is enabled before the engine is built, as in a real
process (the post-import hook fires when the v2 modules load, before the runner's
`torch_cuda_wrapper` copies `torch_npu_graph_wrapper` into `torch.cuda.graph`).

The v2 target matrix follows the v1 overlay matrix (`sim/scenarios.py`): every scenario the v2
manager can run, 200 replay steps each with random batch sizes and KV lengths (padding included).
Stock v2 behaviour is recorded per scenario in `V2_STOCK`; where stock fails, the exact failure is
asserted as evidence and the overlay is held to eager instead.
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

from ascend_graph_patch.core.kinds import FIA, FIA_V2, PA
from torch_npu_sim.harness.scenarios import SCENARIOS
from torch_npu_sim.harness.target import LayerSpec, Scenario

STEPS = 200
TOL = 1e-5  # as the v1 matrix (tests/overlay_support.py); measured max 1.1e-06
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
    layers=(
        LayerSpec("model.layers.60.self_attn.attn"),
        LayerSpec("model.layers.61.self_attn.attn"),
    ),
    capture_sizes=(4, 8),
    max_kv_len=384,
)

# v1 scenarios that do not apply to the v2 target manager (documented skips, docs/v2.md).
NOT_ON_V2 = {
    "dense_full": "v1 FULL-mode padding (one dummy request holds every pad token) is a "
    "v1 NPUModelRunner path; the v2 target manager captures FULL_DECODE_ONLY uniform-decode "
    "descriptors, so its padding is the dense_gqa case",
    "dense_enpu": "ENPU update-then-replay is a v1 runner order; the 0.23.0.post1 v2 "
    "ModelAclGraphManager.run_fullgraph always replays, then updates",
}
V2_TARGETS = [name for name in SCENARIOS if name not in NOT_ON_V2]
# How stock 0.23.0.post1 behaves on the v2 target path (through the harness adapter). It differs
# from v1 on `sinks`: v2's run_fullgraph uses vLLM's set_forward_context, nothing sets
# `_EXTRA_CTX.sinks` (additional_kwargs has no "sinks"), so stock takes the FIA branch and unpacks
# the 15-field FIA-v2 tuple as a 22-field FIA one (attention_v1.py:715, first replayed step).
V2_STOCK = {name: SCENARIOS[name].stock for name in V2_TARGETS} | {
    "sinks": "crash: ValueError: not enough values to unpack (expected 22, got 15)",
}


@dataclass
class Arm:
    outputs: list[torch.Tensor] = field(default_factory=list)
    eager_err: list[float] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    # descriptor -> (kind, layer name, metadata key, step) per task, in capture order
    owned: dict[Any, list[tuple]] = field(default_factory=dict)
    refused: dict[Any, str] = field(default_factory=dict)
    descs: list[Any] = field(default_factory=list)
    error: BaseException | None = None  # what a replay step raised (stock on a broken scenario)

    @property
    def max_err(self) -> float:
        assert self.error is None, f"the arm failed: {type(self.error).__name__}: {self.error}"
        return max(self.eager_err)

    @property
    def failure(self) -> str:
        assert self.error is not None, "the arm did not fail"
        return f"crash: {type(self.error).__name__}: {self.error}"


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


def run_arm(
    scenario: Scenario,
    role: str = "target",
    qlen: int = 1,
    steps: int = STEPS,
    *,
    eager: bool = True,
    before_capture: Callable[[], None] | None = None,
    after_capture: Callable[[], None] | None = None,
) -> Arm:
    """One arm: fresh engine, fixed batch seed. Eager runs first and the KV slots it wrote are
    put back, so skipping it (``eager=False``) leaves the graph outputs unchanged. A step that
    raises ends the arm and is kept in ``arm.error``."""
    from ascend_graph_patch import state
    from ascend_graph_patch.core.registry import REGISTRY
    from torch_npu_sim.harness.v2 import V2Engine

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
            reference = None
            if eager:
                reference = engine.run_v2_eager_isolated(batch)
            try:
                out = engine.run_v2_graph(batch)
            except Exception as exc:  # the stock update of a broken scenario
                arm.error = exc
                break
            arm.outputs.append(out)
            if reference is not None:
                arm.eager_err.append((out - reference).abs().max().item())
        arm.counters = dict(state.STATE.counters)
        arm.owned = {
            g.descriptor: [(t.kind, t.layer_name, t.metadata_key, t.step) for t in g.tasks]
            for g in REGISTRY.graphs()
        }
        arm.refused = {desc: why for (_, desc), why in REGISTRY.refused.items()}
    finally:
        engine.close()
    return arm


def assert_bitwise(a: Arm, b: Arm) -> None:
    for i, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=True)):
        assert torch.equal(x, y), f"step {i}: max diff {(x - y).abs().max().item()}"


def test_release_model_manager_cannot_be_built_on_vllm_0_23() -> None:
    """Evidence for the harness shim: stock v2 target capture cannot even start on vLLM 0.23.0."""
    from torch_npu_sim.harness.v2 import V2Engine, stock_model_manager_error

    for name in V2_MODULES:
        importlib.import_module(name)
    engine = V2Engine(SCENARIOS["dense_gqa"], "target")
    try:
        error = stock_model_manager_error(engine.vllm_config, engine.runner)
    finally:
        engine.close()
    assert isinstance(error, TypeError)
    assert "lora_capture_cases" in str(error)


def expected_tasks(sc: Scenario, num_tokens: int) -> list[tuple[str, str, str, int]]:
    """What a target graph must own: one task per attention layer, in model order, of the kind
    stock captures at that size (PA on `pa_shape_list` sizes and for 512-dim heads, FIA v2 with
    sinks, else FIA), keyed by the layer's metadata key (its KV-sharing target's, if any)."""
    tasks = []
    for spec in sc.layers:
        if spec.kind != "attention":
            continue  # linear-attention layers capture no attention task
        if num_tokens in sc.pa_shape_list or spec.head_size == 512:
            kind = PA
        else:
            kind = FIA_V2 if spec.sinks else FIA
        tasks.append((kind, spec.name, spec.kv_sharing_target or spec.name, 0))
    return tasks


def n_attention(sc: Scenario) -> int:
    return sum(1 for spec in sc.layers if spec.kind == "attention")


@pytest.fixture(scope="module")
def stock_arm() -> Callable[[str], Arm]:
    """The stock v2 target arm per scenario, run once per module (with eager) and shared."""
    cache: dict[str, Arm] = {}

    def get(name: str) -> Arm:
        from ascend_graph_patch import activation

        if name not in cache:
            for module in V2_MODULES:
                importlib.import_module(module)
            assert activation.installed() == [], "stock arm with the overlay enabled"
            cache[name] = run_arm(SCENARIOS[name])
        return cache[name]

    return get


def _v2_target(name: str) -> Scenario:
    if name in NOT_ON_V2:
        pytest.skip(f"not a v2 target path: {NOT_ON_V2[name]}")
    return SCENARIOS[name]


def assert_stock_as_recorded(name: str, stock: Arm) -> bool:
    """Stock v2 behaves as `V2_STOCK` records (ok within tolerance, or the exact failure on the
    first replayed step). True when stock works."""
    if V2_STOCK[name] == "ok":
        assert stock.error is None, stock.failure
        assert len(stock.outputs) == STEPS and stock.max_err < TOL
        return True
    assert stock.failure == V2_STOCK[name]
    assert stock.outputs == []
    return False


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_v2_target_overlay_equals_stock_equals_eager(
    name: str, overlay: Callable[[str], None], stock_arm: Callable[[str], Arm]
) -> None:
    sc = _v2_target(name)
    stock_ok = assert_stock_as_recorded(name, stock := stock_arm(name))
    overlay("on")
    # Where stock works, bitwise == stock carries stock's eager check over (same error, exactly);
    # where it fails, the overlay is compared with eager directly.
    ours = run_arm(sc, eager=not stock_ok)
    assert ours.error is None, ours.failure
    assert len(ours.outputs) == STEPS
    if stock_ok:
        assert_bitwise(ours, stock)
    else:
        assert ours.max_err < TOL
    # every FULL graph owned, keyed by its BatchExecutionDescriptor, one task per attention layer
    assert set(ours.owned) == set(ours.descs) and len(ours.descs) == len(sc.capture_sizes)
    for desc, tasks in ours.owned.items():
        assert tasks == expected_tasks(sc, desc.num_tokens), desc
    assert ours.counters["updates.owned"] == STEPS
    assert ours.counters["tasks.updated"] == STEPS * n_attention(sc)
    assert not any(k.startswith(("fallback", "errors", "updates.stock")) for k in ours.counters)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_v2_target_verify_zero_mismatches(
    name: str, overlay: Callable[[str], None], stock_arm: Callable[[str], Arm]
) -> None:
    sc = _v2_target(name)
    stock_ok = assert_stock_as_recorded(name, stock := stock_arm(name))
    overlay("verify")
    arm = run_arm(sc, eager=not stock_ok)  # where stock works, bitwise == stock implies eager
    assert arm.error is None, arm.failure
    assert len(arm.outputs) == STEPS
    assert arm.counters["verify.updates"] == STEPS
    assert arm.counters.get("verify.mismatches", 0) == 0
    if stock_ok:
        assert arm.counters["verify.tasks"] == STEPS * n_attention(sc)
        assert "verify.stock_failed" not in arm.counters
        assert_bitwise(arm, stock)  # verify applies the stock update after comparing
    else:
        # the dry run shows stock failing every step; the overlay's update is applied instead
        assert arm.counters["verify.stock_failed"] == STEPS
        assert arm.counters["updates.owned"] == STEPS
        assert "verify.tasks" not in arm.counters
        assert arm.max_err < TOL


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_v2_target_observe_changes_nothing(
    name: str, overlay: Callable[[str], None], stock_arm: Callable[[str], Arm]
) -> None:
    sc = _v2_target(name)
    stock_ok = assert_stock_as_recorded(name, stock := stock_arm(name))
    overlay("observe")
    arm = run_arm(sc, eager=False)
    assert set(arm.owned) == set(arm.descs)  # tasks are recorded ...
    assert "updates.owned" not in arm.counters  # ... but never applied
    if stock_ok:
        assert arm.error is None, arm.failure
        assert_bitwise(arm, stock)
        assert arm.counters["updates.observed"] == STEPS
    else:
        assert arm.failure == V2_STOCK[name]  # observe keeps stock's failure, exactly
        assert arm.outputs == []


def test_v2_draft_prefill_overlay_equals_stock_equals_eager(
    overlay: Callable[[str], None],
) -> None:
    from ascend_graph_patch import activation

    stock = run_arm(DRAFT, "draft_prefill", qlen=2)
    assert stock.error is None and len(stock.outputs) == STEPS
    assert stock.max_err < TOL
    overlay("on")
    ours = run_arm(DRAFT, "draft_prefill", qlen=2)
    assert_bitwise(ours, stock)
    assert ours.max_err < TOL
    assert set(ours.owned) == set(ours.descs)
    assert all(d.uniform_token_count == 2 for d in ours.descs)
    for tasks in ours.owned.values():
        assert [t[1] for t in tasks] == [spec.name for spec in DRAFT.layers]
    assert ours.counters["updates.owned"] == STEPS
    assert ours.counters["tasks.updated"] == STEPS * len(DRAFT.layers)
    activation.disable()
    overlay("observe")
    observed = run_arm(DRAFT, "draft_prefill", qlen=2, eager=False)
    assert_bitwise(observed, stock)
    assert observed.counters["updates.observed"] == STEPS
    assert "updates.owned" not in observed.counters


def test_v2_draft_prefill_verify_zero_mismatches(overlay: Callable[[str], None]) -> None:
    overlay("verify")
    arm = run_arm(DRAFT, "draft_prefill", qlen=2)
    assert arm.error is None and len(arm.outputs) == STEPS
    assert arm.counters["verify.updates"] == STEPS
    assert arm.counters["verify.tasks"] == STEPS * len(DRAFT.layers)
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

        @property
        def group(self) -> int:
            return -1  # its own group: the other tasks must not share its shifted values

        def values(self, metadata: Any, cache: dict) -> dict:
            values = self.original.values(metadata, cache)
            kv = list(values["actual_seq_lengths_kv"])
            values["actual_seq_lengths_kv"] = kv[1:] + kv[:1]
            return values

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
    from torch_npu_sim.harness.v2 import V2Engine

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
    assert REGISTRY.refused == {
        ("draft", "d4"): capture_v2.DECODE,
        ("draft", "d8"): capture_v2.DECODE,
    }


def test_v2_late_enable_refuses_and_stays_stock(overlay: Callable[[str], None]) -> None:
    """Overlay enabled after the runner bound torch.cuda.graph: refused per graph, stock runs."""
    from ascend_graph_patch.aspects.capture_v2 import UNSEEN

    sc = SCENARIOS["dense_gqa"]
    arm = run_arm(sc, steps=6, before_capture=lambda: overlay("on"))
    assert arm.owned == {}
    assert set(arm.refused) == set(arm.descs) and set(arm.refused.values()) == {UNSEEN}
    assert arm.counters["updates.stock.unowned"] == 6
    assert arm.max_err < TOL
