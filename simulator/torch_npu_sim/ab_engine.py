"""The real-engine half of the simulator's A/B worker: ``vllm.LLM`` cases on the simulator.

Each case of ``torch_npu_sim.engine.cases`` is one ``vllm.LLM`` (a tiny model, graph settings) run
by the engine tests' own arm code (``engine.arm.run``: vLLM imported once, one forked child per
case, the overlay's figures read by RPC in the process that runs the model runner). This module
only picks the cases and turns the engine's records into the A/B protocol's case records. An
engine has no in-process eager reference (graph or eager is fixed when it is built): the A/B's
``eager`` arm builds the eager engines, and the comparison takes its tokens as the reference.

Host update time is not taken here: on the simulator the runner's update call also drains the
replay it unblocks (the simulated device runs on the host), so it is no host cost; ``bench``
measures that.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

#: The default real-engine set of ``ab``: the dense model, the Gemma4-type model (stock crashes),
#: a draft model (speculative decoding), DeepSeek-V3 with its MTP draft (MLA target and draft
#: graphs; k = 1, the cheapest engine that has both) and Qwen3.5 with its MTP draft (the hybrid
#: the upstream design was validated on: GDN layers among the attention layers, a prompt chunked
#: beside speculative decodes); ``--quick`` runs the first two.
DEFAULT_CASES: tuple[str, ...] = (
    "qwen3/compile/decode-only",
    "gemma4/compile/decode-only",
    "qwen3+eagle3/compile/decode-only",
    "deepseek-v3+mtp/k1/compile/decode-only",
    "qwen3.5+mtp/k1/compile/decode-only",
)
QUICK_CASES: tuple[str, ...] = DEFAULT_CASES[:2]

#: Why an engine case carries no timing on the simulator (the report shows it).
TIMING_NOTE = (
    "no host timing on the simulator: the update call also drains the blocked replay on the "
    "host (see `ascend-graph-patch bench` for host cost)"
)

#: Engine settings every engine process needs on this CPU host (the engine tests set them too).
_ENGINE_ENV = {
    "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    "OMP_NUM_THREADS": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}


def catalogue() -> dict[str, dict[str, Any]]:
    """Engine case name -> what ``ab --list`` shows and how the command selects it."""
    from torch_npu_sim.engine.cases import ALL_CASES

    return {
        case.name: {
            "stock": _expect(case),
            "kind": "engine",
            "default": case.name in DEFAULT_CASES,
            "quick": case.name in QUICK_CASES,
            # The release cannot run these in any graph arm (or at all), or the overlay refuses
            # to start what stock runs wrongly (a stale graph): not an A/B of updates.
            "all": not (case.startup_error or case.overlay_same_as_stock or case.overlay_error),
        }
        for case in ALL_CASES
    }


def is_engine_case(name: str) -> bool:
    from torch_npu_sim.engine.cases import ALL_CASES

    return any(case.name == name for case in ALL_CASES)


def _expect(case: Any) -> str:
    if case.startup_error:
        return f"crash: every arm, eager too: {case.startup_error}"
    return case.stock


def run_cases(names: list[str], spec: dict[str, Any], progress: Any) -> list[dict[str, Any]]:
    """Run the engine cases ``names`` in this arm (graph, or eager for the ``eager`` arm).

    ``progress``: the A/B protocol's progress channel (``advance(n)``); this module does not
    import the overlay (only the worker does), like the rest of the simulator."""
    from torch_npu_sim.engine import arm as engine_arm
    from torch_npu_sim.engine import models
    from torch_npu_sim.engine.cases import ALL_CASES

    for key, value in _ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    by_name = {case.name: case for case in ALL_CASES}
    graph = spec.get("arm") != "eager"
    seed = int(spec.get("seed", 0))
    chosen = {name: dataclasses.replace(by_name[name], seed=seed) for name in names}
    # The eager arm builds each case's eager engine (graph settings do not apply to it).
    runnable = {name: (case if graph else case.eager()) for name, case in chosen.items()}
    root = spec.get("model_root") or str(models.cache_root())
    out = []
    for name, case in runnable.items():
        result = engine_arm.run(
            {
                "graph": graph,
                "model_root": root,
                "timeout": float(spec.get("case_timeout", 300)),
                "cases": [case.to_json()],
            }
        )
        record = result["cases"][case.name]
        out.append(to_ab_case(name, chosen[name], record))
        progress.advance(int(spec.get("units_per_engine_case", spec.get("steps", 1))))
    return out


def to_ab_case(name: str, case: Any, record: dict[str, Any]) -> dict[str, Any]:
    """One engine record as an A/B case record (tokens per step, request, position)."""
    figures = (record.get("runners") or [{}])[0] or {}
    overlay = record.get("status_files") if case.multiprocess else figures.get("overlay")
    spec = record.get("spec") or {}
    error = record.get("error")
    return {
        "name": name,
        "kind": "engine",
        "expect": _expect(case),
        "status": "error" if error else "ok",
        "error": error,
        "traceback": record.get("traceback"),
        "close_error": record.get("close_error"),
        "tokens": record.get("tokens") or [],
        "steps_done": record.get("steps", 0),
        "reference": "eager arm",
        "counters": dict((overlay or {}).get("counters") or {}),
        "graphs_owned": (overlay or {}).get("graphs_owned"),
        "sim": figures.get("sim"),
        "acceptance": spec.get("rate"),
        "spec_decode": spec or None,
        "update_ns": [],
        "timing_note": TIMING_NOTE,
        "seconds": record.get("seconds"),
        "phases": record.get("phases"),
    }
