"""What verify's comparison costs per verified step (docs/design.md, "Verify").

Runs the benchmark's 28-layer graphs (FIA, FIA v2, PA, MLA; MTP and MLA+MTP drafts of k = 3) in
verify mode on the simulator and times, per replay step, ``verify.compare`` (the overlay's
relaunches against stock's dry run) and ``verify.dry_run`` (stock's update, intercepted) around
it, with ``time.perf_counter``. Prints the median per step, in microseconds, per kind.

    .venv/bin/python scripts/verify-cost.py [--steps N] [--kinds FIA,PA,...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--kinds", default="FIA,FIA-v2,PA,MLA,MTP k=3,MLA+MTP k=3")
    args = parser.parse_args()

    from torch_npu_sim.harness import process

    process.ensure()
    from ascend_graph_patch import activation, state
    from ascend_graph_patch.aspects import verify
    from torch_npu_sim.bench import core
    from torch_npu_sim.harness import scenarios
    from torch_npu_sim.workload import run_arm

    timings: dict[str, list[float]] = {"compare": [], "dry_run": []}

    def timed(name: str, fn: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timings[name].append((time.perf_counter() - start) * 1e6)

        return call

    compare, dry_run = verify.compare, verify.dry_run
    verify.compare, verify.dry_run = timed("compare", compare), timed("dry_run", dry_run)
    print(f"{'kind':<14}{'tasks':>6}{'compare us':>12}{'dry run us':>12}{'mismatches':>12}")
    try:
        for kind in args.kinds.split(","):
            for values in timings.values():
                values.clear()
            scenario = core.KINDS[kind](args.layers, (1,))
            activation.enable("verify")
            try:
                build = lambda s=scenario: scenarios.build(s)  # noqa: E731
                result = run_arm(build, args.steps, 1234, eager=False)
                counters = dict(state.STATE.counters)
            finally:
                activation.disable()
            assert result.error is None, result.error
            tasks = counters.get("verify.tasks", 0) // max(counters.get("verify.updates", 1), 1)
            warm = slice(5, None)  # the first steps fill caches
            print(
                f"{kind:<14}{tasks:>6}"
                f"{statistics.median(timings['compare'][warm]):>12.1f}"
                f"{statistics.median(timings['dry_run'][warm]):>12.1f}"
                f"{counters.get('verify.mismatches', 0):>12}"
            )
    finally:
        verify.compare, verify.dry_run = compare, dry_run


if __name__ == "__main__":
    main()
