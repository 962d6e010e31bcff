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

The directory may be shared (a world-writable one, another user's files in it): a write never
follows a link someone placed there. Each write creates a new temporary file exclusively, under a
random name, readable by the user only (the group too in a set-group-ID directory, the usual way a
team shares one), then renames it over the final name (a rename replaces a link, never writes
through it); a directory the writer creates is the user's only (0700). The reader opens regular
files only, without following links and without blocking (a FIFO under a status file's name),
reads at most :data:`MAX_FILE_BYTES`, checks every field it merges, and skips a bad file with its
name and the reason, so one broken file never hides the others.

The final write is registered twice: with ``atexit`` (an interpreter that exits normally), and as a
``multiprocessing`` finalizer (a ``multiprocessing.Process`` child, such as vLLM's engine core or a
tensor-parallel worker, ends through ``os._exit``, which skips ``atexit``, but runs its finalizers
first). ``Process`` clears the finalizers it inherited when it starts, so the registration is
renewed there by an after-fork hook (fork and spawn alike).
"""

from __future__ import annotations

import atexit
import errno
import json
import multiprocessing.util
import os
import stat
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
#: The reader skips a larger file unread (a full file of :data:`MAX_SAMPLES` is about 1.5 MB).
MAX_FILE_BYTES = 16 << 20
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
            snap = status.snapshot(probe=False)
            # Keep the rank once known: the last write, at exit, comes after vLLM destroyed
            # the process group, and the file must still say which rank counted this.
            current = rank()
            self.rank = current if current is not None else getattr(self, "rank", None)
            snap["rank"] = self.rank
            if self.timer is not None:
                snap["update_ns"] = self.timer.samples[-MAX_SAMPLES:]
                snap["update_calls"] = len(self.timer.samples)
                snap["timed_targets"] = sorted(set(self.timer.installed))
                snap["calls"] = dict(self.timer.counts)
            snap["argv"] = sys.argv[:3]
            snap["written_at"] = time.time()
            _make_private_dirs(self.directory)
            _replace_exclusively(self.directory, self.path, json.dumps(snap, default=str))
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
            self.timer.counts.clear()
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
            timer.install(timing.VLLM_TARGETS, counted=timing.VLLM_COUNTED)
            self.timer = timer
        except Exception as exc:
            state.warn_once("status-timing", f"update timing unavailable: {exc!r}")


def _make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each the user's only (0700 less the umask)."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # another process made it meanwhile (or it is not a directory:
            pass  # the write below then fails, and says so)


def _replace_exclusively(directory: Path, final: Path, text: str) -> None:
    """Write ``text`` to a new file under a random name (``O_EXCL``: never an existing path, a
    link included), then rename it over ``final``: readers see the old file or the new one."""
    shared = os.stat(directory).st_mode & stat.S_ISGID
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    tmp = directory / f".{final.name}.{os.urandom(8).hex()}.tmp"
    fd = os.open(tmp, flags, 0o640 if shared else 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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


class Skipped(Exception):
    """A status file the reader leaves out; the message says why."""


def scan(directory: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every good status file in ``directory``, ordered by rank and pid, and every other one as
    ``{"file": name, "reason": why}``."""
    snaps, skipped = [], []
    for path in sorted(Path(directory).glob(f"{_PREFIX}*.json")):
        try:
            snaps.append(_read(path))
        except Skipped as why:
            skipped.append({"file": path.name, "reason": str(why)})
    snaps.sort(key=lambda s: (s.get("rank") is None, s.get("rank") or 0, s["pid"]))
    return snaps, skipped


def read_dir(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every good status file in ``directory`` (see :func:`scan`), ordered by rank and pid."""
    return scan(directory)[0]


_FILE_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _read(path: Path) -> dict[str, Any]:
    """One status file, checked; :class:`Skipped` with the reason otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Skipped("a symbolic link (not followed)") from None
        raise Skipped(f"cannot open: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _FILE_KINDS.get(stat.S_IFMT(mode), "of an unknown kind")
            raise Skipped(f"not a regular file ({kind})")
        try:
            data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise Skipped(f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise Skipped(f"too large (over {MAX_FILE_BYTES} bytes)")
    try:
        snap = json.loads(data)
    except RecursionError:
        raise Skipped("nested too deeply") from None
    except ValueError as exc:
        raise Skipped(f"not JSON: {exc}") from None
    problem = invalid(snap)
    if problem is not None:
        raise Skipped(problem)
    return snap


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_map(value: Any) -> bool:
    return isinstance(value, dict) and all(_is_int(v) for v in value.values())


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _gate(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, dict) and isinstance(v.get("verdict", ""), str) for v in value.values()
    )


#: The fields :func:`merge` reads: how each is checked, what it must be (each may be absent,
#: except ``pid``; keys of JSON objects are strings already).
_FIELDS: tuple[tuple[str, Any, str], ...] = (
    ("pid", lambda v: _is_int(v) and v > 0, "a positive integer"),
    ("rank", lambda v: v is None or _is_int(v), "an integer or null"),
    ("mode", lambda v: v is None or isinstance(v, str), "a string"),
    ("graphs_owned", lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    ("graphs_refused", _str_map, "a mapping of names to reasons"),
    ("tasks_per_kind", _int_map, "a mapping of names to integers"),
    ("counters", _int_map, "a mapping of names to integers"),
    ("update_ns", lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integers"),
    ("update_calls", lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    ("calls", _int_map, "a mapping of names to integers"),
    ("gate", _gate, "a mapping of groups to verdicts"),
    ("fault", lambda v: v is None or _fault(v), "a fault record"),
)
_SCALARS = ("pid", "rank", "mode", "graphs_owned")


def _fault(value: Any) -> bool:
    return isinstance(value, dict) and all(
        v is None or isinstance(v, (str, int, float)) for v in value.values()
    )


def invalid(snap: Any) -> str | None:
    """Why ``snap`` cannot be merged (the first bad field), or None."""
    if not isinstance(snap, dict):
        return f"not a JSON object ({type(snap).__name__})"
    if "pid" not in snap:
        return "pid: missing"
    for name, check, expected in _FIELDS:
        if name in snap and not check(snap[name]):
            shown = f" ({snap[name]!r})" if name in _SCALARS else ""
            return f"{name}: not {expected}{shown}"[:200]
    return None


def merge(
    snaps: list[dict[str, Any]], skipped: list[dict[str, Any]] | tuple = ()
) -> dict[str, Any]:
    """One view of several processes: totals, plus one row per process (pid, rank, figures).

    ``skipped`` (from :func:`scan`) is passed through; a snapshot given here that does not pass
    :func:`invalid` joins it (``file`` None) instead of breaking the sums.
    """
    counters: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    rows = []
    update_ns: list[int] = []
    left_out = list(skipped)
    for snap in snaps:
        problem = invalid(snap)
        if problem is not None:
            left_out.append({"file": None, "reason": problem})
            continue
        counters.update(snap.get("counters") or {})
        tasks.update(snap.get("tasks_per_kind") or {})
        update_ns.extend(snap.get("update_ns") or [])
        row = {
            "pid": snap.get("pid"),
            "rank": snap.get("rank"),
            "mode": snap.get("mode"),
            "gate": {g: v.get("verdict") for g, v in (snap.get("gate") or {}).items()},
            "graphs_owned": snap.get("graphs_owned", 0),
            "graphs_refused": len(snap.get("graphs_refused") or {}),
            "tasks_per_kind": snap.get("tasks_per_kind") or {},
            "counters": snap.get("counters") or {},
        }
        if snap.get("fault"):
            row["fault"] = snap["fault"]
        rows.append(row)
    return {
        "processes": len(rows),
        "graphs_owned": sum(r["graphs_owned"] for r in rows),
        "graphs_refused": sum(r["graphs_refused"] for r in rows),
        "tasks_per_kind": dict(sorted(tasks.items())),
        "counters": dict(sorted(counters.items())),
        "update_ns": update_ns,
        "per_process": rows,
        "faults": [dict(r["fault"], pid=r["pid"]) for r in rows if "fault" in r],
        "skipped": left_out,
    }
