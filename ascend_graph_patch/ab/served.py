"""``ascend-graph-patch ab --serve``: the options and the configuration of a served A/B.

The served A/B is the ordinary A/B (same orchestration, arms, verdicts and reports) with another
worker (:mod:`.worker_serve`): each arm is a fresh ``vllm serve`` process loaded by vLLM's own
client, ``vllm bench serve``. A *load* is one run of the client and one case of the report: by
default greedy decoding; ``--temperature`` above 0 makes it sampling, every request with the
seed ``--sampling-seed`` (so eager, stock and the overlay must give the same tokens), and
``--also-greedy`` keeps the greedy load next to it. The default load is shaped so that FULL
graphs really replay: every request sent at once, at most ``--max-concurrency`` at a time (the
engine's batch), prompt and output lengths equal across requests and EOS ignored, so that after
each wave's prefill every step is pure decode.

With ``--model`` it serves that model with the engine arguments after ``--`` (an Ascend host;
or the simulator where no real torch_npu is installed). Without ``--model`` on the simulator it
serves the simulator's tiny model with its settings (asked of the simulator's worker in a
subprocess: the overlay never imports the simulator).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from ascend_graph_patch import argtypes, supervisor
from ascend_graph_patch.ab.engine_args import has_option

#: The load of a served A/B on an Ascend host (the simulator gives its own, smaller one).
DEFAULT_LOAD = {"num_prompts": 32, "input_len": 64, "output_len": 64, "max_concurrency": 8}
#: ``--timeout`` of a served arm unless given: server start-up, compile, capture, the loads.
DEFAULT_TIMEOUT = 3600.0


class ServedUsageError(Exception):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "served A/B (--serve)",
        "each arm a fresh `vllm serve` on 127.0.0.1, loaded by `vllm bench serve`",
    )
    group.add_argument(
        "--serve",
        action="store_true",
        help="A/B the served path: vllm serve per arm, vllm bench serve as the client",
    )
    group.add_argument(
        "--num-prompts",
        type=argtypes.int_at_least(1),
        default=None,
        help="requests per load (default: 32; sim 8)",
    )
    group.add_argument(
        "--input-len",
        type=argtypes.int_at_least(1),
        default=None,
        help="prompt tokens of the random dataset (default: 64; sim 12)",
    )
    group.add_argument(
        "--output-len",
        type=argtypes.int_at_least(1),
        default=None,
        help="tokens generated per request, EOS ignored (default: 64; sim 16)",
    )
    group.add_argument(
        "--max-concurrency",
        type=argtypes.int_at_least(1),
        default=None,
        help="requests in flight at most (default: 8; sim 4, the engine's batch)",
    )
    group.add_argument(
        "--request-rate",
        type=argtypes.rate,
        default=None,
        help="requests per second, Poisson arrivals (default: all at once)",
    )
    group.add_argument(
        "--temperature",
        type=argtypes.non_negative_float,
        default=0.0,
        help="sampling temperature; above 0 every request is sampled with --sampling-seed "
        "(default: 0, greedy)",
    )
    group.add_argument(
        "--top-p", type=argtypes.probability, default=None, help="top-p of the sampled load"
    )
    group.add_argument(
        "--top-k", type=argtypes.int_at_least(1), default=None, help="top-k of the sampled load"
    )
    group.add_argument(
        "--sampling-seed",
        type=int,
        default=None,
        help="seed of every sampled request (default: --seed)",
    )
    group.add_argument(
        "--also-greedy",
        action="store_true",
        help="with --temperature > 0: a greedy load too, first (two cases, one server per arm)",
    )
    group.add_argument(
        "--data-parallel-size",
        type=argtypes.int_at_least(1),
        default=None,
        help="vllm serve's --data-parallel-size (every rank on this host); above 1 a load of one "
        "request (every rank but one idle) runs before the load asked for, and the report "
        "gives each rank's figures",
    )
    group.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="vllm serve's --enable-expert-parallel (MoE models)",
    )
    group.add_argument(
        "--sim-model",
        default=None,
        help="without --model, on the simulator: the tiny model served (qwen3, the default; "
        "deepseek-v3: MLA and MoE; deepseek-v3+mtp: with its MTP draft, k = 1; qwen3.5-moe+mtp: "
        "the GDN hybrid MoE with its MTP draft, k = 1)",
    )


#: The options only the served A/B reads (their argparse dests and defaults).
_SERVED_ONLY = {
    "num_prompts": None,
    "input_len": None,
    "output_len": None,
    "max_concurrency": None,
    "request_rate": None,
    "temperature": 0.0,
    "top_p": None,
    "top_k": None,
    "sampling_seed": None,
    "also_greedy": False,
    "data_parallel_size": None,
    "enable_expert_parallel": False,
    "sim_model": None,
}


def given(args: argparse.Namespace) -> bool:
    """Whether the served A/B was asked for, or any of its own options given."""
    return bool(getattr(args, "serve", False)) or any(
        getattr(args, k, default) != default for k, default in _SERVED_ONLY.items()
    )


def simulator_defaults(name: str | None = None) -> dict[str, Any]:
    """The simulator's model, engine arguments and load for ``ab --serve`` (``--sim-model
    NAME``; built on first use, in a subprocess: the overlay never imports the simulator)."""
    from ascend_graph_patch.ab.orchestrate import worker_module

    module = worker_module("sim")
    if module is None:
        raise ServedUsageError(
            "--serve without --model needs the simulator (torch-npu-sim); on an Ascend host "
            "pass --model"
        )
    proc = supervisor.run(  # supervised: building the model must not outlive a killed command
        [sys.executable, "-m", module, "--serve-defaults", *([name] if name else [])],
        timeout=600,
        env={**os.environ, "TORCH_NPU_SIM": "1"},
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServedUsageError(f"{module} --serve-defaults failed: {tail}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def loads(args: argparse.Namespace, base: dict[str, Any], prompts_file: str | None) -> list[dict]:
    """The loads of the run, one case each: greedy, sampled with a seed, or both; at data
    parallelism a greedy load of one request first (every rank but one idle: the idle ranks run
    dummy batches in step with the busy one)."""
    asked = _loads(args, base, prompts_file)
    if (args.data_parallel_size or 1) <= 1:
        return asked
    first = asked[0]
    one = {key: first[key] for key in ("input_len", "output_len", "prompts_file")}
    one.update(name="greedy, 1 request", num_prompts=1, max_concurrency=1, temperature=0.0)
    one["request_rate"] = None
    return [one, *asked]


def _loads(args: argparse.Namespace, base: dict[str, Any], prompts_file: str | None) -> list[dict]:
    common = {
        "num_prompts": args.num_prompts or base["num_prompts"],
        "input_len": args.input_len or base["input_len"],
        "output_len": args.output_len or base["output_len"],
        "max_concurrency": args.max_concurrency or base.get("max_concurrency"),
        "request_rate": args.request_rate,
        "prompts_file": prompts_file,
    }
    greedy = {"name": "greedy", **common, "temperature": 0.0}
    if not args.temperature:
        if args.top_p is not None or args.top_k is not None or args.sampling_seed is not None:
            raise ServedUsageError("--top-p, --top-k and --sampling-seed need --temperature > 0")
        return [greedy]
    seed = args.seed if args.sampling_seed is None else args.sampling_seed
    parts = [f"T {args.temperature:g}"]
    parts += [f"top-p {args.top_p:g}"] if args.top_p is not None else []
    parts += [f"top-k {args.top_k}"] if args.top_k is not None else []
    sampled = {
        "name": f"sampled ({', '.join(parts)}, seed {seed})",
        **common,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "sampling_seed": seed,
    }
    return [greedy, sampled] if args.also_greedy else [sampled]


def _check(args: argparse.Namespace) -> None:
    for name in ("num_prompts", "input_len", "output_len", "max_concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ServedUsageError(f"--{name.replace('_', '-')} must be >= 1")
    if args.request_rate is not None and not (args.request_rate > 0):
        raise ServedUsageError("--request-rate must be > 0")
    if args.temperature < 0 or math.isnan(args.temperature):
        raise ServedUsageError("--temperature must be >= 0")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ServedUsageError("--top-p must be in (0, 1]")
    if args.top_k is not None and args.top_k < 1:
        raise ServedUsageError("--top-k must be >= 1")
    if args.scenarios or args.all or args.quick:
        raise ServedUsageError("--scenarios, --all and --quick select simulator workloads")
    if args.max_tokens != 64:
        raise ServedUsageError("--max-tokens is --model's; with --serve use --output-len")
    if args.sim_model is not None and args.model:
        raise ServedUsageError("--sim-model selects the simulator's model; not with --model")


def parallel_args(args: argparse.Namespace, engine_args: list[str]) -> list[str]:
    """``vllm serve`` arguments of ``--data-parallel-size`` and ``--enable-expert-parallel``. At
    data parallelism one API server (vLLM's default is one per rank): its ``/metrics`` then
    count every engine, and the client talks to one process."""
    out: list[str] = []
    dp = args.data_parallel_size
    if dp is not None:
        if has_option(engine_args, "--data-parallel-size", "-dp"):
            raise ServedUsageError("--data-parallel-size given twice (also after --)")
        out += ["--data-parallel-size", str(dp)]
        if dp > 1 and not has_option(engine_args, "--api-server-count", "-asc"):
            out += ["--api-server-count", "1"]
    expert_parallel = has_option(engine_args, "--enable-expert-parallel", "-ep")
    if args.enable_expert_parallel and not expert_parallel:
        out.append("--enable-expert-parallel")
    return out


def write_prompts(prompts: list[str | list[int]], out: Path) -> str:
    """The user's prompts as ``vllm bench serve``'s custom dataset (JSONL, one ``prompt`` each)."""
    if any(not isinstance(p, str) for p in prompts):
        raise ServedUsageError("--serve takes text prompts only (vllm bench serve sends text)")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return str(path.resolve())


def configure(
    cfg: Any,
    args: argparse.Namespace,
    engine_args: list[str],
    prompts: list[str | list[int]] | None,
) -> None:
    """Fill ``cfg`` (an ``ABConfig``) for a served A/B; ``prompts``: the ``--prompts`` file's."""
    from ascend_graph_patch.ab.orchestrate import simulated

    if not args.serve:
        named = [k for k, default in _SERVED_ONLY.items() if getattr(args, k, default) != default]
        raise ServedUsageError(
            ", ".join("--" + k.replace("_", "-") for k in named) + " need --serve"
        )
    _check(args)
    cfg.workload = "serve"
    cfg.simulate = simulated()
    base = dict(DEFAULT_LOAD)
    parallel = parallel_args(args, engine_args)
    if args.model:
        cfg.model, cfg.engine_args = args.model, [*engine_args, *parallel]
    elif cfg.simulate:
        try:
            sim = simulator_defaults(args.sim_model)
        except ServedUsageError as exc:
            raise ServedUsageError(f"--sim-model {args.sim_model}: {exc}") from None
        cfg.model = sim["model"]
        cfg.engine_args = [*sim["engine_args"], *engine_args, *parallel]
        base.update(sim.get("load") or {})
    else:
        raise ServedUsageError("--serve needs --model on a host without the simulator")
    dp = args.data_parallel_size or 1
    if dp > 1 and base.get("max_concurrency"):
        base["max_concurrency"] = int(base["max_concurrency"]) * dp  # every rank's batch
        base["num_prompts"] = int(base["num_prompts"]) * dp
    prompts_file = None
    if prompts:
        prompts_file = write_prompts(prompts, cfg.out)
        base["num_prompts"] = len(prompts)
    cfg.serve = {"loads": loads(args, base, prompts_file)}
    cfg.cases = [load["name"] for load in cfg.serve["loads"]]
    cfg.timeout = args.timeout or DEFAULT_TIMEOUT
    cfg.warmup = 0
    cfg.eager = True  # every request's output is compared with the eager server's
    # On an Ascend host one server at a time (each holds its NPUs); the simulator shares cores.
    cfg.jobs = args.jobs or (2 if cfg.simulate else 1)
