"""Tensor parallelism on the real engine: TP=2 cases, their arms and their per-rank table.

``tensor_parallel_size=2`` runs vLLM's multiprocess executor: one worker process per rank, started
by fork or by spawn (``VLLM_WORKER_MULTIPROC_METHOD``). vLLM falls back from HCCL to gloo and the
TP all-reduce runs through vllm-ascend's communicator (``dist.all_reduce``), captured in every
rank's graphs. The reference is eager TP=1: every TP=2 graph arm must give its tokens. The
overlay's figures are read in every worker by ``collective_rpc`` (one row per rank).

The one-rank fault: rank 1's third relaunch raises (``rank_fault``). Stock leaves rank 0 in a
collective until it times out; the overlay ends rank 1's worker so that vLLM fails the job at once
(``ascend_graph_patch.fail_fast``), unless ``ASCEND_GRAPH_PATCH_TP_FAULT=wait``.

``python -m torch_npu_sim.engine.tp --out DIR`` runs the arms and prints the tables.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import arms, models, rank_fault
from .cases import Case

StatusReader = Callable[[Path], list[dict[str, Any]]]

TP = {"tensor_parallel_size": 2}
FORK = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}

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

#: A fault case expected to wait for the collective's timeout (stock; the overlay told to wait)
#: gets this one (seconds): short, for the suite's time; its error names the timeout.
WAIT_TIMEOUT = 30
#: A fault case the overlay must end by itself gets a timeout longer than a case may run (600 s):
#: waiting for it cannot pass.
FAIL_TIMEOUT = 900
TP_FAULT_VAR = "ASCEND_GRAPH_PATCH_TP_FAULT"  # the overlay's switch (named, not imported)


def _fault_case(
    name: str, start: dict[str, str], timeout: int, pa: bool = True, **env: str
) -> Case:
    """Rank 1 raises at its third relaunch (step 2 of decode: graphs have replayed already).
    The engine core runs in its own process, vLLM's default (in the arm's process, TP=2 hung at
    teardown in zmq's ``Context.term`` after an engine failure)."""
    environment = {rank_fault.ENV_VAR: "1:3", rank_fault.TIMEOUT_VAR: str(timeout), **start, **env}
    return Case(
        name,
        model="qwen3",
        pa_shape_list=(1, 4) if pa else (),
        multiprocess=True,
        engine=TP,
        environment=environment,
    )


#: The overlay ends the failed worker; vLLM fails the job at once (fork, spawn).
FAULT_CASE = _fault_case("qwen3+pa/tp2/fork/fault-rank1", FORK, FAIL_TIMEOUT)
FAULT_SPAWN_CASE = _fault_case("qwen3+pa/tp2/spawn/fault-rank1", SPAWN, FAIL_TIMEOUT)
#: Stock: rank 0 waits in a collective until the timeout, then the job ends.
STOCK_FAULT_CASE = _fault_case(
    f"qwen3+pa/tp2/fork/fault-rank1/timeout-{WAIT_TIMEOUT}s", FORK, WAIT_TIMEOUT
)
#: The negative control: the overlay told to wait does as stock does. It runs in the control
#: arm (overlay on, relaunches skipped: the fault still raises at the third), which balances the
#: two arm slots; FIA at every size, as the control's own case (a PA task replayed with its
#: captured arguments fails before the fault).
WAIT_FAULT_CASE = _fault_case(
    "qwen3/tp2/fork/fault-rank1/wait", FORK, WAIT_TIMEOUT, pa=False, **{TP_FAULT_VAR: "wait"}
)
FAULT_CASES = (FAULT_CASE, FAULT_SPAWN_CASE, STOCK_FAULT_CASE, WAIT_FAULT_CASE)

#: The negative control's case: FIA at every graph size (a PA task replayed with its captured
#: arguments fails instead, at kv length 6144: not a run to its end with other tokens).
CONTROL_CASE = Case("qwen3/tp2/fork", model="qwen3", engine=TP, environment=FORK)

#: Each arm's cases (a fresh interpreter and process tree per arm). Spawn costs a cold vLLM
#: import per worker: the overlay arm alone runs it (the suite's time budget). The overlay arm, the
#: longest, comes first: arms run two at a time, in this order (the others share the second slot).
CASES_BY_ARM: dict[str, list[Case]] = {
    "overlay": [*CASES, FAULT_CASE, FAULT_SPAWN_CASE],
    "eager": [REFERENCE],
    "stock": [CASES[0], STOCK_FAULT_CASE],
    "verify": [CASES[0]],
    "control": [CONTROL_CASE, WAIT_FAULT_CASE],
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
        cases=(*CASES, *FAULT_CASES, CONTROL_CASE),
        cases_by_arm=CASES_BY_ARM,
        timeout=1800.0,
        case_timeout=600.0,
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


_PID = re.compile(r"^\((?:EngineCore|Worker)[^ ]* pid=(\d+)\) ")


def _fired(log: str, pids: set[int]) -> re.Match[str] | None:
    """The test fault's line of the case whose processes include ``pids``."""
    return next(
        (m for m in rank_fault.FIRED_PATTERN.finditer(log) if int(m.group(2)) in pids), None
    )


def case_pids(record: dict[str, Any], log: str = "") -> set[int]:
    """The pids of the processes a multiprocess case started: those that wrote a status file
    (workers, helpers) and, given the arm's log, the faulty rank's parent (the engine core, which
    may be killed before it writes one)."""
    pids = set((record.get("status_files") or {}).get("pids") or [])
    fired = _fired(log, pids)
    return pids | {int(fired.group(3))} if fired else pids


def case_log(log: str, record: dict[str, Any]) -> str:
    """The lines of an arm's log written by one case's processes (vLLM prefixes their pid)."""
    pids = case_pids(record, log)
    lines = []
    for line in log.splitlines():
        found = _PID.match(line)
        if found and int(found.group(1)) in pids:
            lines.append(line)
    return "\n".join(lines)


def fault_fired_at(log: str, record: dict[str, Any]) -> float | None:
    """When the case's test fault fired (wall time, from its rank's line), or None."""
    fired = _fired(log, case_pids(record))
    return float(fired.group(4)) if fired else None


def job_ended_at(statuses: list[dict[str, Any]], record: dict[str, Any]) -> float | None:
    """When the case's last worker ended: its last status file write (at its exit)."""
    written = [
        s.get("written_at")
        for s in statuses
        if s["pid"] in case_pids(record) and s.get("rank") is not None
    ]
    times = [t for t in written if isinstance(t, float)]
    return max(times) if times else None


def fault_outcome(log: str) -> str:
    """How a fault case's job ended, from its processes' log lines.

    Once the overlay has ended a worker, vLLM fails the job by whichever notices first: its
    worker monitor (``died unexpectedly``) or rank 0's collective with the dead peer (gloo's
    ``Connection closed by peer``, raised as the reply the executor reads). Which one logs first
    is a race between two processes; both end the job at once."""
    ended = "died unexpectedly" in log or "Connection closed by peer" in log
    if "ending this worker now" in log and ended:
        return "worker ended by the overlay; vLLM failed the job"
    timeout = re.search(r"Timed out waiting (\d+)ms", log)
    if timeout:
        return f"collective timed out ({int(timeout.group(1)) // 1000} s)"
    return "other"


def fault_rows(
    root: Path, results: dict[str, Any], read_statuses: StatusReader
) -> list[dict[str, Any]]:
    """One row per fault case run: arm, case, outcome, seconds from the fault to the end of the
    job, the error the engine raised, and the root cause the engine core logged.

    ``read_statuses`` reads an arm's status directory (the overlay's reader, passed in by the
    caller that drives the overlay: this module stays on the stock side)."""
    rows = []
    for arm in ARMS:
        cases = results.get(arm, {}).get("cases") or {}
        try:
            log = (root / arm / "log").read_text(errors="replace")
        except OSError:
            log = ""
        statuses = read_statuses(root / arm / "status")
        for case in FAULT_CASES:
            record = cases.get(case.name)
            if record is None:
                continue
            mine = case_log(log, record)
            fired = fault_fired_at(log, record)
            ended = job_ended_at(statuses, record)
            cause = re.search(r"RuntimeError: (Worker failed with error .*?), please check", mine)
            rows.append(
                {
                    "arm": arm,
                    "case": case.name,
                    "log": mine,
                    "outcome": fault_outcome(mine),
                    "seconds": None if None in (fired, ended) else round(ended - fired, 1),
                    "error": (record.get("error") or "").splitlines()[0][:100],
                    "cause": cause.group(1)[:160] if cause else None,
                }
            )
    return rows


def fault_table(root: Path, results: dict[str, Any], read_statuses: StatusReader) -> str:
    """The fault cases: how each job ended, how long after the fault, what the user saw."""
    lines = [
        "| case | arm | outcome | fault to end of job (s) | engine raised | engine core logged |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in fault_rows(root, results, read_statuses):
        lines.append(
            f"| {row['case']} | {row['arm']} | {row['outcome']} | {row['seconds']} | "
            f"{row['error']} | {row['cause']} |"
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
    print()
    from .arm import read_statuses

    print(fault_table(out, results, read_statuses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
