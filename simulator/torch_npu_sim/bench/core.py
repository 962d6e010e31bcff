"""Measure the host cost of one replay step's attention update: stock, overlay, floor.

Everything runs in ONE process with the simulator in null-cost mode (runtime calls only record),
so what is timed is the Python on the host: the stock ``update_graph_params`` body, the overlay's
resolve + apply, and the floor, i.e. the bare runtime calls one update needs (begin / op / end /
record per task, with arguments prebuilt once). The overlay is enabled in-process before the
engine captures (tasks are registered at capture); the stock path is the unwrapped staticmethod.
The three are interleaved round by round so drift hits all of them alike.

Target kinds (FIA, FIA-v2, PA, MLA) update one task per layer under a target forward context.
The ``MTP k=3`` kind is the merged multi-step draft graph of ``harness.draft`` (the real
``_run_merged_draft`` in a real ``ACLGraphWrapper(use_eagle=True)``): 3 tasks per draft layer,
updated under a draft forward context with the arguments the proposer's
``_update_full_graph_params`` passes, ``draft_attn_metadatas`` included; ``MLA+MTP k=3`` is the
same with MLA draft layers (DeepSeek's MTP). MLA kinds go through ``AscendMLAImpl``'s own update
(stock) and the overlay's wrapper on it. ``Hybrid+MTP`` is a hybrid model's target graph (three
GDN keys per attention key in the metadata, v1's order, the MTP draft's key among the attention
ones) updated with an MTP speculative config, as the release's runner updates it. Engines are built,
captured and fed batches through the workload protocol; what is timed is the update call alone,
inside the step's open forward context (``open_step``).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

LAYERS = (1, 28, 64, 94)
BATCHES = (1, 64, 256)
QUICK_LAYERS = (1, 28)
QUICK_BATCHES = (1, 64)

#: Never slower than stock, at any shape (one-layer graphs included).
TARGET_VS_STOCK_ANY = 1.0
#: From this many layers up, the fixed per-update cost is amortised and the tighter targets hold.
AMORTISED_FROM_LAYERS = 28
TARGET_VS_STOCK = 0.5
TARGET_VS_FLOOR = 1.3
TARGET_CAPTURE = 1.03
TARGET_STARTUP_OFF_MS = 1.0
#: Decided on instruction counts (``--instructions``), which no neighbour's load moves: tighter.
TARGET_VS_FLOOR_INSTRUCTIONS = 1.15
TARGET_CAPTURE_INSTRUCTIONS = 1.02
WALL_CLOCK, INSTRUCTIONS = "wall-clock", "instructions"


def stock_target(layers: int) -> float:
    return TARGET_VS_STOCK if layers >= AMORTISED_FROM_LAYERS else TARGET_VS_STOCK_ANY


def floor_target(layers: int, figure: str = WALL_CLOCK) -> float | None:
    """None below ``AMORTISED_FROM_LAYERS``: one bare call cannot carry a per-update cost."""
    if layers < AMORTISED_FROM_LAYERS:
        return None
    return TARGET_VS_FLOOR_INSTRUCTIONS if figure == INSTRUCTIONS else TARGET_VS_FLOOR


def _name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def _fia(layers: int, batches: tuple[int, ...]) -> Any:
    from torch_npu_sim.harness.spec import LayerSpec, Scenario

    return Scenario(
        name=f"bench_fia_{layers}",
        layers=tuple(LayerSpec(_name(i), num_heads=2, num_kv_heads=1) for i in range(layers)),
        capture_sizes=batches,
        max_kv_len=128,
    )


def _fia_v2(layers: int, batches: tuple[int, ...]) -> Any:
    from torch_npu_sim.harness.spec import LayerSpec, Scenario

    return Scenario(
        name=f"bench_fia_v2_{layers}",
        layers=tuple(
            LayerSpec(_name(i), num_heads=2, num_kv_heads=1, sinks=True) for i in range(layers)
        ),
        capture_sizes=batches,
        max_kv_len=128,
    )


def _pa(layers: int, batches: tuple[int, ...]) -> Any:
    from torch_npu_sim.harness.spec import LayerSpec, Scenario

    return Scenario(
        name=f"bench_pa_{layers}",
        layers=tuple(LayerSpec(_name(i), num_heads=2, num_kv_heads=2) for i in range(layers)),
        capture_sizes=batches,
        max_kv_len=128,
        pa_shape_list=batches,
    )


MTP_KIND = "MTP k=3"
MTP_STEPS = 3


def _mtp(layers: int, batches: tuple[int, ...]) -> Any:
    """A merged MTP draft of ``layers`` attention layers, 3 speculative tokens (one KV group)."""
    from torch_npu_sim.harness.spec import DraftScenario, LayerSpec, draft_layer

    return DraftScenario(
        name=f"bench_mtp_k{MTP_STEPS}_{layers}",
        layers=tuple(LayerSpec(draft_layer(i), num_heads=2, num_kv_heads=1) for i in range(layers)),
        num_speculative_tokens=MTP_STEPS,
        capture_sizes=batches,
        max_kv_len=128,
    )


MLA_KIND = "MLA"
MLA_MTP_KIND = "MLA+MTP k=3"


def _mla_layer(name: str) -> Any:
    from torch_npu_sim.harness.spec import LayerSpec

    return LayerSpec(name, num_heads=4, num_kv_heads=1, head_size=64, kind="mla")


def _mla(layers: int, batches: tuple[int, ...]) -> Any:
    """``layers`` MLA layers (DeepSeek-like: AscendMLAImpl's graphs and its own update)."""
    from torch_npu_sim.harness.spec import Scenario

    return Scenario(
        name=f"bench_mla_{layers}",
        layers=tuple(_mla_layer(_name(i)) for i in range(layers)),
        capture_sizes=batches,
        max_kv_len=128,
    )


def _mla_mtp(layers: int, batches: tuple[int, ...]) -> Any:
    """A merged MTP draft of ``layers`` MLA layers, 3 speculative tokens (DeepSeek's MTP)."""
    from torch_npu_sim.harness.spec import DraftScenario, draft_layer

    return DraftScenario(
        name=f"bench_mla_mtp_k{MTP_STEPS}_{layers}",
        layers=tuple(_mla_layer(draft_layer(i)) for i in range(layers)),
        num_speculative_tokens=MTP_STEPS,
        capture_sizes=batches,
        max_kv_len=128,
    )


HYBRID_KIND = "Hybrid+MTP"
#: The real hybrid pattern (Qwen3.5, Qwen3-Next): three linear-attention (GDN) layers before
#: every full-attention layer.
LINEAR_PER_ATTENTION = 3
HYBRID_MTP_KEY = "mtp.layers.0.self_attn.attn"


def _hybrid_mtp(layers: int, batches: tuple[int, ...]) -> Any:
    """A hybrid model's target graph with an MTP draft (Qwen3.5 + MTP on the v1 runner):
    ``layers`` attention layers (one FIA task each), each after three GDN layers whose keys sit
    in the metadata too, in v1's order: the attention group first (the MTP draft layer's key in
    it, after the attention layers: one object for all), the GDN groups last, split as vLLM
    splits them. The update is called with method ``mtp`` (``stack.mtp_config``): stock then
    zips its tasks with every ``layers.N.self_attn.attn`` key sorted by N, the MTP key first."""
    from torch_npu_sim.harness.spec import LayerSpec, Scenario

    specs = []
    for i in range(layers):
        base = (LINEAR_PER_ATTENTION + 1) * i
        specs += [
            LayerSpec(
                f"language_model.model.layers.{base + j}.linear_attn",
                num_heads=2,
                num_kv_heads=1,
                kind="linear",
            )
            for j in range(LINEAR_PER_ATTENTION)
        ]
        name = f"language_model.model.layers.{base + LINEAR_PER_ATTENTION}.self_attn.attn"
        specs.append(LayerSpec(name, num_heads=2, num_kv_heads=1))
    return Scenario(
        name=f"bench_hybrid_mtp_{layers}",
        layers=tuple(specs),
        capture_sizes=batches,
        max_kv_len=128,
        metadata_order="groups",
        mtp_key=HYBRID_MTP_KEY,
        linear_kv_groups=True,
    )


#: kind -> scenario factory(layers, capture sizes). A ``DraftScenario`` is built as a draft engine
#: and measured as a draft update. ``layers`` counts the layers that capture tasks (a hybrid
#: kind's linear layers come on top).
KINDS: dict[str, Callable[[int, tuple[int, ...]], Any]] = {
    "FIA": _fia,
    "FIA-v2": _fia_v2,
    "PA": _pa,
    MTP_KIND: _mtp,
    MLA_KIND: _mla,
    MLA_MTP_KIND: _mla_mtp,
    HYBRID_KIND: _hybrid_mtp,
}
#: The kinds measured as a merged draft graph's update (``MTP_STEPS`` tasks per layer).
DRAFT_KINDS = frozenset({MTP_KIND, MLA_MTP_KIND})


@dataclass
class Point:
    kind: str
    layers: int
    batch: int
    tasks: int = 0
    steps: int = 1  # draft steps per graph: tasks == layers * steps
    floor_getter_calls: int = 0  # PA workspace getter calls in the floor (one per KV group)
    getter_us: float | None = None  # one simulated PA workspace getter call, timed alone
    stock_us: float | None = None
    overlay_us: float | None = None
    floor_us: float | None = None
    #: Instructions of one call (callgrind), where counted: they decide the targets then.
    stock_ir: float | None = None
    overlay_ir: float | None = None
    floor_ir: float | None = None
    error: str | None = None

    @property
    def decided_by(self) -> str:
        """The figure the targets are decided on: instructions where counted."""
        return INSTRUCTIONS if self.overlay_ir is not None else WALL_CLOCK

    @property
    def wall_vs_stock(self) -> float | None:
        return _ratio(self.overlay_us, self.stock_us)

    @property
    def wall_vs_floor(self) -> float | None:
        return _ratio(self.overlay_us, self.floor_us)

    @property
    def ir_vs_stock(self) -> float | None:
        return _ratio(self.overlay_ir, self.stock_ir)

    @property
    def ir_vs_floor(self) -> float | None:
        return _ratio(self.overlay_ir, self.floor_ir)

    @property
    def vs_stock(self) -> float | None:
        """Overlay / stock in the deciding figure."""
        return self.ir_vs_stock if self.decided_by == INSTRUCTIONS else self.wall_vs_stock

    @property
    def vs_floor(self) -> float | None:
        """Overlay / floor in the deciding figure."""
        return self.ir_vs_floor if self.decided_by == INSTRUCTIONS else self.wall_vs_floor

    @property
    def target_vs_stock(self) -> float:
        return stock_target(self.layers)

    @property
    def target_vs_floor(self) -> float | None:
        return floor_target(self.layers, self.decided_by)

    @property
    def met(self) -> bool:
        """Every target of this point met (an errored point meets none)."""
        if self.error or self.vs_stock is None or self.vs_stock > self.target_vs_stock:
            return False
        target = self.target_vs_floor
        return target is None or (self.vs_floor is not None and self.vs_floor <= target)


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if base and value is not None else None


@dataclass
class BenchResult:
    points: list[Point] = field(default_factory=list)
    capture: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, Any] = field(default_factory=dict)


def _prepare() -> None:
    from ascend_graph_patch import activation
    from torch_npu_sim.harness import process

    process.ensure()  # simulator + vllm-ascend imported
    activation.enable("on")  # idempotent; installs at once (modules are loaded)


def _stock_update(impl_cls: Any = None) -> Callable[..., Any]:
    """vllm-ascend's own ``update_graph_params`` of ``impl_cls`` (default: the backend's impl)."""
    if impl_cls is None:
        from vllm_ascend.attention.attention_v1 import AscendAttentionBackendImpl

        impl_cls = AscendAttentionBackendImpl
    fn = impl_cls.__dict__["update_graph_params"]
    while True:  # through every wrapper and staticmethod, down to vllm-ascend's function
        if isinstance(fn, staticmethod):
            fn = fn.__func__
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return fn


def _source(step: Any) -> Any:
    """What the overlay resolves the step's tasks from: per draft step, or the target's metadata."""
    from ascend_graph_patch.core.graph import DraftSource, TargetSource

    if step.draft_metadatas is not None:
        return DraftSource(step.draft_metadatas)
    return TargetSource(step.forward_context.attn_metadata)


def _floor_fn(step: Any) -> tuple[Callable[[], None], int, list[tuple[Callable[..., Any], dict]]]:
    """The runtime calls one update cannot avoid, with their arguments prebuilt once.

    Per task: begin, op, end, record. For PA, also the workspace getter, once per distinct
    (metadata object, static signature): a PA workspace must be sized for the step's fresh
    lengths, so no update can skip that call (stock makes it once per layer). Returns the floor,
    its task count and its getter calls (getter, arguments).
    """
    import torch

    from ascend_graph_patch.aspects.capture import current_role
    from ascend_graph_patch.core.providers import LengthsWorkspaceProvider
    from ascend_graph_patch.core.registry import REGISTRY

    fc = step.forward_context
    owned = REGISTRY.lookup(current_role(fc), fc.batch_descriptor)
    if owned is None:
        raise RuntimeError("the overlay owns no graph for this size (capture not registered)")
    resolved = owned.resolve(_source(step))
    stream = step.update_args[0]
    npu = torch.npu
    begin, end, stream_ctx = npu.graph_task_update_begin, npu.graph_task_update_end, npu.stream
    plan = [(t.handle, t.op, kw, t.event) for t, kw in resolved]
    getters: dict[tuple[int, int], tuple[Callable[..., Any], dict[str, Any]]] = {}
    for task, kwargs in resolved:
        provider = task.provider
        if isinstance(provider, LengthsWorkspaceProvider):
            lengths = kwargs[provider.lengths_key]
            key = (provider.group, id(lengths))  # one metadata object: the same lengths object
            args = {**provider.static, provider.lengths_key: lengths}
            getters.setdefault(key, (provider.workspace_for, args))
    workspaces = list(getters.values())

    def floor() -> None:
        for getter, args in workspaces:
            getter(**args)
        with stream_ctx(stream):
            for handle, op, kwargs, event in plan:
                begin(stream, handle)
                op(**kwargs)
                end(stream)
                event.record(stream)

    return floor, len(plan), workspaces


def _time(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1000.0


@contextmanager
def point_calls(
    engine: Any, kind: str, layers: int, batch: int
) -> Iterator[tuple[Point, dict[str, Callable[[], Any]]]]:
    """The point's metadata and its callables (stock, overlay, floor, and the PA workspace
    getter alone), inside one open step at null cost, each warmed up and the overlay checked
    to take its owned path; for the wall-clock and the instruction measurements alike."""
    from ascend_graph_patch import state
    from torch_npu_sim import runtime

    point = Point(kind, layers, batch)
    # Both called as the runner calls them, through the class attribute (update_full_graph_params:
    # ``impl_cls.update_graph_params(...)``, the model's backend's impl: MLA's has its own), so
    # an attribute's binding cost counts too.
    impl_cls = type(next(layer.impl for layer in engine.stack.layers if layer.impl is not None))
    stock_cls = type(
        "StockImpl", (), {"update_graph_params": staticmethod(_stock_update(impl_cls))}
    )
    overlay_cls = impl_cls
    rng = random.Random(batch)
    work = engine.next_batch(rng)
    while work.num_tokens_padded != batch:
        work = engine.next_batch(rng)
    with engine.open_step(work) as step:
        floor, point.tasks, getters = _floor_fn(step)
        point.floor_getter_calls = len(getters)
        point.steps = len(step.draft_metadatas) if step.draft_metadatas is not None else 1
        args = step.update_args
        calls: dict[str, Callable[[], Any]] = {
            "stock": lambda: stock_cls.update_graph_params(*args),
            "overlay": lambda: overlay_cls.update_graph_params(*args),
            "floor": floor,
        }
        if getters:
            getter, getter_args = getters[0]
            calls["getter"] = lambda: getter(**getter_args)
        with runtime.null_cost():
            for fn in calls.values():  # warm-up (also past the interpreter's specialising)
                _time(fn, WARMUP_CALLS)
            owned_before = state.STATE.counters["updates.owned"]
            overlay_cls.update_graph_params(*args)
            if state.STATE.counters["updates.owned"] != owned_before + 1:
                # a stock fallback would time stock twice and call it the overlay
                raise RuntimeError("the overlay did not take the owned path for this step")
            yield point, calls


#: Calls of each callable before it is measured.
WARMUP_CALLS = 10


def measure_point(
    engine: Any, kind: str, layers: int, batch: int, rounds: int, inner: int
) -> Point:
    """Median over ``rounds`` interleaved rounds of ``inner`` calls each, in microseconds."""
    with point_calls(engine, kind, layers, batch) as (point, calls):
        samples: dict[str, list[float]] = {k: [] for k in calls}
        gc.disable()
        try:
            order = list(calls)
            for r in range(rounds):
                for name in order if r % 2 == 0 else reversed(order):
                    samples[name].append(_time(calls[name], inner))
        finally:
            gc.enable()
    point.stock_us = statistics.median(samples["stock"])
    point.overlay_us = statistics.median(samples["overlay"])
    point.floor_us = statistics.median(samples["floor"])
    if "getter" in samples:
        point.getter_us = statistics.median(samples["getter"])
    return point


def _engine(scenario: Any) -> Any:
    """Build and capture every size (null cost: the attention ops are recorded, not computed;
    except for MLA, whose decode reshapes what a functional op returns, its value up-projection:
    an MLA engine captures with its ops computed). The timed updates run at null cost alike."""
    from torch_npu_sim import runtime
    from torch_npu_sim.harness import scenarios

    engine = scenarios.build(scenario)
    mla = any(spec.kind == "mla" for spec in scenario.layers)
    try:
        with runtime.null_cost(not mla):
            engine.capture()
    except BaseException:
        engine.close()
        raise
    return engine


def sweep(
    kinds: list[str],
    layers: tuple[int, ...],
    batches: tuple[int, ...],
    rounds: int,
    inner: int,
    progress: Any = None,
    points: list[Point] | None = None,
) -> list[Point]:
    """Measure every point; appended to ``points`` (if given) as they finish, so that an
    interrupted sweep still has what it measured."""
    _prepare()
    points = [] if points is None else points
    for kind in kinds:
        for n_layers in layers:
            engine = None
            try:
                engine = _engine(KINDS[kind](n_layers, batches))
                for batch in batches:
                    try:
                        points.append(measure_point(engine, kind, n_layers, batch, rounds, inner))
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        points.append(Point(kind, n_layers, batch, error=_describe(exc)))
                    if progress is not None:
                        progress.update(1)
            except Exception as exc:  # noqa: BLE001
                for batch in batches[
                    len([p for p in points if p.kind == kind and p.layers == n_layers]) :
                ]:
                    points.append(Point(kind, n_layers, batch, error=_describe(exc)))
                    if progress is not None:
                        progress.update(1)
            finally:
                if engine is not None:
                    engine.close()
                engine = None
                gc.collect()
    return points


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:160]


#: Graph sizes one capture-overhead sample captures: several graphs, so a sample is long enough
#: for the ~2% the overlay adds to stand out of a shared machine's noise.
CAPTURE_SIZES = (8, 16, 32, 64)


def capture_overhead(layers: int, sizes: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Capture cost of one engine's graphs (``sizes``), overlay on vs off, in one process.

    The cost is the capturing thread's CPU time (a loaded machine's waits for a core are not
    capture work; the capture runs in this thread). One untimed warm-up per arm first (the first
    capture in a process pays one-off costs), then ``repeats`` pairs back to back, in alternating
    order; the ratio is the median of the pairs' ratios, so drift between repeats cancels.
    Each capture runs with the heap frozen, as vLLM's ``GPUModelRunner._freeze_gc`` freezes it
    around ``capture_model`` (which vllm-ascend's runner calls): without it, whichever arm happens
    to cross a collection threshold pays a full-heap collection into its capture time.
    """
    from ascend_graph_patch import activation
    from torch_npu_sim import runtime
    from torch_npu_sim.harness import scenarios

    times: dict[str, list[float]] = {"stock": [], "overlay": []}
    for r in range(-1, repeats):
        for arm in ("stock", "overlay") if r % 2 == 0 else ("overlay", "stock"):
            if arm == "stock":
                activation.disable()
            else:
                activation.enable("on")
            engine = scenarios.build(KINDS["FIA"](layers, sizes))
            gc.collect()
            gc.freeze()  # as the runner captures (below)
            try:
                with runtime.null_cost():
                    t0 = time.thread_time_ns()
                    engine.capture()
                    elapsed = (time.thread_time_ns() - t0) / 1e6
            finally:
                gc.unfreeze()
                engine.close()
            if r >= 0:
                times[arm].append(elapsed)
    activation.enable("on")
    stock, overlay = statistics.median(times["stock"]), statistics.median(times["overlay"])
    pairs = [o / s for s, o in zip(times["stock"], times["overlay"], strict=True) if s]
    return {
        "layers": layers,
        "sizes": list(sizes),
        "repeats": repeats,
        "stock_ms": stock,
        "overlay_ms": overlay,
        "ratio": statistics.median(pairs) if pairs else None,
        "target": TARGET_CAPTURE,
    }


def startup_cost(repeats: int) -> dict[str, Any]:
    """Loader start-up cost (ms) with the toggle off and on, in fresh interpreters."""
    from ascend_graph_patch import _bootstrap

    out: dict[str, Any] = {"target_off_ms": TARGET_STARTUP_OFF_MS, "repeats": repeats}
    for mode in ("off", "on"):
        try:
            out[f"{mode}_ms"] = _bootstrap.measure_startup(mode, repeats)
        except Exception as exc:  # noqa: BLE001 - e.g. the .pth is not installed here
            out[f"{mode}_ms"] = None
            out[f"{mode}_error"] = _describe(exc)
    return out
