"""The adversarial schedule, executed by prophecy: a task run that some legal schedule lets a later
task update overtake reads that update's host values, and the program's outputs show it.

The simulator runs device work on the host in program order, and vLLM's eager work is plain CPU
torch, so it cannot hold the compute stream back while the update stream runs ahead. What the
adversarial policy (the update stream as early as allowed, the compute stream as late) changes
for a task-group run is which launch arguments it reads: those of the last update that may land
before it. The happens-before detector names, for every ``update`` race, the run it overtakes.
So the same deterministic program runs twice:

1. **record** (the detector on): each ``update`` race as (task group, index of the run it
   overtakes, index of the update), and each update's host values: the launch arguments a device
   task keeps as values (Python scalars and lists, and ``runtime.HOST_ARGS`` tensors such as PA's
   ``context_lens``), by task group and update index (:func:`Recorder.prophecy`). A task group is
   named by its ordinal since the runtime's reset (handle ids run on across resets; ordinals
   repeat in a program that repeats itself).
2. **replay** (``TORCH_NPU_SIM_PROPHECY`` names pass 1's prophecy): each of those runs executes
   with the host values of the update that overtakes it; every such update, when this pass
   reaches it, is compared with what pass 1 recorded. A program that did not repeat itself (other
   host values, or the update never came) makes the pass inconclusive: counted
   (``prophecy_broken`` / ``prophecy_unmet``), never silent.

What it leaves out, and which way that errs: device tensors an overtaking update passes are not
substituted (the run reads them as the compute stream left them, which is stream order, as on a
device); ``record`` races are counted by the detector, not executed (a lost event record hangs a
device); a run is overtaken by the next update of its task only. Each makes it show fewer wrong
outputs than a device could, never more.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

ENV_VAR = "TORCH_NPU_SIM_PROPHECY"
#: The counters this module adds to ``runtime.stats()`` in pass 2 (``prophecy_unmet`` too).
COUNTERS = (
    "prophecy_runs",  # runs executed with an overtaking update's host values
    "prophecy_runs_changed",  # ... whose values differed from the ones the run had
    "prophecy_checked",  # overtaking updates reached and compared with pass 1
    "prophecy_broken",  # ... whose host values differed from pass 1's
)

_SCALARS = (bool, int, float, str, type(None))


def _host_value(value: Any, host_tensor: bool) -> Any:
    """The JSON form of a value the device task keeps (``...`` when it is device memory)."""
    if isinstance(value, torch.Tensor):
        if not host_tensor:
            return ...
        return {"tensor": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, _SCALARS) for v in value):
        return list(value)
    return ...


def host_values(args: tuple, kwargs: dict, host_args: tuple[str, ...]) -> dict:
    """A launch's host values: ``{"args": {position: value}, "kwargs": {name: value}}``
    (``host_args``: the keyword tensors the task keeps as values, ``runtime.HOST_ARGS``)."""
    positional = {}
    for i, value in enumerate(args):
        if (v := _host_value(value, False)) is not ...:
            positional[str(i)] = v
    keywords = {}
    for key, value in kwargs.items():
        if (v := _host_value(value, key in host_args)) is not ...:
            keywords[key] = v
    return {"args": positional, "kwargs": keywords}


def _materialise(value: Any, like: Any) -> Any:
    if isinstance(value, dict) and "tensor" in value:
        dtype = getattr(torch, value["dtype"])
        device = like.device if isinstance(like, torch.Tensor) else None
        return torch.tensor(value["tensor"], dtype=dtype, device=device)
    if isinstance(like, tuple) and isinstance(value, list):
        return tuple(value)
    return value


def substitute(args: tuple, kwargs: dict, values: dict) -> tuple[tuple, dict, bool]:
    """``args`` / ``kwargs`` with ``values`` in place; True when any of them differs."""
    new_args = list(args)
    changed = False
    for position, value in values["args"].items():
        i = int(position)
        if i < len(new_args):
            old = _host_value(new_args[i], False)
            new_args[i] = _materialise(value, new_args[i])
            changed = changed or old != value
    new_kwargs = dict(kwargs)
    for key, value in values["kwargs"].items():
        old = _host_value(kwargs.get(key), True)
        new_kwargs[key] = _materialise(value, kwargs.get(key))
        changed = changed or old != value
    return tuple(new_args), new_kwargs, changed


def rank_key() -> str:
    """This process's key in a prophecy file: its torch.distributed rank (``"None"`` without)."""
    import torch.distributed as dist

    initialised = dist.is_available() and dist.is_initialized()
    return str(dist.get_rank() if initialised else None)


class Recorder:
    """Pass 1: every completed update's host values, by task group ordinal and update index."""

    def __init__(self) -> None:
        self.updates: dict[tuple[int, int], dict] = {}
        self.count: dict[int, int] = {}

    def update(self, handle: int, values: dict) -> int:
        index = self.count.get(handle, 0)
        self.count[handle] = index + 1
        self.updates[(handle, index)] = values
        return index

    def prophecy(self, overtaken: list[tuple[int, int, int]]) -> dict[str, Any]:
        """The prophecy pass 2 reads: the overtaken runs and their overtaking updates' values."""
        used = {(h, u) for h, _, u in overtaken if (h, u) in self.updates}
        return {
            "runs": [list(entry) for entry in overtaken],
            "updates": {f"{h}:{u}": self.updates[(h, u)] for h, u in used},
        }


class Prophecy:
    """Pass 2: which runs read which update's host values; checks the updates when they come."""

    def __init__(self, data: dict[str, Any]) -> None:
        updates = data.get("updates") or {}
        self.runs: dict[tuple[int, int], dict] = {}
        self.expected: dict[tuple[int, int], dict] = {}
        for handle, run, update in data.get("runs") or []:
            values = updates.get(f"{handle}:{update}")
            if values is not None:
                self.runs[(handle, run)] = values
                self.expected[(handle, update)] = values
        self.run_count: dict[int, int] = {}
        self.update_count: dict[int, int] = {}
        # pass 2's own counts (``runtime.stats()`` adds them): none exist in any other arm
        self.counts = dict.fromkeys(COUNTERS, 0)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Prophecy | None:
        """Pass 1's prophecy for this process (by :func:`rank_key`) named by the environment."""
        path = (os.environ if environ is None else environ).get(ENV_VAR)
        if not path:
            return None
        with open(path) as f:
            by_rank = json.load(f)
        data = by_rank.get(rank_key())
        return None if data is None else cls(data)

    def run_values(self, handle: int) -> dict | None:
        """The host values the next run of ``handle``'s task reads (None: its own)."""
        index = self.run_count.get(handle, 0)
        self.run_count[handle] = index + 1
        return self.runs.get((handle, index))

    def check_update(self, handle: int, values: dict) -> bool | None:
        """None when pass 1's prophecy names no run overtaken by this update; else whether the
        update's host values are the ones pass 1 recorded."""
        index = self.update_count.get(handle, 0)
        self.update_count[handle] = index + 1
        expected = self.expected.pop((handle, index), None)
        if expected is None:
            return None
        return json.loads(json.dumps(values)) == expected

    def unmet(self) -> int:
        """Overtaking updates pass 2 never reached (the program did not repeat itself)."""
        return len(self.expected)
