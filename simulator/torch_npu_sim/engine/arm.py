"""One arm of the engine tests: ``python -m torch_npu_sim.engine.arm --spec S --out R``.

The arm's overlay setting (``ASCEND_GRAPH_PATCH``, ``..._STRICT``, ``..._STATUS_DIR``) and the
simulator (``TORCH_NPU_SIM=1``) come from the environment, set before this interpreter started, so
the ``.pth`` loaders decided in every process vLLM spawns. The arm imports vLLM once, then runs
each case in a forked child: every case starts from the same freshly imported state (vllm-ascend
keeps model-specific module globals, e.g. the rotary tables, that one process never resets between
engines; on hardware one process serves one model). Each case is one ``run_arm`` over a
:class:`~torch_npu_sim.engine.workload.VllmWorkload`; a crash is the case's recorded result.

The spec: ``{"graph": bool, "model_root": dir, "timeout": seconds, "cases": [Case JSON, ...]}``.
The result: ``{"pid", "env": {...}, "cases": {name: record}}``, a record holding the tokens per
step, the error, the overlay's counters read from the process that ran the model runner, the
simulator's runtime counters (engine core in-process only) and the speculative decoding figures.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ENV_KEYS = (
    "ASCEND_GRAPH_PATCH",
    "ASCEND_GRAPH_PATCH_STRICT",
    "ASCEND_GRAPH_PATCH_STATUS_DIR",
    "TORCH_NPU_SIM",
    "TORCH_NPU_SIM_TEST_SKIP_RELAUNCH",
    "TORCH_NPU_SIM_TEST_RELAUNCH_RAISES",
    "TORCH_NPU_SIM_TEST_COLLECTIVE_TIMEOUT",
    "TORCH_NPU_SIM_TEST_NO_REPLAY_BARRIER",
    "TORCH_NPU_SIM_RACE_DETECTOR",
    "VLLM_PLUGINS",
)

#: Third-party packages an engine imports while it builds (pandas, scipy, numba, OpenTelemetry,
#: ...) that neither vLLM nor vllm-ascend patches, so when they are imported cannot change what a
#: case does. The first case's child reports which of their modules it imported; the arm imports
#: those before forking the next cases, which then neither import them again (~1 s a case) nor
#: scan them in each of the engine's ~13 ``gc.collect()`` calls. vLLM's, vllm-ascend's, torch's
#: and transformers' own modules stay imported in each case's child, in the engine's order:
#: vllm-ascend patches vLLM's modules as it starts, and an earlier import would change what the
#: patched modules' importers bind.
PRELOADABLE = frozenset(
    {
        "anyio",
        "compressed_tensors",
        "dateutil",
        "email_validator",
        "fastapi",
        "google",
        "grpc",
        "ijson",
        "llguidance",
        "llvmlite",
        "loguru",
        "msgspec",
        "numba",
        "opentelemetry",
        "pandas",
        "prometheus_client",
        "scipy",
        "starlette",
        "sympy",
        "tvm_ffi",
        "xgrammar",
    }
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_npu_sim.engine.arm")
    parser.add_argument("--spec", required=True, help="JSON spec: cases, graph or eager, ...")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    result = run(spec)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run every case of ``spec`` in its own forked child; the records by case name."""
    import torch

    torch.set_num_threads(1)  # many tiny CPU ops: one thread, and identical float results
    import vllm  # noqa: F401 - paid once, inherited by every case's child
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # those VLLM_PLUGINS allows (all, for `ab`): once, inherited too

    from ..workload import run_arm  # noqa: F401 - imported before forking, like vLLM

    _inspect_models_in_process()

    records: dict[str, Any] = {}
    learned: list[str] = []
    for data in spec["cases"]:
        if learned:
            records[data["name"]] = _run_forked(spec, data)
        else:  # until a case got far enough to import them
            records[data["name"]] = _run_forked(spec, data, learned)
            _preload(learned)
    return {
        "pid": os.getpid(),
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "cases": records,
    }


def _inspect_models_in_process() -> None:
    """vLLM inspects each model class in a fresh interpreter, so that the parent never
    initialises CUDA; there is no CUDA here, and that interpreter's cold vLLM import costs 15 to
    80 s per architecture and arm on two busy cores. The arm inspects in its own process."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def _preload(modules: list[str]) -> None:
    """Import ``modules`` (of :data:`PRELOADABLE` packages) here, before the next forks; one
    that fails to import is left to the children, as before."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - the child imports it (or fails) as it did
            continue


def _preloadable(names: list[str]) -> list[str]:
    return [n for n in names if n.partition(".")[0] in PRELOADABLE]


def _run_forked(
    spec: dict[str, Any], case: dict[str, Any], learn: list[str] | None = None
) -> dict[str, Any]:
    """Run ``case`` in a forked child; with ``learn``, also collect into it the preloadable
    modules the child imported (in their import order)."""
    timeout = float(spec.get("timeout", 600))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    modules_out = out.with_suffix(".modules")
    imported_before = set(sys.modules)
    # What the arm holds is never garbage in a case: its collections skip it.
    gc.freeze()
    from ascend_graph_patch import supervisor  # stdlib only: no overlay is activated by it

    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the case's process: its own group, so a timeout kills what it started
        code = 0
        try:
            os.setpgid(0, 0)
            supervisor.die_with_parent()  # the arm killed outright: the case goes too
            out.write_text(json.dumps(run_case(spec, case)))
            if learn is not None:
                new = [n for n in list(sys.modules) if n not in imported_before]
                modules_out.write_text("\n".join(_preloadable(new)))
        except BaseException:  # noqa: BLE001 - reported to the parent through the file
            out.write_text(json.dumps({"error": "arm: " + traceback.format_exc()[-2000:]}))
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    # The arm's guardian stops the case's group (its engine core too) if the arm is killed.
    supervisor.adopt(pid)
    try:
        status = _wait(pid, timeout)
    finally:  # also when the arm is interrupted: what the case started goes with it
        supervisor.stop(pid)
    if learn is not None and modules_out.exists():
        learn.extend(modules_out.read_text().split())
    modules_out.unlink(missing_ok=True)
    try:
        record = json.loads(out.read_text()) if out.stat().st_size else {}
    except (OSError, ValueError):
        record = {}
    finally:
        out.unlink(missing_ok=True)
    if not record:
        record = {"error": f"case process ended without a result ({status})"}
    record["seconds"] = round(time.monotonic() - started, 1)
    return record


def _wait(pid: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return f"wait status {status}"
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return f"timed out after {timeout:.0f} s"
        time.sleep(0.2)


def run_case(spec: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """Run one case in this process; its record (JSON-able)."""
    from ..workload import run_arm
    from .cases import Case
    from .workload import VllmWorkload

    case = Case.from_json(data)
    graph = bool(spec["graph"])
    if case.repairs:  # this case's process only (forked): every later engine process inherits it
        from .repairs import ENV_VAR

        os.environ[ENV_VAR] = ",".join(case.repairs)
    from . import barrier, order_wait

    prophecies = spec.get("prophecy_dir")
    prophecy = Path(prophecies) / prophecy_file(case.name) if prophecies else None
    if prophecy is not None and prophecy.exists():  # the adversarial schedule's pass 2 (none:
        from ..adversarial import ENV_VAR as PROPHECY  # pass 1 reported nothing, e.g. crashed)

        os.environ[PROPHECY] = str(prophecy)
    barrier.install(case.environment)  # a case that removes stock's replay barrier (its process)
    order_wait.install(case.environment)  # or the overlay's stream-order wait
    status_dir = os.environ.get("ASCEND_GRAPH_PATCH_STATUS_DIR")
    pids_before = _status_pids(status_dir)
    seen: dict[str, Any] = {}

    def build() -> VllmWorkload:
        seen["workload"] = VllmWorkload(case, graph=graph, model_root=spec.get("model_root"))
        return seen["workload"]

    def on_step(workload: Any, step: int, batch: Any, out: Any) -> None:
        # While the engine is alive (its owned graphs are still registered), from the process
        # that runs the model runner: this one, or the engine core's (the RPC runs it there).
        started = time.monotonic()
        seen["runners"] = workload.llm.collective_rpc(runner_figures)
        stats = workload.spec_stats()
        seen["spec"] = None if stats is None else {**vars(stats), "rate": stats.acceptance_rate}
        workload.phases["figures"] = round(time.monotonic() - started, 2)

    started = time.monotonic()
    result = run_arm(build, case.steps, case.seed, eager=False, graph=graph, on_step=on_step)
    seen["run_arm_seconds"] = round(time.monotonic() - started, 1)
    record: dict[str, Any] = {
        "case": case.to_json(),
        "graph": graph,
        "steps": result.steps,
        "tokens": [o.tokens for o in result.outputs],
        "error": result.error,
        "error_type": result.error_type,
        "traceback": (result.traceback or "")[-4000:] or None,
        "spec": seen.get("spec"),
        "close_error": getattr(seen.get("workload"), "close_error", None),
        "run_arm_seconds": seen.get("run_arm_seconds"),
        "phases": getattr(seen.get("workload"), "phases", {}),
        "arm_pid": os.getpid(),
        "runners": seen.get("runners"),
    }
    if case.multiprocess or case.engine.get("tensor_parallel_size", 1) > 1:
        record["status_files"] = _overlay_from_files(status_dir, pids_before)
    return record


def prophecy_file(case: str) -> str:
    """The file name of ``case``'s prophecy (pass 1's, by rank) in an adversarial arm's folder."""
    return case.replace("/", "__") + ".json"


def runner_figures(worker: Any = None) -> dict[str, Any]:
    """Run in the model runner's process (by ``collective_rpc``): the overlay's figures there,
    the simulator's runtime counters there, and that process's pid and distributed rank."""
    from .. import runtime
    from .shims import CONTEXT_CHUNK_STEPS
    from .triton_refs import LAUNCHES

    runner = getattr(worker, "model_runner", None)
    return {
        "pid": os.getpid(),
        "rank": _rank(),
        "runner": None if runner is None else f"{type(runner).__module__}.{type(runner).__name__}",
        "triton_launches": dict(LAUNCHES),
        "overlay": _overlay_here(),
        "sim": runtime.stats(),
        "races": runtime.race_report(),
        "prophecy": runtime.prophecy_record(),
        "draft_groups": _draft_groups(worker),
        "mla_context_chunks": dict(CONTEXT_CHUNK_STEPS),
    }


def _rank() -> int | None:
    """This process's rank in torch.distributed (None before or without it)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def _draft_groups(worker: Any) -> list[dict[str, Any]] | None:
    """The proposer's draft attention groups: KV-cache group id and layers, in its order."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    groups = getattr(drafter, "draft_attn_groups", None)
    if not groups:
        return None
    return [{"gid": g.kv_cache_group_id, "layers": list(g.layer_names)} for g in groups]


def _overlay_here() -> dict[str, Any] | None:
    """The overlay's figures in this process (None when it is off here)."""
    if "ascend_graph_patch" not in sys.modules:
        return None
    from ascend_graph_patch import settings, status

    if settings.mode() == settings.OFF:
        return None
    snap = status.snapshot()
    from ascend_graph_patch.core.registry import REGISTRY

    return {
        "processes": 1,
        # (layer, metadata key, draft step) of each task, per owned draft graph
        "draft_tasks": [
            [[t.layer_name, t.metadata_key, t.step] for t in g.tasks]
            for g in REGISTRY.graphs()
            if g.role == "draft"
        ],
        # the same for each owned target graph (hybrid cases: each task keyed by its own layer)
        "target_tasks": [
            [[t.layer_name, t.metadata_key, t.step] for t in g.tasks]
            for g in REGISTRY.graphs()
            if g.role == "target"
        ],
        "mode": snap.get("mode"),
        "graphs_owned": snap.get("graphs_owned", 0),
        "tasks_per_kind": snap.get("tasks_per_kind") or {},
        "counters": snap.get("counters") or {},
        "gate": {g: v.get("verdict") for g, v in (snap.get("gate") or {}).items()},
    }


def read_statuses(directory: Path) -> list[dict[str, Any]]:
    """The status files in ``directory``, read by the overlay's reader (this arm's and the TP
    tables')."""
    from ascend_graph_patch import status_files

    return status_files.read_dir(directory)


def _status_pids(directory: str | None) -> set[int]:
    if not directory or not os.path.isdir(directory):
        return set()
    return {s.get("pid") for s in read_statuses(Path(directory))}


def _overlay_from_files(directory: str | None, pids_before: set[int]) -> dict[str, Any] | None:
    """Merged status files of the processes this case started (the engine core's)."""
    if not directory:
        return None
    from ascend_graph_patch import status_files

    mine = os.getpid()
    snaps = [
        s
        for s in read_statuses(Path(directory))
        if s.get("pid") not in pids_before and s.get("pid") != mine
    ]
    merged = status_files.merge(snaps)
    gates = [row["gate"] for row in merged["per_process"]]
    return {
        "processes": merged["processes"],
        "pids": [row["pid"] for row in merged["per_process"]],
        "graphs_owned": merged["graphs_owned"],
        "tasks_per_kind": merged["tasks_per_kind"],
        "counters": merged["counters"],
        "gate": gates[0] if len(gates) == 1 else gates,
    }


if __name__ == "__main__":
    sys.exit(main())
