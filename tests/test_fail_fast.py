"""The TP fail-fast policy in one process: who ends itself, what it says, what it records.

The real engine shows the whole story at TP=2 (``tests/test_engine_tp.py``); here each branch of
the decision is pinned down with the worker's position faked: a worker the executor does not read
ends itself (unless told to wait), the one it reads and a process that is no executor worker only
record the error, and the record reaches the status file before the process ends.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from ascend_graph_patch import fail_fast, settings, status, status_files


class Ended(Exception):
    """Stands for ``os._exit`` in these tests."""


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A faked position (rank 1 of 2, reply not read) and ``os._exit`` recorded, not run."""
    seen: dict[str, Any] = {"position": (1, 2, False)}

    def end(code: int) -> None:
        seen["exit"] = code
        raise Ended

    monkeypatch.setattr(fail_fast, "_position", lambda: seen["position"])
    monkeypatch.setattr(fail_fast.os, "_exit", end)
    monkeypatch.setattr(fail_fast, "LAST", None)
    monkeypatch.delenv(settings.ENV_TP_FAULT, raising=False)
    return seen


class Descriptor:
    num_tokens = 4


def _raise(error: BaseException) -> None:
    fail_fast.raised(error, "target", Descriptor(), "the update of pa model.layers.0 (1 of 2)")


def _failure() -> RuntimeError:
    try:
        raise RuntimeError("relaunch failed\nsecond line")
    except RuntimeError as exc:
        return exc


def test_a_worker_whose_reply_is_not_read_ends_itself_saying_why(
    worker: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Ended):
        _raise(_failure())
    assert worker["exit"] == fail_fast.EXIT_STATUS
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: relaunch failed" in err
    (line,) = [x for x in err.splitlines() if "ending this worker now" in x]
    for part in (
        "rank 1 of 2",
        "target graph of size 4",
        "RuntimeError: relaunch failed;",
        "pa model.layers.0 (1 of 2)",
        "ASCEND_GRAPH_PATCH_TP_FAULT=wait",
    ):
        assert part in line, line
    assert fail_fast.LAST is not None
    assert {k: v for k, v in fail_fast.LAST.items() if k != "at"} == {
        "type": "RuntimeError",
        "message": "relaunch failed",
        "rank": 1,
        "world_size": 2,
        "role": "target",
        "graph_size": 4,
        "task": "the update of pa model.layers.0 (1 of 2)",
        "action": "ended this worker",
    }


@pytest.mark.parametrize(
    ("position", "switch"),
    [
        ((0, 2, True), None),  # the executor reads this reply: the error reaches the engine
        ((0, 1, None), None),  # no executor worker (the engine core's own runner, TP=1)
        ((1, 2, None), None),  # cannot tell: stock's behaviour
        ((1, 2, False), "wait"),  # told to wait
    ],
)
def test_otherwise_the_error_is_only_recorded_and_raised_by_the_caller(
    worker: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    position: tuple,
    switch: str | None,
) -> None:
    worker["position"] = position
    if switch is not None:
        monkeypatch.setenv(settings.ENV_TP_FAULT, switch)
    _raise(_failure())  # returns: the replay aspect then raises the error
    assert "exit" not in worker and capsys.readouterr().err == ""
    assert fail_fast.LAST is not None and fail_fast.LAST["action"] == "raised into the engine"
    assert status.snapshot()["fault"] == fail_fast.LAST


def test_the_status_file_holds_the_error_before_the_worker_ends(
    worker: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    writer = status_files.StatusWriter(tmp_path)
    monkeypatch.setattr(status_files, "_WRITER", writer)
    with pytest.raises(Ended):
        _raise(_failure())
    (snap,) = status_files.read_dir(tmp_path)
    assert snap["fault"]["message"] == "relaunch failed"
    merged = status_files.merge([snap])
    assert merged["faults"] == [dict(snap["fault"], pid=snap["pid"])]
    assert json.loads(json.dumps(merged))["per_process"][0]["fault"]["rank"] == 1


def test_position_outside_a_vllm_worker_is_unknown() -> None:
    assert not multiprocessing.current_process().name.startswith(fail_fast.WORKER_PREFIX)
    assert fail_fast._position()[2] is None


def test_vllm_names_its_workers_as_the_policy_expects() -> None:
    """The seam the policy reads: vLLM 0.23's multiprocess executor names each worker process
    ``VllmWorker-<rank>`` (a drift there would silently keep stock's wait)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")  # read, not imported: vLLM's import costs seconds
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "v1" / "executor" / "multiproc_executor.py").read_text()
    assert f'name=f"{fail_fast.WORKER_PREFIX}{{rank}}"' in source
