"""Shadow verification: run the stock update as a dry run and compare it with the overlay's.

In verify mode the runtime calls that the stock update makes (task update begin/end, the attention
op relaunches, `ExternalEvent.record`) are intercepted while a dry run is active: recorded per task
handle, not executed. The overlay's resolved arguments are then compared with them, task by task,
on the arguments that change per step. Outside a dry run the interceptors pass straight through.

The op interceptors sit on ``torch_npu`` attributes that torch_npu itself rebinds after start-up
(``_register_atb_extensions`` swaps the PA op and its workspace getter for ``torch.ops.atb``
ones), so every dry run first re-attaches any interceptor whose attribute changed; otherwise stock's
relaunches would run for real and verify would report every such task as not updated by stock.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ascend_graph_patch import state
from ascend_graph_patch.core.graph import ResolvedTask
from ascend_graph_patch.lines.base import Interceptor, TaskLayout


@dataclass
class DryRun:
    launches: dict[int, tuple[Any, str, dict[str, Any]]] = field(default_factory=dict)
    current: Any = None
    records: int = 0


DRY_RUN: contextvars.ContextVar[DryRun | None] = contextvars.ContextVar(
    "ascend_graph_patch_dry_run", default=None
)


class VerifyMismatch(AssertionError):
    """Raised in strict verify mode, after the stock update ran (so nothing is left waiting)."""


def update_begin(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    dry = DRY_RUN.get()
    if dry is None:
        return wrapped(*args, **kwargs)
    dry.current = args[1] if len(args) > 1 else kwargs.get("handle")
    return None


def update_end(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    dry = DRY_RUN.get()
    if dry is None:
        return wrapped(*args, **kwargs)
    dry.current = None
    return None


def event_record(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    dry = DRY_RUN.get()
    if dry is None:
        return wrapped(*args, **kwargs)
    dry.records += 1
    return None


def _op_interceptor(op: str) -> Any:
    """Records each relaunch of ``op`` (its ``torch_npu`` path, as layouts name their op) under
    the task handle being updated: tasks of several kinds may relaunch one op (FIA v2, MLA)."""

    def interceptor(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        dry = DRY_RUN.get()
        if dry is None:
            return wrapped(*args, **kwargs)
        if dry.current is not None:
            dry.launches[id(dry.current)] = (dry.current, op, dict(kwargs))
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


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:
        return False


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        flat = value.flatten().tolist()
        head = flat[:8]
        more = "..." if len(flat) > 8 else ""
        return f"tensor{tuple(value.shape)}{head}{more}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def compare(
    resolved: Sequence[ResolvedTask], dry: DryRun, layouts: Mapping[str, TaskLayout]
) -> list[str]:
    """Readable differences between the overlay's and stock's launches, one line each."""
    problems: list[str] = []
    seen: set[int] = set()
    for task, kwargs in resolved:
        launch = dry.launches.get(id(task.handle))
        label = f"{task.kind} {task.layer_name or task.metadata_key} step {task.step}"
        if launch is None:
            problems.append(f"{label}: stock did not update this task")
            continue
        seen.add(id(task.handle))
        _, stock_op, stock_kwargs = launch
        layout = layouts[task.kind]
        if stock_op != layout.op:
            problems.append(f"{label}: stock relaunched it with {stock_op}, not {layout.op}")
            continue
        for name in layout.dynamic_args:
            ours, theirs = kwargs.get(name), stock_kwargs.get(name)
            if not _same(ours, theirs):
                problems.append(
                    f"{label}: {name}: overlay {_short(ours)} != stock {_short(theirs)}"
                )
    for handle_id, (_, stock_op, _) in dry.launches.items():
        if handle_id not in seen:
            problems.append(f"stock updated a task ({stock_op}) this graph does not own")
    return problems
