"""Fault equivalence: under every fault met at replay, the overlay is never worse than stock.

Each row injects one fault into one step of a run, the same way in a stock arm and in an overlay
arm, and compares that step (and the next one) with the eager run of the same batch and with
stock under the same fault. The overlay's step must be one of:

- ``equal``: stock's output, bitwise, or the same kind of error stock raises;
- ``better``: eager's output where stock's is not, or a recovered next step where stock's graph
  is left waiting (on hardware, a hang).

Never ``WORSE``: a silently wrong output, an error where stock is right, or a graph left waiting
where stock's is not. The table printed by ``-s`` is the matrix the README quotes.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from ascend_graph_patch import activation
from ascend_graph_patch.core.providers import GraphWorkspaceProvider

STEPS = 5
FAULT_STEP = 3  # steps 0-2 warm every cache (stock's key buffer included), step 4 is recovery
TOL = 1e-5
LAYER = "model.layers.1.self_attn.attn"


@dataclass
class StepResult:
    output: torch.Tensor | None = None
    error: str | None = None  # exception type name
    blocked: bool = False  # the simulator found a replay left waiting (a hang on hardware)


@dataclass
class ArmRun:
    faulty: StepResult
    after: StepResult
    eager: torch.Tensor


# --- faults: each arms one injection for the duration of one graph step -------------------------


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
    del metadata[LAYER]


def _none(metadata: dict) -> None:
    metadata[LAYER] = None


def _wrong_type(metadata: dict) -> None:
    from torch_npu_sim.harness.stack import LinearAttnMetadata

    metadata[LAYER] = LinearAttnMetadata(0, 4, 4, torch.zeros(4, dtype=torch.int32))


def _lengths(delta: int) -> Callable[[dict], None]:
    def change(metadata: dict) -> None:
        entry = copy.copy(metadata[LAYER])
        for name in ("seq_lens_list", "actual_seq_lengths_q"):
            values = list(getattr(entry, name))
            setattr(entry, name, values[:-1] if delta < 0 else values + values[-1:])
        if entry.seq_lens is not None:
            entry.seq_lens = (
                entry.seq_lens[:-1]
                if delta < 0
                else torch.cat([entry.seq_lens, entry.seq_lens[-1:]])
            )
        metadata[LAYER] = entry

    return change


def _runtime() -> Any:
    from torch_npu_sim import runtime

    return runtime


def _npu() -> Any:
    return torch.npu


FAULTS: dict[str, Callable[[], Any]] = {
    "relaunch raises at task 2 of n": lambda: nth_call_raises(
        _runtime(), "_apply_update", 2, RuntimeError
    ),
    "update_begin raises at task 2": lambda: nth_call_raises(
        _npu(), "graph_task_update_begin", 2, RuntimeError
    ),
    "update_end raises at task 1": lambda: nth_call_raises(
        _npu(), "graph_task_update_end", 1, RuntimeError
    ),
    "event record raises at task 2": lambda: nth_call_raises(
        _runtime().ExternalEvent, "record", 2, OSError
    ),
    "metadata: key missing": lambda: metadata_changed(_drop),
    "metadata: entry None": lambda: metadata_changed(_none),
    "metadata: entry of another type": lambda: metadata_changed(_wrong_type),
    "metadata: lists one short": lambda: metadata_changed(_lengths(-1)),
    "metadata: lists one long": lambda: metadata_changed(_lengths(+1)),
}
FAULTS_OVERLAY_ONLY = {
    # bugs of ours: stock has no provider and no registration step, and is not affected
    "provider raises": lambda: nth_call_raises(GraphWorkspaceProvider, "values", 1, RuntimeError),
}


# --- one arm ------------------------------------------------------------------------------------


def _step(engine: Any, batch: Any, armed: Callable[[], Any] | None) -> StepResult:
    from torch_npu_sim.runtime import SimulatorError

    try:
        if armed is None:
            return StepResult(output=engine.run(batch).values)
        with armed():
            return StepResult(output=engine.run(batch).values)
    except SimulatorError as exc:
        return StepResult(error=type(exc).__name__, blocked="blocked" in str(exc))
    except Exception as exc:
        return StepResult(error=type(exc).__name__)


def run(build: Any, scenario: str, mode: str, fault: Callable[[], Any] | None) -> ArmRun:
    """One arm, step by step: the fault armed for one graph step only."""
    if mode != "off":
        activation.enable(mode)
    try:
        engine = build(scenario)
        engine.capture()
        rng = random.Random(7)
        faulty = after = None
        eager = None
        for step in range(STEPS):
            batch = engine.next_batch(rng)
            if step == FAULT_STEP:
                eager = engine.run(batch, graph=False).values
                faulty = _step(engine, batch, fault)
            elif step > FAULT_STEP:
                after = _step(engine, batch, None)
            else:
                assert _step(engine, batch, None).error is None
        engine.close()
    finally:
        activation.disable()
    assert faulty is not None and after is not None and eager is not None
    return ArmRun(faulty=faulty, after=after, eager=eager)


def _close(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and float((a - b).abs().max()) <= TOL


def verdict(stock: ArmRun, ours: ArmRun) -> tuple[str, str]:
    """(equal | better | WORSE, why) for the faulty step and the recovery step."""
    s, o = stock.faulty, ours.faulty
    if o.output is not None:
        if _close(o.output, ours.eager):
            step = (
                ("equal", "eager's output, as stock")
                if _close(s.output, stock.eager)
                else ("better", "eager's output where stock's is not")
            )
        elif s.output is not None and torch.equal(o.output, s.output):
            step = ("equal", "stock's output, bitwise")
        else:
            return "WORSE", "a silently wrong output"
    elif o.blocked and not s.blocked:
        return "WORSE", "a graph left waiting where stock's is not"
    elif s.blocked and not o.blocked:
        step = ("better", f"raises {o.error} where stock leaves its graph waiting (a hang)")
    elif s.error == o.error:
        step = ("equal", f"the same error ({o.error})")
    else:
        return "WORSE", f"{o.error} where stock gave {s.error or 'an output'}"
    if ours.after.error is not None and stock.after.error is None:
        return "WORSE", f"the next step fails ({ours.after.error}) where stock's does not"
    if ours.after.error is None and stock.after.blocked:
        return "better", step[1] + "; the next step runs where stock's graph is left waiting"
    return step


def _describe(result: StepResult, eager: torch.Tensor) -> str:
    if result.output is not None:
        return "eager's output" if _close(result.output, eager) else "output != eager"
    return f"raises {result.error}" + (" (blocked)" if result.blocked else "")


ROWS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def print_matrix() -> Iterator[None]:
    yield
    if ROWS:
        print("\n\nfault | kind | stock | overlay | verdict\n--- | --- | --- | --- | ---")
        print("\n".join(ROWS))


CASES = [(f, s) for f in FAULTS for s in ("dense_gqa", "paged_attention")] + [
    (f, "dense_enpu")
    for f in ("relaunch raises at task 2 of n", "metadata: key missing", "metadata: entry None")
]


@pytest.mark.parametrize(("fault", "scenario"), CASES)
def test_the_overlay_is_never_worse_than_stock_under_a_fault(
    build: Any, fault: str, scenario: str
) -> None:
    stock = run(build, scenario, "off", FAULTS[fault])
    ours = run(build, scenario, "on", FAULTS[fault])
    label, why = verdict(stock, ours)
    ROWS.append(
        f"{fault} | {scenario} | {_describe(stock.faulty, stock.eager)}; next step "
        f"{_describe(stock.after, stock.after.output)} | {_describe(ours.faulty, ours.eager)}; "
        f"next step {_describe(ours.after, ours.after.output)} | {label}: {why}"
    )
    assert label != "WORSE", f"{fault} on {scenario}: {why}"


@pytest.mark.parametrize("fault", list(FAULTS_OVERLAY_ONLY))
def test_a_bug_of_ours_gives_stock_s_output(build: Any, fault: str) -> None:
    stock = run(build, "dense_gqa", "off", None)
    ours = run(build, "dense_gqa", "on", FAULTS_OVERLAY_ONLY[fault])
    assert ours.faulty.output is not None and torch.equal(ours.faulty.output, stock.faulty.output)
    ROWS.append(f"{fault} | dense_gqa | (not affected) | stock's output | equal")


def test_the_verdict_can_fail() -> None:
    """Negative control: a wrong output, or a hang where stock raises, is WORSE."""
    eager = torch.ones(2, 4)
    right = ArmRun(StepResult(output=eager.clone()), StepResult(output=eager.clone()), eager)
    wrong = ArmRun(StepResult(output=eager + 1), StepResult(output=eager.clone()), eager)
    raised = ArmRun(
        StepResult(error="KeyError"), StepResult(error="SimulatorError", blocked=True), eager
    )
    hung = ArmRun(StepResult(error="SimulatorError", blocked=True), StepResult(), eager)
    assert verdict(right, wrong)[0] == "WORSE"
    assert verdict(raised, hung)[0] == "WORSE"
    assert verdict(right, raised)[0] == "WORSE"  # an error where stock is right
    assert verdict(raised, right)[0] == "better"
    loud = ArmRun(StepResult(error="KeyError"), StepResult(output=eager.clone()), eager)
    assert verdict(hung, loud)[0] == "better"  # loud where stock hangs
