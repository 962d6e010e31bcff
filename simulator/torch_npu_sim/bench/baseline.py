"""The benchmark's regression guard: instruction ratios against a committed baseline.

Why ratios of instructions: they are the same on every run of the same code (no neighbour's load
moves them) and they compare the overlay with stock and with the floor measured in the same
process, so a baseline made on one machine holds on another with the same stack. ``bench
--instructions --check BASELINE`` fails (exit 3) when any ratio is more than 2% worse than the
baseline's; ``--save-baseline PATH`` writes this run's ratios (docs/bench.md: how to refresh).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

SCHEMA = "ascend-graph-patch-bench-baseline/1"
#: A ratio may worsen by this much (relative) before the check fails.
TOLERANCE = 0.02
#: The baseline kept in the repository.
DEFAULT = Path(__file__).resolve().parent / "baseline.json"


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
    """(regressions, ratios compared): each ratio of this run more than :data:`TOLERANCE` worse
    than the baseline's, named with both figures."""
    current = make(points, capture)
    worse: list[str] = []
    compared = 0
    for name, row in base["points"].items():
        now = current["points"].get(name)
        if now is None:
            continue
        for metric in ("vs_stock", "vs_floor"):
            was, is_ = row.get(metric), now.get(metric)
            if was is None or is_ is None:
                continue
            compared += 1
            if is_ > was * (1 + TOLERANCE):
                worse.append(
                    f"{name} overlay/{metric[3:]}: {is_:.4f} against {was:.4f} "
                    f"(+{(is_ / was - 1) * 100:.1f}%)"
                )
    if base.get("capture") and current.get("capture"):
        compared += 1
        if current["capture"] > base["capture"] * (1 + TOLERANCE):
            worse.append(f"capture: {current['capture']:.4f} against {base['capture']:.4f}")
    return worse, compared
