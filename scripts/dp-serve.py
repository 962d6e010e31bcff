#!/usr/bin/env python3
"""Served data-parallel arms on the simulator, with a negative control and a rank fault.

``ascend-graph-patch ab --serve --data-parallel-size N`` is the user's command; this script runs
the same configuration (``command.build_config``) with the arms chosen by name, so that the
data-parallel table of ``docs/engine.md`` can be reproduced arm by arm on a 2-core machine:

- ``eager``, ``stock``, ``patched``, ``verify``: as in ``ab --serve`` (each a fresh ``vllm serve``);
- ``control``: a patched server whose relaunches the simulator skips
  (``TORCH_NPU_SIM_TEST_SKIP_RELAUNCH=1``): its outputs must differ from eager's;
- ``fault-stock``, ``fault-patched``: a server whose rank ``--fault-rank`` raises at its
  ``--fault-at``-th relaunch (``TORCH_NPU_SIM_TEST_RELAUNCH_RAISES``), collective timeout
  ``--collective-timeout`` s: how the job ends, how long after the fault, what the logs name.

Every arm is judged against the eager arm of the same run (``eager`` must be among the arms for
outputs; without it only the counts are shown). Servers listen on 127.0.0.1 and are stopped by
pid and process group (``ab.server``), also on failure.

    python scripts/dp-serve.py --sim-model deepseek-v3 --arms eager,stock,patched,verify,control
    python scripts/dp-serve.py --sim-model deepseek-v3 --ep --arms eager
    python scripts/dp-serve.py --sim-model deepseek-v3 --arms fault-stock,fault-patched
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

from ascend_graph_patch import status_files
from ascend_graph_patch.ab import command, compare, orchestrate, report, serve_report

ARMS = ("eager", "stock", "patched", "verify", "control", "fault-stock", "fault-patched")
SKIP_RELAUNCH = "TORCH_NPU_SIM_TEST_SKIP_RELAUNCH"
RELAUNCH_RAISES = "TORCH_NPU_SIM_TEST_RELAUNCH_RAISES"
COLLECTIVE_TIMEOUT = "TORCH_NPU_SIM_TEST_COLLECTIVE_TIMEOUT"
FIRED = re.compile(r"test fault fired on rank (\d+), pid (\d+), parent (\d+), at ([\d.]+)")
#: vLLM's log time stamp (local time, whole seconds).
STAMP = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def _config(args: argparse.Namespace, out: Path, arms: list[str], env: dict[str, str]):
    argv = ["--serve", "--sim-model", args.sim_model, "--data-parallel-size", str(args.dp)]
    argv += ["--enable-expert-parallel"] if args.ep else []
    argv += ["--no-progress", "--timeout", str(args.timeout), "--out", str(out)]
    argv += ["--jobs", str(args.jobs)]
    if args.num_prompts:
        argv += ["--num-prompts", str(args.num_prompts)]
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    cfg = command.build_config(parser.parse_args(argv))
    cfg.order = arms
    cfg.extra_env = dict(env)
    return cfg


def _run(cfg) -> list[orchestrate.ArmRun]:
    return orchestrate.run_ab(cfg)


def _fault_row(run: orchestrate.ArmRun, arm: str, started: float) -> dict:
    """How a fault arm ended: the fired line, the last status write, the root cause logged."""
    log = Path((run.result or {}).get("server", {}).get("log") or run.dir / "server.log")
    text = log.read_text(errors="replace") if log.exists() else ""
    fired = FIRED.search(text)
    snaps = status_files.read_dir(run.dir / "status")
    last = max((float(s.get("written_at") or 0) for s in snaps), default=0.0)
    faults = [dict(s["fault"], pid=s["pid"]) for s in snaps if s.get("fault")]
    causes = [
        line.strip()[:300]
        for line in text.splitlines()
        if any(
            k in line
            for k in (
                "sim fault",
                "EngineDeadError",
                "Timed out waiting",
                "ascend-graph-patch:",
                "died unexpectedly",
                "Connection closed by peer",
                "encountered a fatal error",
                "Engine core proc",
                "shutting down",
            )
        )
    ]
    fired_at = float(fired.group(4)) if fired else None
    events = []
    for line in text.splitlines():
        stamp = STAMP.search(line)
        if stamp is None or fired_at is None:
            continue
        when = time.mktime(
            time.strptime(
                f"{time.localtime(fired_at).tm_year}-{stamp.group(0)}", "%Y-%m-%d %H:%M:%S"
            )
        )
        if any(
            k in line
            for k in (
                "fatal error",
                "exited unexpectedly",
                "Timed out waiting",
                "EngineDeadError",
                "Shutting down",
                "died",
            )
        ):
            events.append(f"+{when - fired_at:.0f}s {line.strip()[:220]}")
    return {
        "arm": arm,
        "status": run.status,
        "error": (run.error or "")[:300],
        "fired": fired.group(0) if fired else None,
        "fault_to_last_status_write_s": round(last - fired_at, 1) if fired_at else None,
        "arm_seconds": round(time.time() - started, 1),
        "overlay_fault_records": faults,
        "log_lines": causes[:12],
        "events_after_fault": events[:15],
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sim-model", default="deepseek-v3")
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--ep", action="store_true", help="--enable-expert-parallel")
    parser.add_argument("--arms", default="eager,stock,patched,verify,control")
    parser.add_argument("--out", default="dp-report")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-at", type=int, default=3)
    parser.add_argument("--collective-timeout", type=int, default=60)
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    out = Path(args.out)
    plain = [a for a in arms if a in ("eager", "stock", "patched", "verify")]
    runs: list[orchestrate.ArmRun] = []
    cfg = None
    if plain:
        cfg = _config(args, out / "ab", plain, {})
        runs = _run(cfg)
    if "control" in arms:
        control = _config(args, out / "control", ["patched"], {SKIP_RELAUNCH: "1"})
        (run,) = _run(control)
        run = dataclasses.replace(run, index=len(runs), arm="patched")
        eager = [r for r in runs if r.arm == "eager"]
        summary = compare.summarize(control, [*eager, run])
        print("negative control (relaunches skipped), against the eager arm:")
        print(report.text_table(control, summary))
        _print_ranks(summary, "control")
    if cfg is not None:
        summary = compare.summarize(cfg, runs)
        paths = report.write(cfg, summary, runs)
        print(report.text_table(cfg, summary))
        print(f"report: {paths['md']}")
    faults = []
    for arm in [a for a in arms if a.startswith("fault-")]:
        env = {
            RELAUNCH_RAISES: f"{args.fault_rank}:{args.fault_at}",
            COLLECTIVE_TIMEOUT: str(args.collective_timeout),
        }
        fcfg = _config(args, out / arm, [arm.split("-", 1)[1]], env)
        started = time.time()
        (run,) = _run(fcfg)
        faults.append(_fault_row(run, arm, started))
    if faults:
        print(json.dumps(faults, indent=1))
        (out / "faults.json").write_text(json.dumps(faults, indent=1))
    return 0


def _print_ranks(summary: compare.Summary, label: str) -> None:
    rows = serve_report.rank_rows(summary)
    if rows:
        print(f"{label}: per rank")
        for row in rows:
            print("  " + " | ".join(row))


if __name__ == "__main__":
    sys.exit(main())
