"""The negative control of stream-ordered replay on the real engine: its wait removed.

With ``ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream`` the overlay replaces stock's barrier before a
FULL replay by ``update_stream.wait_stream(compute_stream)`` (``aspects/replay_order.py``). With
``TORCH_NPU_SIM_TEST_NO_ORDER_WAIT=1`` in a process's environment, that wait is a no-op: a
``Stream.wait_stream`` called directly from the overlay's ``_order_updates_after_compute`` (its
code object, in ``ascend_graph_patch/aspects/replay_order.py``) returns at once, counted, as if
the line were gone; every other wait stays. Then nothing orders an update after the previous
replay, and the race detector (``TORCH_NPU_SIM_RACE_DETECTOR``) must count it: the check that
stream order is clean could not pass without the wait. A switch of the simulator for tests only,
like ``barrier``; the overlay is not wrapped (its caller is recognised by its frame).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import runtime

ENV_VAR = "TORCH_NPU_SIM_TEST_NO_ORDER_WAIT"
#: The overlay's file and function that issue the wait.
ORDER_FILE = os.path.join("ascend_graph_patch", "aspects", "replay_order.py")
ORDER_FUNCTION = "_order_updates_after_compute"
COUNTER = "order_waits_skipped"


def requested(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_VAR, "").strip().lower() in ("1", "on", "true")


def _is_order_wait(code: Any) -> bool:
    return code.co_name == ORDER_FUNCTION and code.co_filename.endswith(ORDER_FILE)


def install(environ: dict[str, str] | None = None) -> bool:
    """Make the overlay's stream-order wait a no-op in this process when asked (idempotent)."""
    if not requested(environ):
        return False
    if active():
        return True
    original = runtime.Stream.wait_stream

    def wait_stream(self: runtime.Stream, stream: runtime.Stream) -> None:
        if _is_order_wait(sys._getframe(1).f_code):
            counters = runtime._S.counters
            counters[COUNTER] = counters.get(COUNTER, 0) + 1
            return None
        return original(self, stream)

    wait_stream._no_order_wait = True  # type: ignore[attr-defined]
    wait_stream.__wrapped__ = original  # type: ignore[attr-defined]
    runtime.Stream.wait_stream = wait_stream  # type: ignore[method-assign]
    return True


def active() -> bool:
    """Whether this process skips the overlay's stream-order wait."""
    return bool(getattr(runtime.Stream.wait_stream, "_no_order_wait", False))


def uninstall() -> None:
    """Restore the runtime's ``Stream.wait_stream`` (tests)."""
    if active():
        runtime.Stream.wait_stream = runtime.Stream.wait_stream.__wrapped__  # type: ignore[attr-defined, method-assign]
