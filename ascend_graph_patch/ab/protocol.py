"""The file protocol between the orchestrator and an arm's worker process (stdlib only).

The orchestrator writes ``spec.json`` and starts ``python -m <worker> --spec S --result R
--progress P``; the worker writes its result JSON atomically (a half-written file must read as a
crash, not as a result) and bumps the progress file as it goes. Nothing here imports torch: the
orchestrator stays light and the fake workers of the tests start in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: arm name -> value of ASCEND_GRAPH_PATCH in that arm's process. The eager arm (the reference
#: of workloads without an in-process eager run: real engines) builds eager engines, overlay off.
ARM_MODES: dict[str, str] = {
    "eager": "off",
    "stock": "off",
    "patched": "on",
    "stream": "on",
    "verify": "verify",
}
#: arm name -> further settings of that arm's processes. ``stream``: the overlay with its opt-in
#: stream-ordered replay (owned graphs replay without stock's per-step device synchronize).
ARM_ENV: dict[str, dict[str, str]] = {"stream": {"ASCEND_GRAPH_PATCH_REPLAY_SYNC": "stream"}}

#: Result schema version (bump on incompatible changes).
SCHEMA = 1


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON to ``path`` via a temporary file and rename (readers never see half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


class Progress:
    """Worker side of the progress channel: ``done total`` in a small file, throttled."""

    def __init__(self, path: str | None, total: int) -> None:
        self.path = path
        self.total = total
        self.done = 0
        self._last = 0.0

    def advance(self, n: int = 1, force: bool = False) -> None:
        self.done += n
        now = time.monotonic()
        if self.path and (force or now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            try:
                Path(self.path).write_text(f"{self.done} {self.total}\n")
            except OSError:
                pass


def read_progress(path: Path) -> int:
    """Orchestrator side: steps done so far (0 if nothing readable yet)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def worker_main(
    run: Callable[[dict[str, Any], Progress, Path], dict[str, Any]], argv: list[str] | None = None
) -> int:
    """Common ``main`` of a worker: parse the protocol options, run, write the result.

    An exception escaping ``run`` is a crash of the arm: it is still written into the result
    (``fatal``) for the report, and the exit status is 1 so the orchestrator reports CRASH.
    """
    parser = argparse.ArgumentParser(description="A/B arm worker (internal)")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--progress", default=None)
    ns = parser.parse_args(argv)
    spec = json.loads(Path(ns.spec).read_text())
    result_path = Path(ns.result)
    progress = Progress(ns.progress, int(spec.get("progress_total", 0)))
    started = time.time()
    base = {
        "schema": SCHEMA,
        "arm": spec.get("arm"),
        "mode_env": os.environ.get("ASCEND_GRAPH_PATCH", ""),
        "cache_root": os.environ.get("VLLM_CACHE_ROOT"),
        "seed": spec.get("seed"),
        "pid": os.getpid(),
        "python": sys.executable,
    }
    try:
        body = run(spec, progress, result_path.parent)
    except BaseException as exc:  # noqa: BLE001 - reported, then the arm exits non-zero
        base.update(
            ok=False,
            fatal=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            seconds=time.time() - started,
        )
        write_json_atomic(result_path, base)
        return 1
    base.update(body)
    base.update(ok=True, seconds=time.time() - started)
    write_json_atomic(result_path, base)
    return 0
