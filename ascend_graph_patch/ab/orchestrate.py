"""Run the arms: one fresh process each, ABBA order, own compile cache, same seed, timeouts.

Both workloads (simulator and vLLM) go through :func:`run_ab`; only the worker module and the
spec differ. Arms differ in exactly one variable, ``ASCEND_GRAPH_PATCH`` (off / on / verify); any
other ``ASCEND_GRAPH_PATCH_*`` setting of the caller (strict, force, disable) is removed so it
cannot leak into one arm only, and ``VLLM_CACHE_ROOT`` is per arm because vLLM's compile-cache key
does not see our toggle (research/peers.md 2.5): a shared cache would let one arm replay
artifacts compiled under the other.

An arm whose process exits non-zero, times out or leaves no readable result is a CRASH; the
orchestrator never infers a pass from a missing result.

The model runner may live in other processes than the worker (vLLM's engine core, one process per
tensor-parallel rank): every arm gets ``ASCEND_GRAPH_PATCH_STATUS_DIR=<arm dir>/status`` (not
for harness-only runs, whose host timing it would disturb), every
Python process of the arm writes its counters and update timings there (``status_files``, the
toggle off included), and the orchestrator merges them into the arm's result (``status_files``).
Where no real ``torch_npu`` is installed and the simulator is, the arms run on the simulator
(``TORCH_NPU_SIM=1``, every vLLM plugin loaded as on hardware); the caller's ``TORCH_NPU_SIM``
decides if set.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ascend_graph_patch import status_files, supervisor
from ascend_graph_patch.ab.protocol import ARM_ENV, ARM_MODES, read_progress

#: The worker that runs vLLM itself (on an Ascend host, or on the simulator).
VLLM_WORKER = "ascend_graph_patch.ab.worker_vllm"
#: The worker that serves a model with ``vllm serve`` and loads it with ``vllm bench serve``.
SERVE_WORKER = "ascend_graph_patch.ab.worker_serve"
#: Workloads that run a model with vLLM (their figures live in the engine's processes).
MODEL_WORKLOADS = ("vllm", "serve")
#: Entry-point group through which other distributions add workloads: name -> worker module.
#: The simulator (torch-npu-sim) adds ``sim``; the orchestrator only runs ``python -m`` on it.
WORKERS_GROUP = "ascend_graph_patch.ab_workers"

#: Variables the orchestrator owns in every arm (whatever the caller had).
_OWNED_PREFIX = "ASCEND_GRAPH_PATCH"
_KEEP_FROM_CALLER = ("ASCEND_GRAPH_PATCH_DEBUG",)


def simulated(environ: dict[str, str] | None = None) -> bool:
    """Whether the arms run on the simulator: the caller's ``TORCH_NPU_SIM`` if set, else yes
    exactly when no real ``torch_npu`` is installed and the simulator's worker is."""
    env = os.environ if environ is None else environ
    given = env.get("TORCH_NPU_SIM", "").strip().lower()
    if given:
        return given in ("1", "on", "true", "yes")
    try:
        importlib.metadata.distribution("torch_npu")
        return False
    except importlib.metadata.PackageNotFoundError:
        pass
    return worker_module("sim") is not None


def worker_module(workload: str) -> str | None:
    """The worker module of ``workload`` (``vllm``, or one added by an entry point), or None."""
    if workload == "vllm":
        return VLLM_WORKER
    if workload == "serve":
        return SERVE_WORKER
    for ep in importlib.metadata.entry_points(group=WORKERS_GROUP):
        if ep.name == workload:
            return ep.value.partition(":")[0]
    return None


@dataclass
class ABConfig:
    """Everything an A/B run needs; the CLI builds it, tests build it directly."""

    out: Path
    workload: str = "sim"  # "sim" | "vllm" | "serve"
    cases: list[str] = field(default_factory=list)  # scenario names, or ["vllm:<model>"]
    steps: int = 24
    seed: int = 0
    repeats: int = 1
    verify: bool = False
    #: a ``stream`` arm in every ABBA block: the overlay with stream-ordered replay (opt-in)
    stream: bool = False
    eager: bool = False  # an eager reference arm (first): real engines have no in-process eager
    timeout: float = 600.0
    warmup: int = 2  # leading steps per case left out of the timing statistics
    atol: float = 1e-5  # logits, arm vs arm (same code, same inputs: expect bitwise)
    eager_atol: float = 1e-3  # logits, graph vs eager in one process (padding may round)
    model: str | None = None
    prompts: list[str | list[int]] | None = None
    max_tokens: int = 64
    engine_args: list[str] = field(default_factory=list)
    #: vLLM's model runner of a ``--model`` run (``ab.model_runner``): v1, or v2 by repairs.
    model_runner: str = "v1"
    worker_cmd: list[str] | None = None  # override (tests: a fake worker)
    progress: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    order: list[str] | None = None  # explicit arm order (tests); default: schedule()
    #: Arms run at once. Above 1 every run gets its own compile cache (no two processes write
    #: one) and host timing is not comparable between arms (they share the cores).
    jobs: int = 1
    simulate: bool | None = None  # None: decide by simulated()
    #: The served A/B (``ab --serve``): its loads, one case each (``ab.served``).
    serve: dict[str, Any] | None = None

    #: Cases that are whole engines (one progress unit each, not ``steps``).
    engine_cases: int = 0
    #: Per-process status files (``<arm dir>/status``): None = where the figures can live in other
    #: processes (the vLLM workload, engine cases). Harness-only runs go without, so that the
    #: status writer's own timer and file writes stay out of their host timing.
    status_files: bool | None = None

    def wants_status_files(self) -> bool:
        if self.status_files is not None:
            return self.status_files
        return self.workload in MODEL_WORKLOADS or self.engine_cases > 0

    def units_per_run(self) -> int:
        if self.workload == "serve":
            return len(self.cases)
        if self.workload == "vllm":
            return len(self.prompts or ()) or 8
        return (len(self.cases) - self.engine_cases) * self.steps + self.engine_cases


@dataclass
class ArmRun:
    """One process of one arm."""

    index: int
    arm: str
    mode: str
    repeat: int
    dir: Path
    cache_root: Path
    status: str = "pending"  # ok | crash | timeout
    returncode: int | None = None
    seconds: float = 0.0
    error: str | None = None
    result: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"{self.index:02d}-{self.arm}"

    @property
    def log(self) -> Path:
        return self.dir / "worker.log"

    def summary(self) -> dict[str, Any]:
        res = self.result or {}
        return {
            "index": self.index,
            "arm": self.arm,
            "mode": self.mode,
            "repeat": self.repeat,
            "status": self.status,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 2),
            "error": self.error,
            "pid": res.get("pid"),
            "cache_root": str(self.cache_root),
            "dir": str(self.dir),
            "log": str(self.log),
            "mode_env_seen": res.get("mode_env"),
            "cache_root_seen": res.get("cache_root"),
            "seed_seen": res.get("seed"),
            "overlay_status": res.get("status"),
            "processes": (res.get("processes") or {}).get("count"),
        }


def schedule(repeats: int, verify: bool, eager: bool = False, stream: bool = False) -> list[str]:
    """The eager reference if asked, ABBA per repeat (A = stock, B = patched; with ``stream``,
    ABCCBA, C = the overlay with stream-ordered replay), then one verify arm if asked.

    ABBA cancels a linear drift (thermal, page cache, compile cache warming) between the arms;
    the repeated same-arm runs give the A-A noise floor. Verify is a correctness arm (it computes
    both updates), so it runs once and stays out of the timing comparison.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    block = ["stock", "patched", "stream", "stream", "patched", "stock"]
    if not stream:
        block = [arm for arm in block if arm != "stream"]
    order = (["eager"] if eager else []) + block * repeats
    if verify:
        order.append("verify")
    return order


def arm_env(base: dict[str, str], cfg: ABConfig, run: ArmRun) -> dict[str, str]:
    """The environment of one arm: the caller's, minus our knobs, plus the arm's settings."""
    env = {
        k: v for k, v in base.items() if not k.startswith(_OWNED_PREFIX) or k in _KEEP_FROM_CALLER
    }
    env["ASCEND_GRAPH_PATCH"] = run.mode
    env.update(ARM_ENV.get(run.arm, {}))
    env["VLLM_CACHE_ROOT"] = str(run.cache_root)
    env["PYTHONHASHSEED"] = str(cfg.seed)
    env["PYTHONUNBUFFERED"] = "1"
    if cfg.wants_status_files():
        env["ASCEND_GRAPH_PATCH_STATUS_DIR"] = str(run.dir / "status")
    simulate = cfg.simulate if cfg.simulate is not None else simulated(base)
    if cfg.workload == "sim" or simulate:
        env["TORCH_NPU_SIM"] = "1"
        env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # the simulator is torch_npu
    env.update(cfg.extra_env)
    return env


def plan_runs(cfg: ABConfig) -> list[ArmRun]:
    runs = []
    seen: dict[str, int] = {}
    order = cfg.order or schedule(cfg.repeats, cfg.verify, cfg.eager, cfg.stream)
    for index, arm in enumerate(order):
        seen[arm] = seen.get(arm, 0) + 1
        run_dir = cfg.out / "arms" / f"{index:02d}-{arm}"
        runs.append(
            ArmRun(
                index=index,
                arm=arm,
                mode=ARM_MODES[arm],
                repeat=seen[arm] - 1,
                dir=run_dir,
                cache_root=cfg.out / "cache" / (arm if cfg.jobs <= 1 else f"{index:02d}-{arm}"),
            )
        )
    return runs


def spec_for(cfg: ABConfig, run: ArmRun) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "arm": run.arm,
        "mode": run.mode,
        "repeat": run.repeat,
        "workload": cfg.workload,
        "cases": list(cfg.cases),
        "steps": cfg.steps,
        "seed": cfg.seed,
        "eager_atol": cfg.eager_atol,
        "progress_total": cfg.units_per_run(),
        "units_per_engine_case": 1,
        "case_timeout": cfg.timeout,
    }
    if cfg.workload in MODEL_WORKLOADS:
        spec.update(
            model=cfg.model,
            prompts=cfg.prompts,
            max_tokens=cfg.max_tokens,
            engine_args=list(cfg.engine_args),
            enforce_eager=run.arm == "eager",
            simulate=cfg.simulate,
        )
    if cfg.serve is not None:
        spec["serve"] = cfg.serve
    return spec


class ArmsInterrupted(KeyboardInterrupt):
    """The A/B was interrupted (a signal, Ctrl-C): every arm still running has been stopped and
    marked; ``runs`` holds every planned run, finished or not, for the report of what finished."""

    def __init__(self, runs: list[ArmRun], cause: BaseException) -> None:
        self.runs = runs
        #: The signal's name, and the shell's exit status: 128 + its number (130 for Ctrl-C).
        self.signal, self.exit_code = supervisor.interruption(cause)
        super().__init__(self.signal)


def _stop(*procs: subprocess.Popen) -> None:
    """End arms' process groups (a worker may have children: vLLM's engine core, its workers,
    a server): SIGTERM, one grace period for all, then SIGKILL (``supervisor``)."""
    supervisor.stop_many(procs)


@dataclass
class _Running:
    """An arm's process while it runs."""

    run: ArmRun
    proc: subprocess.Popen
    started: float
    result_path: Path
    progress_path: Path
    shown: int = 0


def start_arm(cfg: ABConfig, run: ArmRun, env: dict[str, str] | None = None) -> _Running:
    """Write the arm's spec and start its worker in a new session (its own process group)."""
    run.dir.mkdir(parents=True, exist_ok=True)
    run.cache_root.mkdir(parents=True, exist_ok=True)
    _share_model_inspection(cfg, run)
    spec_path, result_path, progress_path = (
        run.dir / n for n in ("spec.json", "result.json", "progress")
    )
    for stale in (result_path, progress_path):
        stale.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec_for(cfg, run), indent=1))
    module = worker_module(cfg.workload)
    if cfg.worker_cmd is None and module is None:
        raise RuntimeError(f"no A/B worker for workload {cfg.workload!r} is installed")
    cmd = list(cfg.worker_cmd or [sys.executable, "-m", str(module)])
    cmd += [
        "--spec",
        str(spec_path),
        "--result",
        str(result_path),
        "--progress",
        str(progress_path),
    ]
    run_env = arm_env(dict(os.environ if env is None else env), cfg, run)
    with open(run.log, "wb") as log:  # supervised: ends with this command, however it ends
        proc = supervisor.start(cmd, env=run_env, stdout=log, stderr=subprocess.STDOUT)
    return _Running(run, proc, time.monotonic(), result_path, progress_path)


def _share_model_inspection(cfg: ABConfig, run: ArmRun) -> None:
    """vLLM inspects each model class in a fresh interpreter and caches the answer under
    ``VLLM_CACHE_ROOT/modelinfos`` (a function of vLLM's source, not of the toggle): the arms share
    that one directory, so only the first pays the cold import."""
    link = run.cache_root / "modelinfos"
    if link.exists() or link.is_symlink():
        return
    shared = cfg.out / "cache" / "modelinfos"
    shared.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(shared.resolve(), target_is_directory=True)
    except OSError:  # no symlinks here: each arm inspects for itself
        pass


def poll_arm(cfg: ABConfig, running: _Running, bar: Any = None) -> bool:
    """Feed the progress bar; kill the arm at its timeout. True once the arm has ended."""
    if bar is not None:
        done = min(read_progress(running.progress_path), cfg.units_per_run())
        if done > running.shown:
            bar.update(done - running.shown)
            running.shown = done
    if running.proc.poll() is not None:
        return True
    if time.monotonic() - running.started > cfg.timeout:
        _stop(running.proc)
        running.run.error = f"no result after {cfg.timeout:.0f} s (killed)"
        running.run.status = "timeout"
        return True
    return False


def finish_arm(cfg: ABConfig, running: _Running, bar: Any = None) -> None:
    """Classify the outcome; attach the result and the merged status files of the arm."""
    run, proc = running.run, running.proc
    run.seconds = time.monotonic() - running.started
    run.returncode = proc.returncode
    if bar is not None and cfg.units_per_run() > running.shown:
        bar.update(cfg.units_per_run() - running.shown)
    result = _read_result(running.result_path)
    run.result = result
    if run.status == "timeout":
        pass
    elif proc.returncode != 0:
        run.status = "crash"
        fatal = (result or {}).get("fatal")
        run.error = fatal or f"exit status {proc.returncode}: {_tail(run.log)}"
    elif result is None or not result.get("ok"):
        run.status, run.error = "crash", "exited 0 without a valid result"
    else:
        run.status = "ok"
    if result is not None:
        attach_status_files(cfg, run)


def attach_status_files(cfg: ABConfig, run: ArmRun) -> None:
    """Merge the status files every process of the arm wrote into ``result["processes"]``.

    For the vLLM workload (one case: the model) they are the case's figures: counters summed over
    every process that ran a model runner (engine core, tensor-parallel ranks), update times of
    the lowest rank that has any (each rank times the same steps).
    """
    assert run.result is not None
    snaps = status_files.read_dir(run.dir / "status")
    merged = status_files.merge(snaps)
    per_process = merged["per_process"]
    for row, snap in zip(per_process, snaps, strict=True):
        row["update_calls"] = len(snap.get("update_ns") or [])
        row["argv"] = snap.get("argv")
    run.result["processes"] = {
        "count": merged["processes"],
        "counters": merged["counters"],
        "graphs_owned": merged["graphs_owned"],
        "per_process": per_process,
    }
    if cfg.workload != "vllm" or not snaps:
        return
    timed = [s for s in snaps if s.get("update_ns")]
    for case in run.result.get("cases", []):
        case["counters"] = dict(merged["counters"])
        case["graphs_owned"] = merged["graphs_owned"]
        case["update_ns"] = list(timed[0]["update_ns"]) if timed else []
        case["update_calls"] = [1] * len(case["update_ns"])
        case["runner_processes"] = [
            {"pid": r["pid"], "rank": r["rank"], "update_calls": r["update_calls"]}
            for r in per_process
            if r["counters"] or r["update_calls"]
        ]


def run_arm(cfg: ABConfig, run: ArmRun, bar: Any = None, env: dict[str, str] | None = None) -> None:
    """Run one arm to its end (with timeout, feeding the progress bar), classify the outcome."""
    running = start_arm(cfg, run, env)
    while not poll_arm(cfg, running, bar):
        time.sleep(0.25)
    finish_arm(cfg, running, bar)


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) if text else "(empty log)"


def _progress_bar(cfg: ABConfig, total: int) -> Any:
    if not cfg.progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    unit = {"vllm": "prompt", "serve": "load"}.get(cfg.workload, "step")
    if cfg.workload != "vllm" and cfg.engine_cases == len(cfg.cases):
        unit = "case"
    return tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False)


def run_ab(cfg: ABConfig, env: dict[str, str] | None = None) -> list[ArmRun]:
    """Run every planned arm (``cfg.jobs`` at a time, in order); the runs with their results."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(cfg)
    bar = _progress_bar(cfg, cfg.units_per_run() * len(runs))
    pending, running = list(runs), []
    stopped = False
    try:
        while pending or running:
            while pending and len(running) < max(cfg.jobs, 1):
                run = pending.pop(0)
                if bar is not None:
                    bar.set_description(f"arm {run.index + 1}/{len(runs)} {run.arm}")
                elif cfg.progress:
                    print(f"ab: arm {run.index + 1}/{len(runs)} {run.arm} ...", file=sys.stderr)
                running.append(start_arm(cfg, run, env))
            time.sleep(0.25)
            for entry in list(running):
                if poll_arm(cfg, entry, bar):
                    running.remove(entry)
                    finish_arm(cfg, entry, bar)
                    if bar is None and cfg.progress:
                        r = entry.run
                        print(
                            f"ab:   {r.arm} (run {r.index}) {r.status} in {r.seconds:.1f} s",
                            file=sys.stderr,
                        )
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP (supervisor.Interrupted)
        _stop(*(entry.proc for entry in running))
        stopped = True
        for entry in running:
            entry.run.seconds = time.monotonic() - entry.started
            entry.run.status = "interrupted"
            entry.run.error = f"interrupted ({supervisor.interruption(exc)[0]}): arm stopped"
        for run in pending:
            run.status, run.error = "not run", "interrupted before it started"
        raise ArmsInterrupted(runs, exc) from exc
    finally:
        if not stopped:  # an exception of our own: leave no arm behind either
            _stop(*(entry.proc for entry in running))
        if bar is not None:
            bar.close()
    return runs
