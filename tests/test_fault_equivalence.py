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

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from ascend_graph_patch import activation
from ascend_graph_patch.core.providers import GraphWorkspaceProvider
from torch_npu_sim.faults import (
    FAULTS,
    Fault,
    StepResult,
    as_stock,
    nth_call_raises,
    take_step,
)

STEPS = 5
FAULT_STEP = 3  # steps 0-2 warm every cache (stock's key buffer included), step 4 is recovery
TOL = 1e-5

#: Bugs of ours: stock has no provider and is not affected.
FAULTS_OVERLAY_ONLY = {
    "provider raises": lambda: nth_call_raises(GraphWorkspaceProvider, "values", 1, RuntimeError),
}


@dataclass
class ArmRun:
    faulty: StepResult
    after: StepResult
    eager: torch.Tensor


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
                faulty = take_step(engine, batch, fault)
            elif step > FAULT_STEP:
                after = take_step(engine, batch)
            else:
                assert take_step(engine, batch).error is None
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


def _as_the_table_says(fault: Fault, stock: ArmRun, ours: ArmRun) -> bool:
    """The overlay's behaviour is the one the soak expects (``Fault.overlay_step / _next``)."""
    step = ours.faulty
    if fault.overlay_step == "stock":
        if not as_stock(step, stock.faulty):
            return False
    elif step.error != fault.overlay_step:
        return False
    after = ours.after
    if fault.overlay_next == "ok":
        return after.error is None
    if fault.overlay_next == "blocked":
        return after.blocked
    return after.error == fault.overlay_next


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
    stock = run(build, scenario, "off", FAULTS[fault].arm)
    ours = run(build, scenario, "on", FAULTS[fault].arm)
    label, why = verdict(stock, ours)
    ROWS.append(
        f"{fault} | {scenario} | {_describe(stock.faulty, stock.eager)}; next step "
        f"{_describe(stock.after, stock.after.output)} | {_describe(ours.faulty, ours.eager)}; "
        f"next step {_describe(ours.after, ours.after.output)} | {label}: {why}"
    )
    assert label != "WORSE", f"{fault} on {scenario}: {why}"
    if scenario != "dense_enpu":  # the soak's table is the default (replay-first) order's
        assert _as_the_table_says(FAULTS[fault], stock, ours), (fault, ours.faulty, ours.after)


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


def test_as_stock_can_fail() -> None:
    """Negative control of the "stock" expectation: an error where stock gives an output, an
    output where stock raises, another error, another output are not stock's step."""
    out = torch.ones(2, 4)
    refused = StepResult(error="OpRefused")
    assert as_stock(StepResult(output=out.clone()), StepResult(output=out.clone()))
    assert as_stock(refused, StepResult(error="OpRefused"))
    assert not as_stock(refused, StepResult(output=out))
    assert not as_stock(StepResult(output=out), refused)
    assert not as_stock(StepResult(error="KeyError"), refused)
    assert not as_stock(StepResult(output=out + 1), StepResult(output=out))
