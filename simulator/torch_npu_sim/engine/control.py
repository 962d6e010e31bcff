"""The negative control of the engine tests: every event recorded, every relaunch skipped.

With ``TORCH_NPU_SIM_TEST_SKIP_RELAUNCH=1`` in a process's environment, an op launched inside a
task-update scope closes the scope as done but leaves the captured task's arguments as they were:
the updater (stock or the overlay) still records every event, yet every replay runs with the
arguments of the capture. Tokens must then differ from eager's, which proves that the engine tests'
comparison can fail. It is a switch of the simulator for tests only (the environment reaches the
engine-core process), never an overlay feature.

``TORCH_NPU_SIM_TEST_SKIP_RELAUNCH=while:PATH`` skips relaunches only while the file ``PATH``
exists (looked up at each relaunch): one server then gives the run's outputs and, once the test
creates the file, the control's, without starting a second one.
"""

from __future__ import annotations

import os
from typing import Any

from .. import runtime

ENV_VAR = "TORCH_NPU_SIM_TEST_SKIP_RELAUNCH"


WHILE = "while:"


def requested(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR, "").strip()
    return value.lower() in ("1", "on", "true") or _switch(value) is not None


def _switch(value: str) -> str | None:
    """The file of ``while:PATH``, or None."""
    path = value[len(WHILE) :] if value.startswith(WHILE) else ""
    return path or None


def _skip_relaunch(name: str, args: tuple, kwargs: dict) -> None:
    if runtime._S.update_done:
        raise runtime.SimulatorError("a second op launch inside one update scope")
    runtime._S.update_done = True
    runtime._S.counters["relaunches_skipped"] = runtime._S.counters.get("relaunches_skipped", 0) + 1


class _SkipWhile:
    """Skip a relaunch while ``path`` exists, else apply it as the runtime does."""

    def __init__(self, path: str, apply: Any) -> None:
        self.path, self.apply = path, apply

    def __call__(self, name: str, args: tuple, kwargs: dict) -> None:
        if os.path.exists(self.path):
            return _skip_relaunch(name, args, kwargs)
        return self.apply(name, args, kwargs)


def install(environ: dict[str, str] | None = None) -> bool:
    """Skip every relaunch in this process when the environment asks for it (idempotent), or
    every relaunch while the switch file exists (``while:PATH``)."""
    if not requested(environ) or active():
        return requested(environ)
    env = os.environ if environ is None else environ
    path = _switch(env.get(ENV_VAR, "").strip())
    runtime._apply_update = (
        _skip_relaunch if path is None else _SkipWhile(path, runtime._apply_update)
    )
    return True


def active() -> bool:
    """Whether this process skips relaunches."""
    current: Any = runtime._apply_update
    return current is _skip_relaunch or isinstance(current, _SkipWhile)
