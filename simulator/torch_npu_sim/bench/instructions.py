"""Instruction counts for the benchmark (valgrind's callgrind): a figure the neighbours' load
cannot move.

Why: wall-clock medians of a few microseconds flip with a shared machine's load (a 2-core CI
runner read PA one layer at 1.09x stock in one run, 0.93x in the next). The number of
instructions the host executes for one update is the same on every run of the same code, so it
can decide a target and guard against a regression.

How: the measured process runs under ``valgrind --tool=callgrind --instr-atstart=no`` (imports and
engine builds run uninstrumented, about five times slower than native, not fifty). Around each
measured region it switches instrumentation on, zeroes the counters, calls the region ``n``
times, and dumps the counters under a label (callgrind's client requests, from a ten-line C
helper compiled here once: the requests are inline-assembly macros of ``valgrind/callgrind.h``,
no-ops when not under valgrind). An empty region measured the same way gives the cost of the
measuring itself, which is subtracted. The parent reads one dump file per label.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HELPER_SOURCE = r"""
#include <valgrind/callgrind.h>
void agp_cg_on(void) { CALLGRIND_START_INSTRUMENTATION; }
void agp_cg_off(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void agp_cg_zero(void) { CALLGRIND_ZERO_STATS; }
void agp_cg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
int agp_cg_running(void) { return RUNNING_ON_VALGRIND; }
"""
#: The callgrind header the helper needs (valgrind's development files).
HEADER = "valgrind/callgrind.h"
#: The label of the empty region: the measuring's own cost, subtracted from every other.
EMPTY = "empty"


def unavailable() -> str | None:
    """Why instructions cannot be counted here (None: they can)."""
    if not sys.platform.startswith("linux"):
        return "instruction counts need Linux (valgrind)"
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt install valgrind)"
    if _compiler() is None:
        return "no C compiler (cc/gcc) for the callgrind helper"
    try:
        helper_path()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot build the callgrind helper ({HEADER} missing?): {exc}"
    return None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def helper_path() -> Path:
    """The compiled helper (built once per source, in the user's cache)."""
    digest = hashlib.sha256(HELPER_SOURCE.encode()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch-npu-sim"
    target = base / f"callgrind-helper-{digest}.so"
    if target.is_file():
        return target
    compiler = _compiler()
    if compiler is None:
        raise OSError("no C compiler")
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        source = Path(tmp) / "helper.c"
        source.write_text(HELPER_SOURCE)
        built = Path(tmp) / "helper.so"
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O1", "-o", str(built), str(source)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(built, target)
    return target


class Counter:
    """In the measured process: count the instructions of regions, one labelled dump each."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(str(helper_path()))
        lib.agp_cg_dump.argtypes = [ctypes.c_char_p]
        self._lib = lib
        self.under_valgrind = bool(lib.agp_cg_running())

    def count(self, label: str, fn: Callable[[], Any], n: int) -> None:
        """Instrument, zero, call ``fn`` ``n`` times, dump under ``label``; then switch the
        instrumentation off again (what runs between regions, e.g. an engine build, runs at
        valgrind's uninstrumented speed)."""
        lib = self._lib
        lib.agp_cg_on()
        lib.agp_cg_zero()
        for _ in range(n):
            fn()
        lib.agp_cg_dump(label.encode())
        lib.agp_cg_off()

    def count_empty(self, n: int) -> None:
        """The measuring's own cost (the loop, the calls into the helper), for subtraction."""
        self.count(EMPTY, _nothing, n)


def _nothing() -> None:
    return None


def callgrind_command(out_dir: Path, argv: list[str]) -> list[str]:
    """``argv`` run under callgrind, one dump file per labelled region into ``out_dir``."""
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--collect-jumps=no",
        "--dump-instr=no",
        f"--callgrind-out-file={out_dir}/callgrind.out.%p",
        *argv,
    ]


_DESC = re.compile(r"^desc: Trigger: Client Request: (.*)$", re.M)
_TOTALS = re.compile(r"^(?:totals|summary): (\d+)", re.M)


def parse_dump(text: str) -> tuple[str, int] | None:
    """(label, instructions) of one callgrind dump triggered by a labelled client request
    (None for the other dumps: the one at exit)."""
    desc = _DESC.search(text)
    totals = _TOTALS.search(text)
    if desc is None or totals is None:
        return None
    return desc.group(1).strip(), int(totals.group(1))


def read_dumps(out_dir: Path) -> dict[str, int]:
    """Instructions by label, from every dump file in ``out_dir``; a label dumped twice is an
    error (its regions would be mixed up)."""
    counts: dict[str, int] = {}
    for path in sorted(out_dir.glob("callgrind.out.*")):
        parsed = parse_dump(path.read_text(errors="replace"))
        if parsed is None:
            continue
        label, instructions = parsed
        if label in counts:
            raise ValueError(f"callgrind label {label!r} dumped twice")
        counts[label] = instructions
    return counts


def per_call(counts: dict[str, int], label: str, n: int) -> float:
    """Instructions of one call of the region ``label`` (``n`` calls), the measuring's own
    cost (the empty region, also ``n`` calls) taken off."""
    return (counts[label] - counts.get(EMPTY, 0)) / n


def run_counted(spec: dict[str, Any], work_dir: Path, timeout: float = 7200.0) -> dict[str, Any]:
    """Run the benchmark's points under callgrind (``bench.counted``); their instructions.

    Returns ``{"points": [{kind, layers, batch, tasks, steps, stock, overlay, floor} or with
    "error"], "capture": {layers, sizes, stock, overlay, ratio} or None}``, instructions per
    call. The child is supervised: it ends with this process, however that ends.
    """
    import json
    import time

    from ascend_graph_patch import supervisor

    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in work_dir.glob("callgrind.out.*"):
        stale.unlink()
    spec_path, meta_path = work_dir / "spec.json", work_dir / "counted.json"
    spec_path.write_text(json.dumps(spec))
    meta_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "torch_npu_sim.bench.counted"]
    argv += ["--spec", str(spec_path), "--out", str(meta_path)]
    # one string-hash seed: dict probing, hence the counts, then repeat exactly run to run
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with open(work_dir / "log", "wb") as log:
        proc = supervisor.start(callgrind_command(work_dir, argv), env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        supervisor.stop(proc)
    if proc.returncode != 0 or not meta_path.is_file():
        tail = (work_dir / "log").read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"the counted run failed ({proc.returncode}): {' | '.join(tail)}")
    meta = json.loads(meta_path.read_text())
    counts = read_dumps(work_dir)
    n = int(meta["region_calls"])
    points = []
    for row in meta["points"]:
        if "error" not in row:
            key = f"{row['kind']}|{row['layers']}|{row['batch']}"
            for arm in ("stock", "overlay", "floor"):
                row[arm] = per_call(counts, f"{key}|{arm}", n)
        points.append(row)
    capture = meta.get("capture")
    if capture:
        stock, overlay = counts["capture|stock"], counts["capture|overlay"]
        capture = dict(capture, stock=stock, overlay=overlay, ratio=overlay / stock)
    return {"points": points, "capture": capture}
