"""A happens-before race detector for the simulated device: what the DEVICE would order.

The simulator runs device work on the host, in program order, so a missing dependency between
streams never shows in its results. This module computes, with vector clocks, the order a device
guarantees whatever its schedule, and reports every task update and every ``ExternalEvent`` record
that some legal schedule would apply too early. It covers every scheduling policy at once, the
adversarial one included (the update stream as early as allowed, the compute stream as late), and
it depends only on the sequence of host calls, not on when the simulator happened to run a task.

The model:

* Actors are streams. Each host-launched item on a stream gets the next position of that stream;
  its clock is the join of the stream's previous item (FIFO order), the launching host thread's
  clock at the launch (a launch happens after everything the host knew had finished), and:
  a captured or eager ``ExternalEvent`` wait (a *gate*): the clock of the record it consumes (the
  n-th gate of an event consumes its n-th record); a ``wait_stream`` / ``Event.wait``: the clock of
  the marker item it waits for. An item whose gate's record or awaited marker is not resolved yet
  stays pending, with everything behind it on its stream, as on the device.
* Host threads hold a clock of what they know has finished: ``Stream.synchronize``,
  ``Event.synchronize``, a ``Stream.query`` / ``Event.query`` that answers True, and the device-wide
  ``synchronize`` join the corresponding stream clocks into the calling thread's.
* Replays contribute only the items that matter: each gate, each reset and each task group's op
  task (a *run*), in task order.

The races (each one an unordered pair a device could execute either way):

* ``update``: a task update (``graph_task_update_begin..end`` of a task-group handle) that is not
  ordered after an earlier replay's run of that task: the update may rewrite the task's launch
  arguments before, or while, the previous replay runs it;
* ``run``: a replay's run of a task not ordered after the update before it (the run may read the
  arguments before the update lands);
* ``record``: an ``ExternalEvent`` record not ordered after the gate and reset that consumed its
  previous record (it may be lost to that reset, or be a double record).

What it cannot see: host synchronisation that the simulator does not route through the runtime.
A blocking device-to-host read (``.tolist()``, ``.item()``, ``.cpu()`` of a device tensor) waits for
the stream on hardware; here every tensor is a CPU tensor, so the read is invisible and the detector
may report a race that such an implicit sync would have prevented (vLLM's own sampled-token reads
go through an explicit ``Event.record`` / ``Event.synchronize``, which it does see). Nor does it see
host-to-host ordering between threads (a ``Future``, a queue): a thread's clock holds only what that
thread synchronised itself. Both make it conservative: it may report a race the device would not
have, never miss one the modelled waits leave open.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

ENV_VAR = "TORCH_NPU_SIM_RACE_DETECTOR"
OFF, COUNT, RAISE = "off", "count", "raise"
MODES = (OFF, COUNT, RAISE)
KINDS = ("update", "run", "record")
#: Races described in the report (all are counted).
KEEP = 20

Clock = dict[int, int]


def mode_from_env(environ: dict[str, str] | None = None) -> str:
    """The detector's mode asked by ``TORCH_NPU_SIM_RACE_DETECTOR`` (``off`` when unset)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR, "").strip().lower() or OFF
    if value in ("1", "on", "true"):
        return COUNT
    if value not in MODES:
        raise ValueError(f"{ENV_VAR}={value!r}: expected one of {', '.join(MODES)}")
    return value


def _join(into: Clock, other: Clock) -> None:
    for actor, time in other.items():
        if into.get(actor, 0) < time:
            into[actor] = time


def _covers(clock: Clock, epoch: tuple[int, int]) -> bool:
    """``epoch`` (actor, position) happens before whatever holds ``clock``."""
    actor, time = epoch
    return clock.get(actor, 0) >= time


@dataclass
class Race:
    kind: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "detail": self.detail}


class _Item:
    """One host-launched unit of device work that matters for ordering."""

    __slots__ = ("kind", "obj", "launch", "pos", "where")

    def __init__(self, kind: str, obj: Any, launch: Clock, where: str = "") -> None:
        self.kind = kind  # gate, reset, run, record, update, marker, wait
        self.obj = obj
        self.launch = launch  # the launching thread's clock (shared, never mutated)
        self.pos = 0
        self.where = where


class _StreamClock:
    __slots__ = ("actor", "name", "launched", "clock", "pending")

    def __init__(self, actor: int, name: str) -> None:
        self.actor = actor
        self.name = name
        self.launched = 0
        self.clock: Clock = {}
        self.pending: deque[_Item] = deque()


class _ExternalClock:
    """An ``ExternalEvent``'s records and their consumption."""

    __slots__ = ("issued", "records", "gates", "resets", "reset_count")

    def __init__(self) -> None:
        self.issued = 0  # records launched
        # by record index, until its gate consumed it: None while the record is pending
        self.records: dict[int, Clock | None] = {}
        self.gates = 0  # gates resolved (the n-th consumes record n)
        self.resets: dict[int, tuple[int, int]] = {}  # epoch of the n-th reset, until checked
        self.reset_count = 0


class _Marker:
    """An ``Event.record`` (or a ``wait_stream``'s implicit one): its clock once resolved."""

    __slots__ = ("clock",)

    def __init__(self) -> None:
        self.clock: Clock | None = None


class _TaskClock:
    """A task group's op task: its last update and the runs since, per stream."""

    __slots__ = ("handle", "graph", "update", "runs", "run_index", "runs_seen", "updates_seen")

    def __init__(self, handle: int, graph: int) -> None:
        self.handle = handle
        self.graph = graph
        self.update: tuple[int, int] | None = None
        self.runs: dict[int, int] = {}
        # which run of this task (0, 1, ...) each entry of ``runs`` is; updates resolved so far
        self.run_index: dict[int, int] = {}
        self.runs_seen = 0
        self.updates_seen = 0


class Detector:
    """Vector clocks of streams and host threads; the races found so far."""

    def __init__(self, mode: str, error: type[Exception] = RuntimeError) -> None:
        self.mode = mode
        self.error = error
        self.counts = dict.fromkeys(KINDS, 0)
        self.races: list[Race] = []
        self._streams: weakref.WeakKeyDictionary[Any, _StreamClock] = weakref.WeakKeyDictionary()
        self._externals: weakref.WeakKeyDictionary[Any, _ExternalClock] = (
            weakref.WeakKeyDictionary()
        )
        self._markers: weakref.WeakKeyDictionary[Any, _Marker] = weakref.WeakKeyDictionary()
        self._tasks: dict[int, _TaskClock] = {}
        # per graph, its replay's items (gate, reset, run), until the graph is reset
        self._templates: weakref.WeakKeyDictionary[Any, list[tuple[str, Any]]] = (
            weakref.WeakKeyDictionary()
        )
        self._actors = itertools.count(1)
        self._hosts: dict[int, Clock] = {}
        self._busy: list[_StreamClock] = []  # streams with pending items
        self._update: tuple[Any, int, Clock] | None = None
        #: every ``update`` race as (handle, index of the run overtaken, index of the update):
        #: what the adversarial schedule's prophecy replays (``adversarial``)
        self.overtaken: list[tuple[int, int, int]] = []

    # ---------------------------------------------------------------- state of actors

    def _host(self) -> Clock:
        ident = threading.get_ident()
        clock = self._hosts.get(ident)
        if clock is None:
            clock = self._hosts[ident] = {}
        return clock

    def _stream(self, stream: Any) -> _StreamClock:
        state = self._streams.get(stream)
        if state is None:
            actor = next(self._actors)
            name = "default" if getattr(stream, "_default", False) else f"stream{actor}"
            state = self._streams[stream] = _StreamClock(actor, name)
        return state

    def _external(self, event: Any) -> _ExternalClock:
        state = self._externals.get(event)
        if state is None:
            state = self._externals[event] = _ExternalClock()
        return state

    def _task(self, handle: int, graph: int) -> _TaskClock:
        state = self._tasks.get(handle)
        if state is None:
            state = self._tasks[handle] = _TaskClock(handle, graph)
        return state

    # ---------------------------------------------------------------- launches

    def _launch(self, stream: _StreamClock, items: list[_Item]) -> None:
        for item in items:
            stream.launched += 1
            item.pos = stream.launched
            stream.pending.append(item)
        if stream not in self._busy:
            self._busy.append(stream)
        self._advance()

    def _snapshot(self) -> Clock:
        return dict(self._host())

    def replay(self, stream: Any, graph: Any, tasks: list[Any], groups: dict[int, list]) -> None:
        """``graph`` (its ``tasks``, its task groups by handle id) replayed on ``stream``."""
        template = self._template(graph, tasks, groups)
        launch = self._snapshot()
        where = f"replay of graph #{getattr(graph, '_id', '?')}"
        items = [_Item(kind, obj, launch, where) for kind, obj in template]
        self._launch(self._stream(stream), items)

    def forget(self, graph: Any) -> None:
        """``graph`` was reset: a later capture gives it other tasks and events."""
        self._templates.pop(graph, None)

    def _template(self, graph: Any, tasks: list[Any], groups: dict[int, list]) -> list:
        cached = self._templates.get(graph)
        if cached is not None:
            return cached
        op_task: dict[int, int] = {}
        for handle, group in groups.items():
            ops = [t for t in group if getattr(t, "sim", False)]
            if ops:
                op_task[id(ops[0])] = handle
        graph_id = getattr(graph, "_id", 0)
        template: list[tuple[str, Any]] = []
        for task in tasks:
            kind = task.kind
            if kind == "gate":
                template.append(("gate", self._external(task.event)))
            elif kind == "reset":
                template.append(("reset", self._external(task.event)))
            elif id(task) in op_task:
                template.append(("run", self._task(op_task[id(task)], graph_id)))
        self._templates[graph] = template
        return template

    def gate(self, stream: Any, event: Any) -> None:
        """An eager ``ExternalEvent.wait`` on ``stream``."""
        self._launch(self._stream(stream), [_Item("gate", self._external(event), self._snapshot())])

    def reset(self, stream: Any, event: Any) -> None:
        """An eager ``ExternalEvent.reset`` on ``stream``."""
        item = _Item("reset", self._external(event), self._snapshot())
        self._launch(self._stream(stream), [item])

    def record_external(self, stream: Any, event: Any) -> None:
        """``ExternalEvent.record(stream)``."""
        state = self._external(event)
        state.records[state.issued] = None
        item = _Item("record", (state, state.issued), self._snapshot())
        state.issued += 1
        self._launch(self._stream(stream), [item])

    def update_begin(self, stream: Any, handle: int) -> None:
        self._update = (stream, handle, self._snapshot())

    def abandon_update(self) -> None:
        """The open update scope was dropped without an update."""
        self._update = None

    def update_end(self, graph: Any) -> None:
        """The task update opened by ``update_begin`` was applied (``graph``: its graph)."""
        if self._update is None:
            return
        stream, handle, launch = self._update
        self._update = None
        task = self._task(handle, getattr(graph, "_id", 0))
        self._launch(self._stream(stream), [_Item("update", task, launch)])

    def record_event(self, stream: Any, event: Any) -> None:
        """``Event.record(stream)``: a marker the event stands for from now on."""
        marker = self._markers[event] = _Marker()
        self._launch(self._stream(stream), [_Item("marker", marker, self._snapshot())])

    def wait_event(self, stream: Any, event: Any) -> None:
        """``Event.wait(stream)`` / ``Stream.wait_event``."""
        marker = self._markers.get(event)
        if marker is None:
            return  # never recorded: the wait is a no-op on the device too
        self._launch(self._stream(stream), [_Item("wait", marker, self._snapshot())])

    def wait_stream(self, stream: Any, other: Any) -> None:
        """``stream.wait_stream(other)``: later work on ``stream`` after all launched on ``other``
        so far."""
        if stream is other:
            return
        marker = _Marker()
        self._launch(self._stream(other), [_Item("marker", marker, self._snapshot())])
        self._launch(self._stream(stream), [_Item("wait", marker, self._snapshot())])

    # ---------------------------------------------------------------- host waits

    def sync_stream(self, stream: Any) -> None:
        """The host waited for everything launched on ``stream``."""
        self._advance()
        _join(self._host(), self._stream(stream).clock)

    def sync_event(self, event: Any) -> None:
        """The host saw ``event`` complete (``synchronize``, or a ``query`` answering True)."""
        marker = self._markers.get(event)
        if marker is None:
            return
        self._advance()
        if marker.clock is not None:
            _join(self._host(), marker.clock)

    def sync_all(self) -> None:
        """Device-wide ``synchronize``."""
        self._advance()
        host = self._host()
        for state in list(self._streams.values()):
            _join(host, state.clock)

    # ---------------------------------------------------------------- resolution

    def _advance(self) -> None:
        progress = True
        while progress and self._busy:
            progress = False
            for stream in list(self._busy):
                while stream.pending and self._resolve(stream, stream.pending[0]):
                    stream.pending.popleft()
                    progress = True
                if not stream.pending:
                    self._busy.remove(stream)

    def _resolve(self, stream: _StreamClock, item: _Item) -> bool:
        kind, obj = item.kind, item.obj
        if kind == "gate":
            source: Clock | None = obj.records.get(obj.gates)
            if source is None:
                return False  # its record is not launched or not resolved yet
        elif kind == "wait":
            if obj.clock is None:
                return False
            source = obj.clock
        else:
            source = None
        clock = dict(stream.clock)
        _join(clock, item.launch)
        if source is not None:
            _join(clock, source)
        clock[stream.actor] = item.pos
        epoch = (stream.actor, item.pos)
        if kind == "gate":
            del obj.records[obj.gates]
            obj.gates += 1
        elif kind == "reset":
            obj.resets[obj.reset_count] = epoch
            obj.reset_count += 1
        elif kind == "record":
            self._check_record(obj, clock, stream)
        elif kind == "run":
            self._check_run(obj, clock, stream, item)
        elif kind == "update":
            self._check_update(obj, clock, stream)
        elif kind == "marker":
            obj.clock = clock
        stream.clock = clock
        return True

    def _check_record(self, obj: tuple[_ExternalClock, int], clock: Clock, stream: Any) -> None:
        state, index = obj
        if index > 0:
            consumed = state.resets.pop(index - 1, None)
            if consumed is None or not _covers(clock, consumed):
                self._race(
                    "record",
                    f"ExternalEvent record #{index + 1} on {stream.name} is not ordered after the "
                    f"gate and reset that consume record #{index}"
                    + ("" if consumed else " (not yet consumed when it is recorded)"),
                )
        state.records[index] = clock

    def _check_run(self, task: _TaskClock, clock: Clock, stream: Any, item: _Item) -> None:
        if task.update is not None and not _covers(clock, task.update):
            self._race(
                "run",
                f"{item.where}: the run of task group {task.handle} on {stream.name} is not "
                "ordered after the update before it",
            )
        task.runs[stream.actor] = item.pos
        task.run_index[stream.actor] = task.runs_seen
        task.runs_seen += 1

    def _check_update(self, task: _TaskClock, clock: Clock, stream: Any) -> None:
        unordered = [e for e in task.runs.items() if not _covers(clock, e)]
        for actor, _ in unordered:
            self.overtaken.append((task.handle, task.run_index[actor], task.updates_seen))
        task.updates_seen += 1
        task.run_index = {}
        if task.update is not None and not _covers(clock, task.update):
            unordered.append(task.update)
        if unordered:
            self._race(
                "update",
                f"task update of task group {task.handle} (graph #{task.graph}) on {stream.name} "
                "is not ordered after the previous replay's run of that task",
            )
        task.update = (stream.actor, clock[stream.actor])
        task.runs = {}

    def _race(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        if len(self.races) < KEEP:
            self.races.append(Race(kind, detail))
        if self.mode == RAISE:
            raise self.error(f"happens-before race ({kind}): {detail}")

    # ---------------------------------------------------------------- report

    def report(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "races": sum(self.counts.values()),
            "by_kind": dict(self.counts),
            "examples": [r.as_dict() for r in self.races],
        }


def create(error: type[Exception], environ: dict[str, str] | None = None) -> Detector | None:
    """A detector in the mode the environment asks for (None when off)."""
    mode = mode_from_env(environ)
    return None if mode == OFF else Detector(mode, error)
