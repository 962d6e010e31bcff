"""Faults a graph update can meet, injected into one step of a harness workload.

Each fault arms one injection (a runtime call that raises, or metadata the update reads broken)
for the duration of one graph step, the same way whatever update path runs (stock or an
overlay), so a stock run and a patched run can be compared under the same fault
(``tests/test_fault_equivalence.py``) and a long run can meet faults at random (the soak).

:func:`take_step` runs one graph step and says what came of it (an output, or the type of the
error raised, and whether the simulator found a replay left waiting: a hang on hardware). A run
that must go on after a failed step cannot use ``workload.run_arm``, which ends an arm at its
first error by contract; :func:`take_step` is the one step of such runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class StepResult:
    output: torch.Tensor | None = None
    error: str | None = None  # the exception's type name
    message: str = ""
    blocked: bool = False  # the simulator found a replay left waiting (a hang on hardware)


def take_step(workload: Any, batch: Any, fault: Callable[[], Any] | None = None) -> StepResult:
    """One graph step of ``workload`` with ``fault`` armed for it (None: a clean step)."""
    from torch_npu_sim.runtime import SimulatorError

    try:
        if fault is None:
            return StepResult(output=workload.run(batch).values)
        with fault():
            return StepResult(output=workload.run(batch).values)
    except SimulatorError as exc:
        text = str(exc)
        return StepResult(error=type(exc).__name__, message=text, blocked="blocked" in text)
    except Exception as exc:
        return StepResult(error=type(exc).__name__, message=str(exc))


def take_step_eager(workload: Any, batch: Any) -> StepResult:
    """The eager run of ``batch`` (the reference), what came of it."""
    from torch_npu_sim.runtime import SimulatorError

    try:
        return StepResult(output=workload.run(batch, graph=False).values)
    except SimulatorError as exc:
        return StepResult(error=type(exc).__name__, message=str(exc), blocked="blocked" in str(exc))


def sync_point() -> StepResult:
    """A device-wide synchronisation: where a replay left waiting shows (a hang on hardware)."""
    from torch_npu_sim.runtime import SimulatorError

    try:
        torch.npu.synchronize()
    except SimulatorError as exc:
        return StepResult(error=type(exc).__name__, message=str(exc), blocked="blocked" in str(exc))
    return StepResult()


@contextmanager
def nth_call_raises(target: Any, name: str, n: int, error: type[Exception]) -> Iterator[None]:
    """``target.name`` raises ``error`` on its n-th call (1-based) while armed."""
    original = getattr(target, name)
    calls = {"n": 0}

    def faulty(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise error(f"injected fault in {name}")
        return original(*args, **kwargs)

    setattr(target, name, faulty)
    try:
        yield
    finally:
        setattr(target, name, original)


def attention_key(metadata: dict) -> str:
    """The metadata key of the second attention layer (the first if there is one only)."""
    keys = [k for k in metadata if k.endswith("self_attn.attn")]
    return keys[1] if len(keys) > 1 else keys[0]


@contextmanager
def metadata_changed(change: Callable[[dict], None]) -> Iterator[None]:
    """The update call of the step sees ``change``d metadata (the model's forward does not)."""
    import vllm_ascend.compilation.acl_graph as acl_graph

    original = acl_graph.update_full_graph_params

    def corrupted(backend: Any, stream: Any, forward_context: Any, *args: Any) -> Any:
        metadata = dict(forward_context.attn_metadata)
        change(metadata)
        forward_context.attn_metadata = metadata
        return original(backend, stream, forward_context, *args)

    acl_graph.update_full_graph_params = corrupted
    try:
        yield
    finally:
        acl_graph.update_full_graph_params = original


def _drop(metadata: dict) -> None:
    del metadata[attention_key(metadata)]


def _none(metadata: dict) -> None:
    metadata[attention_key(metadata)] = None


def _wrong_type(metadata: dict) -> None:
    from torch_npu_sim.harness.stack import LinearAttnMetadata

    metadata[attention_key(metadata)] = LinearAttnMetadata(
        0, 4, 4, torch.zeros(4, dtype=torch.int32)
    )


def _lengths(delta: int) -> Callable[[dict], None]:
    def change(metadata: dict) -> None:
        key = attention_key(metadata)
        entry = copy.copy(metadata[key])
        for name in ("seq_lens_list", "actual_seq_lengths_q"):
            values = list(getattr(entry, name))
            setattr(entry, name, values[:-1] if delta < 0 else values + values[-1:])
        if entry.seq_lens is not None:
            lens = entry.seq_lens
            entry.seq_lens = lens[:-1] if delta < 0 else torch.cat([lens, lens[-1:]])
        metadata[key] = entry

    return change


def _runtime() -> Any:
    from torch_npu_sim import runtime

    return runtime


@dataclass(frozen=True)
class Fault:
    """One injection, and what a patched run must show under it (``tests`` check both arms)."""

    name: str
    arm: Callable[[], Any]
    #: the overlay's faulty step: "stock" (what stock's step gives under the same fault, since
    #: the kernel gets the same broken arguments: its output bitwise, or the error it raises,
    #: as when the op refuses the lists, see :func:`as_stock`) or the error type it raises,
    #: stock's
    overlay_step: str
    #: the overlay's next step: "ok", or "blocked" (where stock's is too)
    overlay_next: str = "ok"


def as_stock(ours: StepResult, stock: StepResult) -> bool:
    """The overlay's step is stock's under the same fault: the same output bitwise, or the same
    error type (the one-short / one-long lists are refused by FIA's documented block-table rule
    on the FIA path, stock's relaunch and the overlay's alike; the PA path runs them)."""
    if ours.output is not None or stock.output is not None:
        return (
            ours.output is not None
            and stock.output is not None
            and torch.equal(ours.output, stock.output)
        )
    return ours.error is not None and ours.error == stock.error


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "relaunch raises at task 2 of n",
            lambda: nth_call_raises(_runtime(), "_apply_update", 2, RuntimeError),
            "RuntimeError",
        ),
        Fault(
            "update_begin raises at task 2",
            lambda: nth_call_raises(torch.npu, "graph_task_update_begin", 2, RuntimeError),
            "RuntimeError",
        ),
        Fault(
            "update_end raises at task 1",
            lambda: nth_call_raises(torch.npu, "graph_task_update_end", 1, RuntimeError),
            "RuntimeError",
            # the simulator's update scope stays open: every later update is refused, as stock's
            "SimulatorError",
        ),
        Fault(
            "event record raises at task 2",
            lambda: nth_call_raises(_runtime().ExternalEvent, "record", 2, OSError),
            "OSError",
            "blocked",
        ),
        Fault("metadata: key missing", lambda: metadata_changed(_drop), "KeyError"),
        Fault("metadata: entry None", lambda: metadata_changed(_none), "AttributeError"),
        Fault(
            "metadata: entry of another type",
            lambda: metadata_changed(_wrong_type),
            "AttributeError",
        ),
        Fault("metadata: lists one short", lambda: metadata_changed(_lengths(-1)), "stock"),
        Fault("metadata: lists one long", lambda: metadata_changed(_lengths(+1)), "stock"),
    )
}
