"""The arms of the engine tests and how they are launched: each in a fresh interpreter.

An arm is one setting of the overlay for a whole process tree, so it is fixed in the environment
before the interpreter starts (the ``.pth`` loaders decide in every process vLLM spawns): eager
(no graphs), stock (overlay off), overlay (on), verify (stock's update applied, the overlay's
compared with it), and the negative control (overlay on, every relaunch skipped by the
simulator). Each arm gets its own ``VLLM_CACHE_ROOT`` (vLLM's compile cache does not see the
toggle) and its own status directory; model-inspection results (a pure function of vLLM's source)
are shared between arms to pay that subprocess once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ascend_graph_patch import supervisor

from .. import happens_before
from . import barrier, control, order_wait
from .cases import (
    CASES,
    CONTROL_CASES,
    CONTROL_ONLY_CASES,
    OPTIONAL_CONTROL_CASES,
    OVERLAY_ONLY_CASES,
    Case,
    eager_cases,
)


@dataclass(frozen=True)
class Arm:
    name: str
    graph: bool
    env: dict[str, str] = field(default_factory=dict)


ARMS: dict[str, Arm] = {
    arm.name: arm
    for arm in (
        Arm("eager", graph=False, env={"ASCEND_GRAPH_PATCH": "off"}),
        Arm("stock", graph=True, env={"ASCEND_GRAPH_PATCH": "off"}),
        Arm("overlay", graph=True, env={"ASCEND_GRAPH_PATCH": "on"}),
        Arm("verify", graph=True, env={"ASCEND_GRAPH_PATCH": "verify"}),
        Arm(
            "control",
            graph=True,
            env={"ASCEND_GRAPH_PATCH": "on", control.ENV_VAR: "1"},
        ),
    )
}


#: The overlay's setting for stream-ordered replay (named, not imported: the overlay's settings).
STREAM_ORDER = {"ASCEND_GRAPH_PATCH_REPLAY_SYNC": "stream"}

#: Arms outside the engine tests (``python -m torch_npu_sim.engine.arms --arms NAME``): stock, and
#: the overlay, with stock's replay barrier removed (``barrier``): the race detector's negative
#: controls on the engine (the overlay's updates are ordered by that barrier too).
OPTIONAL_ARMS: dict[str, Arm] = {
    arm.name: arm
    for arm in (
        Arm("nobarrier", graph=True, env={"ASCEND_GRAPH_PATCH": "off", barrier.ENV_VAR: "1"}),
        Arm(
            "overlay-nobarrier",
            graph=True,
            env={"ASCEND_GRAPH_PATCH": "on", barrier.ENV_VAR: "1"},
        ),
        # the overlay's opt-in stream-ordered replay, and its negative control without the wait
        Arm("stream", graph=True, env={"ASCEND_GRAPH_PATCH": "on", **STREAM_ORDER}),
        Arm(
            "stream-nowait",
            graph=True,
            env={"ASCEND_GRAPH_PATCH": "on", **STREAM_ORDER, order_wait.ENV_VAR: "1"},
        ),
    )
}
ALL_ARMS: dict[str, Arm] = {**ARMS, **OPTIONAL_ARMS}

#: ``<arm>@adversarial``: the graph arm ``<arm>`` again under the adversarial schedule, executed
#: by prophecy (``torch_npu_sim.adversarial``): each task run a later update may overtake (the
#: race detector's ``update`` races in ``<arm>``'s own run, pass 1) reads that update's host
#: values. Runs after ``<arm>`` (added when not asked for); its cases are ``<arm>``'s.
ADVERSARIAL = "@adversarial"


def arm_named(name: str) -> Arm:
    """The arm ``name``: one of :data:`ALL_ARMS`, or a graph arm with :data:`ADVERSARIAL`."""
    if name.endswith(ADVERSARIAL):
        source = ALL_ARMS.get(name.removesuffix(ADVERSARIAL))
        if source is None or not source.graph:
            raise ValueError(f"{name}: {ADVERSARIAL} follows a graph arm of {', '.join(ALL_ARMS)}")
        return Arm(name, graph=True, env=dict(source.env))
    if name not in ALL_ARMS:
        raise ValueError(f"unknown arm {name!r}: expected one of {', '.join(ALL_ARMS)}")
    return ALL_ARMS[name]


def source_arm(name: str) -> str | None:
    """The arm whose run is an adversarial arm's pass 1 (None for any other arm)."""
    return name.removesuffix(ADVERSARIAL) if name.endswith(ADVERSARIAL) else None


def write_prophecies(source: dict[str, Any], folder: Path) -> None:
    """Pass 1's prophecies, one file per case (by the rank of each model-runner process), from
    the source arm's results; a case none of whose processes reported one gets no file."""
    from .arm import prophecy_file

    folder.mkdir(parents=True, exist_ok=True)
    for case, record in (source.get("cases") or {}).items():
        by_rank = {
            str(r.get("rank")): r["prophecy"]
            for r in record.get("runners") or []
            if r and r.get("prophecy") is not None
        }
        if by_rank:
            (folder / prophecy_file(case)).write_text(json.dumps(by_rank))


def cases_for(arm: str, cases: tuple[Case, ...] = CASES) -> list[Case]:
    if cases is CASES:  # with the cases only the control (or the overlay) runs
        cases = (*CASES, *CONTROL_ONLY_CASES, *OVERLAY_ONLY_CASES)
    if arm == "eager":
        return list(eager_cases(cases))
    if arm == "control":
        controlled = (*CONTROL_CASES, *OPTIONAL_CONTROL_CASES)
        return [c for c in cases if c.name in controlled or c in CONTROL_ONLY_CASES]
    if arm == "overlay":
        return [c for c in cases if c not in CONTROL_ONLY_CASES]
    return [c for c in cases if c not in CONTROL_ONLY_CASES and c not in OVERLAY_ONLY_CASES]


def arm_env(arm: Arm, directory: Path, shared_modelinfos: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("ASCEND_GRAPH_PATCH", "VLLM_", control.ENV_VAR, barrier.ENV_VAR, order_wait.ENV_VAR)
        )
    }
    cache = directory / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    link = cache / "modelinfos"
    if not link.exists():
        shared_modelinfos.mkdir(parents=True, exist_ok=True)
        link.symlink_to(shared_modelinfos, target_is_directory=True)
    env.update(
        TORCH_NPU_SIM="1",
        # Not needed any more (the simulator stands in for what vllm-ascend's general plugins
        # need: tests/test_sim_torch_additions.py, tests/test_serve.py load them all): it keeps
        # ~2 s of their imports out of every arm; they change nothing the engine cases test.
        VLLM_PLUGINS="ascend",
        VLLM_CACHE_ROOT=str(cache),
        ASCEND_GRAPH_PATCH_STATUS_DIR=str(directory / "status"),
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        # One intra-op thread in every process (the arm sets it too; an engine core started by
        # spawn would not inherit that): many tiny ops, and identical float results.
        OMP_NUM_THREADS="1",
        VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    )
    # The race detector counts in every arm (the tests read its counts; stock's barrier removed
    # must be the only way to get one): a parent's own setting wins.
    env.setdefault(happens_before.ENV_VAR, happens_before.COUNT)
    env.update(arm.env)
    return env


def run_arms(
    directory: Path,
    model_root: Path,
    arms: Iterable[str] = tuple(ARMS),
    cases: tuple[Case, ...] = CASES,
    parallel: int = 2,
    timeout: float = 900.0,
    case_timeout: float = 300.0,
    cases_by_arm: dict[str, list[Case]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run each arm in a fresh interpreter, ``parallel`` at a time; results by arm name.

    ``cases_by_arm`` names an arm's own cases (e.g. the eager TP=1 reference of TP cases);
    otherwise ``cases_for`` chooses them from ``cases``.

    An arm that dies without a result gets ``{"error": ..., "cases": {}}`` with its log's tail.
    """
    shared = directory / "modelinfos"
    names = list(arms)
    for name in list(names):  # an adversarial arm's pass 1 runs first
        source = source_arm(name)
        if source is not None and source not in names:
            names.insert(names.index(name), source)
    pending = [arm_named(name) for name in names]
    running: list[tuple[Arm, subprocess.Popen[bytes], float, Path]] = []
    results: dict[str, dict[str, Any]] = {}
    try:
        while pending or running:
            while len(running) < parallel:
                ready = [a for a in pending if source_arm(a.name) in (None, *results)]
                if not ready:
                    break
                arm = ready[0]
                pending.remove(arm)
                source = source_arm(arm.name)
                prophecies = None
                if source is not None:
                    prophecies = directory / arm.name / "prophecy"
                    write_prophecies(results[source], prophecies)
                mine = (cases_by_arm or {}).get(source or arm.name)
                own = mine or cases_for(source or arm.name, cases)
                launched = _launch(
                    arm, directory, model_root, shared, own, case_timeout, prophecies
                )
                running.append((arm, *launched))
            time.sleep(0.5)
            for entry in list(running):
                arm, proc, started, arm_dir = entry
                if proc.poll() is None and time.monotonic() - started < timeout:
                    continue
                supervisor.stop(proc)  # a timed-out arm and its engine cores; quick once exited
                running.remove(entry)
                results[arm.name] = _load(arm_dir, proc.returncode, time.monotonic() - started)
    finally:  # a failure or an interruption (a test's timeout, Ctrl-C) leaves no engine behind
        supervisor.stop_many(proc for _, proc, _, _ in running)
    return results


def _launch(
    arm: Arm,
    directory: Path,
    model_root: Path,
    shared: Path,
    cases: Iterable[Case],
    case_timeout: float,
    prophecies: Path | None = None,
) -> tuple[subprocess.Popen[bytes], float, Path]:
    """Start one arm, supervised (its own process group, stopped with everything it started)."""
    arm_dir = directory / arm.name
    arm_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "graph": arm.graph,
        "model_root": str(model_root),
        "timeout": case_timeout,
        "cases": [c.to_json() for c in cases],
        "prophecy_dir": None if prophecies is None else str(prophecies),
    }
    (arm_dir / "spec.json").write_text(json.dumps(spec, indent=1))
    cmd = [
        sys.executable,
        "-m",
        "torch_npu_sim.engine.arm",
        "--spec",
        str(arm_dir / "spec.json"),
        "--out",
        str(arm_dir / "result.json"),
    ]
    env = arm_env(arm, arm_dir, shared)
    with (arm_dir / "log").open("wb") as log:
        proc = supervisor.start(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, time.monotonic(), arm_dir


def _load(arm_dir: Path, returncode: int | None, seconds: float) -> dict[str, Any]:
    try:
        result = json.loads((arm_dir / "result.json").read_text())
    except (OSError, ValueError):
        tail = (arm_dir / "log").read_text(errors="replace")[-3000:]
        result = {"error": f"arm exited {returncode} without a result:\n{tail}", "cases": {}}
    result["seconds"] = round(seconds, 1)
    result["returncode"] = returncode
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_npu_sim.engine.arms --out DIR``: run the arms, print the table."""
    import argparse

    from . import models, race_table, report

    parser = argparse.ArgumentParser(prog="python -m torch_npu_sim.engine.arms")
    parser.add_argument("--out", required=True, help="working directory (results, logs, caches)")
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma-separated, of {', '.join(ALL_ARMS)}; a graph arm followed by {ADVERSARIAL} "
        "runs it again under the adversarial schedule (after it)",
    )
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--models", default="", help="model cache (default: OUT/models)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    model_root = Path(args.models) if args.models else out / "models"
    from .cases import ALL_CASES

    every = (*ALL_CASES, *CONTROL_ONLY_CASES)
    chosen = tuple(
        c for c in every if c.name in args.cases.split(",") or (not args.cases and c in CASES)
    )
    for name in {m for c in chosen for m in (c.model, c.draft) if m}:
        models.materialize(name, model_root)
    results = run_arms(out, model_root, args.arms.split(","), chosen)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(report.table(results, chosen))
    print(race_table.table(results, chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
