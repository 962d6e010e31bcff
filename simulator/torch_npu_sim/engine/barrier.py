"""The race detector's negative control on the real engine: stock's replay barrier removed.

vllm-ascend 0.23.0.post1 synchronises the current stream before every FULL replay
(``ACLGraphWrapper.__call__``, ``torch.npu.current_stream().synchronize()``), so that the host's
task update of step i cannot reach a task the replay of step i-1 has not run yet. With
``TORCH_NPU_SIM_TEST_NO_REPLAY_BARRIER=1`` in a process's environment, that one call is a no-op:
a ``Stream.synchronize`` called directly from ``ACLGraphWrapper.__call__`` (its code object, in
``vllm_ascend/compilation/acl_graph.py``) returns at once, uncounted by the race detector, as if
the line were gone; every other synchronisation stays. The simulator still runs everything in
program order, so tokens cannot show the hazard; the race detector
(``TORCH_NPU_SIM_RACE_DETECTOR``) must. A switch of the simulator for tests only, like
``control``; vllm-ascend's code is not wrapped (the caller is recognised by its frame).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import runtime

ENV_VAR = "TORCH_NPU_SIM_TEST_NO_REPLAY_BARRIER"
#: The file whose ``ACLGraphWrapper.__call__`` holds the barrier.
BARRIER_FILE = os.path.join("vllm_ascend", "compilation", "acl_graph.py")
COUNTER = "replay_barriers_skipped"


def requested(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_VAR, "").strip().lower() in ("1", "on", "true")


def _is_barrier(code: Any) -> bool:
    return code.co_name == "__call__" and code.co_filename.endswith(BARRIER_FILE)


def install(environ: dict[str, str] | None = None) -> bool:
    """Make the replay barrier a no-op in this process when asked (idempotent)."""
    if not requested(environ):
        return False
    if active():
        return True
    original = runtime.Stream.synchronize

    def synchronize(self: runtime.Stream) -> None:
        if _is_barrier(sys._getframe(1).f_code):
            counters = runtime._S.counters
            counters[COUNTER] = counters.get(COUNTER, 0) + 1
            return None
        return original(self)

    synchronize._no_replay_barrier = True  # type: ignore[attr-defined]
    synchronize.__wrapped__ = original  # type: ignore[attr-defined]
    runtime.Stream.synchronize = synchronize  # type: ignore[method-assign]
    return True


def active() -> bool:
    """Whether this process skips the replay barrier."""
    return bool(getattr(runtime.Stream.synchronize, "_no_replay_barrier", False))


def uninstall() -> None:
    """Restore the runtime's ``Stream.synchronize`` (tests)."""
    if active():
        runtime.Stream.synchronize = runtime.Stream.synchronize.__wrapped__  # type: ignore[attr-defined, method-assign]
