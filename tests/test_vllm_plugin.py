"""The second way in: vLLM's own general-plugin loader calls our bootstrap.

It matters where `.pth` files are not processed (a package dir on PYTHONPATH, `python -S`, some
embedded interpreters): here the toggle is set only after start-up, so the `.pth` did nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json, os
# The toggle is set only now, after start-up: the .pth saw it off and did nothing.
from ascend_graph_patch import loader_state
before = loader_state.MODE
os.environ["ASCEND_GRAPH_PATCH"] = "observe"
os.environ["TORCH_NPU_SIM"] = "1"
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # vLLM may call it again in the same process
import vllm_ascend.ops  # noqa: F401  (the seams load: the overlay installs itself)
import vllm_ascend.attention.attention_v1  # noqa: F401
import vllm_ascend.compilation.acl_graph  # noqa: F401
from ascend_graph_patch import activation, state
print(json.dumps({"before": before, "after": loader_state.MODE, "state_mode": state.STATE.mode,
                  "installed": "replay.update" in activation.installed()}))
"""


def test_vllm_general_plugin_loader_enables_the_overlay() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_GRAPH_PATCH")}
    env.update(VLLM_PLUGINS="ascend_graph_patch")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"before": None, "after": "observe", "state_mode": "observe", "installed": True}
