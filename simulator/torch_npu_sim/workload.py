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
  harness error); :func:`run_arm` records it and stops the arm (an error in the caller's own
  hooks is the caller's: it propagates);
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
    #: What the tokens are the argmax of: (requests, tokens per request, vocab), where the engine
    #: has it (near ties between graph and eager are judged on it; the A/B worker saves it).
    logits: torch.Tensor | None = None


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
    #: Per step, requests whose greedy tokens differ from eager's (near ties excepted).
    eager_token_mismatches: list[int] = field(default_factory=list)
    #: Per step, requests whose tokens differ only where eager's top two logits are within
    #: ``tie_atol`` (a flip rounding alone can cause).
    eager_near_ties: list[int] = field(default_factory=list)
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
    after_steps: Callable[[Workload], None] | None = None,
    graph: bool = True,
    tie_atol: float = 0.0,
) -> ArmResult:
    """Build a workload, capture, then run ``steps`` batches; close it whatever happens.

    ``eager``: also run each batch eagerly (first) and compare. ``before_steps``: called after
    capture (tests tamper with owned graphs there). ``on_step``: called after each step with the
    workload, the step index, the batch and the graph output. ``after_steps``: called before
    close, also after an error (read what dies with the engine: owned graphs, counters).
    ``graph=False`` runs the arm eagerly only (an eager reference arm). ``tie_atol``: see
    ``ArmResult.eager_near_ties``. An exception from the engine ends the arm and is recorded;
    build failures and exceptions from the hooks propagate (they are not the arm's result).
    """
    workload = build()
    result = ArmResult(name=workload.name)
    rng = random.Random(seed)
    try:
        ready = _attempt(result, workload.capture) is not _FAILED if graph else True
        if ready and before_steps is not None:
            before_steps(workload)
        for step in range(steps if ready else 0):
            taken = _attempt(result, _take_step, workload, rng, eager, graph, tie_atol, result)
            if taken is _FAILED:
                break
            result.steps = step + 1
            if on_step is not None:
                on_step(workload, step, *taken)
        if after_steps is not None:
            after_steps(workload)
    finally:
        workload.close()
    return result


_FAILED = object()


def _attempt(result: ArmResult, fn: Callable[..., Any], *args: Any) -> Any:
    """Call into the engine: what it returns, or ``_FAILED`` with the exception recorded."""
    try:
        return fn(*args)
    except Exception as exc:
        result.error_type = type(exc).__name__
        result.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        result.traceback = traceback.format_exc()
        return _FAILED


def _take_step(
    workload: Workload,
    rng: random.Random,
    eager: bool,
    graph: bool,
    tie_atol: float,
    result: ArmResult,
) -> tuple[Any, StepOutput]:
    """Draw a batch, run it (eagerly first, when compared), record the graph output."""
    batch = workload.next_batch(rng)
    reference = workload.run(batch, graph=False) if eager or not graph else None
    out = workload.run(batch, graph=True) if graph else reference
    assert out is not None
    result.outputs.append(out)
    if eager and graph and reference is not None:
        compare(out, reference, result, tie_atol)
    return batch, out


def compare(out: StepOutput, reference: StepOutput, result: ArmResult, tie_atol: float) -> None:
    """Record one step's distance from the eager reference into ``result``."""
    if out.values is not None and reference.values is not None:
        if out.values.shape != reference.values.shape:  # never compared by broadcasting
            result.eager_max_abs.append(float("inf"))
        else:
            diff = (out.values.float() - reference.values.float()).abs()
            result.eager_max_abs.append(float(diff.max()) if diff.numel() else 0.0)
    mismatches = ties = 0
    for row, (a, b) in enumerate(zip(out.tokens, reference.tokens, strict=True)):
        if a == b:
            continue
        if _near_tie(reference.logits, row, a, b, tie_atol):
            ties += 1
        else:
            mismatches += 1
    result.eager_token_mismatches.append(mismatches)
    result.eager_near_ties.append(ties)


def _near_tie(
    logits: torch.Tensor | None, row: int, a: list[int], b: list[int], atol: float
) -> bool:
    """Whether every position where ``a`` and ``b`` differ is a near tie of ``logits[row]``."""
    if logits is None or atol <= 0 or len(a) != len(b):
        return False
    for pos, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            top2 = torch.topk(logits[row, pos].float(), 2).values
            if float(top2[0] - top2[1]) > atol:
                return False
    return True


def bitwise_equal(a: ArmResult, b: ArmResult) -> tuple[bool, str]:
    """Whether two arms produced identical outputs at every step, and the first difference."""
    if a.steps != b.steps:
        return False, f"{a.steps} steps vs {b.steps}"
    for step, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=True)):
        if x.tokens != y.tokens:
            return False, f"step {step}: tokens {x.tokens} vs {y.tokens}"
        if (x.values is None) != (y.values is None):
            return False, f"step {step}: values present in one arm only"
        if x.values is not None and x.values.shape != y.values.shape:
            return False, f"step {step}: values of shape {x.values.shape} vs {y.values.shape}"
        if x.values is not None and not torch.equal(x.values, y.values):
            diff = float((x.values - y.values).abs().max())
            return False, f"step {step}: values differ by {diff:.3g}"
    return True, ""
