"""Soak: one process, overlay on, every workload in turn for >= 10,000 replay steps in total.

The workloads are names of the harness catalogue (default: the v1 target scenarios; any draft or v2
name of ``ab --list`` can be added); each chunk is one ``run_arm`` on a fresh engine.

Each step the overlay's graph output is checked against the eager run of the same batch
(greedy tokens equal, logits within tolerance). A second, shorter pass in verify mode re-checks
the scenarios on which the stock update works: there every update is shadow-computed by the stock
path too and compared parameter by parameter (mismatches counted by the overlay). RSS is sampled
after every chunk of steps per scenario; it must stay flat. Writes ``soak-result.json``;
exits 1 on any mismatch, error or RSS growth.

``ascend-graph-patch soak [--steps 10000]`` (or ``python -m torch_npu_sim.soak``)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

RSS_GROWTH_LIMIT_MB = 64.0


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _counters() -> dict[str, int]:
    from ascend_graph_patch import status

    return dict(status.snapshot().get("counters", {}))


def _chunk(name: str, steps: int, seed: int, atol: float, stats: dict[str, Any]) -> None:
    """Run ``steps`` graph steps of one workload (a fresh engine), each checked against eager."""
    from torch_npu_sim.harness import scenarios
    from torch_npu_sim.workload import run_arm

    arm = run_arm(lambda: scenarios.build(name), steps, seed)
    stats["steps"] += arm.steps
    stats["max_abs"] = max(stats["max_abs"], arm.max_eager_error)
    stats["mismatches"] += sum(
        1
        for diff, tokens in zip(arm.eager_max_abs, arm.eager_token_mismatches, strict=True)
        if diff > atol or tokens
    )
    if arm.error is not None:  # counted, the soak goes on
        key = "simulator_errors" if arm.error_type == "SimulatorError" else "errors"
        stats[key] += 1
        stats.setdefault("first_error", arm.error[:300])


def run(
    steps: int, chunk: int, verify_steps: int, seed: int, atol: float, names: list[str]
) -> dict[str, Any]:
    from ascend_graph_patch import activation
    from torch_npu_sim.harness.scenarios import CATALOGUE

    activation.enable("on")
    started = time.time()
    per: dict[str, dict[str, Any]] = {
        n: {
            "steps": 0,
            "mismatches": 0,
            "errors": 0,
            "simulator_errors": 0,
            "max_abs": 0.0,
            "rss_mb": [],
        }
        for n in names
    }
    total, cycle = 0, 0
    while total < steps:
        for name in names:
            n = min(chunk, steps - total)
            if n <= 0:
                break
            before = per[name]["steps"]
            _chunk(name, n, seed + cycle, atol, per[name])
            total += max(per[name]["steps"] - before, 1)
            per[name]["rss_mb"].append(round(rss_mb(), 1))
        cycle += 1
    on_counters = _counters()

    # verify pass: stock-capable scenarios, every update shadow-compared with stock
    activation.disable()
    activation.enable("verify")
    verify: dict[str, Any] = {}
    for name in names:
        if CATALOGUE[name].stock != "ok":
            continue
        stats = {"steps": 0, "mismatches": 0, "errors": 0, "simulator_errors": 0, "max_abs": 0.0}
        before = _counters()
        _chunk(name, verify_steps, seed, atol, stats)
        after = _counters()
        stats["verify_updates"] = after.get("verify.updates", 0) - before.get("verify.updates", 0)
        stats["verify_mismatches"] = after.get("verify.mismatches", 0) - before.get(
            "verify.mismatches", 0
        )
        verify[name] = stats
    activation.disable()

    problems = []
    for name, s in per.items():
        rss = s["rss_mb"]
        s["rss_growth_mb"] = round(rss[-1] - rss[1], 1) if len(rss) > 2 else 0.0
        s["rss_flat"] = s["rss_growth_mb"] <= RSS_GROWTH_LIMIT_MB
        for key in ("mismatches", "errors", "simulator_errors"):
            if s[key]:
                problems.append(f"{name}: {s[key]} {key.replace('_', ' ')}")
        if not s["rss_flat"]:
            problems.append(f"{name}: RSS grew by {s['rss_growth_mb']} MB")
    for name, s in verify.items():
        for key in ("mismatches", "errors", "simulator_errors", "verify_mismatches"):
            if s[key]:
                problems.append(f"verify {name}: {s[key]} {key.replace('_', ' ')}")
        if not s["verify_updates"]:
            problems.append(f"verify {name}: no update was verified")
    return {
        "tool": "torch_npu_sim.soak",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "seconds": round(time.time() - started, 1),
        "replay_steps": sum(s["steps"] for s in per.values()),
        "verify_steps": sum(s["steps"] for s in verify.values()),
        "eager_atol": atol,
        "scenarios": per,
        "verify": verify,
        "overlay_counters": on_counters,
        "problems": problems,
        "ok": not problems,
    }


HELP = "soak the overlay on the simulator: >= 10,000 replay steps, each checked against eager"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=10_000, help="replay steps in total")
    parser.add_argument("--chunk", type=int, default=250, help="steps per scenario visit")
    parser.add_argument(
        "--verify-steps", type=int, default=40, help="steps per scenario in the verify pass"
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated workload names, any of `ab --list` (default: the v1 target ones)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--atol", type=float, default=1e-3)
    parser.add_argument("--out", default="soak-result.json")


def run_command(ns: argparse.Namespace) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from torch_npu_sim.harness.scenarios import CATALOGUE, SCENARIOS

    names = [s for s in (ns.scenarios or ",".join(SCENARIOS)).split(",") if s]
    unknown = [n for n in names if n not in CATALOGUE]
    if unknown or ns.steps < 1 or ns.chunk < 1:
        print(f"soak: error: bad arguments (unknown scenarios: {unknown})", file=sys.stderr)
        return 2
    result = run(ns.steps, ns.chunk, ns.verify_steps, ns.seed, ns.atol, names)
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(
        f"soak: {result['replay_steps']} replay steps + {result['verify_steps']} verify steps "
        f"over {len(names)} scenarios in {result['seconds']} s: "
        f"{'OK' if result['ok'] else 'FAILED'} -> {out}"
    )
    for problem in result["problems"]:
        print(f"  - {problem}")
    return 0 if result["ok"] else 1


class _Command:
    """``ascend-graph-patch soak`` (added by torch-npu-sim through an entry point)."""

    HELP = HELP
    add_arguments = staticmethod(add_arguments)
    run = staticmethod(run_command)


command = _Command()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_npu_sim.soak", description=HELP)
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
