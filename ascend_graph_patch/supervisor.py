"""Process supervision for the commands: every process a command starts ends when it ends.

Why: on an Ascend host an orphaned vLLM engine keeps its NPU's memory, and the next run (or the
production server restarted beside it) fails for want of memory. A command ends by SIGTERM (CI
cancellation, ``timeout``, systemd, container stops), SIGINT, SIGHUP, an exception, or SIGKILL;
in every case what it started must stop too.

Every child is started (:func:`start`) in its **own session**, so it leads a process group that
holds whatever it starts without making a group of its own: vLLM's engine core and
tensor-parallel workers stay in it (vLLM starts them with ``multiprocessing``, fork or spawn,
which keeps the group). A child is stopped (:func:`stop`) by its group: SIGTERM, a grace period
in which vLLM shuts its engine down, then SIGKILL to what is left. A process that forks a child
into a group of its own (the simulator's engine arm does, one per case) registers it with
:func:`adopt` so that the same rules cover it.

Three lines of defence, one per way the command can end:

1. **Signals and exceptions.** :func:`supervise` (around the command's whole lifetime: the CLI
   enters it) turns SIGTERM, SIGINT and SIGHUP into :class:`Interrupted` in the main thread (a
   ``KeyboardInterrupt``, exit status 128 + the signal's number by the shell's convention); on
   leaving, by any exception or none, it stops every child still registered. A second signal
   while it stops them cuts the grace period short. An interruption is *sticky*: code can lose
   the exception (a cleanup that raises its own error in its place, which an ``except
   Exception`` then takes for an ordinary failure: seen when SIGTERM lands in a graph capture),
   so until the command acknowledges it (:func:`interruption`, called where it reports it) or
   leaves :func:`supervise`, it is raised again every :data:`REDELIVER` seconds, with one line
   on stderr saying so; lost :data:`REDELIVERIES` more times, the children are stopped and the
   process ends with 128 + the signal's number.
2. **The command killed outright (SIGKILL).** No code of the command runs then. The *guardian*,
   a small process started with the first child (this file run as a script, stdlib only), reads
   a pipe whose write end only the command holds, and learns each group registered; at EOF, the
   command being gone however it ended, it stops every group still registered (SIGTERM, grace,
   SIGKILL) and exits. It lives in a session of its own: a signal to the command's group does
   not reach it.
3. **Linux's parent-death signal.** Each child started from the main thread gets
   ``PR_SET_PDEATHSIG`` = SIGTERM (a forked child can ask for it: :func:`die_with_parent`), so
   it hears of the command's death from the kernel as well. Not from other threads: the kernel
   sends it when the *thread* that started the child ends.

What vLLM 0.23.0 does on its own (read in its source, seen on the simulator): its
tensor-parallel workers watch a pipe to the engine core (``death_pipe``) and exit when it
closes; the engine core itself watches nothing, it outlives a killed parent; on SIGTERM it
shuts down (and terminates its workers). Hence the group, the guardian and the grace period.

The API, small and stable (the served A/B starts ``vllm serve`` and its clients through it):
:func:`start`, :func:`run`, :func:`adopt`, :func:`stop`, :func:`stop_many`, :func:`stop_all`,
:func:`supervise`, :func:`die_with_parent`, :class:`Interrupted`. Stdlib only: the CLI imports it
on every start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

#: Seconds between SIGTERM and SIGKILL: vLLM's engine core needs a moment to shut down.
GRACE = 5.0
#: Seconds to wait for the group to go after SIGKILL (the kernel needs a moment, no more).
KILL_WAIT = 5.0
#: The signals that end a command politely (handled by :func:`supervise`).
SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Seconds after which an interruption the command has not acknowledged is raised again.
REDELIVER = 3.0
#: Times an interruption is raised again before the process is ended outright.
REDELIVERIES = 2
_POLL = 0.05
_PR_SET_PDEATHSIG = 1


class Interrupted(KeyboardInterrupt):
    """The command got one of :data:`SIGNALS`: raised in the main thread by :func:`supervise`.

    A ``KeyboardInterrupt``, so that code which already ends cleanly on Ctrl-C ends cleanly on
    SIGTERM and SIGHUP too; never caught by ``except Exception``."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(self.name)

    @property
    def name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal's number (130 SIGINT, 143 SIGTERM)."""
        return 128 + self.signum


def interruption(exc: BaseException) -> tuple[str, int]:
    """(signal name, exit status) of an interruption: an :class:`Interrupted`'s, else Ctrl-C's
    (a plain ``KeyboardInterrupt``, raised where no :func:`supervise` handler ran).

    Calling it acknowledges the interruption: the caller is handling it (reporting what
    finished), so it is not raised again."""
    _STATE.unacknowledged = None
    if isinstance(exc, Interrupted):
        return exc.name, exc.exit_code
    return "SIGINT", 128 + signal.SIGINT


class _State:
    """This process's children and its guardian (one per process: a forked child starts empty)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: process group id -> the Popen leading it (None: adopted, forked by the caller)
        self.groups: dict[int, subprocess.Popen[Any] | None] = {}
        self.guardian: subprocess.Popen[bytes] | None = None
        self.pipe: int | None = None  # write end of the guardian's pipe
        self.guardian_failed = False
        #: supervise(): a signal came while starting a child (raised once it is registered)
        self.critical = 0
        self.pending: int | None = None
        #: a second signal: stop without the grace period
        self.hurry = False
        #: the signal of an interruption raised and not yet acknowledged (see REDELIVER)
        self.unacknowledged: int | None = None
        self.redelivering = False
        #: inside a stop's grace period: an interruption is not raised again meanwhile
        self.stopping = 0


_STATE = _State()


def _after_fork_in_child() -> None:
    """A forked child (vLLM's engine core, a case of the engine arm) neither owns its parent's
    children nor holds its guardian's pipe open (that would hide the parent's death)."""
    global _STATE
    if _STATE.pipe is not None:
        try:
            os.close(_STATE.pipe)
        except OSError:
            pass
    _STATE = _State()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- starting ----------------------------------------------------------------------------------


def start(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` supervised: in its own session (its group holds what it starts), with the
    parent-death signal where the kernel allows it, registered with the guardian.

    Returns the ``Popen``; end it with :func:`stop` (also once it has exited: that clears what
    it left in its group). Call from a thread that lives as long as the child (the main thread):
    the parent-death signal is tied to the starting thread, so it is only set from the main one.
    """
    preexec = _preexec() if threading.current_thread() is threading.main_thread() else None
    with _critical():
        proc = subprocess.Popen(
            list(cmd),
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=preexec,
        )
        _register(proc.pid, proc)
    return proc


def adopt(pid: int) -> None:
    """Supervise a child this process forked into a group of its own (``setpgid(0, 0)`` in the
    child): :func:`stop_all` and the guardian stop that group too. The caller reaps the child
    itself (``os.waitpid``), then calls :func:`stop` to clear what the child left in its group."""
    try:
        os.setpgid(pid, pid)  # also here, so that no signal can come before the child made it
    except OSError:
        pass  # already its own group, or already gone
    with _critical():
        _register(pid, None)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """In a child: ask the kernel for ``signum`` when the parent (thread) dies; if it already
    has, exit at once. For forked children; :func:`start` does it for its children."""
    parent = os.getppid()
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, int(signum))
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + int(signum))


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: the CLI imports this module on every start

    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def _preexec() -> Callable[[], None] | None:
    """The function run in the child between fork and exec (resolved here, not there)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def child() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os._exit(128 + int(signal.SIGTERM))

    return child


# --- the registry and the guardian ---------------------------------------------------------------


def _register(pgid: int, proc: subprocess.Popen[Any] | None) -> None:
    with _STATE.lock:
        _STATE.groups[pgid] = proc
        _tell_guardian(f"+{pgid}\n")


def _release(pgid: int) -> None:
    with _STATE.lock:
        if _STATE.groups.pop(pgid, False) is not False:
            _tell_guardian(f"-{pgid}\n")


def _tell_guardian(line: str) -> None:
    """One line to the guardian; a new guardian (told every group) if there is none or it died."""
    for _ in range(2):
        if _STATE.pipe is None and not _start_guardian():
            return
        assert _STATE.pipe is not None
        try:
            os.write(_STATE.pipe, line.encode())
            return
        except OSError:  # it died: start another, told about every group
            os.close(_STATE.pipe)
            _STATE.pipe = None
            line = "".join(f"+{g}\n" for g in _STATE.groups)


def _start_guardian() -> bool:
    if _STATE.guardian_failed:
        return False
    read_end, write_end = os.pipe()  # both close-on-exec: children do not inherit them
    try:
        _STATE.guardian = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "--guard", str(GRACE)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
        )
    except OSError as exc:
        os.close(write_end)
        _STATE.guardian_failed = True
        print(
            f"ascend-graph-patch: warning: could not start the process guardian ({exc}); "
            "children started from the main thread still end with this process (parent-death "
            "signal), their own children may not if it is killed with SIGKILL",
            file=sys.stderr,
        )
        return False
    finally:
        os.close(read_end)
    _STATE.pipe = write_end
    return True


def _guardian_main(grace: float) -> int:
    """The guardian: learn the groups from stdin; at EOF (the command is gone) stop them."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    stdin = sys.stdin.buffer
    for line in iter(stdin.readline, b""):
        try:
            sign, pgid = line[:1], int(line[1:])
        except ValueError:
            continue
        if sign == b"+":
            groups.add(pgid)
        elif sign == b"-":
            groups.discard(pgid)
    _stop_groups(groups, grace)
    return 0


# --- stopping ----------------------------------------------------------------------------------


def stop(child: subprocess.Popen[Any] | int, grace: float | None = None) -> int | None:
    """Stop a supervised child and everything in its group: SIGTERM, up to ``grace`` seconds
    (default :data:`GRACE`), SIGKILL; reap it and forget it. Returns the child's exit status
    where this process reaped it (a Popen; None for an adopted pid). Quick when the group is
    already empty."""
    pgid = child if isinstance(child, int) else child.pid
    with _STATE.lock:
        proc = _STATE.groups.get(pgid)
    if isinstance(child, subprocess.Popen):
        proc = child
    _stop_groups({pgid}, grace)
    _reap(pgid, proc)
    _release(pgid)
    return proc.returncode if proc is not None else None


def stop_many(children: Iterable[subprocess.Popen[Any] | int], grace: float | None = None) -> None:
    """Stop several supervised children at once: one grace period for all of them (a command
    interrupted while it runs arms side by side waits once, not once per arm)."""
    with _STATE.lock:
        groups: dict[int, subprocess.Popen[Any] | None] = {}
        for child in children:
            pgid = child if isinstance(child, int) else child.pid
            groups[pgid] = child if not isinstance(child, int) else _STATE.groups.get(pgid)
    if not groups:
        return
    _stop_groups(set(groups), grace)
    for pgid, proc in groups.items():
        _reap(pgid, proc)
        _release(pgid)


def stop_all(grace: float | None = None) -> None:
    """Stop every supervised child of this process, all groups at once (one grace period)."""
    with _STATE.lock:
        groups = list(_STATE.groups)
    stop_many(groups, grace)


def run(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)``, supervised.

    Why: a short helper process (a workload's ``--list``, the simulator's ``--serve-defaults``,
    which builds a model on first use) started with plain ``subprocess.run`` outlives a command
    killed with SIGKILL; started here it gets the parent-death signal and the guardian like any
    other child, and its group is stopped however the call ends (timeout, signal, exception)."""
    proc = start(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop(proc)  # quick once it has exited; clears what it left in its group
    return subprocess.CompletedProcess(
        list(cmd), proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )


def children() -> list[int]:
    """The process groups this process supervises now (their leaders' pids)."""
    with _STATE.lock:
        return sorted(_STATE.groups)


def _reap(pgid: int, proc: subprocess.Popen[Any] | None) -> None:
    """Collect the leader's exit status if it is this process's child and has ended."""
    if proc is not None:
        proc.poll()
        return
    try:
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass


def _stop_groups(pgids: set[int], grace: float | None) -> None:
    with _STATE.lock:
        _STATE.stopping += 1
    try:
        _stop_live_groups(pgids, grace)
    finally:
        with _STATE.lock:
            _STATE.stopping -= 1


def _stop_live_groups(pgids: set[int], grace: float | None) -> None:
    live = _live_groups(pgids)
    if not live:
        return
    _signal_groups(live, signal.SIGTERM)
    deadline = time.monotonic() + (GRACE if grace is None else grace)
    while live and not _STATE.hurry and time.monotonic() < deadline:
        time.sleep(_POLL)
        live = _live_groups(live)
    if not live:
        return
    _signal_groups(live, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT
    while live and time.monotonic() < deadline:
        time.sleep(_POLL)
        live = _live_groups(live)


def _signal_groups(pgids: set[int], signum: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _live_groups(pgids: set[int]) -> set[int]:
    """The groups among ``pgids`` that still hold a running process. Zombies do not count: an
    orphan's zombie stays until init reaps it, and some containers' init never does. Reaps this
    process's own children first (their zombies would count otherwise)."""
    with _STATE.lock:
        mine = {g: _STATE.groups.get(g) for g in pgids if g in _STATE.groups}
    for pgid, proc in mine.items():
        _reap(pgid, proc)
    try:
        names = os.listdir("/proc")
    except OSError:  # no procfs: any member, zombies included
        return {g for g in pgids if _any_member(g)}
    live: set[int] = set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            state, _ppid, pgrp = stat[stat.rindex(b")") + 2 :].split(None, 3)[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) in pgids and state not in (b"Z", b"X"):
            live.add(int(pgrp))
    return live


def _any_member(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the command's lifetime ----------------------------------------------------------------------


@contextmanager
def _critical() -> Iterator[None]:
    """Between starting a child and registering it, a signal waits (else the child would be
    started but not stopped); raised as soon as the section ends."""
    with _STATE.lock:
        _STATE.critical += 1
        try:
            yield
        finally:
            _STATE.critical -= 1
    pending = _STATE.pending
    if pending is not None and not _STATE.critical and _in_main_thread():
        _STATE.pending = None
        raise Interrupted(pending)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def supervise(signals: Sequence[int] = SIGNALS) -> Iterator[None]:
    """For a command's lifetime: ``signals`` raise :class:`Interrupted` in the main thread (the
    first one, raised again until acknowledged, see :data:`REDELIVER`; a later one while
    children are being stopped or after the acknowledgement only cuts the grace period short,
    so the clean-up and the report of an interrupted run are not themselves interrupted); on
    leaving, by any exception or none, every supervised child is stopped. The previous handlers
    are put back. Off the main thread (no signal handlers there) it only stops the children on
    leaving."""
    previous: dict[int, Any] = {}
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:
            if _STATE.redelivering:  # the watchdog's, not the user's second signal
                _STATE.redelivering = False
            else:
                _STATE.hurry = True
            again = _STATE.unacknowledged
            if again is None or fired[-1] == 0 or _STATE.stopping:
                return  # handled, or children being stopped: only the grace period is cut
            if _STATE.critical:
                _STATE.pending = again
                return
            raise Interrupted(again)
        fired.append(signum)
        _STATE.unacknowledged = signum
        threading.Thread(target=_redeliver, args=(signum,), daemon=True).start()
        if _STATE.critical:
            _STATE.pending = signum
            return
        raise Interrupted(signum)

    if _in_main_thread():
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        fired.append(0)  # from here a signal only cuts the grace period short
        try:
            stop_all()
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            _STATE.hurry = False
            _STATE.pending = None
            _STATE.unacknowledged = None


def _redeliver(signum: int) -> None:
    """Watchdog thread of one interruption: while the command has not acknowledged it, raise it
    again in the main thread every :data:`REDELIVER` seconds (not during a stop's grace period
    or while a child is being started: those finish first); after :data:`REDELIVERIES` that
    were lost too, stop the children and end the process (never a command that runs on after
    it was told to stop)."""
    state = _STATE
    name = Interrupted(signum).name
    attempts = 0
    while True:
        time.sleep(REDELIVER)
        if state is not _STATE or state.unacknowledged != signum:
            return  # acknowledged, the command left supervise(), or this is a forked child
        if state.stopping or state.critical:
            continue
        if attempts >= REDELIVERIES:
            _say(f"{name} lost {attempts + 1} times; stopping its children and ending the command")
            try:
                stop_all()
            finally:
                os._exit(128 + signum)
        attempts += 1
        _say(
            f"{name} not handled {REDELIVER:g} s after it came (the code it interrupted may have "
            "lost the exception in its clean-up); interrupting again"
        )
        state.redelivering = True
        # a real signal to the main thread: it also breaks a blocking call, as the first did
        signal.pthread_kill(threading.main_thread().ident or 0, signum)


def _say(line: str) -> None:
    try:
        sys.stdout.flush()
        print(f"ascend-graph-patch: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


if __name__ == "__main__" and sys.argv[1:2] == ["--guard"]:
    sys.exit(_guardian_main(float(sys.argv[2]) if len(sys.argv) > 2 else GRACE))
