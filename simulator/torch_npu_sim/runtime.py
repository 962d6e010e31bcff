"""Graph semantics of the simulated ``torch_npu``: capture, replay, task groups, updates, events.

Execution model (see DESIGN.md section 6):

* Outside a capture, ops run at once on the host (streams are ordering tokens only), except that a
  stream whose queue holds blocked work queues further runtime launches behind it.
* While a graph captures, every aten op is recorded by a ``TorchDispatchMode``. Each recorded op is
  also run once at capture ("warm-up") so that its outputs exist with the right shapes, strides and
  addresses: callers hold those tensors (by address) exactly as they hold graph-pool memory on
  hardware. At replay the op is re-run and its results are written into the recorded outputs;
  in-place and ``out=`` ops simply re-run, view ops are not recorded (their outputs alias recorded
  storage already). Host-side code around the ops (Python, ``.tolist()``) runs only at capture, as
  on hardware.
* Simulated NPU ops (``make_op``) are one task each; the aten ops they run internally are not
  recorded separately. Inside an update scope, a launch does not run: it replaces the launch
  arguments of the task group's op task.
* ``ExternalEvent.wait``/``reset`` captured in a graph become gate tasks. ``replay()`` queues the
  graph's tasks on the current stream and runs them up to the first gate whose event is not
  recorded; ``record`` releases it. Any synchronisation point drains and raises ``SimulatorError``
  if work is still blocked (hardware would hang). The simulator never blocks the host.

Threads: the runner's capture/replay/update path is driven from one thread, but others may
synchronise while it runs (vLLM's async-scheduling output-copy thread waits on events, which drains
the same queued graph tasks). One re-entrant lock serialises every entry into the queues (launch,
replay, drain, record, update, simulated op), as the device orders its own work; the current stream
is per thread, as on a device (a thread starts on the default stream).

Ordering: the simulator runs device work in program order, so a missing wait between streams
never shows in its results. With ``TORCH_NPU_SIM_RACE_DETECTOR=count|raise`` the entry points
below also feed :mod:`.happens_before`, which computes what a device would order (vector clocks)
and reports every task update or event record some legal schedule would apply too early.

Collectives: a captured ``c10d`` collective is a task whose replay issues it again and waits on its
``Work`` (a device graph's collective completes before the next task in its stream); a replay that
dropped the ``Work`` would read a partial sum while the peer ranks still reduce.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import adversarial, happens_before, lifetimes


class SimulatorError(RuntimeError):
    """A misuse that real hardware would punish (error, hang or deadlock)."""


# --------------------------------------------------------------------------------------------
# Process-global state (``reset()`` restores it).


class _State:
    def __init__(self) -> None:
        self.null_cost = False
        self.capturing: NPUGraph | None = None
        self.capture_mode: _CaptureMode | None = None
        self.group: list[_Task] | None = None  # tasks of the open task group
        self.group_op_name: str | None = None
        self.update_handle: _NPUTaskGroupHandle | None = None
        self.update_done = False
        self.executing = 0  # >0 while the runtime itself runs tasks (no recording)
        self.default_stream = Stream._make_default()
        self._per_thread = threading.local()  # each thread's current stream
        self.busy: list[Stream] = []  # streams with queued work, in launch order
        self.counters = dict.fromkeys(_COUNTER_NAMES, 0)
        # the happens-before race detector (``TORCH_NPU_SIM_RACE_DETECTOR``), None when off
        self.hb = happens_before.create(SimulatorError)
        # the adversarial schedule by prophecy (``adversarial``): pass 1 records every update's
        # host values while the detector is on; pass 2 reads the prophecy named by the
        # environment (loaded at the first task group, once the process knows its rank)
        self.recorder = adversarial.Recorder() if self.hb is not None else None
        self.prophecy: adversarial.Prophecy | None = None
        self.prophecy_loaded = False
        self.update_values: dict | None = None
        # task group handle id -> its ordinal since reset: the prophecy's key (handle ids run on
        # across resets, ordinals repeat in a program that repeats itself)
        self.group_ordinals: dict[int, int] = {}

    @property
    def current_stream(self) -> Stream:
        """This thread's current stream (the default stream until the thread sets one)."""
        return getattr(self._per_thread, "stream", None) or self.default_stream

    @current_stream.setter
    def current_stream(self, stream: Stream) -> None:
        self._per_thread.stream = stream


_COUNTER_NAMES = (
    "captures",
    "replays",
    "updates",
    "records",
    "op_launches",
    "tasks_run",
    "group_handles",
    "capture_warmups_skipped",
)
_handle_ids = itertools.count(1)
_graph_ids = itertools.count(1)
_pool_ids = itertools.count(1)
_S: _State  # set at the bottom of the module
#: Serialises every entry into the simulated device's queues across threads (re-entrant: tasks
#: launch ops, draining records events).
_LOCK = threading.RLock()


def _locked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` holding the runtime's lock (dynamo, tracing a model, sees ``fn`` alone: it
    cannot enter a lock, and what it traces runs later, through the runtime's entry points).

    Not in null-cost mode: it touches no queue, and it is the host-cost benchmark's single-threaded
    stand-in for a device runtime whose calls cost nothing (a lock there would be a simulator
    cost counted into every arm's runtime calls).
    """

    @functools.wraps(fn)
    def locked(*args: Any, **kwargs: Any) -> Any:
        if _S.null_cost or torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        with _LOCK:
            return fn(*args, **kwargs)

    return locked


@_locked
def reset() -> None:
    """Forget every graph, queue, scope and counter (test isolation)."""
    global _S
    if _S.capture_mode is not None:
        with contextlib.suppress(Exception):
            _S.capture_mode.__exit__(None, None, None)
    _HANDLES.clear()
    _S = _State()


@_locked
def abandon_update_scope() -> bool:
    """Drop a task update scope left open (True if one was): what a failed stock relaunch leaves
    behind (it never reaches ``graph_task_update_end``). For harnesses that run stock's step as
    a reference and then go on with the overlay's on the same device (the soak)."""
    was_open = _S.update_handle is not None
    _S.update_handle = None
    _S.update_done = False
    _S.update_values = None
    if _S.hb is not None:
        _S.hb.abandon_update()
    return was_open


def stats() -> dict[str, int]:
    """Counters since the last ``reset()``: captures, replays, updates, records, ... (and the
    race detector's ``races_<kind>`` counts when it is on)."""
    counters = dict(_S.counters)
    if _S.prophecy is not None:
        counters.update(_S.prophecy.counts, prophecy_unmet=_S.prophecy.unmet())
    if _S.hb is not None:
        counters.update({f"races_{k}": n for k, n in _S.hb.counts.items()})
    return counters


def race_report() -> dict[str, Any] | None:
    """The happens-before race detector's report since the last ``reset()`` (None when off)."""
    return None if _S.hb is None else _S.hb.report()


def prophecy_record() -> dict[str, Any] | None:
    """Pass 1 of the adversarial schedule (``adversarial``): the runs later updates overtake and
    those updates' host values, for ``TORCH_NPU_SIM_PROPHECY`` (None when the detector is off)."""
    if _S.hb is None or _S.recorder is None:
        return None
    ordinal = _S.group_ordinals
    overtaken = [(ordinal[h], run, update) for h, run, update in _S.hb.overtaken if h in ordinal]
    return _S.recorder.prophecy(overtaken)


def _hb() -> happens_before.Detector | None:
    """The race detector for a host call (not a task the simulator runs, not null cost)."""
    if _S.executing or _S.null_cost:
        return None
    return _S.hb


def set_null_cost(enabled: bool) -> None:
    """Make runtime calls record the minimum and compute nothing (host-overhead benchmarks)."""
    _S.null_cost = bool(enabled)


def is_null_cost() -> bool:
    return _S.null_cost


@contextlib.contextmanager
def null_cost(enabled: bool = True) -> Iterator[None]:
    """Context form of ``set_null_cost``."""
    previous = _S.null_cost
    _S.null_cost = enabled
    try:
        yield
    finally:
        _S.null_cost = previous


# --------------------------------------------------------------------------------------------
# Tasks


class _Task:
    """One unit of device work: a callable with its (replaceable) launch arguments."""

    __slots__ = ("name", "fn", "args", "kwargs", "outputs", "sim", "weak", "handle")
    kind = "op"

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        outputs: list[torch.Tensor] | None = None,
    ) -> None:
        self.name = name
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        # Tensors the result must be written into (functional aten ops); None: the op writes
        # its own outputs (in-place / out= / simulated NPU op) and the result is dropped.
        self.outputs = outputs
        self.sim = False  # a simulated NPU op (the one a task-group update may replace)
        self.weak = lifetimes.weak_args(args, kwargs)  # non-owning arguments (checked at run)
        self.handle: int | None = None  # the ordinal of the task group whose op task this is

    def ready(self) -> bool:
        return True

    def run(self) -> None:
        result = self._call()
        if self.outputs is not None:
            new, _ = tree_flatten(result)
            new = [t for t in new if isinstance(t, torch.Tensor)]
            if len(new) != len(self.outputs):
                raise SimulatorError(f"replayed op {self.name} changed its number of outputs")
            for dst, src in zip(self.outputs, new, strict=True):
                if dst.shape != src.shape:
                    raise SimulatorError(
                        f"replayed op {self.name} produced shape {tuple(src.shape)}, captured "
                        f"{tuple(dst.shape)} (data-dependent shapes cannot be graph-captured)"
                    )
                dst.copy_(src)

    def _call(self) -> Any:
        result = self.fn(*self.args, **self.kwargs)
        _wait_collectives(result)
        return result

    def __repr__(self) -> str:
        return f"<task {self.name}>"


class _FunctionalCollectiveTask(_Task):
    """A captured ``_c10d_functional`` collective: its fresh result is waited (``wait_tensor``)
    before it is written into the captured output, which no ``wait_tensor`` replay would reach
    (the one the caller made at capture waited on the capture-time tensor)."""

    __slots__ = ()

    def _call(self) -> Any:
        result = self.fn(*self.args, **self.kwargs)
        for leaf in tree_flatten(result)[0]:
            if isinstance(leaf, torch.Tensor):
                torch.ops._c10d_functional.wait_tensor(leaf)
        return result


class _GateTask(_Task):
    """``ExternalEvent.wait``: passes only once the event is recorded."""

    __slots__ = ("event",)
    kind = "gate"

    def __init__(self, event: ExternalEvent) -> None:
        super().__init__("ExternalEvent.wait", _noop, (), {})
        self.event = event

    def ready(self) -> bool:
        return self.event._recorded

    def run(self) -> None:
        self.event._pending -= 1


class _ResetTask(_Task):
    __slots__ = ("event",)
    kind = "reset"

    def __init__(self, event: ExternalEvent) -> None:
        super().__init__("ExternalEvent.reset", _noop, (), {})
        self.event = event

    def run(self) -> None:
        self.event._recorded = False


class _RecordTask(_Task):
    """An ``ExternalEvent.record`` queued behind blocked work on its stream."""

    __slots__ = ("event",)
    kind = "record"

    def __init__(self, event: ExternalEvent) -> None:
        super().__init__("ExternalEvent.record", _noop, (), {})
        self.event = event

    def run(self) -> None:
        self.event._do_record()


class _StreamWaitTask(_Task):
    """``Stream.wait_stream`` / ``wait_event``: passes once ``stream`` completed ``target``."""

    __slots__ = ("stream", "target")
    kind = "stream_wait"

    def __init__(self, stream: Stream, target: int) -> None:
        super().__init__("Stream.wait_stream", _noop, (), {})
        self.stream = stream
        self.target = target

    def ready(self) -> bool:
        return self.stream._completed >= self.target


def _noop(*_a: Any, **_k: Any) -> None:
    return None


_WORK = "__torch__.torch.classes.c10d.Work"


def _is_work(leaf: Any) -> bool:
    if isinstance(leaf, torch.ScriptObject):  # through the dispatcher: a boxed Work
        return leaf._type().qualified_name() == _WORK
    return type(leaf).__name__ == "Work" and hasattr(leaf, "wait")


def _wait_collectives(result: Any) -> None:
    """Wait on every collective ``Work`` a replayed op returned (``c10d.allreduce_`` & co.)."""
    if not isinstance(result, (tuple, list)):
        result = [result]  # ``alltoall_base_`` and the coalesced ops return their Work alone
    for leaf in tree_flatten(result)[0]:
        if _is_work(leaf):
            leaf.wait()


# --------------------------------------------------------------------------------------------
# Streams and events


class Stream:
    """A simulated NPU stream: an ordering token with a queue for blocked work."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.priority = priority
        self.device = torch.device("cpu")
        self._queue: deque[_Task] = deque()
        self._launched = 0
        self._completed = 0
        self._default = False
        self.npu_stream = id(self)

    @classmethod
    def _make_default(cls) -> Stream:
        stream = cls()
        stream._default = True
        return stream

    # Launch ``task`` after everything queued on this stream (runs now if nothing is queued).
    @_locked
    def _launch(self, task: _Task) -> None:
        if not self._queue and task.ready():
            self._launched += 1
            _run_task(task)
            self._completed += 1
            return
        self._queue.append(task)
        self._launched += 1
        if self not in _S.busy:
            _S.busy.append(self)
        _drain()

    def _blocked(self) -> bool:
        return bool(self._queue)

    @_locked
    def wait_stream(self, stream: Stream) -> None:
        """Order later work here after all work launched on ``stream`` so far."""
        if _S.hb is not None and _S.capturing is None and (hb := _hb()) is not None:
            hb.wait_stream(self, stream)
        if _S.capturing is not None or stream is self or not stream._queue:
            return
        self._launch(_StreamWaitTask(stream, stream._launched))

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    @_locked
    def synchronize(self) -> None:
        """Sync point: drain; blocked work here would hang the host on hardware."""
        if _S.null_cost:
            return
        _drain()
        if self._queue:
            _report_blocked([self], "Stream.synchronize()")
        if _S.hb is not None and (hb := _hb()) is not None:
            hb.sync_stream(self)

    @_locked
    def query(self) -> bool:
        done = not self._queue
        if done and _S.hb is not None and (hb := _hb()) is not None:
            hb.sync_stream(self)  # the host saw it finish
        return done

    def set_data_preprocess_stream(self, is_data_preprocess_stream: bool = False) -> None:
        return None

    def __repr__(self) -> str:
        name = "default" if self._default else hex(id(self))
        return f"<sim npu Stream {name} queued={len(self._queue)}>"


class Event:
    """Plain ``torch.npu.Event``: a marker at a stream position."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self._stream: Stream | None = None
        self._target = 0

    @_locked
    def record(self, stream: Stream | None = None) -> None:
        stream = stream or _S.current_stream
        self._stream, self._target = stream, stream._launched
        if _S.hb is not None and _S.capturing is None and (hb := _hb()) is not None:
            hb.record_event(stream, self)

    @_locked
    def wait(self, stream: Stream | None = None) -> None:
        stream = stream or _S.current_stream
        if _S.hb is not None and _S.capturing is None and (hb := _hb()) is not None:
            hb.wait_event(stream, self)
        if _S.capturing is not None or self._stream is None or self._done():
            return
        stream._launch(_StreamWaitTask(self._stream, self._target))

    def _done(self) -> bool:
        return self._stream is None or self._stream._completed >= self._target

    @_locked
    def query(self) -> bool:
        done = self._done()
        if done and _S.hb is not None and (hb := _hb()) is not None:
            hb.sync_event(self)  # the host saw it complete
        return done

    @_locked
    def synchronize(self) -> None:
        _drain()
        if not self._done():
            _report_blocked([self._stream], "Event.synchronize()")
        if _S.hb is not None and (hb := _hb()) is not None:
            hb.sync_event(self)

    def elapsed_time(self, end_event: Event) -> float:
        return 0.0


class ExternalEvent:
    """``torch.npu.ExternalEvent``: a host-recordable event a stream (or a graph) can wait on."""

    def __init__(self) -> None:
        self._recorded = False
        self._pending = 0  # queued wait gates not yet passed

    @_locked
    def wait(self, stream: Stream | None = None) -> None:
        gate = _GateTask(self)
        if _S.capturing is not None:
            _S.capturing._record(gate)
            return
        stream = stream or _S.current_stream
        if _S.hb is not None and (hb := _hb()) is not None:
            hb.gate(stream, self)
        self._pending += 1
        stream._launch(gate)

    @_locked
    def reset(self, stream: Stream | None = None) -> None:
        task = _ResetTask(self)
        if _S.capturing is not None:
            _S.capturing._record(task)
            return
        stream = stream or _S.current_stream
        if _S.hb is not None and (hb := _hb()) is not None:
            hb.reset(stream, self)
        stream._launch(task)

    def record(self, stream: Stream | None = None) -> None:
        """Release the pending (or next) wait; a second record before its reset is an error."""
        _S.counters["records"] += 1
        if _S.null_cost:
            return
        self._record(stream)

    @_locked
    def _record(self, stream: Stream | None) -> None:
        if _S.capturing is not None:
            raise SimulatorError("ExternalEvent.record during graph capture is not simulated")
        stream = stream or _S.current_stream
        if _S.hb is not None and (hb := _hb()) is not None:
            hb.record_external(stream, self)
        if not stream._queue:
            self._do_record()
            return
        task = _RecordTask(self)
        stream._launch(task)
        if task in stream._queue:
            _check_deadlock(stream)

    def _do_record(self) -> None:
        # A record ahead of its wait is legal (vllm-ascend's ENPU order: update, then replay):
        # the event stays recorded until the captured reset. A second record before that
        # reset (twice for one wait) is the error.
        if self._recorded:
            raise SimulatorError(
                "double record: ExternalEvent recorded again before its wait/reset consumed "
                f"the previous record ({self._pending} wait(s) pending)"
            )
        self._recorded = True
        _drain()


def _run_task(task: _Task) -> None:
    if task.weak:
        _check_owners(task.name, task.weak, "runs")
    own = None
    if _S.prophecy is not None and task.handle is not None:
        values = _S.prophecy.run_values(task.handle)
        if values is not None:  # overtaken: this run reads a later update's host values
            own = task.args, task.kwargs
            task.args, task.kwargs, changed = adversarial.substitute(*own, values)
            _S.prophecy.counts["prophecy_runs"] += 1
            _S.prophecy.counts["prophecy_runs_changed"] += int(changed)
    _S.executing += 1
    try:
        with torch.inference_mode():
            task.run()
    finally:
        _S.executing -= 1
        if own is not None:
            task.args, task.kwargs = own
    _S.counters["tasks_run"] += 1


def _check_owners(name: str, weak: tuple[torch.Tensor, ...], what: str) -> None:
    """A task must not touch memory whose owner is gone (the weak reference does not own it)."""
    freed = lifetimes.freed(weak)
    if freed is not None:
        raise SimulatorError(
            f"use after free: task {name} {what} with a weak reference "
            f"(torch_npu._C._weak_ref_tensor) whose owner was freed: {freed}. On hardware the "
            "caching allocator may already have given that memory to another tensor."
        )


@_locked
def _drain() -> None:
    """Run every stream's queue as far as its gates allow."""
    progress = True
    while progress and _S.busy:
        progress = False
        for stream in list(_S.busy):
            queue = stream._queue
            while queue and queue[0].ready():
                task = queue.popleft()
                _run_task(task)
                stream._completed += 1
                progress = True
            if not queue and stream in _S.busy:
                _S.busy.remove(stream)


def _head_blockers(stream: Stream) -> list[Stream]:
    """Streams whose progress would unblock ``stream``'s head task."""
    head = stream._queue[0]
    if isinstance(head, _StreamWaitTask):
        return [head.stream]
    if isinstance(head, _GateTask):
        return [
            s
            for s in _S.busy
            if any(isinstance(t, _RecordTask) and t.event is head.event for t in s._queue)
        ]
    return []


def _check_deadlock(start: Stream) -> None:
    """Raise if ``start``'s blocked work waits (transitively) on itself."""
    seen: list[Stream] = []
    frontier = [start]
    while frontier:
        stream = frontier.pop()
        if stream in seen or not stream._queue:
            continue
        seen.append(stream)
        for nxt in _head_blockers(stream):
            if nxt is start:
                _discard(seen)
                raise SimulatorError(
                    "deadlock (would hang on hardware): a stream waits on a stream whose "
                    "replay is blocked on an ExternalEvent that only the first stream records "
                    "(e.g. update_stream.wait_stream(main) after replay, before the record)"
                )
            frontier.append(nxt)


def _discard(streams: list[Stream]) -> None:
    """After reporting blocked work, drop it so later tests and calls are not poisoned."""
    for stream in streams:
        for task in stream._queue:
            if isinstance(task, _GateTask):
                task.event._pending -= 1
        stream._completed += len(stream._queue)
        stream._queue.clear()
        if stream in _S.busy:
            _S.busy.remove(stream)


def _report_blocked(streams: list[Stream], where: str) -> None:
    blocked = [(s, s._queue[0]) for s in streams if s._queue]
    detail = "; ".join(f"{s!r} blocked at {head!r}" for s, head in blocked)
    deadlock = any(_head_blockers(s) for s, _ in blocked)
    _discard([s for s, _ in blocked])
    kind = "deadlock" if deadlock else "blocked"
    raise SimulatorError(
        f"{where}: {kind}, work is still blocked (would hang on hardware: an ExternalEvent "
        f"wait was never recorded): {detail}"
    )


@_locked
def synchronize(device: Any = None) -> None:
    """Device-wide sync point: drain everything, raise if anything stays blocked."""
    if _S.null_cost:
        return
    _drain()
    if _S.busy:
        _report_blocked(list(_S.busy), "synchronize()")
    if _S.hb is not None and (hb := _hb()) is not None:
        hb.sync_all()


def current_stream(device: Any = None) -> Stream:
    return _S.current_stream


def default_stream(device: Any = None) -> Stream:
    return _S.default_stream


def set_stream(stream: Stream | None) -> None:
    """Make ``stream`` the current stream (``None``: no-op, as in torch_npu)."""
    if stream is not None:
        _S.current_stream = stream


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[Stream | None]:
    """Make ``stream`` the current stream for the block (``None``: no-op, as in torch_npu)."""
    if stream is None:
        yield stream
        return
    previous = _S.current_stream
    _S.current_stream = stream
    try:
        yield stream
    finally:
        _S.current_stream = previous


# --------------------------------------------------------------------------------------------
# Graphs


class _CaptureMode(TorchDispatchMode):
    """Records every aten op launched while a graph captures (and runs it once: warm-up).

    Custom ops (vLLM's ``unified_attention_with_output``, ...) and higher-order ops (the
    ``auto_functionalized_v2`` of compiled graphs) are not tasks: a device graph holds the kernels
    their bodies launch. Their bodies run under this mode, so those kernels are recorded one by one
    (an opaque custom-op task would re-run its Python body at replay, bypassing updated tasks).
    """

    supports_higher_order_operators = True

    def __init__(self, graph: NPUGraph) -> None:
        super().__init__()
        self.graph = graph
        self.thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if threading.get_ident() != self.thread:
            # A backend's worker thread that inherited the mode with the thread-local state
            # (gloo runs collectives so, copying results into outputs): its ops are the inside
            # of the collective task the capturing thread recorded, not tasks of their own.
            return func(*args, **kwargs)
        body = _body(func)
        if body is not None and not _S.executing and _S.capturing is self.graph:
            with self:
                return body(*args, **kwargs)
        if isinstance(func, HigherOrderOperator):
            return NotImplemented
        out = func(*args, **kwargs)
        if _S.executing or _S.capturing is not self.graph:
            return out
        if func.namespace == "c10d":
            self.graph._record(_collective_task(func, args, kwargs, out))
            return out
        if func.namespace == "_c10d_functional" and func._opname != "wait_tensor":
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            self.graph._record(_FunctionalCollectiveTask(str(func), func, args, kwargs, outputs))
            return out
        kind = _op_kind(func)
        if kind == "view" and _fresh_output(args, out):
            kind = "functional"  # e.g. aten.to.dtype under inference_mode: "may alias", copied
        if kind in ("skip", "view"):
            if kind == "skip":
                self.graph._reserved.append(out)  # graph-pool memory (see lifetimes)
            return out
        if kind == "mutating":
            self.graph._record(_Task(str(func), func, args, kwargs))
            return out
        flat, _ = tree_flatten(out)
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if tensors:
            self.graph._record(_Task(str(func), func, args, kwargs, tensors))
        return out


def _collective_task(func: Any, args: tuple, kwargs: dict, out: Any) -> _Task:
    """A captured ``c10d`` collective as one device task: issue plus wait, writing its outputs.

    ``c10d`` schemas carry no alias annotations, so the generic rules misread them: an op that
    returns only its ``Work`` (``alltoall_base_``, the coalesced ones) would not be recorded at all,
    and one that returns tensors would be replayed as a functional op. And the backend may finish
    the collective inside ``Work.wait`` on the caller's thread (gloo's reduce-scatter copies its
    result into the output there): under capture that copy would be recorded as a task of its own
    that, at replay, writes the capture-time result over the fresh one. So the ``Work`` is waited
    here, with recording off, and the caller's own ``wait`` finds it done; at replay the task
    issues the collective again and waits (``_Task.run``), as a device graph's collective completes
    before the next task on its stream.
    """
    _S.executing += 1
    try:
        _wait_collectives(out)
    finally:
        _S.executing -= 1
    return _Task(str(func), func, args, kwargs)


def install_collective_wait(torch_module: Any) -> None:
    """Make ``Work.wait`` inside a capture record nothing (idempotent).

    Gloo's reduce-scatter ``Work`` splits its buffer and copies the result into the output on
    every ``wait`` (on the caller's thread). The caller waits right after the collective; under
    capture those ops would become tasks of their own that, at replay, copy the capture-time
    buffer over the fresh result (DP=2's MoE reduce-scatter replayed zeros). On a device a wait
    inside a graph is stream order only: the collective task (:func:`_collective_task`) waits at
    replay.
    """
    c10d = getattr(torch_module._C, "_distributed_c10d", None)
    work = getattr(c10d, "Work", None)
    if work is None or getattr(work.wait, "_sim_capture_aware", False):
        return
    real_wait = work.wait

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _S.capturing is None or _S.executing:
            return real_wait(self, *args, **kwargs)
        _S.executing += 1
        try:
            return real_wait(self, *args, **kwargs)
        finally:
            _S.executing -= 1

    wait._sim_capture_aware = True  # type: ignore[attr-defined]
    work.wait = wait


#: Namespaces of torch's own ops: their kernels are device kernels, recorded as one task each.
_TORCH_NAMESPACES = frozenset({"aten", "prims", "c10d", "_c10d_functional", "rngprims", "profiler"})


def _body(func: Any) -> Callable[..., Any] | None:
    """The body to run transparently under capture: a HOP's dense kernel, a custom op's kernel."""
    if isinstance(func, HigherOrderOperator):
        return func.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
    if func.namespace in _TORCH_NAMESPACES:
        return None
    return functools.partial(func.redispatch, DispatchKeySet(DispatchKey.CPU))


_KIND_CACHE: dict[Any, str] = {}
# Allocation-only ops: memory comes from the graph pool at capture, no kernel runs at replay.
_ALLOC_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def _op_kind(func: Any) -> str:
    kind = _KIND_CACHE.get(func)
    if kind is not None:
        return kind
    schema = func._schema
    if func._opname in _ALLOC_OPS:
        kind = "skip"
    elif any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        kind = "mutating"
    elif any(r.alias_info is not None for r in schema.returns):
        kind = "view"  # aliases storage that recorded ops keep up to date (unless it copied)
    else:
        kind = "functional"
    _KIND_CACHE[func] = kind
    return kind


def _fresh_output(args: tuple, out: Any) -> bool:
    """True when an op whose schema *may* alias returned new storage instead of a view."""
    inputs = {
        t.untyped_storage().data_ptr() for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)
    }
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return bool(outs) and all(t.untyped_storage().data_ptr() not in inputs for t in outs)


# torch_npu's own messages for the two capture rules it enforces (libtorch_npu.so).
CAPTURE_ON_DEFAULT_STREAM = (
    "NPU graphs must be captured on a non-default stream. (However, after capture, it's ok to "
    "replay them on the default stream.)"
)
CAPTURE_END_ON_OTHER_STREAM = "Capture must end on the same stream it began on."
UPDATE_WITHOUT_AUTO_DISPATCH = (
    "The current graph configuration does not support update,"
    "Try to capture by setting auto_dispatch_capture=True during capture"
)


class NPUGraph:
    """A captured task list; ``replay()`` queues it on the current stream."""

    def __init__(self) -> None:
        self._tasks: list[_Task] = []
        self._groups: dict[int, list[_Task]] = {}
        self._captured = False
        self._pool: tuple[int, int] | None = None
        self._last: tuple[Stream, int] | None = None  # stream and target of the last replay
        self._capture_stream: Stream | None = None
        # Memory allocated while capturing: the graph's private pool keeps it for the graph even
        # after the tensors that held it are gone (their weak references stay owned).
        self._reserved: list[torch.Tensor] = []
        self._id = next(_graph_ids)
        self.auto_dispatch_capture = False

    def _record(self, task: _Task) -> None:
        if _S.group is not None:
            _S.group.append(task)
        self._tasks.append(task)

    @_locked
    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if _S.capturing is not None:
            raise SimulatorError("nested graph capture: a graph is already capturing")
        if self._captured:
            raise SimulatorError("NPUGraph.capture_begin on an already captured graph (reset it)")
        if _S.current_stream._default:
            raise SimulatorError(CAPTURE_ON_DEFAULT_STREAM)
        self._capture_stream = _S.current_stream
        self._pool = pool if pool is not None else graph_pool_handle()
        _S.capturing = self
        _S.capture_mode = _CaptureMode(self)
        _S.capture_mode.__enter__()

    @_locked
    def capture_end(self) -> None:
        if _S.capturing is not self:
            raise SimulatorError("NPUGraph.capture_end without a matching capture_begin")
        if _S.group is not None:
            raise SimulatorError("capture ended inside an open graph task group")
        wrong_stream = _S.current_stream is not self._capture_stream
        mode, _S.capture_mode, _S.capturing = _S.capture_mode, None, None
        mode.__exit__(None, None, None)
        if wrong_stream:  # the capture is abandoned (hardware leaves it open: a broken stream)
            self._tasks.clear()
            raise SimulatorError(CAPTURE_END_ON_OTHER_STREAM)
        self._captured = True
        _S.counters["captures"] += 1

    @_locked
    def abandon_capture(self) -> None:
        """End a capture whose body raised: no graph, nothing left open (a task group the body
        began is dropped). The body's exception is the one that propagates: capture_end's
        complaint about the open group would replace it (a SIGTERM that lands between a task
        group's begin and end would become an ordinary error, and a capture would stay open
        for the rest of the process)."""
        if _S.capturing is not self:
            return
        _S.group = None
        mode, _S.capture_mode, _S.capturing = _S.capture_mode, None, None
        mode.__exit__(None, None, None)
        self.reset()

    @_locked
    def replay(self) -> None:
        """Queue the tasks on the current stream; run them up to the first unrecorded gate."""
        if _S.capturing is not None:
            raise SimulatorError("NPUGraph.replay during graph capture")
        if not self._captured:
            raise SimulatorError("NPUGraph.replay before capture_end")
        _S.counters["replays"] += 1
        if _S.null_cost:
            return
        if self._last is not None:  # the previous replay of this graph must have finished
            last_stream, target = self._last
            _drain()
            if last_stream._completed < target:
                _report_blocked([last_stream], "NPUGraph.replay() (previous replay)")
        s = _S.current_stream
        if _S.hb is not None and (hb := _hb()) is not None:
            hb.replay(s, self, self._tasks, self._groups)
        queue = s._queue
        for task in self._tasks:
            if isinstance(task, _GateTask):
                task.event._pending += 1
            queue.append(task)
        s._launched += len(self._tasks)
        self._last = (s, s._launched)
        if queue and s not in _S.busy:
            _S.busy.append(s)
        _drain()

    @_locked
    def reset(self) -> None:
        if _S.hb is not None:
            _S.hb.forget(self)
        self._tasks.clear()
        self._reserved.clear()
        for gid in self._groups:
            _HANDLES.pop(gid, None)
        self._groups.clear()
        self._captured = False
        self._last = None

    def pool(self) -> tuple[int, int] | None:
        return self._pool

    def update(self, cpu_update_input: list[dict[str, Any]]) -> None:
        """torch_npu's declarative update; only graphs captured with auto-dispatch have one."""
        if not self.auto_dispatch_capture:
            raise RuntimeError(UPDATE_WITHOUT_AUTO_DISPATCH)
        raise SimulatorError("NPUGraph.update (auto_dispatch_capture) is not simulated")

    def enable_debug_mode(self) -> None:
        return None

    def debug_dump(self, debug_path: str) -> None:
        return None

    def __repr__(self) -> str:
        return f"<sim NPUGraph #{self._id} tasks={len(self._tasks)}>"


def graph_pool_handle() -> tuple[int, int]:
    return (0, next(_pool_ids))


class graph:  # noqa: N801 - torch API name
    """``torch.npu.graph(g, pool=None, stream=None, ...)``: capture on ``stream`` (a side stream).

    ``auto_dispatch_capture=True`` (torch_npu's own task-group framework, which vllm-ascend
    0.23 does not use) is not simulated: entering such a capture raises.
    """

    default_capture_stream: Stream | None = None

    def __init__(
        self,
        npu_graph: NPUGraph,
        pool: Any = None,
        stream: Stream | None = None,
        auto_dispatch_capture: bool = False,
        capture_error_mode: str = "global",
    ) -> None:
        if stream is None:
            if graph.default_capture_stream is None:
                graph.default_capture_stream = Stream()
            stream = graph.default_capture_stream
        self.npu_graph = npu_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self.npu_graph.auto_dispatch_capture = auto_dispatch_capture
        self._previous: Stream | None = None

    def __enter__(self) -> None:
        if self.npu_graph.auto_dispatch_capture:
            raise SimulatorError("torch.npu.graph(auto_dispatch_capture=True) is not simulated")
        synchronize()
        self._previous = _S.current_stream
        _S.current_stream = self.capture_stream
        try:
            self.npu_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            _S.current_stream = self._previous
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            if _S.capturing is self.npu_graph:
                if exc[0] is not None:  # the body failed (or was interrupted): no graph
                    self.npu_graph.abandon_capture()
                else:
                    self.npu_graph.capture_end()
        finally:
            _S.current_stream = self._previous


def is_current_stream_capturing() -> bool:
    return _S.capturing is not None


# --------------------------------------------------------------------------------------------
# Task groups and updates


class _NPUTaskGroupHandle:
    """Opaque handle of a captured task group (``torch_npu._C._NPUTaskGroupHandle``)."""

    __slots__ = ("_id",)

    def __init__(self, _id: int = 0) -> None:
        self._id = _id

    def __repr__(self) -> str:
        return f"<NPUTaskGroupHandle {self._id}>"


# handle id -> (graph, task list) of every live task group
_HANDLES: dict[int, tuple[NPUGraph | None, list[_Task]]] = {}


@_locked
def graph_task_group_begin(stream: Stream) -> None:
    if _S.null_cost:
        _S.group = []
        return
    if _S.capturing is None:
        raise SimulatorError("graph_task_group_begin outside a graph capture")
    if _S.group is not None:
        raise SimulatorError("nested graph_task_group_begin")
    _S.group = []


@_locked
def graph_task_group_end(stream: Stream) -> _NPUTaskGroupHandle:
    if _S.group is None:
        raise SimulatorError("graph_task_group_end without graph_task_group_begin")
    tasks, _S.group = _S.group, None
    handle = _NPUTaskGroupHandle(next(_handle_ids))
    ordinal = _S.group_ordinals[handle._id] = len(_S.group_ordinals)
    for task in tasks:
        if task.sim:  # the op task an update replaces
            task.handle = ordinal
            break
    if not _S.prophecy_loaded:  # pass 2 of the adversarial schedule, if the environment asks
        _S.prophecy_loaded = True
        _S.prophecy = adversarial.Prophecy.from_env()
    _S.counters["group_handles"] += 1
    _HANDLES[handle._id] = (_S.capturing, tasks)
    if _S.capturing is not None:
        _S.capturing._groups[handle._id] = tasks
    return handle


def graph_task_update_begin(stream: Stream, handle: _NPUTaskGroupHandle) -> None:
    if _S.null_cost:  # before the lock: the benchmark's runtime calls cost nothing (``_locked``)
        _S.update_handle = handle
        return
    _update_begin(stream, handle)


@_locked
def _update_begin(stream: Stream, handle: _NPUTaskGroupHandle) -> None:
    if _S.update_handle is not None:
        raise SimulatorError("nested graph_task_update_begin")
    if _S.capturing is not None:
        raise SimulatorError("graph_task_update_begin during graph capture")
    if not isinstance(handle, _NPUTaskGroupHandle) or handle._id not in _HANDLES:
        raise SimulatorError(
            f"graph_task_update_begin with an unknown task group handle {handle!r}"
        )
    _S.update_handle = handle
    _S.update_done = False
    if _S.hb is not None and (hb := _hb()) is not None:
        hb.update_begin(stream, handle._id)


def graph_task_update_end(stream: Stream) -> None:
    if _S.null_cost:
        _S.update_handle = None
        _S.counters["updates"] += 1
        return
    _update_end(stream)


@_locked
def _update_end(stream: Stream) -> None:
    if _S.update_handle is None:
        raise SimulatorError("graph_task_update_end outside an update scope")
    handle = _S.update_handle
    done, _S.update_handle = _S.update_done, None
    if not done:
        raise SimulatorError("update scope closed without an op launch to update the task with")
    _S.counters["updates"] += 1
    values, _S.update_values = _S.update_values, None
    if values is not None and _S.prophecy is not None:
        held = _S.prophecy.check_update(_S.group_ordinals[handle._id], values)
        if held is not None:
            _S.prophecy.counts["prophecy_checked"] += 1
            _S.prophecy.counts["prophecy_broken"] += int(not held)
    if _S.hb is not None and (hb := _hb()) is not None:
        if values is not None and _S.recorder is not None:  # numbered as the detector's
            _S.recorder.update(_S.group_ordinals[handle._id], values)
        hb.update_end(_HANDLES.get(handle._id, (None,))[0])


def _apply_update(name: str, args: tuple, kwargs: dict) -> None:
    handle = _S.update_handle
    _, tasks = _HANDLES[handle._id]
    ops = [t for t in tasks if t.sim]
    if not ops:
        raise SimulatorError(f"task group {handle!r} holds no simulated op task to update")
    if _S.update_done:
        raise SimulatorError("a second op launch inside one update scope")
    task = ops[0]
    if task.name != name:
        raise SimulatorError(
            f"update-scope op mismatch: task group {handle!r} captured {task.name!r}, "
            f"the update launched {name!r}"
        )
    weak = lifetimes.weak_args(args, kwargs)
    if weak:
        _check_owners(name, weak, "is relaunched")
    task.args, task.kwargs = args, freeze_host_args(name, kwargs)
    task.weak = weak
    _S.update_done = True
    if _S.recorder is not None or _S.prophecy is not None:
        host = HOST_ARGS.get(name.removesuffix(".out"), ())
        _S.update_values = adversarial.host_values(task.args, task.kwargs, host)


# --------------------------------------------------------------------------------------------
# Simulated NPU ops

# Launch arguments that live on the host: the device task keeps the values they had at launch
# (capture or task update), so a later change to the Python list or CPU tensor is not seen until
# the next task update. This is why the stock update must relaunch with fresh lengths.
HOST_ARGS: dict[str, tuple[str, ...]] = {
    "npu_fused_infer_attention_score": ("actual_seq_lengths", "actual_seq_lengths_kv"),
    "npu_fused_infer_attention_score_v2": ("actual_seq_qlen", "actual_seq_kvlen"),
    "_npu_paged_attention": ("context_lens",),
}


# Launch arguments the registered schema types as ``Tensor`` (name, position) where a caller could
# pass a list: the dispatcher rejects that at the call, so every launch path checks them.
TENSOR_ARGS: dict[str, tuple[tuple[str, int], ...]] = {
    "_npu_paged_attention": (("context_lens", 7),),
}


def _check_tensor_args(name: str, spec: tuple[tuple[str, int], ...], args: tuple, kw: dict) -> None:
    for arg, position in spec:
        value = args[position] if len(args) > position else kw.get(arg)
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name}(): argument '{arg}' (position {position + 1}) must be Tensor, not "
                f"{type(value).__name__}"
            )


def freeze_host_args(name: str, kwargs: dict) -> dict:
    """Copy the host-side arguments of a launch of op ``name`` (``.out`` variants included)."""
    names = HOST_ARGS.get(name.removesuffix(".out"))
    if not names:
        return kwargs
    frozen = dict(kwargs)
    _S.executing += 1  # the copies are host work, not device tasks: keep them out of the graph
    try:
        _freeze(frozen, names)
    finally:
        _S.executing -= 1
    return frozen


def _freeze(frozen: dict, names: tuple[str, ...]) -> None:
    for arg in names:
        value = frozen.get(arg)
        if isinstance(value, torch.Tensor):
            frozen[arg] = value.clone()
        elif isinstance(value, (list, tuple)):
            frozen[arg] = list(value)


class SimOp:
    """A simulated NPU op: one task when captured, an arg update inside an update scope."""

    __slots__ = (
        "name",
        "fn",
        "out",
        "tensor_args",
        "rules",
        "_positional",
        "_params",
        "_defaults",
        "__wrapped__",
    )

    def __init__(self, name: str, fn: Callable[..., Any], out: SimOp | None = None) -> None:
        self.name = name
        self.fn = fn
        self.out = out
        self.tensor_args = TENSOR_ARGS.get(name, ())
        # what the real op refuses at launch (``op_rules``), checked where its body does not run:
        # a capture inside a task group, and a relaunch inside a task update
        self.rules: Callable[[dict[str, Any], bool], None] | None = inspect.getattr_static(
            fn,
            "launch_rules",
            None,  # static: a mock op answers every attribute
        )
        params = inspect.signature(fn).parameters.values() if self.rules is not None else ()
        self._positional = tuple(
            p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        self._params = frozenset(p.name for p in params)
        self._defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self.__wrapped__ = fn

    def _check_in_graph(self, args: tuple, kwargs: dict) -> None:
        """The op's launch rules over every parameter (bound by hand: ``Signature.bind`` costs
        ~10x more, and this runs at every relaunch)."""
        if len(args) > len(self._positional) or not self._params.issuperset(kwargs):
            raise TypeError(f"{self.name}(): arguments do not match its schema")
        arguments = dict(self._defaults)
        arguments.update(zip(self._positional, args, strict=False))  # fewer args: defaults
        arguments.update(kwargs)
        if len(arguments) != len(self._params):
            missing = sorted(self._params - arguments.keys())
            raise TypeError(f"{self.name}(): missing required arguments {missing}")
        self.rules(arguments, True)  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _S.null_cost:  # before the lock: the benchmark's runtime calls cost nothing
            if self.tensor_args:
                _check_tensor_args(self.name, self.tensor_args, args, kwargs)
            _S.counters["op_launches"] += 1
            return None if _S.update_handle is not None else kwargs.get("out")
        return self._call(*args, **kwargs)

    @_locked
    def _call(self, *args: Any, **kwargs: Any) -> Any:
        if self.tensor_args:
            _check_tensor_args(self.name, self.tensor_args, args, kwargs)
        s = _S
        if s.update_handle is not None:
            s.counters["op_launches"] += 1
            if s.null_cost:
                return None
            if self.rules is not None:
                self._check_in_graph(args, kwargs)
            _apply_update(self.name, args, kwargs)
            return None
        if s.null_cost:
            s.counters["op_launches"] += 1
            return kwargs.get("out")
        if s.executing:
            return self.fn(*args, **kwargs)
        if not torch.compiler.is_compiling():
            # Traced by dynamo (a model's torch_npu call inside vLLM's compiled forward), the
            # increment would become a side effect that the compiled code replays by rebuilding
            # the whole dict as it was at trace time, losing every count made since.
            s.counters["op_launches"] += 1
        if s.capturing is not None:
            if self.rules is not None and s.group is not None:
                self._check_in_graph(args, kwargs)
            task = _Task(self.name, self.fn, args, freeze_host_args(self.name, kwargs))
            task.sim = True
            s.capturing._record(task)
            s.executing += 1  # warm-up run; its inner aten ops are not recorded
            try:
                result = self.fn(*args, **kwargs)
            except Exception:
                # A capture executes nothing on the device: a launch into given outputs whose
                # captured arguments cannot run (PA captured at its maximum-workspace kv length,
                # beyond the block table) fails if it is ever replayed as captured, not here.
                if "out" not in kwargs:
                    raise
                s.counters["capture_warmups_skipped"] += 1
                return kwargs["out"]
            finally:
                s.executing -= 1
            if _fresh_output((args, kwargs), result):  # functional: replay writes its outputs
                task.outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            return result
        current = s.current_stream
        if current._queue:
            # Queued behind blocked work, as on the device: run now for the result's shapes
            # (stale values), re-run when the queue reaches it, writing into the same tensors.
            result = self.fn(*args, **kwargs)
            outputs = None
            if "out" not in kwargs:
                outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            current._launch(_Task(self.name, self.fn, args, kwargs, outputs))
            return result
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<sim op {self.name}>"


def make_op(name: str, fn: Callable[..., Any], out: SimOp | None = None) -> SimOp:
    """Wrap a reference op ``fn`` as a launchable simulated NPU op named ``name``."""
    return SimOp(name, fn, out)


_S = _State()
