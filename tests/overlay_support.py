"""Helpers for the overlay tests: run one arm (stock / on / observe / verify) of a scenario.

An arm builds a fresh engine with the overlay in the given mode, runs `steps` decode steps from a
fixed seed (so every arm sees the same batches and KV lengths), and returns the outputs, the eager
outputs of the same real code (when asked), the overlay's counters, and the stock error if the
stock update crashed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ascend_graph_patch import activation, state, status

STEPS = 200
EAGER_TOL = 1e-5


@dataclass
class Arm:
    mode: str
    outputs: list[torch.Tensor] = field(default_factory=list)
    eager: list[torch.Tensor] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    snapshot: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None

    def max_eager_error(self) -> float:
        return max(
            (float((o - e).abs().max()) for o, e in zip(self.outputs, self.eager, strict=True)),
            default=0.0,
        )


def run_arm(
    engine_factory: Callable[..., Any],
    scenario: Any,
    mode: str,
    steps: int = STEPS,
    *,
    seed: int = 1234,
    eager: bool = False,
    before_steps: Callable[[Any], None] | None = None,
    **overrides: Any,
) -> Arm:
    arm = Arm(mode)
    if mode != "off":
        activation.enable(mode)
    try:
        engine = engine_factory(scenario, **overrides)
        if before_steps is not None:
            before_steps(engine)
        rng = random.Random(seed)
        for _ in range(steps):
            batch = engine.random_batch(rng)
            try:
                arm.outputs.append(engine.run_graph(batch))
            except Exception as exc:  # the stock update of a broken scenario
                arm.error = exc
                break
            if eager:
                arm.eager.append(engine.run_eager(batch))
        arm.snapshot = status.snapshot()
        arm.counters = dict(state.STATE.counters)
        engine.close()
    finally:
        activation.disable()
    return arm


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
