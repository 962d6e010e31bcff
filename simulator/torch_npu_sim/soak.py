"""Soak: one process, overlay on, every workload in turn for >= 10,000 replay steps in total.

With ``--faults RATE`` (default 0.01) a second run of as many steps injects, at that rate, a fault
drawn from ``torch_npu_sim.faults`` into one graph step: each faulty step must show what stock
shows under that fault (the error it raises, or eager's output; ``Fault.overlay_step``, which
``tests/test_fault_equivalence.py`` checks against a stock arm), the step after it must recover as
the table says, and every other step must equal eager. RSS must stay flat here too.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ascend_graph_patch import argtypes

RSS_GROWTH_LIMIT_MB = 64.0


def rss_mb() -> float:
    """Resident memory after a collection, with freed heap handed back to the system first (so
    the allocator's high-water mark between engines is not read as growth)."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
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


#: Faults the soak draws: those after which the runtime can go on (an update_end that raises
#: leaves the simulator's update scope open for good, in stock as in the overlay).
def _soak_faults() -> list[Any]:
    from torch_npu_sim.faults import FAULTS

    return [f for f in FAULTS.values() if f.overlay_next in ("ok", "blocked")]


def _fault_chunk(
    name: str, steps: int, rate: float, rng: Any, atol: float, stats: dict[str, Any]
) -> None:
    """``steps`` graph steps of one workload, a fault injected into about ``rate`` of them."""

    from torch_npu_sim import runtime
    from torch_npu_sim.faults import as_stock, sync_point, take_step, take_step_eager
    from torch_npu_sim.harness import scenarios

    engine = scenarios.build(name)
    pool = _soak_faults()
    if engine.stock != "ok":  # no stock output to match a broken-lists step against
        pool = [f for f in pool if f.overlay_step != "stock"]
    try:
        engine.capture()
        expect_next = "ok"
        for _ in range(steps):
            if expect_next == "blocked":  # the last step's fault left a replay waiting, as stock's
                blocked = sync_point()
                if not blocked.blocked:
                    stats["unexpected"] += 1
                    stats.setdefault("first_unexpected", f"no replay left waiting: {blocked}")
                expect_next = "ok"
            batch = engine.next_batch(rng)
            reference = take_step_eager(engine, batch)
            if reference.output is None:  # a replay left waiting where none should be: a hang
                stats["hangs"] += int(reference.blocked)
                stats["unexpected"] += 1
                stats.setdefault("first_unexpected", f"before the step: {reference.message}")
                sync_point()
                continue
            eager = reference.output
            fault = rng.choice(pool) if rng.random() < rate else None
            result = take_step(engine, batch, fault.arm if fault is not None else None)
            stats["steps"] += 1
            if fault is not None:
                stats["faults"][fault.name] = stats["faults"].get(fault.name, 0) + 1
                if fault.overlay_step == "stock":  # the same step, stock updating: bitwise
                    with _stock_updates():
                        stock = take_step(engine, batch, fault.arm)
                    if stock.error is not None:  # its failed relaunch left its update scope open
                        runtime.abandon_update_scope()
                    sync_point()  # whatever stock left waiting is cleared before going on
                    ok = as_stock(result, stock)
                else:
                    ok = result.error == fault.overlay_step
                expect_next = fault.overlay_next
                what = f"{fault.name}: got {result.error or 'an output'}"
            else:
                ok = result.output is not None and _within(result.output, eager, atol)
                what = f"clean step: {result.error or 'output differs from eager'}"
            if result.blocked and not (fault is not None and fault.overlay_next == "blocked"):
                stats["hangs"] += 1
            if not ok:
                stats["unexpected"] += 1
                stats.setdefault("first_unexpected", what[:300])
    finally:
        engine.close()


@contextmanager
def _stock_updates() -> Iterator[None]:
    """For one step, the overlay observes and stock updates its graphs: stock's own output."""
    from ascend_graph_patch.aspects import scope

    active = scope.ACTIVE
    assert active is not None
    mode, active.mode = active.mode, "observe"
    try:
        yield
    finally:
        active.mode = mode


def _within(output: Any, eager: Any, atol: float) -> bool:
    return bool(float((output.float() - eager.float()).abs().max()) <= atol)


def fault_pass(
    steps: int,
    chunk: int,
    rate: float,
    seed: int,
    atol: float,
    names: list[str],
    done: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The overlay on, faults injected at ``rate``: per workload, what happened (also in
    ``done["faults"]`` as it happens)."""
    import random

    from ascend_graph_patch import activation

    activation.enable("on")
    rng = random.Random(seed)
    per: dict[str, dict[str, Any]] = {
        n: {"steps": 0, "unexpected": 0, "hangs": 0, "faults": {}, "rss_mb": []} for n in names
    }
    if done is not None:
        done["faults"] = per
    total = 0
    try:
        while total < steps:
            for name in names:
                n = min(chunk, steps - total)
                if n <= 0:
                    break
                _fault_chunk(name, n, rate, rng, atol, per[name])
                total += n
                per[name]["rss_mb"].append(round(rss_mb(), 1))
    finally:
        activation.disable()
    return per


def run(
    steps: int,
    chunk: int,
    verify_steps: int,
    seed: int,
    atol: float,
    names: list[str],
    fault_rate: float = 0.0,
    fault_names: list[str] | None = None,
    done: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The soak; ``done`` (if given) holds the per-workload figures as they accumulate, so that
    an interrupted soak can still report what finished."""
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
    done = {} if done is None else done
    done["scenarios"] = per
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
    done["verify"] = verify
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
    faulted: dict[str, Any] = {}
    if fault_rate > 0:
        faulted = fault_pass(steps, chunk, fault_rate, seed + 1, atol, fault_names or names, done)
        for name, s in faulted.items():
            rss = s["rss_mb"]
            s["rss_growth_mb"] = round(rss[-1] - rss[1], 1) if len(rss) > 2 else 0.0
            if s["unexpected"]:
                problems.append(
                    f"faults {name}: {s['unexpected']} unexpected step(s): {s['first_unexpected']}"
                )
            if s["rss_growth_mb"] > RSS_GROWTH_LIMIT_MB:
                problems.append(f"faults {name}: RSS grew by {s['rss_growth_mb']} MB")
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
        "fault_rate": fault_rate,
        "fault_steps": sum(s["steps"] for s in faulted.values()),
        "faults_injected": sum(sum(s["faults"].values()) for s in faulted.values()),
        "fault_hangs": sum(s["hangs"] for s in faulted.values()),
        "faults": faulted,
        "overlay_counters": on_counters,
        "problems": problems,
        "ok": not problems,
    }


def _interrupted(done: dict[str, Any], signal_name: str, seconds: float) -> dict[str, Any]:
    """The result of an interrupted soak: the figures of what finished, marked, never ok."""
    per = done.get("scenarios") or {}
    verify = done.get("verify") or {}
    faulted = done.get("faults") or {}
    return {
        "tool": "torch_npu_sim.soak",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "seconds": round(seconds, 1),
        "interrupted": signal_name,
        "replay_steps": sum(s["steps"] for s in per.values()),
        "verify_steps": sum(s["steps"] for s in verify.values()),
        "fault_steps": sum(s["steps"] for s in faulted.values()),
        "scenarios": per,
        "verify": verify,
        "faults": faulted,
        "problems": [f"interrupted ({signal_name}) before the soak finished"],
        "ok": False,
    }


HELP = "soak the overlay on the simulator: >= 10,000 replay steps, each checked against eager"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps", type=argtypes.int_at_least(1), default=10_000, help="replay steps in total"
    )
    parser.add_argument(
        "--chunk", type=argtypes.int_at_least(1), default=250, help="steps per scenario visit"
    )
    parser.add_argument(
        "--verify-steps",
        type=argtypes.int_at_least(1),
        default=40,
        help="steps per scenario in the verify pass",
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated workload names, any of `ab --list` (default: the v1 target ones)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--atol", type=argtypes.non_negative_float, default=1e-3)
    parser.add_argument(
        "--faults",
        type=_rate,
        default=0.01,
        help="also run as many steps with a fault injected at this rate (0: no fault pass)",
    )
    parser.add_argument(
        "--out",
        type=argtypes.output_file,
        default="soak-result.json",
        help="the result's JSON file (default: %(default)s)",
    )


def _rate(text: str) -> float:
    """A fault rate in [0, 1]."""
    value = argtypes.non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"a rate between 0 and 1, not {text}")
    return value


def run_command(ns: argparse.Namespace) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from torch_npu_sim.harness.scenarios import CATALOGUE, SCENARIOS
    from torch_npu_sim.harness.spec import Scenario

    names = [s for s in (ns.scenarios or ",".join(SCENARIOS)).split(",") if s]
    unknown = [n for n in names if n not in CATALOGUE]
    if unknown:
        known = ", ".join(sorted(CATALOGUE))
        print(f"soak: error: unknown scenarios {unknown}; known: {known}", file=sys.stderr)
        return 2
    if ns.steps < 1 or ns.chunk < 1:
        print("soak: error: --steps and --chunk must be >= 1", file=sys.stderr)
        return 2
    if not 0.0 <= ns.faults <= 1.0:
        print("soak: error: --faults is a rate between 0 and 1", file=sys.stderr)
        return 2
    # faults are injected into the default (replay-first) order's updates: ENPU left out
    fault_names = [
        n
        for n in names
        if isinstance(CATALOGUE[n], Scenario) and CATALOGUE[n].update_order == "replay_then_update"
    ]
    done: dict[str, Any] = {}
    started = time.time()
    out = Path(ns.out)
    try:
        result = run(
            ns.steps,
            ns.chunk,
            ns.verify_steps,
            ns.seed,
            ns.atol,
            names,
            ns.faults,
            fault_names,
            done,
        )
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: write what finished, then end
        from ascend_graph_patch import supervisor

        signal_name = supervisor.interruption(exc)[0]
        partial = _interrupted(done, signal_name, time.time() - started)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(partial, indent=1))
        print(
            f"soak: interrupted ({signal_name}) after {partial['replay_steps']} replay steps: "
            f"INTERRUPTED -> {out}",
            file=sys.stderr,
        )
        raise
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(
        f"soak: {result['replay_steps']} replay steps + {result['verify_steps']} verify steps "
        f"+ {result['fault_steps']} steps with {result['faults_injected']} faults injected, "
        f"over {len(names)} workloads in {result['seconds']} s: "
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
