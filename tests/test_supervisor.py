"""The process supervisor: what a command starts ends when the command ends, however it ends.

Each case runs a small command in a fresh process (signals, SIGKILL), whose children carry a
marker in their environment (``process_support``), and looks for any of them afterwards. The
negative control starts the same children as the orchestrator did before the supervisor (a
session of their own, nothing else): killed with SIGKILL, that command leaves them running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ascend_graph_patch import supervisor
from tests.process_support import MARK, kill_marked, marked, new_mark, wait_for, wait_gone

COMMAND = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from ascend_graph_patch import supervisor

    supervisor.GRACE = float(os.environ.get("TEST_GRACE", "5"))
    supervisor.REDELIVER = float(os.environ.get("TEST_REDELIVER", "3"))
    # a child and its grandchild in its group: a worker and the engine core vLLM forks for it
    FAMILY = "import os, time\\nos.fork()\\ntime.sleep(300)"
    STUBBORN = "import signal\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" + FAMILY


    # a step whose clean-up raises an error of its own when interrupted: the interruption is
    # lost to the caller's except Exception (as in a graph capture cut short)
    def capture(seconds):
        try:
            time.sleep(seconds)
        finally:
            if sys.exc_info()[0] is not None:
                raise RuntimeError("capture_end: a task group was left open")


    def main(how):
        try:
            with supervisor.supervise():
                if how in ("swallow", "swallow always"):  # any Exception: a failed step
                    supervisor.start([sys.executable, "-c", FAMILY])
                    print("ready", flush=True)
                    seconds = 300  # the first step: the one the signal interrupts
                    while True:
                        try:
                            capture(seconds)
                        except Exception as exc:
                            print(f"step failed: {exc}", flush=True)
                        if how == "swallow":
                            seconds = 0
                            time.sleep(0.2)
                if how == "acknowledge":  # reports what finished, slowly, after the signal
                    print("ready", flush=True)
                    try:
                        time.sleep(300)
                    except KeyboardInterrupt as exc:
                        name = supervisor.interruption(exc)[0]
                        time.sleep(2.5)
                        print(f"report written ({name})", flush=True)
                        return 3
                if how in ("run", "plainrun"):  # a short helper that blocks the command
                    print("ready", flush=True)
                    cmd = [sys.executable, "-c", FAMILY]
                    if how == "run":
                        supervisor.run(cmd, timeout=300)
                    else:  # as ab's --list and --serve-defaults helpers ran before
                        subprocess.run(cmd, capture_output=True, timeout=300)
                    return 0
                code = STUBBORN if "stubborn" in how else FAMILY
                if how.startswith("plain"):  # the orchestrator before: a session of its own
                    subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
                else:
                    supervisor.start([sys.executable, "-c", code])
                if "adopt" in how:  # a forked child in a group of its own, as the engine arm's
                    pid = os.fork()
                    if pid == 0:
                        os.setpgid(0, 0)
                        supervisor.die_with_parent()
                        os.fork()
                        time.sleep(300)
                        os._exit(0)
                    supervisor.adopt(pid)
                print("ready", flush=True)
                if how.endswith(("raise", "done")):  # once the test has seen the children
                    while not os.path.exists(os.environ["TEST_GO"]):
                        time.sleep(0.05)
                if how.endswith("raise"):
                    raise RuntimeError("boom")
                if how == "done":
                    return 0
                time.sleep(300)
        except supervisor.Interrupted as exc:
            print(f"interrupted {exc.name}", flush=True)
            return exc.exit_code


    sys.exit(main(sys.argv[1]))
    """
)


class Command:
    """One run of ``COMMAND`` with its own marker; its output goes to a file (the children would
    hold a pipe open: a killed command's output would never end)."""

    def __init__(
        self, tmp_path: Path, how: str, grace: float = 5.0, redeliver: float = 3.0
    ) -> None:
        script = tmp_path / "command.py"
        script.write_text(COMMAND)
        self.mark = new_mark()
        self.log = tmp_path / "output"
        env = {**os.environ, MARK: self.mark, "TEST_GRACE": str(grace)}
        env["TEST_REDELIVER"] = str(redeliver)
        self.go_file = tmp_path / "go"
        env["TEST_GO"] = str(self.go_file)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), how], env=env, stdout=log, stderr=log
            )

    @property
    def output(self) -> str:
        return self.log.read_text()

    def ready(self, processes: int) -> None:
        """Wait for the command's word and for ``processes`` marked processes besides it."""
        end = time.monotonic() + 60
        while "ready" not in self.output and self.proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert "ready" in self.output, self.output
        found = wait_for(self.mark, processes + 1, deadline=30)
        assert len(found) >= processes + 1, found

    def go(self) -> None:
        """Let a ``raise`` or ``done`` command go on past its word."""
        self.go_file.write_text("go")

    def end(self, signum: int) -> int:
        self.proc.send_signal(signum)
        return self.proc.wait(timeout=60)


@pytest.fixture
def commands(tmp_path: Path):
    made: list[Command] = []

    def make(how: str, grace: float = 5.0, redeliver: float = 3.0) -> Command:
        sub = tmp_path / f"c{len(made)}"
        sub.mkdir()
        made.append(Command(sub, how, grace, redeliver))
        return made[-1]

    yield make
    for cmd in made:  # whatever a failed test left behind
        if cmd.proc.poll() is None:
            cmd.proc.kill()
            cmd.proc.wait()
        kill_marked(cmd.mark)


def test_sigkill_of_the_command_ends_every_process_it_started(commands) -> None:
    """SIGKILL: no code of the command runs. The guardian and the parent-death signal stop the
    child, its grandchild in its group, and a forked child in a group of its own with its own
    grandchild. Negative control: the same children started as before leave all running."""
    supervised, plain = commands("adopt"), commands("plain")
    supervised.ready(processes=5)  # child, grandchild, adopted child and its child, guardian
    plain.ready(processes=2)
    assert supervised.end(signal.SIGKILL) == -signal.SIGKILL
    assert plain.end(signal.SIGKILL) == -signal.SIGKILL
    assert wait_gone(supervised.mark) == {}
    left = wait_gone(plain.mark, deadline=2.0)
    assert len(left) == 2, left  # the negative control: both outlive their command


def test_a_helper_run_to_completion_is_supervised_too(commands) -> None:
    """``supervisor.run`` (ab's ``--list`` and ``--serve-defaults`` helpers): SIGKILL of the
    command stops the helper and its grandchild. Negative control: ``subprocess.run``, as
    before, leaves both running."""
    supervised, plain = commands("run"), commands("plainrun")
    supervised.ready(processes=3)  # helper, its grandchild, guardian
    plain.ready(processes=2)
    assert supervised.end(signal.SIGKILL) == -signal.SIGKILL
    assert plain.end(signal.SIGKILL) == -signal.SIGKILL
    assert wait_gone(supervised.mark) == {}
    left = wait_gone(plain.mark, deadline=2.0)
    assert len(left) == 2, left


def test_a_signal_during_a_helper_stops_it_and_exits_143(commands) -> None:
    cmd = commands("run", grace=1.0)
    cmd.ready(processes=3)
    assert cmd.end(signal.SIGTERM) == 143, cmd.output
    assert "interrupted SIGTERM" in cmd.output
    assert wait_gone(cmd.mark, deadline=10.0) == {}


def test_run_returns_the_output_and_status_like_subprocess_run() -> None:
    done = supervisor.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"])
    assert (done.returncode, done.stdout.strip()) == (3, "out")
    assert supervisor.children() == []


@pytest.mark.parametrize(
    "signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)]
)
def test_a_signal_stops_the_children_and_exits_by_the_shells_convention(
    commands, signum: int, code: int
) -> None:
    cmd = commands("adopt")
    cmd.ready(processes=5)
    assert cmd.end(signum) == code, cmd.output
    assert f"interrupted {signal.Signals(signum).name}" in cmd.output
    assert wait_gone(cmd.mark) == {}


def test_an_interruption_lost_in_a_cleanup_is_raised_again(commands) -> None:
    """SIGTERM during a step whose clean-up raises its own error (an ``except Exception``
    loop then goes on, as the soak did when SIGTERM landed in a graph capture): the command
    still ends with 143, by the interruption raised again, says so, and stops its children.
    Negative control: with the re-raise put off, the same command runs on after the signal."""
    cmd, control = commands("swallow", redeliver=1.0), commands("swallow", redeliver=1e6)
    for c in (cmd, control):
        c.ready(processes=2)
        c.proc.send_signal(signal.SIGTERM)
    assert cmd.proc.wait(timeout=30) == 143, cmd.output
    assert "step failed: capture_end" in cmd.output, cmd.output  # the first one was lost
    assert "SIGTERM not handled 1 s after it came" in cmd.output
    assert "interrupted SIGTERM" in cmd.output
    assert wait_gone(cmd.mark) == {}
    with pytest.raises(subprocess.TimeoutExpired):
        control.proc.wait(timeout=4)
    assert "step failed: capture_end" in control.output
    assert len(marked(control.mark)) == 4  # the command, its guardian, its two children


def test_an_interruption_lost_every_time_ends_the_process(commands) -> None:
    """Code that loses the interruption however often it is raised: after the re-raises, the
    children are stopped and the process ends with 143 (no hang, nothing left running)."""
    cmd = commands("swallow always", redeliver=0.5)
    cmd.ready(processes=2)
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.proc.wait(timeout=30) == 143, cmd.output
    assert cmd.output.count("step failed: capture_end") == 3, cmd.output
    assert "SIGTERM lost 3 times; stopping its children and ending" in cmd.output
    assert wait_gone(cmd.mark) == {}


def test_an_acknowledged_interruption_is_not_raised_again(commands) -> None:
    """The command took the interruption (``supervisor.interruption``) and reports slowly: its
    report is not cut short, and it ends with its own status."""
    cmd = commands("acknowledge", redeliver=0.5)
    cmd.ready(processes=0)
    assert cmd.end(signal.SIGTERM) == 3, cmd.output
    assert "report written (SIGTERM)" in cmd.output
    assert "not handled" not in cmd.output


def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period(commands) -> None:
    """Politely first, then SIGKILL: by the command on SIGTERM, by the guardian on SIGKILL."""
    by_signal, by_guardian = commands("stubborn", grace=0.5), commands("stubborn adopt", 0.5)
    by_signal.ready(processes=3)
    by_guardian.ready(processes=5)
    assert by_signal.end(signal.SIGTERM) == 143, by_signal.output
    assert by_guardian.end(signal.SIGKILL) == -signal.SIGKILL
    assert wait_gone(by_signal.mark) == {}
    assert wait_gone(by_guardian.mark) == {}


@pytest.mark.parametrize("how, code", [("raise", 1), ("done", 0)])
def test_an_exception_or_the_end_stops_the_children_and_the_guardian(
    commands, how: str, code: int
) -> None:
    """The command raises, or returns, once its child, the child's grandchild and the guardian
    are seen running: all three are gone after it. Negative control: the same children started
    as before the supervisor outlive a command that raises."""
    cmd, plain = commands(how), commands("plain raise")
    cmd.ready(processes=3)  # child, grandchild, guardian: running before the end
    plain.ready(processes=2)
    cmd.go()
    plain.go()
    assert cmd.proc.wait(timeout=60) == code, cmd.output
    assert plain.proc.wait(timeout=60) == 1, plain.output
    assert wait_gone(cmd.mark) == {}
    left = wait_gone(plain.mark, deadline=2.0)
    assert len(left) == 2, left  # the negative control: both outlive their command


def test_stop_clears_the_group_and_forgets_it() -> None:
    """In this process: a child whose grandchild outlives it is cleared by stop(); stop() of an
    ended child with an empty group is quick; the registry is empty afterwards."""
    mark = new_mark()
    env = {**os.environ, MARK: mark}
    code = "import os, sys, time\nif os.fork(): sys.exit(0)\ntime.sleep(300)"
    proc = supervisor.start([sys.executable, "-c", code], env=env)
    try:
        proc.wait(timeout=60)
        assert len(wait_for(mark, 1, deadline=30)) == 1  # the orphaned grandchild runs on
        assert proc.pid in supervisor.children()
        assert supervisor.stop(proc) == 0
        assert marked(mark) == {} and proc.pid not in supervisor.children()
        assert supervisor.stop(proc) == 0  # again: nothing left, nothing to wait for
    finally:
        kill_marked(mark)


def test_interrupted_is_a_keyboard_interrupt_with_the_shells_exit_status() -> None:
    exc = supervisor.Interrupted(signal.SIGTERM)
    assert isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Exception)
    assert (exc.name, exc.exit_code) == ("SIGTERM", 143)
    assert supervisor.Interrupted(signal.SIGHUP).exit_code == 129
