"""Root conftest: environment for the CPU test stack, then the simulator as ``torch_npu``.

Runs before any test module imports vLLM: ``vllm.config`` (through vLLM's platform plugin
discovery) imports vllm_ascend and with it ``torch_npu``, which must already be the simulator.
Harness fixtures live in ``tests/``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TORCH_NPU_SIM", "1")  # subprocesses get the simulator too
# The platform plugin only. Not a workaround any more: the simulator stands in for what
# vllm-ascend's general plugins need, and tests/test_sim_torch_additions.py and tests/test_serve.py
# load them all (as `vllm serve` does for a user). It keeps their imports (~2 s per vLLM process)
# out of the suite's many engines, and their service-profiling plugin from writing to ~/.config.
os.environ.setdefault("VLLM_PLUGINS", "ascend")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
if not os.environ.get("VLLM_CACHE_ROOT"):
    # A fresh cache makes vLLM's model-inspection subprocess run cold (research item 7).
    _cache = tempfile.mkdtemp(prefix="agp-vllm-cache-")
    os.environ["VLLM_CACHE_ROOT"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import torch  # noqa: E402

import torch_npu_sim  # noqa: E402

# The simulated kernels are many tiny CPU ops: intra-op thread hand-off costs more than it saves,
# and one thread keeps every run's float results identical.
torch.set_num_threads(1)
torch_npu_sim.install()
