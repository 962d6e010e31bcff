"""Measure the host cost of one replay step's attention update: stock, overlay, floor.

Everything runs in ONE process with the simulator in null-cost mode (runtime calls only record),
so what is timed is the Python on the host: the stock ``update_graph_params`` body, the overlay's
resolve + apply, and the floor, i.e. the bare runtime calls one update needs (begin / op / end /
record per task, with arguments prebuilt once). The overlay is enabled in-process before the
engine captures (tasks are registered at capture); the stock path is the unwrapped staticmethod.
The three are interleaved round by round so drift hits all of them alike.

Target kinds (FIA, FIA-v2, PA) update one task per layer under a target forward context. The
``MTP k=3`` kind is the merged multi-step draft graph of ``sim.draft_harness`` (the real
``_run_merged_draft`` in a real ``ACLGraphWrapper(use_eagle=True)``): 3 tasks per draft layer,
updated under a draft forward context with the arguments the proposer's
``_update_full_graph_params`` passes, ``draft_attn_metadatas`` included.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LAYERS = (1, 28, 64, 94)
BATCHES = (1, 64, 256)
QUICK_LAYERS = (1, 28)
QUICK_BATCHES = (1, 64)

TARGET_VS_STOCK = 0.5
TARGET_VS_FLOOR = 1.3
TARGET_CAPTURE = 1.05
TARGET_STARTUP_OFF_MS = 1.0


def _name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def _fia(layers: int, batches: tuple[int, ...]) -> Any:
    from torch_npu_sim.harness.target import LayerSpec, Scenario

    return Scenario(
        name=f"bench_fia_{layers}",
        layers=tuple(LayerSpec(_name(i), num_heads=2, num_kv_heads=1) for i in range(layers)),
        capture_sizes=batches,
        max_kv_len=128,
    )


def _fia_v2(layers: int, batches: tuple[int, ...]) -> Any:
    from torch_npu_sim.harness.target import LayerSpec, Scenario

    return Scenario(
        name=f"bench_fia_v2_{layers}",
        layers=tuple(
            LayerSpec(_name(i), num_heads=2, num_kv_heads=1, sinks=True) for i in range(layers)
        ),
        capture_sizes=batches,
        max_kv_len=128,
    )


def _pa(layers: int, batches: tuple[int, ...]) -> Any:
    from torch_npu_sim.harness.target import LayerSpec, Scenario

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
    from torch_npu_sim.harness.draft import DraftScenario, draft_layer
    from torch_npu_sim.harness.target import LayerSpec

    return DraftScenario(
        name=f"bench_mtp_k{MTP_STEPS}_{layers}",
        layers=tuple(LayerSpec(draft_layer(i), num_heads=2, num_kv_heads=1) for i in range(layers)),
        num_speculative_tokens=MTP_STEPS,
        capture_sizes=batches,
        max_kv_len=128,
    )


#: kind -> scenario factory(layers, capture sizes). A factory returning a ``DraftScenario`` is
#: built as a ``DraftEngine`` and measured as a draft update (see ``_DraftStep``).
KINDS: dict[str, Callable[[int, tuple[int, ...]], Any]] = {
    "FIA": _fia,
    "FIA-v2": _fia_v2,
    "PA": _pa,
    MTP_KIND: _mtp,
}


@dataclass
class Point:
    kind: str
    layers: int
    batch: int
    tasks: int = 0
    steps: int = 1  # draft steps per graph: tasks == layers * steps
    stock_us: float | None = None
    overlay_us: float | None = None
    floor_us: float | None = None
    error: str | None = None

    @property
    def vs_stock(self) -> float | None:
        if self.stock_us and self.overlay_us is not None:
            return self.overlay_us / self.stock_us
        return None

    @property
    def vs_floor(self) -> float | None:
        if self.floor_us and self.overlay_us is not None:
            return self.overlay_us / self.floor_us
        return None


@dataclass
class BenchResult:
    points: list[Point] = field(default_factory=list)
    capture: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, Any] = field(default_factory=dict)


def _prepare() -> None:
    from ascend_graph_patch import activation
    from torch_npu_sim.harness.target import _Process

    _Process.ensure()  # simulator + vllm-ascend imported
    activation.enable("on")  # idempotent; installs at once (modules are loaded)


def _stock_update() -> Callable[..., Any]:
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackendImpl

    raw = AscendAttentionBackendImpl.__dict__["update_graph_params"]
    fn = getattr(raw, "__wrapped__", raw)
    return fn.__func__ if isinstance(fn, staticmethod) else fn


class _Step:
    """One decode step's forward context for a captured size, kept open while timing.

    ``args`` are the positional arguments ``update_full_graph_params`` passes to
    ``update_graph_params``; ``source`` is what the overlay resolves its tasks from.
    """

    steps = 1

    def __init__(self, engine: Any, batch_size: int, rng: random.Random) -> None:
        from vllm.config import set_current_vllm_config

        self.engine = engine
        batch = engine.random_batch(rng)
        while batch.num_tokens_padded != batch_size:
            batch = engine.random_batch(rng)
        self.padded = batch_size
        self._cfg = set_current_vllm_config(engine.vllm_config)
        self._cfg.__enter__()
        engine._load_inputs(batch, batch_size)
        md = engine._metadata(
            num_reqs=batch.num_reqs,
            num_tokens_padded=batch_size,
            seq_lens=batch.seq_lens,
            mode=engine._full,
            capturing=False,
        )
        self._ctx = engine._context(
            md, batch_size, engine._full, engine._batch_descriptor(batch_size)
        )
        self._ctx.__enter__()
        from vllm.forward_context import get_forward_context

        self.fc = get_forward_context()
        e = engine
        self.args = (
            e.update_stream,
            self.fc,
            batch_size,
            e.vllm_config,
            e.vllm_config.speculative_config,
            batch_size,
            None,
        )
        from ascend_graph_patch.core.graph import TargetSource

        self.source: Any = TargetSource(self.fc.attn_metadata)

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)
        self._cfg.__exit__(None, None, None)


class _DraftStep(_Step):
    """One propose call's draft forward context (``is_draft_model=True``), kept open.

    Set up as ``DraftEngine.run_draft_graph`` does; ``args`` are what the proposer's
    ``_update_full_graph_params`` hands on (``num_dcp_pcp_tokens`` None, the per-step metadata
    list last), so stock takes its draft branch and the overlay its draft-source resolve.
    """

    def __init__(self, engine: Any, batch_size: int, rng: random.Random) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import get_forward_context

        from ascend_graph_patch.core.graph import DraftSource

        self.engine = engine
        self.steps = engine.draft.num_speculative_tokens
        batch = engine.draft_batch(rng)
        while batch.num_tokens_padded != batch_size:
            batch = engine.draft_batch(rng)
        self.padded = batch_size
        self._cfg = set_current_vllm_config(engine.vllm_config)
        self._cfg.__enter__()
        engine._load(batch, batch_size)
        per_step = engine._draft_metadata(batch, batch_size, True, False)
        self._ctx = engine._draft_context(
            per_step, batch_size, engine._full, engine._batch_descriptor(batch_size)
        )
        self._ctx.__enter__()
        self.fc = get_forward_context()
        p = engine.proposer
        self.args = (
            p.update_stream,
            self.fc,
            batch_size,
            p.vllm_config,
            p.vllm_config.speculative_config,
            None,
            per_step,
        )
        self.source = DraftSource(per_step)


def _floor_fn(step: _Step) -> tuple[Callable[[], None], int]:
    """Bare runtime calls of one update with the overlay's arguments prebuilt once."""
    import torch

    from ascend_graph_patch.aspects.capture import current_role
    from ascend_graph_patch.core.registry import REGISTRY

    owned = REGISTRY.lookup(current_role(step.fc), step.fc.batch_descriptor)
    if owned is None:
        raise RuntimeError("the overlay owns no graph for this size (capture not registered)")
    resolved = owned.resolve(step.source)
    stream = step.args[0]
    npu = torch.npu
    begin, end, stream_ctx = npu.graph_task_update_begin, npu.graph_task_update_end, npu.stream
    plan = [(t.handle, t.op, kw, t.event) for t, kw in resolved]

    def floor() -> None:
        with stream_ctx(stream):
            for handle, op, kwargs, event in plan:
                begin(stream, handle)
                op(**kwargs)
                end(stream)
                event.record(stream)

    return floor, len(plan)


def _time(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1000.0


def measure_point(
    engine: Any, kind: str, layers: int, batch: int, rounds: int, inner: int
) -> Point:
    """Median over ``rounds`` interleaved rounds of ``inner`` calls each, in microseconds."""
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackendImpl

    from ascend_graph_patch import state
    from torch_npu_sim import runtime

    point = Point(kind, layers, batch)
    stock = _stock_update()
    overlay = AscendAttentionBackendImpl.update_graph_params
    step = (_DraftStep if _is_draft(engine) else _Step)(engine, batch, random.Random(batch))
    try:
        floor, point.tasks = _floor_fn(step)
        point.steps = step.steps
        args = step.args
        calls = {"stock": lambda: stock(*args), "overlay": lambda: overlay(*args), "floor": floor}
        samples: dict[str, list[float]] = {k: [] for k in calls}
        with runtime.null_cost():
            for fn in calls.values():  # warm-up
                _time(fn, 3)
            owned_before = state.STATE.counters["updates.owned"]
            overlay(*args)
            if state.STATE.counters["updates.owned"] != owned_before + 1:
                # a stock fallback would time stock twice and call it the overlay
                raise RuntimeError("the overlay did not take the owned path for this step")
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
    finally:
        step.close()
    return point


def _is_draft(engine: Any) -> bool:
    from torch_npu_sim.harness.draft import DraftEngine

    return isinstance(engine, DraftEngine)


def _engine(scenario: Any, captured: tuple[int, ...]) -> Any:
    """Build and capture (null cost: the attention ops are recorded, not computed)."""
    from torch_npu_sim import runtime
    from torch_npu_sim.harness.draft import DraftEngine, DraftScenario
    from torch_npu_sim.harness.target import SimEngine

    engine = (DraftEngine if isinstance(scenario, DraftScenario) else SimEngine)(scenario)
    with runtime.null_cost():
        for size in captured:
            engine.capture(size)
    return engine


def sweep(
    kinds: list[str],
    layers: tuple[int, ...],
    batches: tuple[int, ...],
    rounds: int,
    inner: int,
    progress: Any = None,
) -> list[Point]:
    _prepare()
    points = []
    for kind in kinds:
        for n_layers in layers:
            engine = None
            try:
                engine = _engine(KINDS[kind](n_layers, batches), batches)
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
                    _close(engine)
                engine = None
                gc.collect()
    return points


def _close(engine: Any) -> None:
    """Close and let the engine's graphs die before the next engine captures.

    ``DraftEngine.close`` drops ``engine.wrapper`` but its proposer still holds the wrapper
    (``proposer._runnable``, a cycle through ``_run_merged_draft``): the old draft graphs would stay
    alive, the registry would see two live graphs per (draft, descriptor) and own neither.
    """
    engine.close()
    if getattr(engine, "proposer", None) is not None:
        engine.proposer = None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:160]


def capture_overhead(layers: int, batch: int, repeats: int) -> dict[str, Any]:
    """Capture time of one graph, overlay on vs off (same process, alternating)."""
    from ascend_graph_patch import activation
    from torch_npu_sim import runtime
    from torch_npu_sim.harness.target import SimEngine

    times: dict[str, list[float]] = {"stock": [], "overlay": []}
    for r in range(repeats):
        for arm in ("stock", "overlay") if r % 2 == 0 else ("overlay", "stock"):
            if arm == "stock":
                activation.disable()
            else:
                activation.enable("on")
            engine = SimEngine(KINDS["FIA"](layers, (batch,)))
            try:
                with runtime.null_cost():
                    t0 = time.perf_counter_ns()
                    engine.capture(batch)
                    times[arm].append((time.perf_counter_ns() - t0) / 1e6)
            finally:
                engine.close()
    activation.enable("on")
    stock, overlay = statistics.median(times["stock"]), statistics.median(times["overlay"])
    return {
        "layers": layers,
        "batch": batch,
        "repeats": repeats,
        "stock_ms": stock,
        "overlay_ms": overlay,
        "ratio": overlay / stock if stock else None,
        "target": TARGET_CAPTURE,
    }


def startup_cost(repeats: int) -> dict[str, Any]:
    """Loader start-up cost (ms) with the toggle off and on, in fresh interpreters."""
    from ascend_graph_patch import _bootstrap

    measure = getattr(_bootstrap, "measure_startup", None)
    out: dict[str, Any] = {"target_off_ms": TARGET_STARTUP_OFF_MS, "repeats": repeats}
    for mode in ("off", "on"):
        try:
            out[f"{mode}_ms"] = measure(mode, repeats) if measure else _importtime(mode, repeats)
        except Exception as exc:  # noqa: BLE001 - e.g. the .pth is not installed here
            out[f"{mode}_ms"] = None
            out[f"{mode}_error"] = _describe(exc)
    return out


def _importtime(mode: str, repeats: int) -> float:
    """Fallback: whole-interpreter ``-X importtime`` of ``ascend_graph_patch*`` modules (ms)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ASCEND_GRAPH_PATCH=mode)
    env.pop("TORCH_NPU_SIM", None)
    samples = []
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        total = 0
        for line in proc.stderr.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[2].strip().startswith(("ascend_graph_patch", "wrapt")):
                total += int(parts[0].split(":")[-1])
        samples.append(total / 1000.0)
    return statistics.median(samples)
