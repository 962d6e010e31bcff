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

from .caller_switch import CallerSwitch

ENV_VAR = "TORCH_NPU_SIM_TEST_NO_REPLAY_BARRIER"
#: The file whose ``ACLGraphWrapper.__call__`` holds the barrier.
BARRIER_FILE = os.path.join("vllm_ascend", "compilation", "acl_graph.py")
COUNTER = "replay_barriers_skipped"

SWITCH = CallerSwitch(ENV_VAR, "synchronize", "__call__", BARRIER_FILE, COUNTER)
requested = SWITCH.requested
#: Make the replay barrier a no-op in this process when asked (idempotent).
install = SWITCH.install
#: Whether this process skips the replay barrier.
active = SWITCH.active
#: Restore the runtime's ``Stream.synchronize`` (tests).
uninstall = SWITCH.uninstall
