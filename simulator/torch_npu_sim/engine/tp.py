"""Tensor parallelism on the real engine: TP=2 cases, their arms and their per-rank table.

``tensor_parallel_size=2`` runs vLLM's multiprocess executor: one worker process per rank, started
by fork or by spawn (``VLLM_WORKER_MULTIPROC_METHOD``). vLLM falls back from HCCL to gloo and the
TP all-reduce runs through vllm-ascend's communicator (``dist.all_reduce``), captured in every
rank's graphs. The reference is eager TP=1: every TP=2 graph arm must give its tokens. The
overlay's figures are read in every worker by ``collective_rpc`` (one row per rank).

``python -m torch_npu_sim.engine.tp --out DIR`` runs the arms and prints the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from . import arms, models, rank_fault
from .cases import Case

TP = {"tensor_parallel_size": 2}
FORK = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
#: Rank 1 raises at its third relaunch (step 2 of decode: graphs have replayed already).
FAULT = {rank_fault.ENV_VAR: "1:3", rank_fault.TIMEOUT_VAR: "60", **FORK}

#: The eager reference: the same model on one device.
REFERENCE = Case("qwen3", model="qwen3").eager()

#: The TP=2 graph cases: one model with PA graph sizes (PA at 1 and 4, FIA at 2). The fork case
#: runs as vLLM does by default: the engine core in its own process, async scheduling on (each
#: worker's output-copy thread synchronises while its main thread replays). With the engine core in
#: the arm's process, TP=2 with async scheduling (or after an engine failure) hung at teardown in
#: zmq's ``Context.term`` (vLLM's, not the simulator's): the spawn case keeps it there, async off.
CASES: tuple[Case, ...] = (
    Case(
        "qwen3+pa/tp2/fork/async",
        model="qwen3",
        pa_shape_list=(1, 4),
        multiprocess=True,
        engine={**TP, "async_scheduling": True},
        environment=FORK,
    ),
    Case(
        "qwen3+pa/tp2/spawn",
        model="qwen3",
        pa_shape_list=(1, 4),
        engine=TP,
        environment=SPAWN,
    ),
)

#: Rank 1's third relaunch raises; rank 0 waits in a collective until gloo's timeout (60 s here),
#: then fails: the job ends with an error, the same in stock and overlay (``docs/engine.md``).
FAULT_CASE = Case(
    "qwen3+pa/tp2/fork/fault-rank1",
    model="qwen3",
    pa_shape_list=(1, 4),
    multiprocess=True,
    engine=TP,
    environment=FAULT,
)

#: The negative control's case: FIA at every graph size (a PA task replayed with its captured
#: arguments fails instead, at kv length 6144: not a run to its end with other tokens).
CONTROL_CASE = Case("qwen3/tp2/fork", model="qwen3", engine=TP, environment=FORK)

#: Each arm's cases (a fresh interpreter and process tree per arm). Spawn costs a cold vLLM
#: import per worker: the overlay arm alone runs it (the suite's time budget).
CASES_BY_ARM: dict[str, list[Case]] = {
    "eager": [REFERENCE],
    "stock": [CASES[0], FAULT_CASE],
    "overlay": [*CASES, FAULT_CASE],
    "verify": [CASES[0]],
    "control": [CONTROL_CASE],
}


def graph_cases(arm: str) -> list[Case]:
    """The TP=2 graph cases ``arm`` runs (its fault case aside)."""
    return [c for c in CASES_BY_ARM[arm] if c in CASES]


ARMS = tuple(CASES_BY_ARM)


def run(directory: Path, model_root: Path, arm_names: tuple[str, ...] = ARMS) -> dict[str, Any]:
    """Run the TP arms, two at a time; results by arm name."""
    models.materialize("qwen3", model_root)
    return arms.run_arms(
        directory,
        model_root,
        arm_names,
        cases=(*CASES, FAULT_CASE, CONTROL_CASE),
        cases_by_arm=CASES_BY_ARM,
        timeout=900.0,
        case_timeout=300.0,
    )


def reference_tokens(results: dict[str, Any]) -> Any:
    record = results.get("eager", {}).get("cases", {}).get(REFERENCE.name) or {}
    return None if record.get("error") else record.get("tokens")


def ranks(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-rank figures of a case (from every worker, by ``collective_rpc``), by rank."""
    rows = [r for r in record.get("runners") or [] if r]
    return sorted(rows, key=lambda r: (r.get("rank") is None, r.get("rank")))


def table(results: dict[str, Any]) -> str:
    """The TP arm table: tokens vs eager TP=1 and, per rank, graphs owned and tasks updated."""
    reference = reference_tokens(results)
    lines = [
        "| case | arm | tokens vs eager TP=1 | per rank: graphs owned / tasks updated "
        "(replays) | verify mismatches | seconds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for arm in ARMS:
        for name, record in (results.get(arm, {}).get("cases") or {}).items():
            error = record.get("error")
            if arm == "eager":
                outcome = f"crash: {error}" if error else "(reference)"
            elif error:
                outcome = "crash: " + error.splitlines()[0][:120]
            else:
                outcome = "equal" if record.get("tokens") == reference else "DIFFER"
            cells, mismatches = [], []
            for row in ranks(record):
                counters = (row.get("overlay") or {}).get("counters") or {}
                sim = row.get("sim") or {}
                tasks = counters.get("tasks.updated", 0) + counters.get("verify.tasks", 0)
                owned = counters.get("graphs.owned", "-") if row.get("overlay") else "-"
                cells.append(f"r{row.get('rank')}: {owned} / {tasks} ({sim.get('replays')})")
                if "verify.tasks" in counters:
                    mismatches.append(f"r{row.get('rank')}: {counters.get('verify.mismatches', 0)}")
            lines.append(
                f"| {name} | {arm} | {outcome} | {'; '.join(cells) or '-'} | "
                f"{'; '.join(mismatches) or '-'} | {record.get('seconds')} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_npu_sim.engine.tp --out DIR [--arms a,b]``: run, print the table."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m torch_npu_sim.engine.tp")
    parser.add_argument("--out", required=True, help="working directory (results, logs, caches)")
    parser.add_argument("--arms", default=",".join(ARMS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run(out, out / "models", tuple(args.arms.split(",")))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
