"""`ascend-graph-patch ab` under supervision: however it ends, nothing it started runs on.

Each case runs the real console command in a fresh process with a marker in its environment
(``process_support``): every process it starts inherits the marker. The arm's worker is a small
protocol worker whose first arm (stock) finishes and whose second (patched) starts a long-lived
grandchild in its group (as vLLM's engine core is) and sleeps. The test signals the command while
the second arm runs, then looks for any marked process. One case does the same with a real
engine arm of the simulator (the arm forks its case, which builds vLLM's engine).

These tests fail on the command as it was before issue 27: SIGTERM killed the command at once
(exit -15, no report) and the arms ran on, re-parented to init; so did SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process_support import MARK, kill_marked, marked, new_mark, wait_gone

pytestmark = pytest.mark.timeout(240)

WORKER = textwrap.dedent(
    '''
    """Protocol worker: stock finishes; patched starts a grandchild in its group and sleeps."""
    import os, subprocess, sys, time
    from ascend_graph_patch.ab.protocol import worker_main

    def run(spec, progress, out_dir):
        if os.environ.get("ASCEND_GRAPH_PATCH") == "on":
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            print("patched arm running", flush=True)
            time.sleep(300)
        cases = [{"name": n, "status": "ok", "tokens": [[1, 2]], "counters": {},
                  "expect": "ok", "update_ns": [], "logits_file": None}
                 for n in spec["cases"]]
        progress.advance(spec["steps"])
        return {"workload": "fake", "cases": cases}

    sys.exit(worker_main(run))
    '''
)

COMMAND = [sys.executable, "-m", "ascend_graph_patch.cli"]


@pytest.fixture
def mark() -> Iterator[str]:
    value = new_mark()
    yield value
    kill_marked(value)  # whatever a failed case left behind


def _start(argv: list[str], mark: str, tmp_path: Path, **extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_GRAPH_PATCH")}
    env.update(extra)
    env[MARK] = mark
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    return subprocess.Popen(
        [*COMMAND, *argv],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _fake_ab(tmp_path: Path, mark: str) -> tuple[subprocess.Popen[str], Path]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "out"
    argv = ["ab", "--worker", str(worker), "--scenarios", "alpha", "--steps", "2"]
    argv += ["--no-progress", "--timeout", "200", "--out", str(out)]
    proc = _start(argv, mark, tmp_path)
    # the command, the patched arm's worker and its grandchild (and guardians) carry the mark
    _wait_for_cmdline(mark, "time.sleep(300)", proc)
    return proc, out


def _wait_for_cmdline(mark: str, needle: str, proc: subprocess.Popen[str], limit=120.0) -> None:
    end = time.monotonic() + limit
    while not any(needle in cmd for cmd in marked(mark).values()):
        if proc.poll() is not None or time.monotonic() > end:
            out, err = proc.communicate(timeout=30) if proc.poll() is not None else ("", "")
            pytest.fail(f"{needle!r} never ran: {proc.returncode}\n{out}\n{err[-3000:]}")
        time.sleep(0.1)


def _end(proc: subprocess.Popen[str], limit: float = 60.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the command did not end within {limit} s of the signal: {err[-2000:]}")
    return proc.returncode, out, err


@pytest.mark.parametrize(
    ("signum", "code"),
    [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)],
    ids=["SIGTERM", "SIGINT", "SIGHUP"],
)
def test_a_signal_stops_every_arm_and_the_report_says_interrupted(
    tmp_path: Path, mark: str, signum: int, code: int
) -> None:
    proc, out = _fake_ab(tmp_path, mark)
    proc.send_signal(signum)
    returncode, stdout, stderr = _end(proc)
    assert returncode == code, stderr[-3000:]
    name = signal.Signals(signum).name
    assert f"interrupted ({name})" in stderr
    assert "Traceback" not in stderr
    assert "VERDICT: INTERRUPTED" in stdout
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "INTERRUPTED" and report["exit_code"] == code
    statuses = [r["status"] for r in report["runs"]]
    assert statuses == ["ok", "interrupted", "not run", "not run"], statuses
    assert report["problems"][0] == "interrupted: 1 of 4 arm runs finished"
    assert wait_gone(mark, 20.0) == {}


def test_the_command_killed_outright_leaves_nothing_running(tmp_path: Path, mark: str) -> None:
    proc, _ = _fake_ab(tmp_path, mark)
    proc.kill()
    _end(proc)
    assert wait_gone(mark, 20.0) == {}


def test_a_real_engine_arm_stops_with_the_command_killed_outright(
    tmp_path: Path, mark: str
) -> None:
    """The arm's worker forks the case, whose process builds vLLM's engine (the arm process and
    the case process each in a group of their own). SIGKILL to the command while the engine
    builds: 20 s later nothing it started is running, and the arm never wrote its result (it
    was stopped, not left to finish: on the old command it finished, orphaned)."""
    out = tmp_path / "out"
    argv = ["ab", "--scenarios", "qwen3/compile/decode-only", "--jobs", "1", "--no-progress"]
    proc = _start([*argv, "--out", str(out)], mark, tmp_path)
    # the eager arm's worker forks its case once vLLM is imported: two worker processes
    end = time.monotonic() + 180
    while sum("torch_npu_sim.ab_worker" in c for c in marked(mark).values()) < 2:
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            pytest.fail(f"the arm never forked its case: {proc.communicate()[1][-3000:]}")
        time.sleep(0.05)
    proc.kill()
    _end(proc)
    assert wait_gone(mark, 20.0) == {}
    time.sleep(1.0)  # a worker that lived on would have written it by now
    (arm,) = (out / "arms").iterdir()
    assert not (arm / "result.json").exists(), "the arm ran to its end after the command died"


def _wait_for_counting(status_dir: Path, proc: subprocess.Popen[str], limit: float = 180.0) -> None:
    """Until the command's overlay has written a status file (it counts updates: the soak or
    the benchmark is past its imports, measuring)."""
    end = time.monotonic() + limit
    while not any(status_dir.glob("status-*.json")):
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            pytest.fail(f"no status file: {proc.returncode} {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)


@pytest.mark.parametrize("command", ["soak", "bench"])
def test_an_interrupted_soak_or_benchmark_writes_what_it_measured(
    tmp_path: Path, mark: str, command: str
) -> None:
    """SIGTERM while measuring: exit 143, and the JSON result is written, marked interrupted,
    with what finished (before issue 27 the process died and wrote nothing)."""
    result = tmp_path / "result.json"
    status_dir = tmp_path / "status"
    argv = {
        "soak": ["soak", "--steps", "100000", "--chunk", "50", "--out", str(result)],
        "bench": ["bench", "--kinds", "FIA", "--layers", "1,28,64,94", "--no-progress"]
        + ["--json", str(result)],
    }[command]
    proc = _start(argv, mark, tmp_path, ASCEND_GRAPH_PATCH_STATUS_DIR=str(status_dir))
    _wait_for_counting(status_dir, proc)
    proc.send_signal(signal.SIGTERM)
    returncode, stdout, stderr = _end(proc)
    assert returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    data = json.loads(result.read_text())
    assert data["interrupted"] == "SIGTERM"
    if command == "soak":
        assert data["ok"] is False and data["problems"][0].startswith("interrupted (SIGTERM)")
        assert "INTERRUPTED" in stderr
    else:
        assert data["all_met"] is False and "INTERRUPTED (SIGTERM)" in stdout
    assert wait_gone(mark, 20.0) == {}
