"""The benchmark's regression guard: instruction ratios against a committed baseline.

Why ratios of instructions: they are the same on every run of the same code (no neighbour's load
moves them) and they compare the overlay with stock and with the floor measured in the same
process, so a baseline made on one machine holds on another with the same stack. ``bench
--instructions --check BASELINE`` fails (exit 3) when any ratio is more than 2% worse than the
baseline's (5% at one layer, see :data:`TOLERANCE_ONE_LAYER`); ``--save-baseline PATH`` writes
this run's ratios (docs/bench.md: how to refresh).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

SCHEMA = "ascend-graph-patch-bench-baseline/1"
#: A ratio may worsen by this much (relative) before the check fails.
TOLERANCE = 0.02
#: The same at one layer. Not every instruction repeats from one process to the next: the
#: simulated ops allocate their tensors' storage with ``posix_memalign``, and glibc's cost for it
#: depends on the heap's history (the counted process trims the heap before each point, which
#: takes most of it out). Measured on the same code in four processes laid out differently: the
#: one-layer ratios (30-170k instructions a step) spread by up to 2.8%, those from 28 layers up by
#: at most 0.6%. A 2% check at one layer would fail on noise.
TOLERANCE_ONE_LAYER = 0.05
#: The baseline kept in the repository.
DEFAULT = Path(__file__).resolve().parent / "baseline.json"


def tolerance(name: str) -> float:
    """How much the ratio of the point ``kind|layers|batch`` may worsen."""
    return TOLERANCE_ONE_LAYER if name.split("|")[1] == "1" else TOLERANCE


def key(point: Any) -> str:
    return f"{point.kind}|{point.layers}|{point.batch}"


def make(points: list[Any], capture: dict[str, Any] | None) -> dict[str, Any]:
    """This run's instruction ratios, as a baseline."""
    rows = {
        key(p): {"vs_stock": p.ir_vs_stock, "vs_floor": p.ir_vs_floor}
        for p in points
        if not p.error and p.overlay_ir is not None
    }
    if not rows:
        raise ValueError("no point has instruction counts: run with --instructions")
    counted = (capture or {}).get("instructions")
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "figure": "instructions (callgrind), overlay / stock and overlay / floor per point",
        "points": rows,
        "capture": counted["ratio"] if counted else None,
    }


def load(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a bench baseline ({SCHEMA})")
    return data


def check(
    points: list[Any], capture: dict[str, Any] | None, base: dict[str, Any]
) -> tuple[list[str], int]:
    """(regressions, ratios compared): each ratio of this run more than its :func:`tolerance`
    worse than the baseline's, named with both figures."""
    current = make(points, capture)
    worse: list[str] = []
    compared = 0
    for name, row in base["points"].items():
        now = current["points"].get(name)
        if now is None:
            continue
        allowed = tolerance(name)
        for metric in ("vs_stock", "vs_floor"):
            was, is_ = row.get(metric), now.get(metric)
            if was is None or is_ is None:
                continue
            compared += 1
            if is_ > was * (1 + allowed):
                worse.append(
                    f"{name} overlay/{metric[3:]}: {is_:.4f} against {was:.4f} "
                    f"(+{(is_ / was - 1) * 100:.1f}%, allowed {allowed:.0%})"
                )
    if base.get("capture") and current.get("capture"):
        compared += 1
        if current["capture"] > base["capture"] * (1 + TOLERANCE):
            worse.append(f"capture: {current['capture']:.4f} against {base['capture']:.4f}")
    return worse, compared
