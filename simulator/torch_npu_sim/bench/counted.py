"""The benchmark's points, counted in instructions: the program ``bench --instructions`` runs
under callgrind (``python -m torch_npu_sim.bench.counted --spec SPEC --out OUT``).

The same engines, steps and callables as the wall-clock sweep (``core.point_calls``: stock's own
update, the overlay's, the floor of bare runtime calls, in one process, warmed up), each counted
over :data:`REGION_CALLS` calls; and the capture of one FIA engine's graphs with the overlay off
and on, as ``core.capture_overhead`` times it (heap frozen, null cost, after one warm-up capture
per arm). Writes the points' metadata; the counts are in callgrind's dump files, one per label
``kind|layers|batch|arm`` or ``capture|arm``, which the parent reads.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
from pathlib import Path
from typing import Any

from torch_npu_sim.bench import core, instructions

#: Calls per counted region: the count is exact, a few calls average the first-call effects out.
REGION_CALLS = 5
ARMS = ("stock", "overlay", "floor")


def label(kind: str, layers: int, batch: int, arm: str) -> str:
    return f"{kind}|{layers}|{batch}|{arm}"


def count_points(
    counter: instructions.Counter, kinds: list[str], layers: list[int], batches: list[int]
) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    for kind in kinds:
        for n_layers in layers:
            engine = core._engine(core.KINDS[kind](n_layers, tuple(batches)))
            try:
                for batch in batches:
                    row: dict[str, Any] = {"kind": kind, "layers": n_layers, "batch": batch}
                    try:
                        _trim_heap()
                        with core.point_calls(engine, kind, n_layers, batch) as (point, calls):
                            gc.disable()
                            try:
                                for arm in ARMS:
                                    counter.count(
                                        label(kind, n_layers, batch, arm), calls[arm], REGION_CALLS
                                    )
                            finally:
                                gc.enable()
                        row.update(tasks=point.tasks, steps=point.steps)
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
                    points.append(row)
            finally:
                engine.close()
                gc.collect()
    return points


def _trim_heap() -> None:
    """Give the allocator's free chunks back (glibc's ``malloc_trim``) before a point warms up.

    Why: the simulated ops allocate tensor storage with ``posix_memalign``, whose instructions
    depend on what the heap holds from everything before (an engine closed, another point): a
    one-layer point's overlay / floor moved by 1.5% between processes laid out differently, 0.3%
    with the heap trimmed first. Not glibc: nothing to do."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def count_capture(counter: instructions.Counter, layers: int, sizes: list[int]) -> None:
    from ascend_graph_patch import activation
    from torch_npu_sim import runtime
    from torch_npu_sim.harness import scenarios

    for counted in (False, True):  # the first capture of each arm pays one-off costs
        for arm in ("stock", "overlay"):
            if arm == "stock":
                activation.disable()
            else:
                activation.enable("on")
            engine = scenarios.build(core.KINDS["FIA"](layers, tuple(sizes)))
            gc.collect()
            gc.freeze()  # as vLLM's runner freezes the heap around its capture
            try:
                with runtime.null_cost():
                    if counted:
                        counter.count(f"capture|{arm}", engine.capture, 1)
                    else:
                        engine.capture()
            finally:
                gc.unfreeze()
                engine.close()
    activation.enable("on")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_npu_sim.bench.counted")
    parser.add_argument("--spec", required=True, help="JSON: kinds, layers, batches, capture")
    parser.add_argument("--out", required=True, help="where to write the points' metadata")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    counter = instructions.Counter()
    core._prepare()
    counter.count_empty(REGION_CALLS)
    points = count_points(counter, spec["kinds"], spec["layers"], spec["batches"])
    capture = spec.get("capture")
    if capture:
        count_capture(counter, capture["layers"], capture["sizes"])
    out = {
        "points": points,
        "capture": capture,
        "region_calls": REGION_CALLS,
        "under_valgrind": counter.under_valgrind,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
