"""Per-process status files: written by every process that counts, merged by the reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_graph_patch import cli, state, status_files

CHILD = """
import os, sys
from ascend_graph_patch import state
state.count("updates.owned", 3)
if len(sys.argv) > 1 and sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        state.count("updates.owned")   # the child's own work only
        sys.exit(0)  # atexit runs: the child writes its own file
    os.waitpid(pid, 0)
print(os.getpid())
"""


def run_child(tmp_path: Path, *args: str, **env: str) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_GRAPH_PATCH")}
    clean.update(ASCEND_GRAPH_PATCH="observe", ASCEND_GRAPH_PATCH_STATUS_DIR=str(tmp_path / "st"))
    clean.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        env=clean,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


def test_a_process_with_the_overlay_on_writes_its_counters_at_exit(tmp_path: Path) -> None:
    pid = run_child(tmp_path, RANK="3")
    (snap,) = status_files.read_dir(tmp_path / "st")
    assert snap["pid"] == pid and snap["rank"] == 3 and snap["mode"] == "observe"
    assert snap["counters"] == {"updates.owned": 3}


def test_without_the_variable_nothing_is_written(tmp_path: Path) -> None:
    run_child(tmp_path, ASCEND_GRAPH_PATCH_STATUS_DIR="")
    assert not (tmp_path / "st").exists()


def test_a_forked_child_writes_its_own_file_with_its_own_counters(tmp_path: Path) -> None:
    parent = run_child(tmp_path, "fork")
    snaps = {s["pid"]: s for s in status_files.read_dir(tmp_path / "st")}
    assert len(snaps) == 2
    (child,) = [pid for pid in snaps if pid != parent]
    assert snaps[parent]["counters"] == {"updates.owned": 3}
    assert snaps[child]["counters"] == {"updates.owned": 1}


def test_writes_are_throttled_but_the_first_count_writes(tmp_path: Path, monkeypatch) -> None:
    writer = status_files.StatusWriter(tmp_path, interval=3600)
    writes: list[int] = []
    monkeypatch.setattr(writer, "write", lambda: writes.append(1))
    for _ in range(100):
        writer.maybe_write()
    assert writes == [1]


def test_the_last_counts_of_a_burst_are_written_without_a_later_count(
    tmp_path: Path, monkeypatch
) -> None:
    """A live server's files (``status --from`` while it serves) lag by at most an interval: a
    count skipped by the throttle is written when the interval ends, though nothing is counted
    after it; one write per skipped burst, none without counts."""
    import threading
    import time

    writer = status_files.StatusWriter(tmp_path, interval=0.2)
    writes: list[float] = []
    written = threading.Event()

    def write() -> None:
        writes.append(time.monotonic())
        if len(writes) == 2:
            written.set()

    monkeypatch.setattr(writer, "write", write)
    for _ in range(50):
        writer.maybe_write()
    assert len(writes) == 1  # the first count wrote; the rest waits for the interval
    assert written.wait(10.0), "the skipped counts were never written"
    time.sleep(0.5)
    assert len(writes) == 2  # no count since: no further write


def test_an_unwritable_directory_warns_once_and_never_raises(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    writer = status_files.StatusWriter(blocker / "sub")
    state.STATE.warned.discard("status-dir")
    writer.write()
    writer.write()
    assert writer.failed is not None
    assert capsys.readouterr().err.count("cannot write status file") == 1


def _snap(pid: int, rank: int | None, counters: dict, owned: int) -> dict:
    return {
        "pid": pid,
        "rank": rank,
        "mode": "on",
        "counters": counters,
        "graphs_owned": owned,
        "tasks_per_kind": {"fia": owned * 2},
        "gate": {"v1": {"verdict": "supported"}},
    }


def test_merge_sums_and_keeps_one_row_per_process_by_rank() -> None:
    merged = status_files.merge(
        [
            _snap(20, 1, {"updates.owned": 5}, 3),
            _snap(10, 0, {"updates.owned": 7, "tasks.updated": 14}, 3),
        ]
    )
    assert merged["processes"] == 2 and merged["graphs_owned"] == 6
    assert merged["counters"] == {"tasks.updated": 14, "updates.owned": 12}
    assert merged["tasks_per_kind"] == {"fia": 12}
    assert [r["rank"] for r in merged["per_process"]] == [1, 0]  # merge keeps the given order


def test_read_dir_orders_by_rank_and_skips_broken_files(tmp_path: Path) -> None:
    for snap in (_snap(30, None, {}, 0), _snap(20, 1, {}, 1), _snap(10, 0, {}, 1)):
        (tmp_path / f"status-{snap['pid']}.json").write_text(json.dumps(snap))
    (tmp_path / "status-99.json").write_text("{half a fi")
    assert [s["pid"] for s in status_files.read_dir(tmp_path)] == [10, 20, 30]


def test_cli_status_from_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for snap in (_snap(10, 0, {"updates.owned": 2}, 1), _snap(20, 1, {"updates.owned": 3}, 1)):
        (tmp_path / f"status-{snap['pid']}.json").write_text(json.dumps(snap))
    assert cli.main(["status", "--from", str(tmp_path), "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged["counters"] == {"updates.owned": 5} and merged["processes"] == 2
    assert cli.main(["status", "--from", str(tmp_path)]) == 0
    assert "per_process.1.rank: 1" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["status", "--from", str(tmp_path / "empty")]) == 1


def test_status_says_when_the_overlay_may_not_load_at_all() -> None:
    from ascend_graph_patch import status

    on = {"ASCEND_GRAPH_PATCH": "on"}
    assert not any("VLLM_PLUGINS" in w for w in status.loader_warnings(on))
    restrictive = status.loader_warnings({**on, "VLLM_PLUGINS": "ascend"})
    assert any("leaves out ascend_graph_patch" in w for w in restrictive)
    allowed = {**on, "VLLM_PLUGINS": "ascend,ascend_graph_patch"}
    assert not any("VLLM_PLUGINS" in w for w in status.loader_warnings(allowed))
    assert status.loader_warnings({"VLLM_PLUGINS": "ascend"}) == []  # off: nothing to load


FAKE_RUNNER = """
import time

def update_full_graph_params(*args):
    time.sleep(0.002)
"""


def test_with_the_toggle_off_a_status_directory_still_measures_update_time(tmp_path: Path) -> None:
    """The stock arm of an A/B is measured as the patched one is: same wrapper, every process."""
    package = tmp_path / "fake" / "vllm_ascend"
    (package / "worker").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "worker" / "__init__.py").write_text("")
    (package / "worker" / "model_runner_v1.py").write_text(FAKE_RUNNER)
    code = (
        "import sys; from vllm_ascend.worker import model_runner_v1 as m\n"
        "for _ in range(3): m.update_full_graph_params()\n"
        "print('overlay' if 'ascend_graph_patch.installer' in sys.modules else 'stock')"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_GRAPH_PATCH")}
    clean.update(
        ASCEND_GRAPH_PATCH="off",
        ASCEND_GRAPH_PATCH_STATUS_DIR=str(tmp_path / "st"),
        PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=clean,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "stock"  # nothing of the overlay was installed
    (snap,) = status_files.read_dir(tmp_path / "st")
    assert snap["mode"] == "off" and snap["update_calls"] == 3
    assert all(ns >= 2_000_000 for ns in snap["update_ns"])
    assert snap["timed_targets"] == ["vllm_ascend.worker.model_runner_v1:update_full_graph_params"]
    assert status_files.merge([snap, snap])["update_ns"] == snap["update_ns"] * 2


MP_CHILD = """
import multiprocessing, os, sys
from ascend_graph_patch import state

def work():
    for _ in range(5):  # the first count writes the file; the other four fall in its second
        state.count("updates.owned")
    print(os.getpid(), flush=True)

if __name__ == "__main__":
    proc = multiprocessing.get_context(sys.argv[1]).Process(target=work)
    proc.start()
    proc.join()
    sys.exit(proc.exitcode)
"""


def test_a_multiprocessing_child_ending_in_os_exit_writes_its_last_counts(tmp_path: Path) -> None:
    """A forked ``multiprocessing.Process`` (vLLM's engine core, TP workers) ends through
    ``os._exit``, skipping atexit: the multiprocessing finalizer still writes. (A spawned child
    exits through ``sys.exit``, so atexit covers it.)"""
    script = tmp_path / "mp_child.py"
    script.write_text(MP_CHILD)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_GRAPH_PATCH")}
    clean.update(ASCEND_GRAPH_PATCH="observe", ASCEND_GRAPH_PATCH_STATUS_DIR=str(tmp_path / "st"))
    proc = subprocess.run(
        [sys.executable, str(script), "fork"],
        env=clean,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    child = int(proc.stdout.split()[-1])
    snaps = {s["pid"]: s for s in status_files.read_dir(tmp_path / "st")}
    assert snaps[child]["counters"] == {"updates.owned": 5}
