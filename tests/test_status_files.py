"""Per-process status files: written by every process that counts, merged by the reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
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


# --- status files in a shared directory: safe to write, safe to read ---------------------------


def test_a_symlink_at_the_old_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """Someone who can write to the directory plants ``status-<pid>.json.tmp`` (the temporary
    name the writer used to use, predictable) and ``status-<pid>.json`` as symlinks to a file of
    the server user's: neither file is written through."""
    directory = tmp_path / "sd"
    directory.mkdir()
    victims = [tmp_path / "victim-tmp", tmp_path / "victim-final"]
    for victim in victims:
        victim.write_text("precious")
    (directory / f"status-{os.getpid()}.json.tmp").symlink_to(victims[0])
    (directory / f"status-{os.getpid()}.json").symlink_to(victims[1])
    writer = status_files.StatusWriter(directory)
    writer.write()
    assert writer.failed is None, writer.failed
    assert [v.read_text() for v in victims] == ["precious", "precious"]
    written = directory / f"status-{os.getpid()}.json"
    assert not written.is_symlink() and json.loads(written.read_text())["pid"] == os.getpid()


def test_status_files_are_private_and_so_is_a_directory_the_overlay_creates(
    tmp_path: Path,
) -> None:
    old = os.umask(0o022)  # the common default: a plain open would give 0644 and 0755
    try:
        writer = status_files.StatusWriter(tmp_path / "new" / "sd")
        writer.write()
    finally:
        os.umask(old)
    assert writer.failed is None, writer.failed
    assert (tmp_path / "new" / "sd").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    assert writer.path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "new" / "sd").iterdir()] == [writer.path.name]


def test_a_group_shared_directory_gets_group_readable_files(tmp_path: Path) -> None:
    """A set-group-ID directory is how a team shares one: its files are readable by the group
    (never by others), the directory itself is left as it is."""
    shared = tmp_path / "team"
    shared.mkdir()
    shared.chmod(0o2770)
    old = os.umask(0o022)
    try:
        writer = status_files.StatusWriter(shared)
        writer.write()
    finally:
        os.umask(old)
    assert writer.path.stat().st_mode & 0o777 == 0o640
    assert shared.stat().st_mode & 0o7777 == 0o2770


def _read_in_thread(directory: Path) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def read() -> None:
        try:
            box["snaps"], box["skipped"] = status_files.scan(directory)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(30)  # a guard against a hang, not a speed target
    return thread, box


def test_a_fifo_under_a_status_file_name_does_not_hang_the_reader(tmp_path: Path) -> None:
    (tmp_path / "status-10.json").write_text(json.dumps(_snap(10, 0, {}, 1)))
    fifo = tmp_path / "status-11.json"
    os.mkfifo(fifo)
    thread, box = _read_in_thread(tmp_path)
    if thread.is_alive():  # release the blocked open, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
        pytest.fail("the reader blocked opening a FIFO")
    assert "error" not in box, box
    assert [s["pid"] for s in box["snaps"]] == [10]
    assert box["skipped"] == [{"file": "status-11.json", "reason": "not a regular file (a FIFO)"}]


def test_a_symlinked_status_file_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(_snap(12, 0, {}, 1)))
    directory = tmp_path / "sd"
    directory.mkdir()
    (directory / "status-12.json").symlink_to(elsewhere)
    snaps, skipped = status_files.scan(directory)
    assert snaps == []
    assert skipped == [{"file": "status-12.json", "reason": "a symbolic link (not followed)"}]


def test_an_oversized_file_is_skipped_unread(tmp_path: Path) -> None:
    big = _snap(13, 0, {}, 1)
    big["argv"] = ["x" * status_files.MAX_FILE_BYTES]
    (tmp_path / "status-13.json").write_text(json.dumps(big))
    snaps, skipped = status_files.scan(tmp_path)
    assert snaps == []
    (entry,) = skipped
    assert entry["file"] == "status-13.json" and entry["reason"].startswith("too large")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("graphs_owned", "lots", "graphs_owned: not a non-negative integer ('lots')"),
        ("counters", {"updates.owned": "5"}, "counters: not a mapping of names to integers"),
        ("counters", [1, 2], "counters: not a mapping of names to integers"),
        ("pid", "10", "pid: not a positive integer ('10')"),
        ("rank", 1.5, "rank: not an integer or null (1.5)"),
        ("gate", {"v1": "supported"}, "gate: not a mapping of groups to verdicts"),
        ("update_ns", [1, None], "update_ns: not a list of integers"),
        ("tasks_per_kind", {"fia": True}, "tasks_per_kind: not a mapping of names to integers"),
        ("graphs_refused", {"k": 3}, "graphs_refused: not a mapping of names to reasons"),
    ],
)
def test_a_file_with_a_field_of_the_wrong_type_is_skipped_by_name(
    tmp_path: Path, field: str, value: object, reason: str
) -> None:
    """One bad file must not end the merge (it did, with TypeError, for ``"graphs_owned":
    "lots"``): the good files are merged, the bad one is named with its reason."""
    (tmp_path / "status-10.json").write_text(json.dumps(_snap(10, 0, {"updates.owned": 2}, 1)))
    bad = _snap(20, 1, {"updates.owned": 3}, 1)
    bad[field] = value
    (tmp_path / "status-20.json").write_text(json.dumps(bad))
    snaps, skipped = status_files.scan(tmp_path)
    merged = status_files.merge(snaps, skipped)
    assert merged["processes"] == 1 and merged["counters"] == {"updates.owned": 2}
    assert merged["skipped"] == [{"file": "status-20.json", "reason": reason}]


def test_a_deeply_nested_file_is_skipped_not_a_recursion_error(tmp_path: Path) -> None:
    (tmp_path / "status-10.json").write_text(json.dumps(_snap(10, 0, {}, 1)))
    (tmp_path / "status-20.json").write_text('{"pid": 20, "gate": ' + "[" * 100_000)
    snaps, skipped = status_files.scan(tmp_path)
    assert [s["pid"] for s in snaps] == [10]
    assert skipped == [{"file": "status-20.json", "reason": "nested too deeply"}]


def test_merge_itself_skips_a_bad_snapshot_it_is_given() -> None:
    merged = status_files.merge([_snap(10, 0, {}, 1), {"pid": 20, "graphs_owned": "lots"}])
    assert merged["processes"] == 1
    assert merged["skipped"] == [
        {"file": None, "reason": "graphs_owned: not a non-negative integer ('lots')"}
    ]


def test_cli_status_from_names_the_bad_files_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "status-10.json").write_text(json.dumps(_snap(10, 0, {"updates.owned": 2}, 1)))
    (tmp_path / "status-20.json").write_text('{"pid": 20, "graphs_owned": "lots"}')
    os.mkfifo(tmp_path / "status-30.json")
    assert cli.main(["status", "--from", str(tmp_path), "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged["processes"] == 1 and [s["file"] for s in merged["skipped"]] == [
        "status-20.json",
        "status-30.json",
    ]
    assert cli.main(["status", "--from", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "status-20.json: graphs_owned: not a non-negative integer ('lots')" in text
    assert "status-30.json: not a regular file (a FIFO)" in text
    # only bad files: nothing to show, an error naming them
    for good in tmp_path.glob("status-10.json"):
        good.unlink()
    assert cli.main(["status", "--from", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no readable status files" in err and "status-20.json" in err
