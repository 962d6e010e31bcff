"""Helpers for the overlay tests: one arm (stock / on / observe / verify) of a catalogue workload.

An arm is ``torch_npu_sim.workload.run_arm`` (fresh engine, fixed seed: every arm sees the same
batches, weights and KV history) with the overlay in the given mode, plus what the overlay recorded
in it, read before the engine closes: counters, status snapshot, owned and refused graphs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ascend_graph_patch import activation, state, status
from torch_npu_sim.harness import scenarios
from torch_npu_sim.workload import ArmResult, StepHook, Workload, bitwise_equal, run_arm

#: Replay steps per arm: 150 in the suite; ``scripts/mutate.py`` sets fewer (``AGP_TEST_STEPS``)
#: to bound a mutation run's time.
STEPS = int(os.environ.get("AGP_TEST_STEPS", "150"))
EAGER_TOL = 1e-5


@dataclass
class OverlayArm:
    """One arm's run and the overlay's record of it."""

    run: ArmResult
    counters: dict[str, int] = field(default_factory=dict)
    snapshot: dict[str, Any] = field(default_factory=dict)
    #: (role, descriptor) -> task identities (``UpdateTask.key``) of each owned graph
    keys: dict[tuple[str, Any], list[tuple]] = field(default_factory=dict)
    #: (role, descriptor) -> (kind, layer name, metadata key, step) per task, in capture order
    tasks: dict[tuple[str, Any], list[tuple]] = field(default_factory=dict)
    #: (role, descriptor) -> why the overlay left the graph to stock
    refused: dict[tuple[str, Any], str] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        return self.run.error

    @property
    def outputs(self) -> list[Any]:
        return self.run.outputs

    @property
    def max_eager_error(self) -> float:
        assert self.run.ok, f"the arm failed: {self.run.error}"
        assert self.run.eager_max_abs, "the arm ran no eager comparison"
        return self.run.max_eager_error

    def owned(self, role: str) -> dict[Any, list[tuple]]:
        """descriptor -> tasks of the graphs of ``role`` the overlay owned."""
        return {desc: tasks for (r, desc), tasks in self.tasks.items() if r == role}


def overlay_arm(
    workload: str | Any,
    mode: str | None,
    steps: int = STEPS,
    *,
    seed: int = 1234,
    eager: bool = False,
    before_steps: Callable[[Workload], None] | None = None,
    on_step: StepHook | None = None,
    after_steps: Callable[[Workload], None] | None = None,
    build: Callable[[], Workload] | None = None,
    **overrides: Any,
) -> OverlayArm:
    """Run one arm of ``workload`` (catalogue name or scenario, with field ``overrides``).

    ``mode``: the overlay is enabled in it for the arm and disabled after ("off": stock); None
    leaves the activation as the caller set it. ``build``: a custom engine factory instead.
    """
    from ascend_graph_patch.core.registry import REGISTRY

    record: dict[str, Any] = {}

    def read_overlay(w: Workload) -> None:
        record["counters"] = dict(state.STATE.counters)
        record["snapshot"] = status.snapshot()
        graphs = REGISTRY.graphs()
        record["keys"] = {(g.role, g.descriptor): [t.key for t in g.tasks] for g in graphs}
        record["tasks"] = {
            (g.role, g.descriptor): [
                (t.kind, t.layer_name, t.metadata_key, t.step) for t in g.tasks
            ]
            for g in graphs
        }
        record["refused"] = dict(REGISTRY.refused)
        if after_steps is not None:
            after_steps(w)

    if mode not in (None, "off"):
        activation.enable(mode)
    try:
        run = run_arm(
            build or (lambda: scenarios.build(workload, **overrides)),
            steps,
            seed,
            eager=eager,
            before_steps=before_steps,
            on_step=on_step,
            after_steps=read_overlay,
        )
    finally:
        if mode is not None:
            activation.disable()
    return OverlayArm(run, **record)


def assert_bitwise(a: OverlayArm | ArmResult, b: OverlayArm | ArmResult) -> None:
    """Both arms produced identical values and tokens at every step."""
    ra = a.run if isinstance(a, OverlayArm) else a
    rb = b.run if isinstance(b, OverlayArm) else b
    equal, why = bitwise_equal(ra, rb)
    assert equal, why
