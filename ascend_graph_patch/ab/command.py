"""``ascend-graph-patch ab``: the overlay against stock replay, a fresh process per arm.

Without ``--model`` the workload is the simulator (the real vllm-ascend attention in real
ACLGraphWrapper capture/replay); with ``--model`` it is vLLM offline greedy inference (Ascend
hosts). Exit status: 0 PASS, 1 outputs differ (or the overlay was not effective), 2 usage error,
3 an arm crashed or timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HELP = "A/B the overlay against stock replay (fresh process per arm, ABBA); writes a report"

#: Steps per scenario of the default simulator run: sized so that 4 arms x all scenarios finish
#: in about two minutes on a 2-core machine (each arm pays ~13 s of imports).
DEFAULT_STEPS = 32
EXIT_USAGE = 2


class UsageError(Exception):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="ab-report", help="report directory (default: %(default)s)"
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated simulator scenarios (default: all; see --list)",
    )
    parser.add_argument("--list", action="store_true", help="list the simulator scenarios")
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="decode steps per scenario (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every arm (default: 0)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="ABBA blocks (stock, patched, patched, stock) (default: 1)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="add a verify arm (ASCEND_GRAPH_PATCH=verify: shadow-compares "
        "every update with stock in-process)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per arm before it is killed and reported as CRASH "
        "(default: 600 simulator, 3600 vLLM)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="leading steps per case left out of the timing (default: 2)",
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=1e-5,
        help="logits tolerance between arms (default: %(default)g)",
    )
    parser.add_argument(
        "--eager-atol",
        type=float,
        default=1e-3,
        help="logits tolerance graph vs eager (default: %(default)g)",
    )
    parser.add_argument(
        "--model", default=None, help="run vLLM offline inference with this model (Ascend host)"
    )
    parser.add_argument(
        "--prompts",
        default=None,
        help='JSONL file of prompts for --model ({"prompt": ...} or a string '
        "per line; default: built-in prompts)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=64,
        help="tokens generated per prompt with --model (default: 64)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--json", action="store_true", help="print report.json instead of the table"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # tests: fake worker
    parser.add_argument(
        "engine_args",
        nargs=argparse.REMAINDER,
        help="after --: vLLM engine args for --model (as for `vllm serve`)",
    )


def catalogue(workload: str = "sim") -> dict[str, str]:
    """Scenario name -> how stock is known to behave on it, asked of the workload's worker.

    The worker runs in a subprocess (``--list``): the overlay never imports a workload package.
    """
    import subprocess

    from ascend_graph_patch.ab.orchestrate import worker_module

    module = worker_module(workload)
    if module is None:
        raise UsageError(
            f"no {workload!r} workload is installed (the simulator's is in torch-npu-sim); "
            "on an Ascend host pass --model"
        )
    proc = subprocess.run(
        [sys.executable, "-m", module, "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TORCH_NPU_SIM": "1"},
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{module} --list failed: {tail}")
    return dict(json.loads(proc.stdout))


def read_prompts(path: str) -> list[str]:
    """One prompt per JSONL line: a JSON string, or an object with a ``prompt`` (or ``text``)."""
    prompts = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read --prompts {path}: {exc.strerror}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{path}:{number}: not JSON ({exc})") from exc
        if isinstance(item, dict):
            item = item.get("prompt", item.get("text"))
        if not isinstance(item, str) or not item:
            raise UsageError(f'{path}:{number}: expected a string or {{"prompt": "..."}}')
        prompts.append(item)
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts


def build_config(args: argparse.Namespace):  # -> ABConfig (import kept lazy)
    from ascend_graph_patch.ab.orchestrate import ABConfig

    engine_args = list(args.engine_args or [])
    if engine_args and engine_args[0] == "--":
        engine_args = engine_args[1:]
    if args.steps < 1:
        raise UsageError("--steps must be >= 1")
    if args.repeats < 1:
        raise UsageError("--repeats must be >= 1")
    if args.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    cfg = ABConfig(
        out=Path(args.out),
        steps=args.steps,
        seed=args.seed,
        repeats=args.repeats,
        verify=args.verify,
        warmup=args.warmup,
        atol=args.atol,
        eager_atol=args.eager_atol,
        progress=not args.no_progress,
    )
    if args.model:
        if args.scenarios:
            raise UsageError("--scenarios selects simulator workloads; it cannot go with --model")
        cfg.workload, cfg.model = "vllm", args.model
        cfg.cases = [f"vllm:{args.model}"]
        cfg.prompts = read_prompts(args.prompts) if args.prompts else None
        cfg.max_tokens = args.max_tokens
        cfg.engine_args = engine_args
        cfg.timeout = args.timeout or 3600.0
        cfg.warmup = 0 if args.warmup == 2 else args.warmup  # vLLM: samples are engine steps
    else:
        if args.prompts or engine_args:
            raise UsageError("--prompts and engine args need --model")
        known = list(catalogue()) if args.worker is None else None
        names = [s.strip() for s in (args.scenarios or "").split(",") if s.strip()]
        if not names:
            if known is None:
                raise UsageError("--scenarios is required with --worker")
            names = known
        unknown = [n for n in names if known is not None and n not in known]
        if unknown:
            raise UsageError(
                f"unknown scenario(s) {', '.join(unknown)}; available: {', '.join(known or [])}"
            )
        cfg.cases = names
        cfg.timeout = args.timeout or 600.0
    if args.worker:
        cfg.worker_cmd = [sys.executable, args.worker]
    return cfg


def run(args: argparse.Namespace) -> int:
    try:
        if args.list:
            for name, stock in catalogue().items():
                print(f"{name:<22} stock: {stock}")
            return 0
        cfg = build_config(args)
    except UsageError as exc:
        print(f"ascend-graph-patch ab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from ascend_graph_patch.ab import compare, orchestrate, report

    runs = orchestrate.run_ab(cfg)
    summary = compare.summarize(cfg, runs)
    paths = report.write(cfg, summary, runs)
    if args.json:
        print(paths["json"].read_text())
    else:
        print(report.text_table(cfg, summary))
        written = ", ".join(str(p) for p in paths.values() if p is not None)
        print(f"report: {written}")
        if paths["png"] is None:
            print(
                "(no update_time.png: install matplotlib, e.g. pip install "
                "'ascend-graph-patch[report]')"
            )
    return summary.exit_code
