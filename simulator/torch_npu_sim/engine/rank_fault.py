"""A fault on one rank of a tensor-parallel job: one relaunch raises on that rank only.

With ``TORCH_NPU_SIM_TEST_RELAUNCH_RAISES=RANK:N`` in the environment, the process whose
``torch.distributed`` rank is ``RANK`` raises ``RuntimeError`` at its ``N``-th relaunch (an op
launched inside a task-update scope, whichever updater launched it: stock or the overlay), the way
a failing task update of the device's runtime would. Its peer ranks run on and reach the next
collective, which the failed rank never joins: the job must end with the error, never leave a rank
waiting forever. A switch of the simulator for tests only (the environment reaches every worker),
never an overlay feature; the same idea as ``faults.nth_call_raises``, aimed at one rank.

A peer left in a collective waits for gloo's timeout (30 min by default; on hardware, HCCL's). With
the fault armed, every gloo group the process creates gets ``TORCH_NPU_SIM_TEST_COLLECTIVE_TIMEOUT``
seconds (default 60): the waiting rank then fails with gloo's timeout error, the job ends. When the
fault fires, one line on stderr (:data:`FIRED`) gives the rank, its pid, its parent's (the engine
core's) and the wall time, so a test can tell how long the job took to end after it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

from .. import runtime

ENV_VAR = "TORCH_NPU_SIM_TEST_RELAUNCH_RAISES"
TIMEOUT_VAR = "TORCH_NPU_SIM_TEST_COLLECTIVE_TIMEOUT"
MESSAGE = "sim fault: relaunch {n} raised on rank {rank}"
FIRED = "torch-npu-sim: test fault fired on rank {rank}, pid {pid}, parent {parent}, at {at:.3f}"
FIRED_PATTERN = re.compile(
    r"torch-npu-sim: test fault fired on rank (\d+), pid (\d+), parent (\d+), at ([\d.]+)"
)


def requested(environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """``(rank, n)`` when the environment asks for the fault, else None."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR, "").strip()
    if not value:
        return None
    rank, _, n = value.partition(":")
    return int(rank), int(n or 1)


def _rank() -> int | None:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


_at_fork = False


def install(environ: dict[str, str] | None = None) -> bool:
    """Arm the fault in this process when the environment asks for it (idempotent), and again in
    every child forked later: a case sets the variable after the simulator was installed, and
    vLLM forks its workers from that process."""
    global _at_fork
    if not _at_fork and environ is None:
        _at_fork = True
        os.register_at_fork(after_in_child=install)
    target = requested(environ)
    current: Any = runtime._apply_update
    if target is None or getattr(current, "_rank_fault", False):
        return False
    rank, n = target
    _bound_collectives(float((os.environ if environ is None else environ).get(TIMEOUT_VAR, 60)))
    calls = {"n": 0}

    def relaunch_or_raise(name: str, args: tuple, kwargs: dict) -> None:
        if _rank() == rank:
            calls["n"] += 1
            if calls["n"] == n:
                pid, parent, at = os.getpid(), os.getppid(), time.time()
                fired = FIRED.format(rank=rank, pid=pid, parent=parent, at=at)
                print(fired, file=sys.stderr, flush=True)
                raise RuntimeError(MESSAGE.format(n=n, rank=rank))
        return current(name, args, kwargs)

    relaunch_or_raise._rank_fault = True  # type: ignore[attr-defined]
    runtime._apply_update = relaunch_or_raise
    return True


def _bound_collectives(seconds: float) -> None:
    """Give the gloo groups created from now on a timeout of ``seconds`` (torch's default)."""
    import datetime

    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = datetime.timedelta(seconds=seconds)
