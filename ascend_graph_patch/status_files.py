"""Per-process status files: how counters and update timings leave the processes that did the work.

vLLM runs the model runner in its engine-core process (the default) and, with tensor
parallelism, in one worker process per rank: the figures that matter never live in the process
that started the engine. With ``ASCEND_GRAPH_PATCH_STATUS_DIR=<dir>``, every Python process (the
``.pth`` loader starts this even with the toggle off, so a stock run can be measured the same way)
writes its :func:`status.snapshot` to ``<dir>/status-<pid>.json`` (with its rank inside),
atomically: at most once a second while it counts, and once more at exit. Once vllm_ascend loads,
each call of the runner's update entry points is timed (``ab.timing``: a wrapper above whatever
the overlay installed, the same in every mode) and the samples go into the file. A reader
(``ascend-graph-patch status --from <dir>``, the A/B report) merges the files with :func:`merge`.

The hot path pays one comparison per counter update; the file is written outside of it only
when a second has passed. A fork starts the child's file afresh (its own pid, its own counters).

The final write is registered twice: with ``atexit`` (an interpreter that exits normally), and as a
``multiprocessing`` finalizer (a ``multiprocessing.Process`` child, such as vLLM's engine core or a
tensor-parallel worker, ends through ``os._exit``, which skips ``atexit``, but runs its finalizers
first). ``Process`` clears the finalizers it inherited when it starts, so the registration is
renewed there by an after-fork hook (fork and spawn alike).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

#: Seconds between two writes of one process's file while it keeps counting.
INTERVAL = 1.0
#: Priority of the final write among ``multiprocessing`` finalizers: after everything else (lower
#: runs later), so what the process counted while shutting down is in the file.
FINALIZER_PRIORITY = -100
#: Update-time samples kept per process (the newest).
MAX_SAMPLES = 100_000
_PREFIX = "status-"


def rank() -> int | None:
    """This process's distributed rank, if it has one (torch.distributed, else the launcher's)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-initialised process group: fall back to the environment
        pass
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return None


class StatusWriter:
    """Writes this process's snapshot into a directory: throttled, at exit, fork-aware."""

    def __init__(self, directory: str | os.PathLike[str], interval: float = INTERVAL) -> None:
        self.directory = Path(directory)
        self.interval = interval
        self.next_write = 0.0
        self.failed: str | None = None
        self.timer: Any = None  # ab.timing.UpdateTimer, once vllm_ascend loads
        self.pending: threading.Timer | None = None  # the write that follows a skipped one

    @property
    def path(self) -> Path:
        return self.directory / f"{_PREFIX}{os.getpid()}.json"

    def maybe_write(self) -> None:
        """Called on every counter update: writes when ``interval`` has passed, else makes sure
        that a write follows when it has (a timer thread), so that the last counts of a burst
        reach the file within ``interval`` even if nothing is counted after them: a server's
        files read while it serves (``status --from``) are at most that old."""
        now = time.monotonic()
        if now >= self.next_write:
            self.next_write = now + self.interval
            self.write()
        elif self.pending is None:
            self.pending = threading.Timer(self.next_write - now, self._write_pending)
            self.pending.daemon = True
            self.pending.start()

    def _write_pending(self) -> None:
        # The next one is an interval away: the counting thread does not write meanwhile.
        self.next_write = time.monotonic() + self.interval
        self.pending = None
        self.write()

    def write(self) -> None:
        """Write the snapshot now; a failure is remembered (and warned once), never raised."""
        from ascend_graph_patch import state, status

        try:
            snap = status.snapshot()
            # Keep the rank once known: the last write, at exit, comes after vLLM destroyed
            # the process group, and the file must still say which rank counted this.
            current = rank()
            self.rank = current if current is not None else getattr(self, "rank", None)
            snap["rank"] = self.rank
            if self.timer is not None:
                snap["update_ns"] = self.timer.samples[-MAX_SAMPLES:]
                snap["update_calls"] = len(self.timer.samples)
                snap["timed_targets"] = sorted(set(self.timer.installed))
            snap["argv"] = sys.argv[:3]
            snap["written_at"] = time.time()
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(snap, default=str))
            os.replace(tmp, self.path)
        except Exception as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            state.warn_once(
                "status-dir", f"cannot write status file in {self.directory}: {self.failed}"
            )

    def after_fork_in_child(self) -> None:
        """A forked child starts its own file with its own counters (the parent keeps its)."""
        from ascend_graph_patch import state

        state.STATE.counters.clear()
        if self.timer is not None:
            self.timer.samples.clear()
        self.next_write = 0.0
        self.pending = None  # the parent's timer thread does not cross the fork

    def register_final_write(self) -> None:
        """Write once more when this process ends through ``multiprocessing`` (``os._exit``)."""
        multiprocessing.util.Finalize(None, self.write, exitpriority=FINALIZER_PRIORITY)

    def time_updates(self) -> None:
        """Time the runner's update entry points (trigger callback: vllm_ascend is loading)."""
        from ascend_graph_patch import state

        try:
            from ascend_graph_patch.ab import timing

            timer = timing.UpdateTimer(on_sample=self.maybe_write)
            timer.install(timing.VLLM_TARGETS)
            self.timer = timer
        except Exception as exc:
            state.warn_once("status-timing", f"update timing unavailable: {exc!r}")


_WRITER: StatusWriter | None = None


def start(directory: str) -> StatusWriter:
    """Begin writing this process's status into ``directory`` (idempotent per process)."""
    global _WRITER
    from ascend_graph_patch import state

    if _WRITER is None:
        from ascend_graph_patch import trigger

        _WRITER = StatusWriter(directory)
        writer = _WRITER
        state.on_count(writer.maybe_write)
        atexit.register(lambda: writer.write())
        writer.register_final_write()
        # A multiprocessing.Process child clears inherited finalizers, then runs these hooks.
        multiprocessing.util.register_after_fork(writer, StatusWriter.register_final_write)
        os.register_at_fork(after_in_child=writer.after_fork_in_child)
        trigger.arm(writer.time_updates)
    return _WRITER


def read_dir(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every status file in ``directory`` (unreadable ones are skipped), ordered by rank, pid."""
    snaps = []
    for path in sorted(Path(directory).glob(f"{_PREFIX}*.json")):
        try:
            snaps.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(snaps, key=lambda s: (s.get("rank") is None, s.get("rank") or 0, s.get("pid")))


def merge(snaps: list[dict[str, Any]]) -> dict[str, Any]:
    """One view of several processes: totals, plus one row per process (pid, rank, figures)."""
    counters: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    rows = []
    update_ns: list[int] = []
    for snap in snaps:
        counters.update(snap.get("counters") or {})
        tasks.update(snap.get("tasks_per_kind") or {})
        update_ns.extend(snap.get("update_ns") or [])
        rows.append(
            {
                "pid": snap.get("pid"),
                "rank": snap.get("rank"),
                "mode": snap.get("mode"),
                "gate": {g: v.get("verdict") for g, v in (snap.get("gate") or {}).items()},
                "graphs_owned": snap.get("graphs_owned", 0),
                "graphs_refused": len(snap.get("graphs_refused") or {}),
                "tasks_per_kind": snap.get("tasks_per_kind") or {},
                "counters": snap.get("counters") or {},
            }
        )
    return {
        "processes": len(snaps),
        "graphs_owned": sum(r["graphs_owned"] for r in rows),
        "graphs_refused": sum(r["graphs_refused"] for r in rows),
        "tasks_per_kind": dict(sorted(tasks.items())),
        "counters": dict(sorted(counters.items())),
        "update_ns": update_ns,
        "per_process": rows,
    }
