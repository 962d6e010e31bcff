"""The workload protocol: one shape for every engine the simulator drives, and one arm runner.

Every engine (the target, draft and v2 harnesses over the real vllm-ascend graph code, and the real
vLLM engine) is used the same way: build it, capture its graphs, draw batches, run each batch
through the graph or eagerly, close it. An *arm* is one such life with one setting of the overlay
(stock, on, observe, verify), which is whatever is installed in the process when the arm runs:
this module never touches the overlay. Tests, the A/B worker, the soak and the benchmark all run
arms through :func:`run_arm`, so they cannot drift apart in how a step is taken or judged.

The contract an engine keeps:

- ``run(batch, graph=False)`` and ``run(batch, graph=True)`` of one batch see the same inputs and
  the same state (KV cache included): the two runs are comparable, whichever comes first;
- ``run`` raises what the engine raises (a stock update that crashes is an arm's *result*, not a
  harness error); :func:`run_arm` records it and stops the arm;
- ``close`` releases every graph and every process-global the engine set, so the next engine in
  the process starts clean, even after an error.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class StepOutput:
    """What one run of a batch produced: comparable values and the greedy tokens they give."""

    #: Hidden states or logits, one row per real request (None where only tokens exist, as with
    #: the real vLLM engine).
    values: torch.Tensor | None
    #: Greedy tokens, one list per real request.
    tokens: list[list[int]]


@runtime_checkable
class Workload(Protocol):
    """An engine under test. Build it with its factory; then capture, run batches, close."""

    #: The workload's name (a scenario or model name).
    name: str
    #: How the stock update is known to behave on it: ``"ok"``, ``"crash: <Type>: <message>"`` or
    #: ``"wrong: <why>"``; a crash of that type in a stock arm is then expected, not a failure.
    stock: str

    def capture(self) -> None:
        """Capture every graph the engine will replay (idempotent)."""

    def next_batch(self, rng: random.Random) -> Any:
        """The next batch, drawn from ``rng`` (same seed, same batches, in every arm)."""

    def run(self, batch: Any, *, graph: bool = True) -> StepOutput:
        """Run ``batch`` through the captured graph (replay + update) or eagerly."""

    def close(self) -> None:
        """Release graphs and process-globals (idempotent)."""


@dataclass
class ArmResult:
    """One arm's record: outputs per step, the eager comparison, and how the arm ended."""

    name: str
    steps: int = 0
    outputs: list[StepOutput] = field(default_factory=list)
    #: Per step, max |graph - eager| over the values (when compared against eager).
    eager_max_abs: list[float] = field(default_factory=list)
    #: Per step, rows whose greedy token differs from eager's.
    eager_token_mismatches: list[int] = field(default_factory=list)
    #: ``"<Type>: <message>"`` of the exception that stopped the arm, or None.
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None

    @property
    def max_eager_error(self) -> float:
        return max(self.eager_max_abs, default=0.0)

    @property
    def ok(self) -> bool:
        return self.error is None


StepHook = Callable[[Workload, int, Any, StepOutput], None]


def run_arm(
    build: Callable[[], Workload],
    steps: int,
    seed: int = 0,
    *,
    eager: bool = True,
    before_steps: Callable[[Workload], None] | None = None,
    on_step: StepHook | None = None,
    graph: bool = True,
) -> ArmResult:
    """Build a workload, capture, then run ``steps`` batches; close it whatever happens.

    ``eager``: also run each batch eagerly (first) and compare. ``before_steps``: called after
    capture (tests tamper with owned graphs there). ``on_step``: called after each step with the
    workload, the step index, the batch and the graph output. ``graph=False`` runs the arm eagerly
    only (an eager reference arm). An exception from the engine ends the arm and is recorded;
    build failures propagate (there is no arm to record then).
    """
    workload = build()
    result = ArmResult(name=workload.name)
    rng = random.Random(seed)
    try:
        if graph:
            workload.capture()
        if before_steps is not None:
            before_steps(workload)
        for step in range(steps):
            batch = workload.next_batch(rng)
            reference = workload.run(batch, graph=False) if eager or not graph else None
            out = workload.run(batch, graph=True) if graph else reference
            assert out is not None
            result.outputs.append(out)
            if eager and graph and reference is not None:
                compare(out, reference, result)
            result.steps = step + 1
            if on_step is not None:
                on_step(workload, step, batch, out)
    except Exception as exc:
        result.error_type = type(exc).__name__
        result.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        result.traceback = traceback.format_exc()
    finally:
        workload.close()
    return result


def compare(out: StepOutput, reference: StepOutput, result: ArmResult) -> None:
    """Record one step's distance from the eager reference into ``result``."""
    if out.values is not None and reference.values is not None:
        diff = (out.values.float() - reference.values.float()).abs()
        result.eager_max_abs.append(float(diff.max()) if diff.numel() else 0.0)
    mismatches = sum(a != b for a, b in zip(out.tokens, reference.tokens, strict=True))
    result.eager_token_mismatches.append(mismatches)


def bitwise_equal(a: ArmResult, b: ArmResult) -> tuple[bool, str]:
    """Whether two arms produced identical outputs at every step, and the first difference."""
    if a.steps != b.steps:
        return False, f"{a.steps} steps vs {b.steps}"
    for step, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=True)):
        if x.tokens != y.tokens:
            return False, f"step {step}: tokens {x.tokens} vs {y.tokens}"
        if (x.values is None) != (y.values is None):
            return False, f"step {step}: values present in one arm only"
        if x.values is not None and not torch.equal(x.values, y.values):
            diff = float((x.values - y.values).abs().max())
            return False, f"step {step}: values differ by {diff:.3g}"
    return True, ""
