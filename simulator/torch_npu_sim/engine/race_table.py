"""The race detector's table over engine arms: case x arm, races by kind, tokens against eager.

The races are read from each case's model-runner processes (``runner_figures``: the simulator's
counters there, ``races_<kind>``, present when ``TORCH_NPU_SIM_RACE_DETECTOR`` was on), summed over
the processes (TP ranks). ``python -m torch_npu_sim.engine.race_table RESULTS.json`` prints it for
a run of ``python -m torch_npu_sim.engine.arms``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..happens_before import KINDS
from . import report
from .cases import Case


def races(record: dict[str, Any]) -> dict[str, int] | None:
    """Races by kind over a case's model-runner processes (None: the detector was off)."""
    found: dict[str, int] | None = None
    for runner in record.get("runners") or []:
        sim = (runner or {}).get("sim") or {}
        if not any(f"races_{k}" in sim for k in KINDS):
            continue
        found = found or dict.fromkeys(KINDS, 0)
        for kind in KINDS:
            found[kind] += sim.get(f"races_{kind}", 0)
    return found


def _barriers(record: dict[str, Any]) -> int:
    runners = record.get("runners") or []
    return sum(((r or {}).get("sim") or {}).get("replay_barriers_skipped", 0) for r in runners)


#: the overlay's status counters of stream-ordered replays: v1 wrappers and v2 managers
#: (tests/test_replay_order.py pins them against ascend_graph_patch.aspects.replay_order.ORDERED)
_STREAM_ORDERED = ("replay_order.stream", "replay_order.stream.v2")


def stream_order(record: dict[str, Any]) -> tuple[int, int]:
    """(replays the overlay stream-ordered, stream-order waits the negative control skipped)
    over a case's model-runner processes. Reads the overlay's published ``status`` counters by
    name, as report.py does (the simulator never imports the overlay)."""
    ordered = skipped = 0
    for runner in record.get("runners") or []:
        counters = ((runner or {}).get("overlay") or {}).get("counters") or {}
        ordered += sum(counters.get(k, 0) for k in _STREAM_ORDERED)
        skipped += ((runner or {}).get("sim") or {}).get("order_waits_skipped", 0)
    return ordered, skipped


def adversarial(record: dict[str, Any]) -> str:
    """An adversarial arm's execution of its prophecy over the model-runner processes: runs that
    read an overtaking update's host values (how many of them changed a value), and whether the
    program repeated pass 1 (every overtaking update reached, with pass 1's values); ``-`` for an
    arm without a prophecy."""
    sims = [((r or {}).get("sim") or {}) for r in record.get("runners") or []]
    sims = [s for s in sims if "prophecy_runs" in s]
    if not sims:
        return "-"
    runs, changed, broken, unmet = (
        sum(s.get(k, 0) for s in sims)
        for k in ("prophecy_runs", "prophecy_runs_changed", "prophecy_broken", "prophecy_unmet")
    )
    held = "held" if not broken and not unmet else f"BROKEN ({broken} differ, {unmet} unmet)"
    return f"{runs} ({changed} changed), {held}"


def rows(results: dict[str, Any], cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        for arm, data in results.items():
            if arm == "eager":
                continue
            record = (data.get("cases") or {}).get(case.name)
            if record is None:
                continue
            c = report.cell(results, arm, case)
            out.append(
                {
                    "case": case.name,
                    "async": bool(case.engine.get("async_scheduling")),
                    "arm": arm,
                    "races": races(record),
                    "barriers_skipped": _barriers(record),
                    "stream_order": stream_order(record),
                    "adversarial": adversarial(record),
                    "replays": c.get("replays"),
                    "error": c.get("error"),
                    "equal": c.get("equal"),
                }
            )
    return out


def table(results: dict[str, Any], cases: tuple[Case, ...]) -> str:
    """Markdown: one row per case and graph arm."""
    head = [
        "case",
        "async scheduling",
        "arm",
        "races (update / run / record)",
        "barriers skipped",
        "stream-ordered / waits skipped",
        "replays",
        "overtaken runs executed (changed), prophecy",
        "tokens vs eager",
    ]
    lines = [head, ["---"] * len(head)]
    for r in rows(results, cases):
        counts = r["races"]
        shown = "off" if counts is None else " / ".join(str(counts[k]) for k in KINDS)
        if r["error"]:
            tokens = "crash: " + r["error"][:60]
        else:
            tokens = {True: "equal", False: "DIFFER", None: "?"}[r["equal"]]
        lines.append(
            [
                r["case"],
                "on" if r["async"] else "off",
                r["arm"],
                shown,
                str(r["barriers_skipped"]),
                "{} / {}".format(*r["stream_order"]),
                str(r["replays"]),
                r["adversarial"],
                tokens,
            ]
        )
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def main(argv: list[str] | None = None) -> int:
    from .arms import CONTROL_ONLY_CASES
    from .cases import ALL_CASES

    args = sys.argv[1:] if argv is None else argv
    results = json.loads(Path(args[0]).read_text())
    ran = {name for data in results.values() for name in (data.get("cases") or {})}
    cases = tuple(c for c in (*ALL_CASES, *CONTROL_ONLY_CASES) if c.name in ran)
    print(table(results, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
