"""A projection, never a measurement: per-step host update time on an Ascend host.

On hardware each runtime call of an update (``graph_task_update_begin``, the relaunch,
``graph_task_update_end``, the event record, PA's workspace getter) costs tens to hundreds of
microseconds, far more than the Python around it. The null-cost bench measures only that Python
(the *glue*: an arm's time minus the floor, the floor being the same bare calls). This module
adds the two: projected time = measured glue + runtime calls x per-call cost, with the costs as
parameters whose defaults are derived from published upstream figures (``DERIVATION``). It shows
what share of the step the overlay can save, and where it saves by avoiding calls (PA's getter,
once per KV group instead of once per layer) rather than by running less Python.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

#: Printed with every projection: where the default per-call costs come from.
DERIVATION = (
    "Default per-call costs (us) derive from upstream figures, not from a measurement here: "
    "MiniCPM-o Talker, 20 FIA layers on 910B3, 3.68 ms of update per step (issue 13058) and "
    "GLM-5.3-Flash, 11 FIA ops, 2.4 ms (PR 15471): ~184-218 us per FIA task, taken as "
    "begin 10 + relaunch 150 + end 10 + record 10. PA, 28 layers on 910B: 2.4-2.95 ms per step "
    "with the workspace getter called per layer, ~1.66 ms reusing it (PR 15579): ~59 us per PA "
    "task without the getter (relaunch 29 + 30), and the 27 avoided getter calls 0.74-1.29 ms, "
    "~35 us each. The split between the four calls of a task is an assumption; the totals are "
    "the published ones. MLA's relaunch (FIA v2 with the rope split) has no published figure: "
    "it is taken as FIA's."
)


@dataclass(frozen=True)
class CallCosts:
    """Host cost of one runtime call on an Ascend host, in microseconds."""

    update_begin: float = 10.0
    update_end: float = 10.0
    event_record: float = 10.0
    relaunch_fia: float = 150.0
    relaunch_pa: float = 29.0
    relaunch_mla: float = 150.0
    pa_workspace_getter: float = 35.0

    @classmethod
    def parse(cls, overrides: list[str]) -> CallCosts:
        """``name=us`` overrides, e.g. ``relaunch_fia=120``; a bad one is a ``ValueError``."""
        names = {f.name for f in fields(cls)}
        values: dict[str, float] = {}
        for item in overrides:
            name, sep, text = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in names:
                raise ValueError(f"--cost {item!r}: expected NAME=US, NAME one of {sorted(names)}")
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"--cost {item!r}: {text!r} is not a number") from None
            if value < 0:
                raise ValueError(f"--cost {item!r}: a cost cannot be negative")
            values[name] = value
        return replace(cls(), **values)

    def task(self, relaunch: float) -> float:
        """One task's begin, relaunch, end and record: what both arms pay per task."""
        return self.update_begin + relaunch + self.update_end + self.event_record


@dataclass(frozen=True)
class Shape:
    """A model's step: ``layers`` target attention layers (one KV group), and optionally an MTP
    draft of ``draft_layers`` layers of the same attention (FIA for a PA target) updated for
    ``mtp_steps`` speculative tokens."""

    layers: int
    attention: str  # "FIA", "PA" or "MLA": the target layers' op
    mtp_steps: int = 0
    draft_layers: int = 1

    @property
    def name(self) -> str:
        mtp = f" + MTP k={self.mtp_steps}" if self.mtp_steps else ""
        return f"{self.layers} layers {self.attention}{mtp}"

    @property
    def draft_kind(self) -> str:
        """The bench kind whose glue the draft's tasks cost."""
        return "MLA+MTP k=3" if self.attention == "MLA" else "MTP k=3"


SHAPES = tuple(
    Shape(layers, attention, steps)
    for layers in (28, 64, 94)
    for attention in ("FIA", "PA")
    for steps in (0, 3)
)
#: DeepSeek V3 / R1: 61 MLA layers, alone and with its MTP layer at k = 1 (vllm-ascend's
#: DeepSeek tutorials); projected when the run measured the MLA kinds.
MLA_SHAPES = (Shape(61, "MLA", 0), Shape(61, "MLA", 1))


@dataclass(frozen=True)
class Glue:
    """Host Python of one update call, per arm: ``fixed + per_task x tasks`` microseconds."""

    fixed: float
    per_task: float

    def at(self, tasks: int) -> float:
        return max(self.fixed + self.per_task * tasks, 0.0)


def fit_glue(points: list[Any], kind: str) -> dict[str, Glue] | None:
    """Stock's and the overlay's glue for ``kind`` from this run's points (arm minus floor,
    minus the simulated getter calls stock makes beyond the floor's).

    Two layer counts give a line (fixed + per task); one gives a per-task figure alone. The
    median batch's points are used; errored points are not.
    """
    rows = [p for p in points if p.kind == kind and not p.error and p.floor_us is not None]
    if not rows:
        return None
    batches = sorted({p.batch for p in rows})
    batch = batches[len(batches) // 2]
    rows = sorted((p for p in rows if p.batch == batch), key=lambda p: p.tasks)
    out = {}
    for arm in ("stock", "overlay"):
        glue = [
            (p.tasks, getattr(p, f"{arm}_us") - p.floor_us - _extra_getters(p, arm)) for p in rows
        ]
        (t0, g0), (t1, g1) = glue[0], glue[-1]
        if t1 == t0:
            out[arm] = Glue(0.0, g1 / t1)
        else:
            slope = (g1 - g0) / (t1 - t0)
            out[arm] = Glue(g0 - slope * t0, slope)
    return out


def _extra_getters(point: Any, arm: str) -> float:
    """The simulated getter time an arm spends beyond the floor's getter calls (PA's stock calls
    the getter per task): runtime time, not glue, so the projection prices it separately."""
    if arm != "stock" or not point.getter_us:
        return 0.0
    return (point.tasks - point.floor_getter_calls) * point.getter_us


@dataclass
class Row:
    shape: str
    tasks: int
    stock_getter_calls: int
    overlay_getter_calls: int
    stock_ms: float
    overlay_ms: float
    saved_by_glue_ms: float
    saved_by_calls_ms: float

    @property
    def saved_ms(self) -> float:
        return self.stock_ms - self.overlay_ms

    @property
    def saved_share(self) -> float:
        return self.saved_ms / self.stock_ms if self.stock_ms else 0.0


def project_shape(shape: Shape, costs: CallCosts, glue: dict[str, dict[str, Glue]]) -> Row:
    """One shape's projected per-step update time, stock and overlay.

    Both arms make the same begin / relaunch / end / record calls per task. Stock calls PA's
    workspace getter once per PA layer; the overlay once per (metadata object, static
    signature), i.e. once per step for a dense model's one KV group.
    """
    relaunch = {"PA": costs.relaunch_pa, "MLA": costs.relaunch_mla}.get(
        shape.attention, costs.relaunch_fia
    )
    draft_relaunch = costs.relaunch_mla if shape.attention == "MLA" else costs.relaunch_fia
    target_tasks = shape.layers
    draft_tasks = shape.draft_layers * shape.mtp_steps
    calls_us = target_tasks * costs.task(relaunch) + draft_tasks * costs.task(draft_relaunch)
    stock_getters = target_tasks if shape.attention == "PA" else 0
    overlay_getters = 1 if shape.attention == "PA" else 0
    glue_us = {}
    for arm in ("stock", "overlay"):
        glue_us[arm] = glue[shape.attention][arm].at(target_tasks)
        if draft_tasks:
            glue_us[arm] += glue[shape.draft_kind][arm].at(draft_tasks)
    stock_us = glue_us["stock"] + calls_us + stock_getters * costs.pa_workspace_getter
    overlay_us = glue_us["overlay"] + calls_us + overlay_getters * costs.pa_workspace_getter
    return Row(
        shape=shape.name,
        tasks=target_tasks + draft_tasks,
        stock_getter_calls=stock_getters,
        overlay_getter_calls=overlay_getters,
        stock_ms=stock_us / 1000,
        overlay_ms=overlay_us / 1000,
        saved_by_glue_ms=(glue_us["stock"] - glue_us["overlay"]) / 1000,
        saved_by_calls_ms=(stock_getters - overlay_getters) * costs.pa_workspace_getter / 1000,
    )


def project(points: list[Any], costs: CallCosts) -> dict[str, Any]:
    """Every shape of ``SHAPES`` projected from this run's glue; needs FIA, PA and MTP points.
    The MLA shapes too, when the run measured the MLA kinds."""
    glue = {kind: fit_glue(points, kind) for kind in ("FIA", "PA", "MTP k=3")}
    missing = [kind for kind, fit in glue.items() if fit is None]
    if missing:
        raise ValueError(
            f"a projection needs measured FIA, PA and MTP k=3 points; missing {', '.join(missing)}"
        )
    shapes = SHAPES
    mla = {kind: fit_glue(points, kind) for kind in ("MLA", "MLA+MTP k=3")}
    if all(fit is not None for fit in mla.values()):
        glue.update(mla)
        shapes = SHAPES + MLA_SHAPES
    rows = [project_shape(shape, costs, glue) for shape in shapes]  # type: ignore[arg-type]
    return {
        "label": "projection, not a measurement",
        "costs_us": asdict(costs),
        "derivation": DERIVATION,
        "glue_us": {
            kind: {arm: asdict(g) for arm, g in fit.items()}  # type: ignore[union-attr]
            for kind, fit in glue.items()
        },
        "rows": [dict(asdict(r), saved_ms=r.saved_ms, saved_share=r.saved_share) for r in rows],
    }


def render(projection: dict[str, Any]) -> str:
    cols = [
        "shape",
        "tasks",
        "PA getter calls stock/overlay",
        "stock ms",
        "overlay ms",
        "saved ms",
        "saved",
        "of which: glue ms",
        "calls avoided ms",
    ]
    body = [
        [
            r["shape"],
            str(r["tasks"]),
            f"{r['stock_getter_calls']}/{r['overlay_getter_calls']}",
            f"{r['stock_ms']:.2f}",
            f"{r['overlay_ms']:.2f}",
            f"{r['saved_ms']:.2f}",
            f"{100 * r['saved_share']:.1f}%",
            f"{r['saved_by_glue_ms']:.3f}",
            f"{r['saved_by_calls_ms']:.2f}",
        ]
        for r in projection["rows"]
    ]
    widths = [max(len(row[i]) for row in [cols, *body]) for i in range(len(cols))]
    lines = [
        "PROJECTION to an Ascend host, NOT a measurement: per-step host update time = this run's "
        "measured Python glue + runtime calls x per-call cost (parameters; --cost NAME=US).",
        "costs (us): " + ", ".join(f"{k}={v:g}" for k, v in projection["costs_us"].items()),
    ]
    lines += [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [cols, ["-" * w for w in widths], *body]
    ]
    lines.append(projection["derivation"])
    lines.append(
        "The glue was measured on this machine's CPU in null-cost mode; an Ascend host's CPU "
        "differs, so read the glue columns as an order of magnitude. Both arms make the same "
        "begin/relaunch/end/record calls per task: only PA's getter calls are avoided."
    )
    return "\n".join(lines)
