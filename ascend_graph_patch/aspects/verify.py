"""Shadow verification: run the stock update as a dry run and compare it with the overlay's.

In verify mode the runtime calls that the stock update makes (task update begin/end, the attention
op relaunches, ``ExternalEvent.record``) are intercepted while a dry run is active: recorded per
task handle, not executed. The overlay's resolved relaunches are then compared with them, task by
task, as a whole: the op (by name and by the function called), every argument stock passes,
positional ones named by the op's schema (``TaskLayout.positional``), and the event stock records
after the task's update. An argument the overlay passes and stock does not, or the reverse, is a
mismatch. Tensors compare by identity (stock passes the captured object, or the metadata's),
except the values stock computes per step (``TaskLayout.dynamic_args``: by value) and a scratch
workspace stock allocates per step (``TaskLayout.scratch``: by shape, dtype and device).
Outside a dry run the interceptors pass straight through.

The op interceptors sit on ``torch_npu`` attributes that torch_npu itself rebinds after start-up
(``_register_atb_extensions`` swaps the PA op and its workspace getter for ``torch.ops.atb``
ones), so every dry run first re-attaches any interceptor whose attribute changed; otherwise stock's
relaunches would run for real and verify would report every such task as not updated by stock.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ascend_graph_patch import state
from ascend_graph_patch.core.graph import ResolvedTask
from ascend_graph_patch.lines.base import Interceptor, TaskLayout


@dataclass(eq=False, slots=True)
class Relaunch:
    """One op call stock made inside a task's update scope."""

    op: str  # the layouts' name for it (its ``torch_npu`` path)
    function: Any  # what was called (beneath the interceptor)
    args: tuple
    kwargs: dict[str, Any]


@dataclass(eq=False, slots=True)
class Launch:
    """What stock did to one task handle in a dry run."""

    handle: Any
    opened: int = 0  # update scopes opened on it
    calls: list[Relaunch] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)  # recorded after its update scope closed


@dataclass
class DryRun:
    launches: dict[int, Launch] = field(default_factory=dict)
    current: Launch | None = None  # the task whose update scope is open
    last: Launch | None = None  # the task whose update scope closed last (its event follows)
    records: int = 0
    stray_events: list[Any] = field(default_factory=list)  # recorded after no task's update
    stray_calls: list[str] = field(default_factory=list)  # relaunches outside any update scope


DRY_RUN: contextvars.ContextVar[DryRun | None] = contextvars.ContextVar(
    "ascend_graph_patch_dry_run", default=None
)


class VerifyMismatch(AssertionError):
    """Raised in strict verify mode, after the stock update ran (so nothing is left waiting)."""


def update_begin(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    dry = DRY_RUN.get()
    if dry is None:
        return wrapped(*args, **kwargs)
    handle = args[1] if len(args) > 1 else kwargs.get("handle")
    launch = dry.launches.get(id(handle))
    if launch is None:
        launch = dry.launches[id(handle)] = Launch(handle)
    launch.opened += 1
    dry.current, dry.last = launch, None
    return None


def update_end(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    dry = DRY_RUN.get()
    if dry is None:
        return wrapped(*args, **kwargs)
    dry.current, dry.last = None, dry.current
    return None


def event_record(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    dry = DRY_RUN.get()
    if dry is None:
        return wrapped(*args, **kwargs)
    dry.records += 1
    if dry.last is not None:
        dry.last.events.append(instance)
    else:
        dry.stray_events.append(instance)
    return None


def _op_interceptor(op: str) -> Any:
    """Records each relaunch of ``op`` (its ``torch_npu`` path, as layouts name their op), whole,
    under the task handle being updated: tasks of several kinds may relaunch one op (FIA v2,
    MLA)."""

    def interceptor(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        dry = DRY_RUN.get()
        if dry is None:
            return wrapped(*args, **kwargs)
        if dry.current is not None:
            dry.current.calls.append(Relaunch(op, wrapped, args, dict(kwargs)))
        else:
            dry.stray_calls.append(op)
        return None

    interceptor.__name__ = f"intercept_{op.replace('.', '_')}"
    return interceptor


fia_out = _op_interceptor("npu_fused_infer_attention_score.out")
fia_v2_out = _op_interceptor("npu_fused_infer_attention_score_v2.out")
paged_attention = _op_interceptor("_npu_paged_attention")


def dry_run(
    stock: Any, args: tuple, kwargs: dict, interceptors: tuple[Interceptor, ...] = ()
) -> tuple[DryRun, BaseException | None]:
    """Run ``stock`` with its runtime calls intercepted (re-attached first where rebound)."""
    if interceptors:
        from ascend_graph_patch import installer

        again = installer.reattach(interceptors)
        if again:
            state.count("verify.reattached", again)
    dry = DryRun()
    token = DRY_RUN.set(dry)
    try:
        stock(*args, **kwargs)
        error = None
    except Exception as exc:  # stock itself is broken for this graph (evidence, not our fault)
        error = exc
    finally:
        DRY_RUN.reset(token)
    return dry, error


def _is_tensor(kind: type) -> bool:
    return torch.Tensor in kind.__mro__  # (``isinstance`` on torch.Tensor is slow: its metaclass)


def _same(a: Any, b: Any) -> bool:
    """Equal values: tensors by shape, dtype and contents; sequences element by element."""
    if a is b:
        return True
    kind, other = type(a), type(b)
    if (kind is list or kind is tuple) and (other is list or other is tuple):
        if len(a) != len(b):
            return False
        if kind is other and not any(_is_tensor(type(x)) for x in a[:1]):
            try:  # host lengths: one C comparison
                if a == b:
                    return True
            except Exception:  # a tensor further in: element by element below
                pass
        return all(map(_same, a, b))
    if _is_tensor(kind) or _is_tensor(other):
        if not (_is_tensor(kind) and _is_tensor(other)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def _identical(a: Any, b: Any) -> bool:
    """The same objects: tensors by identity, sequences element by element, other values equal
    and of one type (``1`` is not ``1.0``, ``True`` is not ``1``)."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is list or kind is tuple:  # the outputs: a fresh list of the captured tensors
        return len(a) == len(b) and all(map(_identical, a, b))
    if _is_tensor(kind):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


def _alike(a: Any, b: Any) -> bool:
    """Scratch memory: tensors of one shape, dtype and device (their contents are not data)."""
    if a is b:
        return True
    if not (_is_tensor(type(a)) and _is_tensor(type(b))):
        return False
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        flat = value.flatten().tolist()
        head = flat[:8]
        more = "..." if len(flat) > 8 else ""
        return f"tensor{tuple(value.shape)}@{id(value):x}{head}{more}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        inner = ", ".join(_short(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _named(layout: TaskLayout, call: Relaunch) -> tuple[dict[str, Any], str | None]:
    """Stock's arguments by name: positional ones named by the op's schema."""
    if len(call.args) > len(layout.positional):
        return {}, (
            f"stock passed {len(call.args)} positional argument(s); the line names "
            f"{len(layout.positional)} ({', '.join(layout.positional) or 'none'})"
        )
    named = dict(zip(layout.positional, call.args))  # noqa: B905 - fewer args than names
    twice = sorted(named.keys() & call.kwargs.keys())
    if twice:
        return {}, f"stock passed {', '.join(twice)} both by position and by name"
    named.update(call.kwargs)
    return named, None


_MISSING = object()


class _Label:
    """A task's name in a mismatch, formatted only when one is reported."""

    __slots__ = ("task",)

    def __init__(self, task: Any) -> None:
        self.task = task

    def __format__(self, spec: str) -> str:
        task = self.task
        return f"{task.kind} {task.layer_name or task.metadata_key} step {task.step}"


def _same_argument(layout: TaskLayout, name: str, ours: Any, theirs: Any) -> bool:
    if name in layout.scratch:
        return _alike(ours, theirs)
    if name in layout.dynamic_args:
        return _same(ours, theirs)
    return _identical(ours, theirs)


def _compare_task(
    task: Any, kwargs: dict[str, Any], launch: Launch, layout: TaskLayout
) -> list[str]:
    problems: list[str] = []
    label = _Label(task)
    if launch.opened != 1:
        problems.append(f"{label}: stock opened {launch.opened} update scope(s) on it")
    if len(launch.calls) != 1:
        ops = ", ".join(c.op for c in launch.calls) or "nothing"
        problems.append(f"{label}: stock relaunched {ops} in its update, not one {layout.op}")
        if not launch.calls:
            return problems
    call = launch.calls[0]
    if call.op != layout.op:
        problems.append(f"{label}: stock relaunched it with {call.op}, not {layout.op}")
        return problems
    op = task.op
    if (
        op is not call.function
        and getattr(op, "__wrapped__", None) is not call.function  # ours beneath verify's layer
        and inspect.unwrap(op) is not inspect.unwrap(call.function)
    ):
        problems.append(
            f"{label}: op: overlay calls {task.op!r} != stock {call.function!r} ({call.op})"
        )
    theirs, why = _named(layout, call)
    if why is not None:
        problems.append(f"{label}: {why}")
        return problems
    for name, ours in kwargs.items():
        stocks = theirs.get(name, _MISSING)
        if stocks is ours:  # the common case: the very object (a captured tensor, a constant)
            continue
        if stocks is _MISSING:
            problems.append(f"{label}: {name}: overlay passes {_short(ours)}, stock does not")
        elif not _same_argument(layout, name, ours, stocks):
            problems.append(
                f"{label}: {name}: overlay {_short(ours)} != stock {_short(theirs[name])}"
            )
    if len(theirs) != len(kwargs) or problems:
        for name in theirs.keys() - kwargs.keys():
            problems.append(
                f"{label}: {name}: stock passes {_short(theirs[name])}, overlay does not"
            )
    if len(launch.events) != 1 or launch.events[0] is not task.event:
        recorded = ", ".join(f"{type(e).__name__}@{id(e):x}" for e in launch.events) or "none"
        problems.append(
            f"{label}: event: stock recorded {recorded} after its update, overlay records "
            f"{type(task.event).__name__}@{id(task.event):x}"
        )
    return problems


def compare(
    resolved: Sequence[ResolvedTask], dry: DryRun, layouts: Mapping[str, TaskLayout]
) -> list[str]:
    """Readable differences between the overlay's and stock's relaunches, one line each."""
    problems: list[str] = []
    seen: set[int] = set()
    for task, kwargs in resolved:
        launch = dry.launches.get(id(task.handle))
        if launch is None:
            label = f"{task.kind} {task.layer_name or task.metadata_key} step {task.step}"
            problems.append(f"{label}: stock did not update this task")
            continue
        seen.add(id(task.handle))
        problems.extend(_compare_task(task, kwargs, launch, layouts[task.kind]))
    for handle_id, launch in dry.launches.items():
        if handle_id not in seen:
            ops = ", ".join(c.op for c in launch.calls) or "nothing"
            problems.append(f"stock updated a task ({ops}) this graph does not own")
    if dry.stray_calls:
        problems.append(f"stock relaunched {', '.join(dry.stray_calls)} outside any task update")
    if dry.stray_events:
        problems.append(f"stock recorded {len(dry.stray_events)} event(s) after no task update")
    return problems
