"""Stock's decode step on the simulated runtime, as a hand-built program: a graph captured with
an ``ExternalEvent`` gate before its attention task group, replayed on the compute stream, its task
updated on an update stream and the event recorded there (the race detector's tests and the
stream-order tests drive it with one wait or another before each replay)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_npu_sim import runtime

npu = runtime


def scale_out(a: torch.Tensor, *, scale: float, out: torch.Tensor) -> torch.Tensor:
    out.copy_(a * scale)
    return out


class Step:
    """Stock's decode step: a captured graph (gate, reset, task group), an update stream."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.op = rt.make_op("toy_scale", scale_out)
        self.a, self.out = torch.ones(2), torch.zeros(2)
        self.graph = npu.NPUGraph()
        self.capture()
        self.update_stream = npu.Stream()

    def capture(self) -> None:
        """Capture the step's graph (again, after ``graph.reset()``): a new event gating a new
        task group."""
        self.event = npu.ExternalEvent()
        with npu.graph(self.graph):
            s = npu.current_stream()
            self.event.wait(s)
            self.event.reset(s)
            npu.graph_task_group_begin(s)
            self.op(self.a, scale=1.0, out=self.out)
            self.handle = npu.graph_task_group_end(s)

    def update(self, scale: float) -> None:
        upd = self.update_stream
        with npu.stream(upd):
            npu.graph_task_update_begin(upd, self.handle)
            self.op(self.a, scale=scale, out=self.out)
            npu.graph_task_update_end(upd)
            self.event.record(upd)

    def run(self, steps: int, before_replay: Callable[[Step], None]) -> list[float]:
        """``steps`` decode steps: ``before_replay``, replay, update; each step's output as the
        simulator computed it (in program order)."""
        seen = []
        for i in range(steps):
            before_replay(self)
            self.graph.replay()
            self.update(float(i + 2))
            seen.append(float(self.out[0]))
        npu.synchronize()
        return seen
