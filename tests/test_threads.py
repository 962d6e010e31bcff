"""Two threads updating at once are serialised (CANN is reported to fail with concurrent
updaters): one graph's update scopes never interleave with another thread's."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from ascend_graph_patch import state
from ascend_graph_patch.aspects import ON, replay
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.core.graph import OwnedGraph, UpdateTask
from ascend_graph_patch.lines.v0_23 import LINE


class RecordingRuntime:
    """The update protocol as (thread, call) pairs; slow enough to interleave if allowed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def _log(self, what: str) -> None:
        with self.lock:
            self.calls.append((threading.current_thread().name, what))
        time.sleep(0.002)

    def graph_task_update_begin(self, stream: Any, handle: Any) -> None:
        self._log("begin")

    def graph_task_update_end(self, stream: Any) -> None:
        self._log("end")

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Any:
        yield


def graph(runtime: RecordingRuntime) -> tuple[OwnedGraph, list]:
    owned = OwnedGraph(role="target", descriptor=4)
    for i in range(3):
        owned.add(
            UpdateTask(
                kind="fia",
                metadata_key=f"l{i}",
                step=0,
                layer_name=f"l{i}",
                handle=i,
                event=SimpleNamespace(record=lambda s: None),
                op=lambda **kw: None,
                template={},
                provider=SimpleNamespace(kind="fia", group=0, value_keys=(), values=lambda md: {}),
            )
        )
    return owned, [{} for _ in owned.tasks]  # per task, the values its relaunch adds


def interleaved(calls: list[tuple[str, str]]) -> bool:
    """Whether another thread's call came between a begin and its end."""
    open_by: str | None = None
    for thread, what in calls:
        if what == "begin":
            if open_by is not None and open_by != thread:
                return True
            open_by = thread
        elif what == "end":
            open_by = None
    return False


@pytest.fixture(autouse=True)
def clean_state() -> Any:
    """The updates below count into the process's state: leave none of it behind."""
    yield
    state.reset()


def run_two_threads(monkeypatch: pytest.MonkeyPatch, runtime: RecordingRuntime) -> None:
    owned, values = graph(runtime)
    monkeypatch.setattr(shared, "ACTIVE", shared.Active(line=LINE, mode=ON))
    monkeypatch.setattr(replay, "_plan", lambda active, args, kwargs: (owned, values, "upd"))
    monkeypatch.setattr(replay.torch, "npu", runtime)
    threads = [
        threading.Thread(target=replay.update_graph_params, args=(None, None, (), {}), name=n)
        for n in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


def test_concurrent_updates_are_serialised(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = RecordingRuntime()
    run_two_threads(monkeypatch, runtime)
    assert len(runtime.calls) == 12  # 2 threads x 3 tasks x (begin, end)
    assert not interleaved(runtime.calls)
    first = runtime.calls[0][0]
    assert [t for t, _ in runtime.calls[:6]] == [first] * 6  # one whole update, then the other


def test_without_the_lock_they_interleave(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the check above can fail."""
    monkeypatch.setattr(replay, "_UPDATE_LOCK", contextlib.nullcontext())
    runtime = RecordingRuntime()
    run_two_threads(monkeypatch, runtime)
    assert interleaved(runtime.calls)
