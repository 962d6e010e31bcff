"""Served arm worker: one fresh ``vllm serve``, loaded by vLLM's own client, ``vllm bench serve``.

The orchestrator set the arm's toggle, compile cache and status directory before this
interpreter started; the server inherits them (and so does every process it starts: engine core,
tensor-parallel workers). The worker starts the server on 127.0.0.1 (a free port), runs each load
of the spec (a case: greedy, or sampling with a seed) with ``vllm bench serve`` against it, and
stops it by pid and process group, also on failure (:mod:`.server`, through the supervisor).

The client is ``vllm bench serve`` itself (its argument parser and its ``main``), run in this
process: its import (vLLM's, tens of seconds on a small host) then overlaps the server's
start-up and is paid once for every load. Its output goes to ``worker.log``; its result file
(every request's text, the figures) to ``client-<load>.json``. A load still running at the arm's
deadline is cut short by stopping the server (its requests then fail: the case is an error).

Per load it keeps what the client received (each request's text; re-tokenized with the model's
tokenizer so that the report names the first token that differs), the client's own figures
(throughput, TTFT, TPOT, ITL, end-to-end latency), the server's engine steps (``/metrics``) and,
from the status files the server's processes write while they serve, what the overlay did during
that load: replays of FULL graphs (calls of the runner's update entry point), owned updates,
fallbacks. Those figures are read live, before and after the load, while the server runs; they
are the difference. The merged final files (after the server exited) are the arm's totals,
attached by the orchestrator.

Run as ``python -m ascend_graph_patch.ab.worker_serve --spec S --result R [--progress P]``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ascend_graph_patch import status_files, supervisor
from ascend_graph_patch.ab import server
from ascend_graph_patch.ab.engine_args import option
from ascend_graph_patch.ab.protocol import Progress, worker_main

#: Seconds after the client ends before the status files are read: every process has written
#: what it counted by then (a process writes at most once a second, and within a second of its
#: last count).
SETTLE = status_files.INTERVAL + 0.5
#: Seconds at most that a load's figures wait for the server's processes to go quiet: at data
#: parallelism the ranks run dummy batches after the last request ended, until vLLM's next check
#: of the ranks' unfinished requests (every 32 steps).
QUIET_MAX = 30.0
#: Seconds of the arm's timeout kept back to stop the server and write the result.
STOP_MARGIN = server.STOP_GRACE + 10.0
#: The client's figures kept (``vllm bench serve``'s result keys), in the report's order.
CLIENT_FIGURES = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "spec_decode_acceptance_rate",
)


def server_args(spec: dict[str, Any]) -> list[str]:
    """``vllm serve`` arguments of the arm: the user's engine args, the eager arm's
    ``--enforce-eager``, and a shutdown timeout (vLLM's default 0 kills the engine core at once
    on SIGTERM, before it writes its last status file)."""
    args = list(spec.get("engine_args") or [])
    if spec.get("enforce_eager") and "--enforce-eager" not in args:
        args.append("--enforce-eager")
    if option(args, "--shutdown-timeout") is None:
        args += ["--shutdown-timeout", str(server.SHUTDOWN_TIMEOUT)]
    if option(args, "--seed") is None:
        args += ["--seed", str(spec["seed"])]
    return args


def client_args(spec: dict[str, Any], load: dict[str, Any], url: str, result: Path) -> list[str]:
    """``vllm bench serve``'s arguments for one load: its dataset (random with the A/B's seed,
    or the prompts file), concurrency and rate, the sampling parameters, every request's text
    saved."""
    engine_args = list(spec.get("engine_args") or [])
    cmd = ["--backend", "openai", "--base-url", url]
    cmd += ["--model", spec["model"]]
    for name in ("--served-model-name", "--tokenizer"):
        value = option(engine_args, name)
        if value is not None:
            cmd += [name, value]
    if "--trust-remote-code" in engine_args:
        cmd.append("--trust-remote-code")
    cmd += ["--num-prompts", str(load["num_prompts"]), "--seed", str(spec["seed"])]
    if load.get("prompts_file"):
        cmd += ["--dataset-name", "custom", "--dataset-path", str(load["prompts_file"])]
        cmd += ["--custom-output-len", str(load["output_len"])]
        cmd += ["--skip-chat-template", "--disable-shuffle"]
    else:
        cmd += ["--dataset-name", "random", "--random-range-ratio", "0"]
        cmd += ["--random-input-len", str(load["input_len"])]
        cmd += ["--random-output-len", str(load["output_len"])]
    if load.get("max_concurrency"):
        cmd += ["--max-concurrency", str(load["max_concurrency"])]
    if load.get("request_rate") is not None:
        cmd += ["--request-rate", str(load["request_rate"])]
    cmd += ["--ignore-eos", "--temperature", str(load.get("temperature", 0.0))]
    for key in ("top_p", "top_k"):
        if load.get(key) is not None:
            cmd += ["--" + key.replace("_", "-"), str(load[key])]
    if load.get("sampling_seed") is not None:
        cmd += ["--extra-body", json.dumps({"seed": int(load["sampling_seed"])})]
    cmd += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    cmd += ["--save-result", "--save-detailed", "--disable-tqdm"]
    cmd += ["--result-dir", str(result.parent), "--result-filename", result.name]
    return cmd


# --- what the server's processes counted ------------------------------------------------------


def live_figures(directory: Path) -> dict[str, Any]:
    """The server's status files as they are now: counters summed over processes, FULL-graph
    replays (update calls of the process that made most: every tensor-parallel rank replays the
    same steps), graphs owned."""
    snaps = status_files.read_dir(directory)
    merged = status_files.merge(snaps)
    calls = [int(s.get("update_calls") or len(s.get("update_ns") or [])) for s in snaps]
    busiest = snaps[calls.index(max(calls))] if snaps else {}
    return {
        "counters": merged["counters"],
        "replays": max(calls, default=0),
        "update_ns": list(busiest.get("update_ns") or []),
        "graphs_owned": merged["graphs_owned"],
        "processes": len(snaps),
        "pids": sorted(int(s["pid"]) for s in snaps if s.get("counters") or s.get("update_calls")),
        "ranks": ranks(snaps),
    }


def ranks(snaps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per distributed rank (data-parallel engines, tensor-parallel workers): FULL-graph replays
    (update calls), the counted calls (dummy batches, the drafter's dummy runs), the overlay's
    counters, graphs owned, summed over that rank's processes that did any of it (the API server
    and the DP coordinator have no rank)."""
    out: dict[str, dict[str, Any]] = {}
    for snap in snaps:
        calls = {k: int(v) for k, v in (snap.get("calls") or {}).items()}
        replays = int(snap.get("update_calls") or 0)
        counters = snap.get("counters") or {}
        if snap.get("rank") is None or not (replays or counters or any(calls.values())):
            continue
        row = out.setdefault(
            str(snap["rank"]),
            {"replays": 0, "calls": {}, "counters": {}, "graphs_owned": 0, "pids": []},
        )
        row["replays"] += replays
        row["graphs_owned"] += int(snap.get("graphs_owned") or 0)
        row["pids"].append(int(snap["pid"]))
        for into, more in ((row["calls"], calls), (row["counters"], counters)):
            for k, v in more.items():
                into[k] = into.get(k, 0) + int(v)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def rank_deltas(after: dict[str, Any], before: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each rank did between two readings of :func:`ranks`."""
    out = {}
    for rank, now in after.items():
        was = before.get(rank) or {"replays": 0, "calls": {}, "counters": {}}
        out[rank] = {
            "replays": now["replays"] - was["replays"],
            "calls": {k: v - was["calls"].get(k, 0) for k, v in now["calls"].items()},
            "counters": _delta(now["counters"], was["counters"]),
            "graphs_owned": now["graphs_owned"],
            "pids": now["pids"],
        }
    return out


def _activity(figures: dict[str, Any]) -> Any:
    return figures["counters"], figures["replays"], figures["ranks"]


def quiet_figures(directory: Path, deadline: float) -> dict[str, Any]:
    """:func:`live_figures` once two readings :data:`SETTLE` apart agree (every process done
    counting: a data-parallel wave runs on after its last request), or at :data:`QUIET_MAX`."""
    time.sleep(SETTLE)
    last = live_figures(directory)
    until = min(deadline, time.monotonic() + QUIET_MAX)
    while time.monotonic() < until:
        time.sleep(SETTLE)
        now = live_figures(directory)
        if _activity(now) == _activity(last):
            return now
        last = now
    return last


def engine_steps(metrics_text: str) -> int | None:
    """Engine steps so far: the sample count of vLLM's ``vllm:iteration_tokens_total``
    histogram (one observation per step that scheduled tokens), over every engine."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_count"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return int(total) if seen else None


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


# --- one load -----------------------------------------------------------------------------------


def _tokenizer(spec: dict[str, Any]) -> Any:
    """The model's tokenizer, to name the first token that differs (None: compare characters)."""
    args = list(spec.get("engine_args") or [])
    if "--skip-tokenizer-init" in args:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            option(args, "--tokenizer") or spec["model"],
            trust_remote_code="--trust-remote-code" in args,
        )
    except Exception:  # noqa: BLE001 - the texts are still compared, character by character
        return None


def _tokens(tokenizer: Any, text: str) -> list[Any]:
    if tokenizer is None:
        return list(text)
    return [int(t) for t in tokenizer(text, add_special_tokens=False).input_ids]


class Client:
    """``vllm bench serve`` in this process: vLLM's own parser and ``main``."""

    def __init__(self) -> None:
        from vllm.benchmarks import serve as bench
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self.bench = bench
        self.parser = FlexibleArgumentParser(prog="vllm bench serve")
        bench.add_cli_args(self.parser)

    def run(self, args: list[str]) -> None:
        print("$ vllm bench serve " + " ".join(args), flush=True)
        self.bench.main(self.parser.parse_args(args))


def run_load(
    srv: server.Server,
    spec: dict[str, Any],
    load: dict[str, Any],
    out_dir: Path,
    deadline: float,
    tokenizer: Any,
    client: Client,
) -> dict[str, Any]:
    """One load against the running server: a case of the A/B (an error is data, not raised)."""
    status_dir = Path(os.environ.get("ASCEND_GRAPH_PATCH_STATUS_DIR") or out_dir / "status")
    name = load["name"]
    slug = "".join(c if c.isalnum() else "-" for c in name)
    result = out_dir / f"client-{slug}.json"
    result.unlink(missing_ok=True)
    case: dict[str, Any] = {
        "name": name,
        "kind": "serve",
        "expect": "ok",
        "status": "ok",
        "reference": "eager arm",
        "tokens": [],
        "texts": [],
        "load": dict(load),
    }
    if spec.get("simulate"):
        case["timing_note"] = (
            "client figures are simulator times (the simulated device runs on the host CPU), "
            "not hardware"
        )
    before, steps_before = live_figures(status_dir), engine_steps(srv.get("/metrics")[1])
    # The time bound: at the deadline the server is stopped, and the client's requests fail.
    watchdog = threading.Timer(max(deadline - time.monotonic(), 1.0), server.stop, [srv.proc])
    watchdog.daemon = True
    watchdog.start()
    try:
        client.run(client_args(spec, load, srv.url, result))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the case failed; the next may run
        case.update(status="error", error=f"vllm bench serve: {type(exc).__name__}: {exc}")
    finally:
        watchdog.cancel()
    if srv.proc.poll() is not None:
        case.update(status="error", error="the server ended during the load (deadline?)")
        return case
    after = quiet_figures(status_dir, deadline)
    steps_after = engine_steps(srv.get("/metrics")[1])
    data = _read_json(result) if case["status"] == "ok" else None
    if case["status"] == "ok" and data is None:
        case.update(status="error", error="vllm bench serve wrote no result")
    if data is not None:
        texts = [str(t) for t in data.get("generated_texts") or []]
        errors = [e for e in data.get("errors") or [] if e]
        if errors or len(texts) != int(load["num_prompts"]):
            first = (errors[0].strip().splitlines() or ["?"])[-1] if errors else "missing"
            case.update(
                status="error",
                error=f"{len(errors) or int(load['num_prompts']) - len(texts)} of "
                f"{load['num_prompts']} requests failed: {first}",
            )
        case["texts"] = texts
        # One step holding every request: the report names a divergence as request, position.
        case["tokens"] = [[_tokens(tokenizer, t) for t in texts]] if texts else []
        case["client"] = {k: data[k] for k in CLIENT_FIGURES if data.get(k) is not None}
    case["counters"] = _delta(after["counters"], before["counters"])
    case["graphs_owned"] = after["graphs_owned"]
    case["replays"] = after["replays"] - before["replays"]
    # Host time of each update call of the load (the process that replayed most): the timing
    # part of the report, where it means something (not on the simulator).
    case["update_ns"] = after["update_ns"][-case["replays"] :] if case["replays"] > 0 else []
    case["update_calls"] = [1] * len(case["update_ns"])
    if steps_before is not None and steps_after is not None:
        case["engine_steps"] = steps_after - steps_before
    case["runner_pids"] = after["pids"]
    case["ranks"] = rank_deltas(after["ranks"], before["ranks"])
    case["live"] = {
        key: {k: v for k, v in figures.items() if k != "update_ns"}
        for key, figures in (("before", before), ("after", after))
    }
    return case


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run(spec: dict[str, Any], progress: Progress, out_dir: Path) -> dict[str, Any]:
    serve = spec["serve"]
    deadline = time.monotonic() + float(spec.get("case_timeout", 3600.0)) - STOP_MARGIN
    args = server_args(spec)
    cases: list[dict[str, Any]] = []
    started = time.monotonic()
    srv, (client, tokenizer) = server.start_ready(
        spec["model"],
        args,
        dict(os.environ),
        out_dir / "server.log",
        max(deadline - time.monotonic(), 1.0),
        lambda: (Client(), _tokenizer(spec)),  # while the server starts
    )
    try:
        ready = time.monotonic() - started
        for load in serve["loads"]:
            cases.append(run_load(srv, spec, load, out_dir, deadline, tokenizer, client))
            progress.advance(force=True)
    finally:
        server.stop(srv.proc)
    server_pid = srv.proc.pid
    return {
        "workload": "serve",
        "model": spec["model"],
        "server": {
            "pid": server_pid,
            "args": args,
            "ready_seconds": round(ready, 1),
            "log": str(out_dir / "server.log"),
            "vllm_plugins": os.environ.get("VLLM_PLUGINS"),
        },
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    # SIGTERM or SIGINT to the worker (the orchestrator interrupted) stops the server politely.
    with supervisor.supervise():
        return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
