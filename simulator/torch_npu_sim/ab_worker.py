"""Simulator arm worker: the real vLLM engine cases and the harness workloads, on the simulator.

One process per arm runs every selected workload in turn (start-up dominates on small machines).
A name of the engine cases (``torch_npu_sim.engine.cases``: a real ``vllm.LLM`` over a tiny model)
runs through ``ab_engine`` first, each case in a forked child of this process; the ``eager`` arm
runs only those (its eager engines are their reference). Any other name is one of the harness
catalogue (``torch_npu_sim.harness.scenarios``: v1 target scenarios, v1 MTP / Eagle merged
drafts, v2 target and draft-prefill managers), which carries its eager reference in-process.
Each harness workload is one ``torch_npu_sim.workload.run_arm``: capture, then per step the batch
eagerly (the reference) and through the graph (replay + the runner's update), compared. Greedy
tokens are the argmax of the toy model's logits. The overlay is whatever the arm's
``ASCEND_GRAPH_PATCH`` installed at start-up; this module never touches it.

Run as ``python -m torch_npu_sim.ab_worker --spec S --result R [--progress P]``, or ``--list``
(every name: how stock behaves on it, its kind, whether ``ab`` runs it by default or ``--quick``),
or ``--serve-defaults [NAME]`` (what ``ab --serve [--sim-model NAME]`` serves here without
``--model``: ``engine.served``).
"""

from __future__ import annotations

import sys
import time
import traceback
from array import array
from pathlib import Path
from typing import Any

from ascend_graph_patch.ab import timing
from ascend_graph_patch.ab.protocol import Progress, worker_main

#: The update entry points timed on the simulator: the target harness resolves it through the
#: acl_graph module at call time; the proposer and the v2 managers imported it by name.
UPDATE_TARGETS: tuple[str, ...] = (
    "vllm_ascend.compilation.acl_graph:update_full_graph_params",
    *timing.VLLM_TARGETS,
)
#: The simulator's task executor: its time is device time, not host time.
DEVICE_TARGET = "torch_npu_sim.runtime:_drain"


def _counters() -> dict[str, int]:
    """The overlay's per-process counters (empty in the stock arm, where nothing is loaded)."""
    from ascend_graph_patch import settings, status

    if settings.mode() == settings.OFF:
        return {}

    return dict(status.snapshot().get("counters", {}))


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def run_case(
    name: str,
    spec: dict[str, Any],
    timer: timing.UpdateTimer,
    progress: Progress,
    out_dir: Path,
) -> dict[str, Any]:
    """All steps of one workload; an exception is recorded on the case, not raised."""
    from torch_npu_sim.harness import scenarios
    from torch_npu_sim.workload import StepOutput, Workload, run_arm

    steps, seed = int(spec["steps"]), int(spec["seed"])
    scenario = scenarios.with_overrides(scenarios.CATALOGUE[name], seed=seed)
    case: dict[str, Any] = {
        "name": name,
        "expect": scenario.stock,
        "status": "ok",
        "steps_done": 0,
        "tokens": [],
        "rows": [],
        "update_ns": [],
        "update_calls": [],
    }
    logits_name = f"{name}.logits.f32"
    logits_buf = array("f")
    mark = [0]

    def start(workload: Workload) -> None:
        mark[0] = len(timer.samples)  # capture calls no update; nothing before counts

    def step(workload: Workload, index: int, batch: Any, out: StepOutput) -> None:
        samples = timer.take(mark[0])  # the eager run calls no update: these are the graph's
        mark[0] = len(timer.samples)
        scores = out.logits if out.logits is not None else out.values
        assert scores is not None
        case["tokens"].append(out.tokens)
        case["rows"].append(len(out.tokens))
        case["update_ns"].append(sum(samples))
        case["update_calls"].append(len(samples))
        logits_buf.extend(scores.float().flatten().tolist())
        case["vocab"] = int(scores.shape[-1])
        progress.advance()

    before = _counters()
    started = time.perf_counter()
    try:
        # No inference_mode here: the simulator's graph replay under inference_mode does not
        # match eager (reported); the harness runs without it too.
        arm = run_arm(
            lambda: scenarios.build(scenario),
            steps,
            seed,
            before_steps=start,
            on_step=step,
            tie_atol=float(spec.get("eager_atol", 1e-3)),
        )
    except Exception as exc:  # noqa: BLE001 - the engine could not be built: data too
        case["status"] = "error"
        case["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        case["traceback"] = traceback.format_exc()
    else:
        if not arm.ok:  # a workload failure is data (known or not)
            case.update(status="error", error=arm.error, traceback=arm.traceback)
        mismatches = arm.eager_token_mismatches
        case["eager"] = {
            "token_mismatches": sum(mismatches),
            "near_ties": sum(arm.eager_near_ties),
            "max_abs": arm.max_eager_error,
            "first_mismatch": next((i for i, m in enumerate(mismatches) if m), None),
        }
    done = len(case["tokens"])
    progress.advance(steps - done)  # skipped steps still count for the progress bar
    case["steps_done"] = done
    case["seconds"] = round(time.perf_counter() - started, 3)
    with open(out_dir / logits_name, "wb") as f:
        logits_buf.tofile(f)
    case["logits_file"] = logits_name
    case["counters"] = _delta(_counters(), before)
    return case


def run(spec: dict[str, Any], progress: Progress, out_dir: Path) -> dict[str, Any]:
    from torch_npu_sim import ab_engine

    names = list(spec["cases"])
    engine = [n for n in names if ab_engine.is_engine_case(n)]
    harness = [n for n in names if n not in engine]
    # Engine cases fork from this process: before the harness has built anything in it.
    done = {c["name"]: c for c in ab_engine.run_cases(engine, spec, progress)}
    if spec.get("arm") == "eager":  # harness workloads carry their eager reference in-process
        progress.advance(len(harness) * int(spec["steps"]))
    else:
        timer = timing.UpdateTimer()
        timer.install(UPDATE_TARGETS, DEVICE_TARGET)
        for name in harness:
            done[name] = run_case(name, spec, timer, progress, out_dir)
    cases = [done[n] for n in names if n in done]
    return {
        "workload": "sim",
        "cases": cases,
        "status": _status(),
    }


def _status() -> dict[str, Any]:
    try:
        from ascend_graph_patch import status

        snap = status.snapshot()
    except Exception as exc:  # noqa: BLE001 - the report shows it, the arm goes on
        return {"error": repr(exc)}
    keep = (
        "mode",
        "simulator",
        "gate",
        "aspects_installed",
        "aspects_effective",
        "graphs_owned",
        "counters",
    )
    return {k: snap.get(k) for k in keep}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--serve-defaults"] and len(args) <= 2:
        # `ab --serve` without --model: model, engine args, load (of `--sim-model NAME`)
        import json

        from torch_npu_sim.engine import served

        print(json.dumps(served.defaults(*args[1:])))
        return 0
    if args == ["--list"]:  # the catalogue, for `ab --list` (plain data: no vLLM)
        import json

        from torch_npu_sim import ab_engine
        from torch_npu_sim.harness.scenarios import stock_table

        table = ab_engine.catalogue()
        for name, stock in stock_table().items():
            table[name] = {"stock": stock, "kind": "harness", "default": False, "quick": False}
        print(json.dumps(table))
        return 0
    return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
