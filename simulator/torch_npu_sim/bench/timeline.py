"""A modelled step timeline, never a measurement: what stock's per-step barrier costs a decode
step, and what stream-ordered replay gives back, on an Ascend host.

One decode step is: the host prepares it (scheduling, inputs), [stock: waits until the compute
stream is idle], launches the FULL graph replay, updates each attention task (host cost per task;
each update runs on the update stream and records the event its task waits on), and launches the
sampler. The device runs the replay layer by layer (a layer's attention waits for its task's
update) and the sampler. With async scheduling the host may prepare step i while step i-1 runs (it
waits for step i-2's output); without it, for step i-1's. Four arms:

- ``stock``: stock's host update cost, the barrier before every replay;
- ``stock, no barrier``: the same without the barrier, UNSAFE (an update may overtake the previous
  replay: the race detector's negative control), shown for reference only;
- ``overlay``: the overlay's host update cost, stock's barrier;
- ``overlay + stream order``: the overlay's cost, no barrier; the update stream waits for what the
  compute stream held when the replay was launched (``ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream``).

The per-step host update time comes from ``projection`` (this run's measured glue plus the
published per-call costs); the rest of the step is the :class:`StepModel` constants, each stated
with its source or marked an assumption, and :func:`sensitivity` shows how the result moves when
each is halved or doubled. Per step the columns are: step time (steady state), the host's and the
device's idle share, and the physical limit max(host busy, device busy).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

#: Printed with every timeline: where the constants come from.
SOURCES = (
    "layer_device_us 60.5: 1.21 ms of replay for 20 layers (MiniCPM-o Talker on 910B3, issue "
    "13058, beside its 3.68 ms of update); host update per step: the projection (published "
    "per-call costs + this run's glue). Assumptions, no published figure: host_other_us (the "
    "step's host work besides the update: scheduling, input preparation, sampling bookkeeping), "
    "launch_us (one graph launch), sample_device_us (sampler and output copy on the device), "
    "update_device_us (one task update and its event record on the update stream); the device "
    "time per layer is taken as independent of the batch size (no published figure per batch)"
)

ARMS = ("stock", "stock, no barrier (unsafe)", "overlay", "overlay + stream order")


@dataclass(frozen=True)
class StepModel:
    """Modelled durations of one decode step outside the host update, in microseconds."""

    host_other_us: float = 1000.0
    launch_us: float = 30.0
    layer_device_us: float = 60.5
    sample_device_us: float = 100.0
    update_device_us: float = 5.0


@dataclass(frozen=True)
class Arm:
    name: str
    update_us: float  # host update time per step
    barrier: bool
    stream_order: bool


@dataclass
class Timeline:
    """Steady-state figures of one arm."""

    arm: str
    step_ms: float
    host_idle: float
    device_idle: float
    limit_ms: float
    unsafe: bool = False
    #: steps whose first update ran on the device before the previous step's work had ended
    #: (it may rewrite a task that replay has not run yet: the race the barrier prevents)
    overtaking_steps: int = 0


def simulate(
    model: StepModel,
    arm: Arm,
    tasks: int,
    device_layers: int,
    async_scheduling: bool = True,
    steps: int = 60,
    warmup: int = 10,
) -> Timeline:
    """Run ``steps`` decode steps of ``arm`` and report the steady state (after ``warmup``).

    ``tasks``: attention tasks updated per step (target and draft); ``device_layers``: layers the
    device runs per step (their attention waits, in order, for the first ``tasks`` updates)."""
    per_task = arm.update_us / tasks if tasks else 0.0
    layers = max(device_layers, tasks)
    host = compute = update = 0.0  # when the host, compute stream, update stream are next free
    done: list[float] = []
    overtaking = 0
    for i in range(steps):
        # async scheduling keeps one step in flight: step i waits for step i-2's output
        lag = 2 if async_scheduling else 1
        if i >= lag:
            host = max(host, done[i - lag])
        host += model.host_other_us
        if arm.barrier:
            host = max(host, compute)  # torch.npu.current_stream().synchronize()
        ordered_after = compute if arm.stream_order else 0.0  # update_stream.wait_stream(compute)
        host += model.launch_us
        layer_end = max(host, compute)  # the replay starts once launched and the stream is free
        issued = host
        update = max(update, ordered_after)
        previous_end = compute
        for k in range(layers):
            if k < tasks:
                issued += per_task
                started = max(update, issued)
                if k == 0 and started < previous_end:
                    overtaking += 1
                update = started + model.update_device_us
                layer_end = max(layer_end, update)  # the layer's attention waits on its event
            layer_end += model.layer_device_us
        host = issued if tasks else host
        compute = layer_end + model.sample_device_us
        done.append(compute)
    span = done[-1] - done[warmup - 1]
    step = span / (steps - warmup)
    host_busy = model.host_other_us + model.launch_us + arm.update_us
    device_busy = layers * model.layer_device_us + model.sample_device_us
    return Timeline(
        arm=arm.name,
        step_ms=step / 1000,
        host_idle=max(0.0, 1 - host_busy / step),
        device_idle=max(0.0, 1 - device_busy / step),
        limit_ms=max(host_busy, device_busy) / 1000,
        unsafe=not arm.barrier and not arm.stream_order,
        overtaking_steps=overtaking,
    )


def arms(stock_us: float, overlay_us: float) -> list[Arm]:
    return [
        Arm(ARMS[0], stock_us, barrier=True, stream_order=False),
        Arm(ARMS[1], stock_us, barrier=False, stream_order=False),
        Arm(ARMS[2], overlay_us, barrier=True, stream_order=False),
        Arm(ARMS[3], overlay_us, barrier=False, stream_order=True),
    ]


def shape_layers(row: dict[str, Any]) -> int:
    """Layers the device runs per step for a projection row (``tasks``: target + draft)."""
    return int(row["tasks"])


def timelines(
    projection: dict[str, Any], model: StepModel, async_scheduling: bool = True
) -> list[dict[str, Any]]:
    """Every projected shape's four arms."""
    out = []
    for row in projection["rows"]:
        tasks = int(row["tasks"])
        for arm in arms(row["stock_ms"] * 1000, row["overlay_ms"] * 1000):
            line = simulate(model, arm, tasks, shape_layers(row), async_scheduling)
            out.append({"shape": row["shape"], **asdict(line)})
    return out


#: The constants :func:`sensitivity` halves and doubles, and the host update (all arms' alike).
VARIED = ("host_other_us", "launch_us", "layer_device_us", "update_us")
#: The shapes :func:`sensitivity` varies: one host-bound, one device-bound once the overlay's
#: update is cheap (PA: the getter calls avoided).
SENSITIVITY_SHAPES = ("64 layers FIA", "64 layers PA")


def sensitivity(projection: dict[str, Any], model: StepModel) -> list[dict[str, Any]]:
    """For each of :data:`SENSITIVITY_SHAPES` the projection has (else its first shape), the
    step time of each arm with each constant halved and doubled."""
    rows = [r for r in projection["rows"] if r["shape"] in SENSITIVITY_SHAPES]
    out = []
    for row in rows or projection["rows"][:1]:
        tasks = int(row["tasks"])
        for name in ("(defaults)", *VARIED):
            for factor in (0.5, 2.0) if name != "(defaults)" else (1.0,):
                scaled, update_scale = model, 1.0
                if name == "update_us":
                    update_scale = factor
                elif name != "(defaults)":
                    scaled = replace(model, **{name: getattr(model, name) * factor})
                lines = {
                    a.name: simulate(scaled, a, tasks, shape_layers(row))
                    for a in arms(
                        row["stock_ms"] * 1000 * update_scale,
                        row["overlay_ms"] * 1000 * update_scale,
                    )
                }
                stock, ordered = lines[ARMS[0]], lines[ARMS[3]]
                out.append(
                    {
                        "shape": row["shape"],
                        "varied": name,
                        "factor": factor,
                        "stock_ms": stock.step_ms,
                        "overlay_ms": lines[ARMS[2]].step_ms,
                        "stream_ms": ordered.step_ms,
                        "stream_vs_overlay": ordered.step_ms / lines[ARMS[2]].step_ms,
                        "stream_vs_stock": ordered.step_ms / stock.step_ms,
                        "limit_ms": ordered.limit_ms,
                    }
                )
    return out


def report(projection: dict[str, Any], model: StepModel | None = None) -> dict[str, Any]:
    model = model or StepModel()
    return {
        "label": "modelled timeline, not a measurement",
        "model_us": asdict(model),
        "sources": SOURCES,
        "async_scheduling": timelines(projection, model, True),
        "sync_scheduling": timelines(projection, model, False),
        "sensitivity": sensitivity(projection, model),
    }


def _table(cols: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [cols, *body]) for i in range(len(cols))]
    return [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [cols, ["-" * w for w in widths], *body]
    ]


def render(data: dict[str, Any]) -> str:
    lines = [
        "MODELLED step timeline on an Ascend host, NOT a measurement (constants below; the host "
        "update per step from the projection). Async scheduling on:",
    ]
    cols = ["shape", "arm", "step ms", "host idle", "device idle", "limit ms", "overtaking"]
    body = [
        [
            r["shape"],
            r["arm"],
            f"{r['step_ms']:.2f}",
            f"{100 * r['host_idle']:.0f}%",
            f"{100 * r['device_idle']:.0f}%",
            f"{r['limit_ms']:.2f}",
            str(r["overtaking_steps"]),
        ]
        for r in data["async_scheduling"]
    ]
    lines += _table(cols, body)
    sync = {(r["shape"], r["arm"]): r for r in data["sync_scheduling"]}
    shapes = list(dict.fromkeys(r["shape"] for r in data["sync_scheduling"]))
    lines.append(
        "Async scheduling off (the host waits for each step's output, the barrier finds the "
        "device idle): step ms stock / overlay / stream-ordered: "
        + "; ".join(
            f"{s} {sync[(s, ARMS[0])]['step_ms']:.2f} / {sync[(s, ARMS[2])]['step_ms']:.2f} / "
            f"{sync[(s, ARMS[3])]['step_ms']:.2f}"
            for s in shapes
        )
    )
    lines.append("Sensitivity (each constant halved and doubled):")
    cols = ["shape", "varied", "x", "stock ms", "overlay ms", "stream-ordered ms"]
    cols += ["stream/overlay", "stream/stock", "limit ms"]
    body = [
        [
            r["shape"],
            r["varied"],
            f"{r['factor']:g}",
            f"{r['stock_ms']:.2f}",
            f"{r['overlay_ms']:.2f}",
            f"{r['stream_ms']:.2f}",
            f"{r['stream_vs_overlay']:.3f}",
            f"{r['stream_vs_stock']:.3f}",
            f"{r['limit_ms']:.2f}",
        ]
        for r in data["sensitivity"]
    ]
    lines += _table(cols, body)
    lines.append("model (us): " + ", ".join(f"{k}={v:g}" for k, v in data["model_us"].items()))
    lines.append(data["sources"])
    lines.append(
        "overtaking: steps (of 60) whose first update ran on the device before the previous "
        "step's work ended. 'stock, no barrier' is unsafe (an update may overtake the previous "
        "replay; the simulator's race detector flags it): for reference, never an option."
    )
    return "\n".join(lines)
