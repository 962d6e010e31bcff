"""Model runner v2: target (`ModelAclGraphManager`) and draft prefill
(`PrefillEagleAclGraphManager`) graphs owned by the overlay through the v2 seams, keyed by their
`BatchExecutionDescriptor`.

Each arm builds a fresh `V2Engine` (same seed: same batches, weights, KV history); eager runs
first in each step and puts back the KV slots it wrote. The overlay is enabled before the engine
is built, as in a real process (the post-import hook fires when the v2 modules load, before the
runner's `torch_cuda_wrapper` copies `torch_npu_graph_wrapper` into `torch.cuda.graph`).

The v2 target matrix follows the v1 overlay matrix (`harness/scenarios.py`): every scenario the
v2 manager can run (catalogue names `v2_<scenario>`), 150 replay steps each with random batch
sizes and KV lengths (padding included). Stock v2 behaviour is recorded on each v2 scenario
(`stock`); where stock fails, the exact failure is asserted as evidence and the overlay is held to
eager instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from ascend_graph_patch.core.kinds import FIA, FIA_V2, MLA, PA
from tests.overlay_support import OverlayArm, assert_bitwise, overlay_arm
from torch_npu_sim.harness.scenarios import (
    NOT_ON_V2,
    SCENARIOS,
    V2_DRAFT_MODEL,
    V2_SCENARIOS,
    build,
    v2_name,
)
from torch_npu_sim.harness.spec import Scenario, V2Scenario

STEPS = 150
TOL = 1e-5  # as the v1 matrix (tests/overlay_support.py); measured max 1.1e-06
V2_MODULES = (
    "vllm_ascend.ops",
    "vllm_ascend.attention.attention_v1",
    "vllm_ascend.compilation.acl_graph",
    "vllm_ascend.worker.v2.aclgraph_utils",
    "vllm_ascend.worker.v2.utils",
    "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph",
)
DRAFT_PREFILL = "v2_draft_prefill"
DRAFT = V2_DRAFT_MODEL


@dataclass
class Arm:
    """A v2 arm: the overlay's record and the graph descriptors the manager captured."""

    overlay: OverlayArm
    descs: list[Any]

    @property
    def counters(self) -> dict[str, int]:
        return self.overlay.counters

    @property
    def outputs(self) -> list[Any]:
        return self.overlay.outputs

    @property
    def owned(self) -> dict[Any, list[tuple]]:
        """descriptor -> (kind, layer name, metadata key, step) per task, in capture order."""
        return {d: t for (_, d), t in self.overlay.tasks.items()}

    @property
    def refused(self) -> dict[Any, str]:
        return {desc: why for (_, desc), why in self.overlay.refused.items()}

    @property
    def max_err(self) -> float:
        return self.overlay.max_eager_error

    @property
    def failure(self) -> str:
        assert self.overlay.error is not None, "the arm did not fail"
        return f"crash: {self.overlay.error}"


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
    name: str,
    steps: int = STEPS,
    *,
    eager: bool = True,
    after_build: Callable[[], None] | None = None,
    after_capture: Callable[[], None] | None = None,
) -> Arm:
    """One arm of a v2 catalogue workload, fixed batch seed, the overlay as the test set it. Eager
    leaves the KV caches as it found them, so skipping it (``eager=False``) leaves the graph
    outputs unchanged. A step that raises ends the arm (``arm.failure``)."""
    descs: list[Any] = []

    def engine() -> Any:
        workload = build(name)
        if after_build is not None:
            after_build()
        return workload

    arm = overlay_arm(
        name,
        None,
        steps,
        seed=99,
        eager=eager,
        build=engine,
        before_steps=(lambda w: after_capture()) if after_capture is not None else None,
        after_steps=lambda w: descs.extend(w.manager.graphs),
    )
    return Arm(arm, descs)


def test_release_model_manager_cannot_be_built_on_vllm_0_23() -> None:
    """Evidence for the harness shim: stock v2 target capture cannot even start on vLLM 0.23.0."""
    from torch_npu_sim.harness.v2 import stock_model_manager_error

    for name in V2_MODULES:
        importlib.import_module(name)
    engine: Any = build(v2_name("dense_gqa"))
    try:
        error = stock_model_manager_error(engine.vllm_config, engine.runner)
    finally:
        engine.close()
    assert isinstance(error, TypeError)
    assert "lora_capture_cases" in str(error)


def expected_tasks(sc: Scenario, num_tokens: int) -> list[tuple[str, str, str, int]]:
    """What a target graph must own: one task per attention layer, in model order, of the kind
    stock captures at that size (MLA for MLA layers, PA on `pa_shape_list` sizes and for 512-dim
    heads, FIA v2 with sinks, else FIA), keyed by the layer's metadata key (its KV-sharing
    target's, if any)."""
    tasks = []
    for spec in sc.layers:
        if not spec.captures_task:
            continue  # linear-attention layers capture no attention task
        if spec.kind == "mla":
            kind = MLA
        elif num_tokens in sc.pa_shape_list or spec.head_size == 512:
            kind = PA
        else:
            kind = FIA_V2 if spec.sinks else FIA
        tasks.append((kind, spec.name, spec.kv_sharing_target or spec.name, 0))
    return tasks


def n_attention(sc: Scenario) -> int:
    return sum(1 for spec in sc.layers if spec.captures_task)


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
            cache[name] = run_arm(v2_name(name))
        return cache[name]

    return get


def _v2_target(name: str) -> V2Scenario:
    if name in NOT_ON_V2:
        pytest.skip(f"not a v2 target path: {NOT_ON_V2[name]}")
    return V2_SCENARIOS[v2_name(name)]


def assert_stock_as_recorded(name: str, stock: Arm) -> bool:
    """Stock v2 behaves as the v2 scenario records (ok within tolerance, or the exact failure on
    the first replayed step). True when stock works."""
    recorded = V2_SCENARIOS[v2_name(name)].stock
    if recorded == "ok":
        assert stock.overlay.error is None, stock.failure
        assert len(stock.outputs) == STEPS and stock.max_err < TOL
        return True
    assert stock.failure == recorded
    assert stock.outputs == []
    return False


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_v2_target_overlay_equals_stock_equals_eager(
    name: str, overlay: Callable[[str], None], stock_arm: Callable[[str], Arm]
) -> None:
    sc = _v2_target(name).base
    stock_ok = assert_stock_as_recorded(name, stock := stock_arm(name))
    overlay("on")
    # Where stock works, bitwise == stock carries stock's eager check over (same error, exactly);
    # where it fails, the overlay is compared with eager directly.
    ours = run_arm(v2_name(name), eager=not stock_ok)
    assert ours.overlay.error is None, ours.failure
    assert len(ours.outputs) == STEPS
    if stock_ok:
        assert_bitwise(ours.overlay, stock.overlay)
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
    sc = _v2_target(name).base
    stock_ok = assert_stock_as_recorded(name, stock := stock_arm(name))
    overlay("verify")
    arm = run_arm(v2_name(name), eager=not stock_ok)  # stock works: bitwise == stock implies eager
    assert arm.overlay.error is None, arm.failure
    assert len(arm.outputs) == STEPS
    assert arm.counters["verify.updates"] == STEPS
    assert arm.counters.get("verify.mismatches", 0) == 0
    if stock_ok:
        assert arm.counters["verify.tasks"] == STEPS * n_attention(sc)
        assert "verify.stock_failed" not in arm.counters
        assert_bitwise(
            arm.overlay, stock.overlay
        )  # verify applies the stock update after comparing
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
    _v2_target(name)
    stock_ok = assert_stock_as_recorded(name, stock := stock_arm(name))
    overlay("observe")
    arm = run_arm(v2_name(name), eager=False)
    assert set(arm.owned) == set(arm.descs)  # tasks are recorded ...
    assert "updates.owned" not in arm.counters  # ... but never applied
    if stock_ok:
        assert arm.overlay.error is None, arm.failure
        assert_bitwise(arm.overlay, stock.overlay)
        assert arm.counters["updates.observed"] == STEPS
    else:
        assert arm.failure == V2_SCENARIOS[v2_name(name)].stock  # stock's failure, exactly
        assert arm.outputs == []


def test_v2_draft_prefill_overlay_equals_stock_equals_eager(
    overlay: Callable[[str], None],
) -> None:
    from ascend_graph_patch import activation

    stock = run_arm(DRAFT_PREFILL)
    assert stock.overlay.error is None and len(stock.outputs) == STEPS
    assert stock.max_err < TOL
    overlay("on")
    ours = run_arm(DRAFT_PREFILL)
    assert_bitwise(ours.overlay, stock.overlay)
    assert ours.max_err < TOL
    assert set(ours.owned) == set(ours.descs)
    assert all(d.uniform_token_count == 2 for d in ours.descs)
    for tasks in ours.owned.values():
        assert [t[1] for t in tasks] == [spec.name for spec in DRAFT.layers]
    assert ours.counters["updates.owned"] == STEPS
    assert ours.counters["tasks.updated"] == STEPS * len(DRAFT.layers)
    activation.disable()
    overlay("observe")
    observed = run_arm(DRAFT_PREFILL, eager=False)
    assert_bitwise(observed.overlay, stock.overlay)
    assert observed.counters["updates.observed"] == STEPS
    assert "updates.owned" not in observed.counters


def test_v2_draft_prefill_verify_zero_mismatches(overlay: Callable[[str], None]) -> None:
    overlay("verify")
    arm = run_arm(DRAFT_PREFILL)
    assert arm.overlay.error is None and len(arm.outputs) == STEPS
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

        @property
        def value_keys(self) -> tuple[str, ...]:
            return self.original.value_keys

        def values(self, metadata: Any) -> dict:
            values = self.original.values(metadata)
            kv = list(values["actual_seq_lengths_kv"])
            values["actual_seq_lengths_kv"] = kv[1:] + kv[:1]
            return values

    for graph in REGISTRY.graphs():
        graph.tasks[0].provider = Shifted(graph.tasks[0].provider)


def test_v2_wrong_binding_caught_by_verify_and_eager(overlay: Callable[[str], None]) -> None:
    from ascend_graph_patch import activation

    overlay("verify")
    checked = run_arm(DRAFT_PREFILL, steps=8, after_capture=_shift_first_task)
    assert checked.counters["verify.mismatches"] == 8  # one wrong task per update
    activation.disable()
    overlay("on")
    wrong = run_arm(DRAFT_PREFILL, steps=8, after_capture=_shift_first_task)
    assert wrong.max_err > 1e-2


def test_v2_draft_decode_graphs_refused_with_reason(overlay: Callable[[str], None]) -> None:
    from ascend_graph_patch import status
    from ascend_graph_patch.aspects.capture_v2 import DECODE

    overlay("on")
    engine: Any = build(V2Scenario("v2_draft_decode", DRAFT, role="draft"))
    try:
        engine.capture()
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

    arm = run_arm(v2_name("dense_gqa"), steps=6, after_build=lambda: overlay("on"))
    assert arm.owned == {}
    assert set(arm.refused) == set(arm.descs) and set(arm.refused.values()) == {UNSEEN}
    assert arm.counters["updates.stock.unowned"] == 6
    assert arm.max_err < TOL
