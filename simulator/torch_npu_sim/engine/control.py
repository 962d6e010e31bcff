"""The negative control of the engine tests: every event recorded, every relaunch skipped.

With ``TORCH_NPU_SIM_TEST_SKIP_RELAUNCH=1`` in a process's environment, an op launched inside a
task-update scope closes the scope as done but leaves the captured task's arguments as they were:
the updater (stock or the overlay) still records every event, yet every replay runs with the
arguments of the capture. Tokens must then differ from eager's, which proves that the engine tests'
comparison can fail. It is a switch of the simulator for tests only (the environment reaches the
engine-core process), never an overlay feature.
"""

from __future__ import annotations

import os
from typing import Any

from .. import runtime

ENV_VAR = "TORCH_NPU_SIM_TEST_SKIP_RELAUNCH"


def requested(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_VAR, "").strip().lower() in ("1", "on", "true")


def _skip_relaunch(name: str, args: tuple, kwargs: dict) -> None:
    if runtime._S.update_done:
        raise runtime.SimulatorError("a second op launch inside one update scope")
    runtime._S.update_done = True
    runtime._S.counters["relaunches_skipped"] = runtime._S.counters.get("relaunches_skipped", 0) + 1


def install(environ: dict[str, str] | None = None) -> bool:
    """Skip every relaunch in this process when the environment asks for it (idempotent)."""
    if not requested(environ):
        return False
    runtime._apply_update = _skip_relaunch
    return True


def active() -> bool:
    """Whether this process skips relaunches."""
    current: Any = runtime._apply_update
    return current is _skip_relaunch
