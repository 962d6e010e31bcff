"""Simulator arm worker: runs the selected scenarios through the real vllm-ascend graph path.

One process per arm runs every selected scenario in turn (start-up dominates on small machines).
Per step: one graph step (capture on first use of a size, replay, the runner's update), the same
batch eagerly as the reference, greedy tokens = argmax of the toy model's logits (hidden states
times the tied embedding). The overlay is whatever the arm's ``ASCEND_GRAPH_PATCH`` installed at
start-up; this module never touches it.

Run as ``python -m torch_npu_sim.ab_worker --spec S --result R [--progress P]``.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
import traceback
from array import array
from pathlib import Path
from typing import Any

from ascend_graph_patch.ab import timing
from ascend_graph_patch.ab.protocol import Progress, worker_main

#: The update entry point timed on the simulator (the harness resolves it per call).
UPDATE_TARGETS: tuple[str, ...] = ("vllm_ascend.compilation.acl_graph:update_full_graph_params",)
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


def _head(engine: Any, hidden: Any) -> Any:
    """Logits of the toy model: a harness ``logits()`` if it has one, else the tied embedding."""
    fn = getattr(engine, "logits", None)
    if callable(fn):
        return fn(hidden)
    return hidden @ engine.model.embed.T


def _eager_compare(graph: Any, eager: Any, atol: float) -> tuple[int, int, float]:
    """(token mismatches, near ties forgiven, max |graph - eager|) for one step."""
    import torch

    diff = float((graph - eager).abs().max()) if graph.numel() else 0.0
    g_tok, e_tok = graph.argmax(-1), eager.argmax(-1)
    mismatches = ties = 0
    for row in torch.nonzero(g_tok != e_tok).flatten().tolist():
        top2 = torch.topk(eager[row], 2).values
        if float(top2[0] - top2[1]) <= atol:  # a near tie may flip on rounding alone
            ties += 1
        else:
            mismatches += 1
    return mismatches, ties, diff


def run_case(
    scenario: Any,
    spec: dict[str, Any],
    timer: timing.UpdateTimer,
    progress: Progress,
    out_dir: Path,
) -> dict[str, Any]:
    """All steps of one scenario; an exception is recorded on the case, not raised."""
    from torch_npu_sim.harness.target import SimEngine

    steps, seed = int(spec["steps"]), int(spec["seed"])
    eager_atol = float(spec.get("eager_atol", 1e-3))
    if any(f.name == "seed" for f in dataclasses.fields(scenario)):
        scenario = dataclasses.replace(scenario, seed=seed)
    case: dict[str, Any] = {
        "name": scenario.name,
        "expect": getattr(scenario, "stock", "ok"),
        "status": "ok",
        "steps_done": 0,
        "tokens": [],
        "rows": [],
        "update_ns": [],
        "update_calls": [],
        "eager": {"token_mismatches": 0, "near_ties": 0, "max_abs": 0.0, "first_mismatch": None},
    }
    logits_name = f"{scenario.name}.logits.f32"
    logits_buf = array("f")
    before = _counters()
    started = time.perf_counter()
    rng = random.Random(seed)
    done = 0
    try:
        # No inference_mode here: the simulator's graph replay under inference_mode does not
        # match eager (reported); the harness runs without it too.
        with SimEngine(scenario) as engine:
            for step in range(steps):
                batch = engine.random_batch(rng)
                mark = len(timer.samples)
                hidden = engine.run_graph(batch)
                samples = timer.take(mark)
                logits = _head(engine, hidden).float()
                eager = _head(engine, engine.run_eager(batch)).float()
                mism, ties, diff = _eager_compare(logits, eager, eager_atol)
                ev = case["eager"]
                ev["token_mismatches"] += mism
                ev["near_ties"] += ties
                ev["max_abs"] = max(ev["max_abs"], diff)
                if mism and ev["first_mismatch"] is None:
                    ev["first_mismatch"] = step
                case["tokens"].append(logits.argmax(-1).tolist())
                case["rows"].append(int(logits.shape[0]))
                case["update_ns"].append(sum(samples))
                case["update_calls"].append(len(samples))
                logits_buf.extend(logits.flatten().tolist())
                case["vocab"] = int(logits.shape[-1])
                done += 1
                progress.advance()
    except Exception as exc:  # noqa: BLE001 - a scenario failure is data (known or not)
        case["status"] = "error"
        case["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        case["traceback"] = traceback.format_exc()
    progress.advance(steps - done)  # skipped steps still count for the progress bar
    case["steps_done"] = done
    case["seconds"] = round(time.perf_counter() - started, 3)
    with open(out_dir / logits_name, "wb") as f:
        logits_buf.tofile(f)
    case["logits_file"] = logits_name
    case["counters"] = _delta(_counters(), before)
    return case


def run(spec: dict[str, Any], progress: Progress, out_dir: Path) -> dict[str, Any]:
    timer = timing.UpdateTimer()
    timer.install(UPDATE_TARGETS, DEVICE_TARGET)
    from torch_npu_sim.harness import scenarios as sim_scenarios

    table = sim_scenarios.SCENARIOS
    cases = [run_case(table[name], spec, timer, progress, out_dir) for name in spec["cases"]]
    return {
        "workload": "sim",
        "cases": cases,
        "timed_targets": sorted(set(timer.installed)),
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
    if args == ["--list"]:  # the catalogue, for `ab --list` (imports torch, not vLLM)
        import json

        from torch_npu_sim.harness.scenarios import SCENARIOS

        print(json.dumps({name: sc.stock for name, sc in SCENARIOS.items()}))
        return 0
    return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
