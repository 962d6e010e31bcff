"""``ascend-graph-patch ab``: the overlay against stock replay, a fresh process per arm.

Without ``--model`` the workload is the simulator's (torch-npu-sim): by default the real vLLM
engine over tiny models (dense, Gemma4-type, a draft model), with ``--scenarios`` any engine case
or harness workload (the real vllm-ascend graph code driven directly: MTP drafts, model runner
v2), with ``--all`` every one. With ``--model`` it is vLLM offline greedy inference of that model:
on an Ascend host, or on the simulator where no real torch_npu is installed. Exit status: 0 PASS,
1 outputs differ (or the overlay was not effective), 2 usage error, 3 an arm crashed or timed out,
128 + the signal's number when interrupted (130 SIGINT, 143 SIGTERM, 129 SIGHUP; the report is
still written, verdict INTERRUPTED, with the arms that finished).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ascend_graph_patch import argtypes
from ascend_graph_patch.ab import model_runner, served

HELP = "A/B the overlay against stock replay (fresh process per arm, ABBA); writes a report"

#: Steps per scenario of the default simulator run: sized so that 4 arms x all scenarios finish
#: in about two minutes on a 2-core machine (each arm pays ~13 s of imports).
DEFAULT_STEPS = 32
EXIT_USAGE = 2


class UsageError(Exception):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=argtypes.output_dir,
        default="ab-report",
        help="report directory (default: %(default)s)",
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated simulator cases and workloads (default: the real-engine set; "
        "see --list)",
    )
    parser.add_argument(
        "--all", action="store_true", help="every simulator case and workload (see --list)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the quick real-engine set, arms eager, stock, patched (one each, no ABBA)",
    )
    parser.add_argument("--list", action="store_true", help="list the simulator workloads")
    parser.add_argument(
        "--steps",
        type=argtypes.int_at_least(1),
        default=DEFAULT_STEPS,
        help="decode steps per scenario (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every arm (default: 0)")
    parser.add_argument(
        "--repeats",
        type=argtypes.int_at_least(1),
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
        "--stream-order",
        action="store_true",
        help="add a stream arm: the overlay with its opt-in stream-ordered replay "
        "(ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream: owned graphs replay without stock's per-step "
        "device synchronize; their updates wait on the compute stream instead)",
    )
    parser.add_argument(
        "--eager",
        action="store_true",
        help="with --model: add an eager reference arm (enforce_eager); always on for the "
        "simulator's engine cases",
    )
    parser.add_argument(
        "--jobs",
        type=argtypes.int_at_least(1),
        default=None,
        help="arms run at once (default: 2 for simulator engine cases, whose host timing is "
        "not used; else 1)",
    )
    parser.add_argument(
        "--timeout",
        type=argtypes.positive_float,
        default=None,
        help="seconds per arm before it is killed and reported as CRASH "
        "(default: 600 simulator, 3600 vLLM)",
    )
    parser.add_argument(
        "--warmup",
        type=argtypes.int_at_least(0),
        default=2,
        help="leading steps per case left out of the timing (default: 2)",
    )
    parser.add_argument(
        "--atol",
        type=argtypes.non_negative_float,
        default=1e-5,
        help="logits tolerance between arms (default: %(default)g)",
    )
    parser.add_argument(
        "--eager-atol",
        type=argtypes.non_negative_float,
        default=1e-3,
        help="logits tolerance graph vs eager (default: %(default)g)",
    )
    parser.add_argument(
        "--model",
        type=argtypes.model,
        default=None,
        help="run vLLM offline inference with this model: a local folder (checked before any "
        "arm starts) or a hub id (Ascend host)",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        help='JSONL file of prompts for --model ({"prompt": ...} or a string '
        "per line; default: built-in prompts)",
    )
    parser.add_argument(
        "--max-tokens",
        type=argtypes.int_at_least(1),
        default=64,
        help="tokens generated per prompt with --model (default: 64)",
    )
    parser.add_argument(
        "--model-runner",
        choices=model_runner.CHOICES,
        default="v1",
        help="with --model: vLLM's model runner (default: %(default)s). v2 sets "
        "VLLM_USE_V2_MODEL_RUNNER=1 in every arm and, on the simulator only, the opt-in repairs "
        "that make vllm-ascend 0.23.0.post1 run it (the release does not: see docs/v2.md)",
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
    served.add_arguments(parser)


def catalogue(workload: str = "sim") -> dict[str, dict]:
    """Name -> {stock, kind, default, quick}: how stock is known to behave on each workload,
    whether it is a real-engine case or a harness workload, and which sets it is in; asked of
    the workload's worker.

    The worker runs in a subprocess (``--list``): the overlay never imports a workload package.
    """
    from ascend_graph_patch import supervisor
    from ascend_graph_patch.ab.orchestrate import worker_module

    module = worker_module(workload)
    if module is None:
        raise UsageError(
            f"no {workload!r} workload is installed (the simulator's is in torch-npu-sim); "
            "on an Ascend host pass --model"
        )
    proc = supervisor.run(  # supervised: it must not outlive a killed command either
        [sys.executable, "-m", module, "--list"],
        timeout=120,
        env={**os.environ, "TORCH_NPU_SIM": "1"},
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{module} --list failed: {tail}")
    table = dict(json.loads(proc.stdout))
    return {  # a worker of an older protocol answers name -> stock
        name: entry if isinstance(entry, dict) else {"stock": entry, "kind": "harness"}
        for name, entry in table.items()
    }


def read_prompts(path: str) -> list[str | list[int]]:
    """One prompt per JSONL line: a JSON string, or an object with a ``prompt`` (or ``text``);
    or token ids (a list of ints, or ``{"prompt_token_ids": [...]}``) for a model without a
    tokenizer (pass ``--skip-tokenizer-init`` to the engine)."""
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
            item = item.get("prompt", item.get("text", item.get("prompt_token_ids")))
        if isinstance(item, list) and item and all(type(t) is int for t in item):
            prompts.append(item)
            continue
        if not isinstance(item, str) or not item:
            raise UsageError(
                f'{path}:{number}: expected a string, {{"prompt": "..."}} or token ids'
            )
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
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    if args.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    cfg = ABConfig(
        out=Path(args.out),
        steps=args.steps,
        seed=args.seed,
        repeats=args.repeats,
        verify=args.verify,
        stream=args.stream_order,
        warmup=args.warmup,
        atol=args.atol,
        eager_atol=args.eager_atol,
        progress=not args.no_progress,
    )
    if args.model_runner != "v1" and (served.given(args) or not args.model):
        raise UsageError(
            "--model-runner selects the runner of --model (offline); the simulator's engine "
            "cases name theirs (the */v2 cases, see --list)"
        )
    if served.given(args):
        try:
            prompts = read_prompts(args.prompts) if args.prompts and args.serve else None
            served.configure(cfg, args, engine_args, prompts)
        except served.ServedUsageError as exc:
            raise UsageError(str(exc)) from None
    elif args.model:
        if args.scenarios or args.all or args.quick:
            raise UsageError(
                "--scenarios, --all and --quick select simulator workloads, not --model"
            )
        from ascend_graph_patch.ab.orchestrate import simulated

        cfg.workload, cfg.model = "vllm", args.model
        cfg.cases = [f"vllm:{args.model}"]
        cfg.prompts = read_prompts(args.prompts) if args.prompts else None
        cfg.max_tokens = args.max_tokens
        cfg.engine_args = engine_args
        cfg.timeout = args.timeout or 3600.0
        cfg.warmup = 0 if args.warmup == 2 else args.warmup  # vLLM: samples are engine steps
        cfg.eager = args.eager
        cfg.simulate = simulated()
        cfg.jobs = args.jobs or 1
        if args.model_runner == "v2" and not cfg.simulate:
            raise UsageError(model_runner.REFUSED_ON_HARDWARE)
        cfg.model_runner = args.model_runner
        cfg.extra_env.update(model_runner.environment(args.model_runner))
    else:
        if args.prompts or engine_args:
            raise UsageError("--prompts and engine args need --model")
        if sum(bool(x) for x in (args.scenarios, args.all, args.quick)) > 1:
            raise UsageError("--scenarios, --all and --quick exclude each other")
        known = catalogue() if args.worker is None else None
        names = [s.strip() for s in (args.scenarios or "").split(",") if s.strip()]
        if known is None:
            if not names:
                raise UsageError("--scenarios is required with --worker")
        elif args.all:  # less what the release cannot run in any graph arm (see --list)
            names = [n for n, e in known.items() if e.get("all", True)]
        elif not names:
            key = "quick" if args.quick else "default"
            names = [n for n, e in known.items() if e.get(key)]
            if not names:  # a worker without sets: every harness workload, as before
                names = list(known)
        unknown = [n for n in names if known is not None and n not in known]
        if unknown:
            raise UsageError(
                f"unknown scenario(s) {', '.join(unknown)}; available: {', '.join(known or [])}"
            )
        engine = [n for n in names if known is not None and known[n].get("kind") == "engine"]
        cfg.cases = names
        cfg.engine_cases = len(engine)
        cfg.timeout = args.timeout or 600.0
        cfg.eager = bool(engine) or args.eager
        cfg.jobs = args.jobs or (2 if engine and len(engine) == len(names) else 1)
        if args.quick:
            cfg.order = ["eager", "stock", "patched"]
            cfg.order += (["stream"] if args.stream_order else []) + (
                ["verify"] if args.verify else []
            )
    if args.worker:
        cfg.worker_cmd = [sys.executable, args.worker]
    return cfg


def run(args: argparse.Namespace) -> int:
    try:
        if args.list:
            for name, entry in catalogue().items():
                sets = [k for k in ("default", "quick") if entry.get(k)]
                if not entry.get("all", True):
                    sets.append("not in --all: the release cannot run it in any graph arm")
                tag = f" [{', '.join(sets)}]" if sets else ""
                print(f"{name:<36} {entry.get('kind', '?'):<8} stock: {entry['stock']}{tag}")
            return 0
        cfg = build_config(args)
    except UsageError as exc:
        print(f"ascend-graph-patch ab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from ascend_graph_patch.ab import compare, orchestrate, report

    interrupted: orchestrate.ArmsInterrupted | None = None
    try:
        runs = orchestrate.run_ab(cfg)
    except orchestrate.ArmsInterrupted as exc:  # its arms are stopped: report what finished
        interrupted, runs = exc, exc.runs
        print(f"ascend-graph-patch ab: interrupted ({exc.signal}); arms stopped", file=sys.stderr)
    summary = compare.summarize(cfg, runs)
    if interrupted is not None:
        summary.exit_code = interrupted.exit_code
    paths = report.write(cfg, summary, runs)
    if args.json:
        print(paths["json"].read_text())
    else:
        print(report.text_table(cfg, summary))
        written = ", ".join(str(paths[k]) for k in ("json", "md", "png") if paths[k])
        print(f"report: {written}")
        if paths["png"] is None:
            hint = ""
            if "matplotlib" in str(paths["plot_error"]):
                hint = ": pip install 'ascend-graph-patch[report]'"
            print(f"(no report.png: {paths['plot_error']}{hint})")
    return summary.exit_code
