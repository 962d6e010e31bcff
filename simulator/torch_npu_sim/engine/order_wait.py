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

from .caller_switch import CallerSwitch

ENV_VAR = "TORCH_NPU_SIM_TEST_NO_ORDER_WAIT"
#: The overlay's file and function that issue the wait.
ORDER_FILE = os.path.join("ascend_graph_patch", "aspects", "replay_order.py")
ORDER_FUNCTION = "_order_updates_after_compute"
COUNTER = "order_waits_skipped"

SWITCH = CallerSwitch(ENV_VAR, "wait_stream", ORDER_FUNCTION, ORDER_FILE, COUNTER)
requested = SWITCH.requested
#: Make the overlay's stream-order wait a no-op in this process when asked (idempotent).
install = SWITCH.install
#: Whether this process skips the overlay's stream-order wait.
active = SWITCH.active
#: Restore the runtime's ``Stream.wait_stream`` (tests).
uninstall = SWITCH.uninstall
