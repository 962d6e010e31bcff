"""vLLM arm worker: offline greedy inference with ``vllm.LLM`` (an Ascend host, or the simulator).

The toggle (``ASCEND_GRAPH_PATCH``) was set by the orchestrator before this interpreter started,
so the ``.pth`` loader has already decided whether the overlay installs, in this process and in
every process vLLM starts (engine core, tensor-parallel workers). The counters and update timings
of those processes reach the orchestrator through their status files (``status_files``); the
figures taken here (this process only) are the fallback where no status file was written. The
``eager`` arm builds the engine with ``enforce_eager`` (the reference tokens).

Run as ``python -m ascend_graph_patch.ab.worker_vllm --spec S --result R [--progress P]``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from ascend_graph_patch.ab import timing
from ascend_graph_patch.ab.protocol import Progress, worker_main

#: Built-in prompts: short, varied, deterministic under greedy decoding.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Write a haiku about the sea:",
    "def fibonacci(n):",
    "Explain in one sentence why the sky is blue.",
    "List three prime numbers greater than 100:",
    "Translate to German: 'Good morning, how are you?'",
    "The quick brown fox",
    "Q: What is 17 times 23?\nA:",
)


def engine_kwargs(model: str, engine_args: list[str]) -> dict[str, Any]:
    """``vllm serve``-style CLI engine args -> the ``LLM(**kwargs)`` that differ from defaults.

    Parsing with vLLM's own ``EngineArgs.add_cli_args`` accepts exactly what the user knows from
    ``vllm serve`` and rejects typos; passing only the changed fields keeps ``LLM``'s defaults.
    """
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def parse(extra: list[str]) -> EngineArgs:
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        return EngineArgs.from_cli_args(parser.parse_args(["--model", model, *extra]))

    base, given = parse([]), parse(list(engine_args))
    out = {}
    for field in dataclasses.fields(EngineArgs):
        value = getattr(given, field.name)
        if field.name != "model" and value != getattr(base, field.name):
            out[field.name] = value
    return out


def generate(spec: dict[str, Any], progress: Progress) -> tuple[list[Any], dict[str, Any], float]:
    """Build the engine and run greedy generation: the outputs, the engine kwargs and the
    seconds ``generate`` took (not the build); the one call tests mock is ``LLM.generate``."""
    from vllm import LLM, SamplingParams

    kwargs = engine_kwargs(spec["model"], spec.get("engine_args", []))
    kwargs.setdefault("seed", int(spec["seed"]))
    if spec.get("enforce_eager"):
        kwargs["enforce_eager"] = True
    llm = LLM(model=spec["model"], **kwargs)
    params = SamplingParams(
        temperature=0.0,
        max_tokens=int(spec.get("max_tokens", 64)),
        seed=int(spec["seed"]),
        logprobs=1,
    )
    prompts = [as_prompt(p) for p in spec.get("prompts") or DEFAULT_PROMPTS]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    progress.advance(len(prompts), force=True)
    return list(outputs), kwargs, seconds


def as_prompt(prompt: str | list[int]) -> Any:
    """A text prompt, or token ids (a model without a tokenizer: ``--skip-tokenizer-init``)."""
    return {"prompt_token_ids": list(prompt)} if isinstance(prompt, list) else prompt


def run(spec: dict[str, Any], progress: Progress, out_dir: Path) -> dict[str, Any]:
    timer = timing.UpdateTimer()
    timer.install(timing.VLLM_TARGETS)
    prompts = list(spec.get("prompts") or DEFAULT_PROMPTS)
    case: dict[str, Any] = {
        "name": spec.get("cases", ["vllm"])[0],
        "expect": "ok",
        "status": "ok",
        "tokens": [],
        "texts": [],
        "cumulative_logprob": [],
        "update_ns": [],
        "update_calls": [],
    }
    kwargs: dict[str, Any] = {}
    try:
        outputs, kwargs, case["generate_seconds"] = generate(spec, progress)
    except Exception as exc:  # noqa: BLE001 - recorded; the orchestrator decides what it means
        import traceback

        case.update(
            status="error",
            error=f"{type(exc).__name__}: {exc}".splitlines()[0],
            traceback=traceback.format_exc(),
        )
        outputs = []
    # LLM.generate returns one output per prompt, in the prompts' order.
    for index, prompt in enumerate(prompts):
        out = outputs[index] if index < len(outputs) else None
        if out is None or not out.outputs:
            if case["status"] == "ok":
                case.update(status="error", error=f"no output for prompt {prompt!r}")
            continue
        first = out.outputs[0]
        case["tokens"].append([int(t) for t in first.token_ids])
        case["texts"].append(first.text)
        case["cumulative_logprob"].append(first.cumulative_logprob)
    # One step holding every request: the report shows a divergence as request, position.
    case["tokens"] = [case["tokens"]] if case["tokens"] else []
    case["rows"] = [len(case["tokens"][0])] if case["tokens"] else []
    # Step latency: the requests decode together, so the longest output is the number of steps.
    longest = max((len(t) for t in case["tokens"][0]), default=0) if case["tokens"] else 0
    if longest and "generate_seconds" in case:
        case["step_ms"] = case["generate_seconds"] * 1000.0 / longest
    case["steps_done"] = len(case["tokens"])
    # vLLM interleaves prompts in one batch: every timed update call is one step of the engine.
    case["update_ns"] = list(timer.samples)
    case["update_calls"] = [1] * len(timer.samples)
    case["counters"] = _counters()
    return {
        "workload": "vllm",
        "model": spec["model"],
        "engine_kwargs": {k: repr(v) for k, v in kwargs.items()},
        "cases": [case],
        "timed_targets": sorted(set(timer.installed)),
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
    }


def _counters() -> dict[str, int]:
    from ascend_graph_patch import settings

    if settings.mode() == settings.OFF:
        return {}
    try:
        from ascend_graph_patch import status

        return dict(status.snapshot().get("counters", {}))
    except Exception:  # noqa: BLE001
        return {}


def main(argv: list[str] | None = None) -> int:
    return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
