"""Process-wide set-up of the harness engines, and the one live engine a process may hold.

Done once per interpreter: the simulator is installed as ``torch_npu``, vllm-ascend is imported
and the (gloo, world size 1) distributed groups are initialised. Reset at every engine build and
close: the vllm-ascend module globals a graph run fills (GraphParams, key buffers, lru caches,
ascend config, graph pool) and the simulator runtime, so engines of different scenarios can
follow each other in one process. Those globals are module-level, hence one engine at a time.
"""

from __future__ import annotations

import importlib
import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import torch

#: Scratch directory of this process (the toy models' config.json files).
_tmp: tempfile.TemporaryDirectory | None = None


def ensure() -> None:
    """Install the simulator and import vllm-ascend's graph modules (once per process)."""
    global _tmp
    if _tmp is not None:
        return
    # The platform plugin only: vllm-ascend's general plugins (which load fine on the simulator)
    # cost ~2 s of imports per process and touch nothing the harness drives.
    os.environ.setdefault("VLLM_PLUGINS", "ascend")
    os.environ.setdefault("TORCH_NPU_SIM", "1")
    from torch_npu_sim.install import install

    install()  # before anything imports vllm.config (torch_npu must be the simulator)
    # vllm_ascend.ops first: importing attention_v1 first hits a circular import.
    for module in (
        "vllm_ascend.ops",
        "vllm_ascend.attention.attention_v1",
        "vllm_ascend.compilation.acl_graph",
    ):
        importlib.import_module(module)
    _tmp = tempfile.TemporaryDirectory(prefix="agp-harness-")


def scratch_dir() -> str:
    ensure()
    assert _tmp is not None
    return _tmp.name


def ensure_distributed(vllm_config: Any) -> None:
    """World size 1 over gloo, as a single-card vLLM worker runs (once per process)."""
    import torch.distributed as dist
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    with set_current_vllm_config(vllm_config):
        if not dist.is_initialized():
            ps.init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                local_rank=0,
                backend="gloo",
            )
        if not ps.model_parallel_is_initialized():
            ps.ensure_model_parallel_initialized(1, 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reset_process_state() -> None:
    """Reset the vllm-ascend globals one graph workload fills (real_code_on_cpu.md item 11)."""
    import vllm_ascend.ascend_config as ascend_config
    import vllm_ascend.attention.attention_v1 as attention_v1
    import vllm_ascend.attention.utils as attn_utils
    import vllm_ascend.compilation.acl_graph as acl_graph
    import vllm_ascend.utils as va_utils
    from vllm.platforms import current_platform

    acl_graph._graph_params = None
    acl_graph._draft_graph_params = None
    acl_graph._draft_graph_prefill_params = None
    attention_v1._ATTN_KEYS_BUFFER = None
    attn_utils.needs_layer_aware_fia_graph_replay.cache_clear()
    attn_utils.enable_cp.cache_clear()
    for name in (
        "_IS_MOE_MODEL",
        "_IS_DRAFTER_MOE_MODEL",
        "_IS_VL_MODEL",
        "_ENABLE_SP",
        "_HAS_LAYER_IDX",
        "_HAS_ROPE",
    ):
        if hasattr(va_utils, name):
            setattr(va_utils, name, None)
    ascend_config.clear_ascend_config()
    type(current_platform)._global_graph_pool = None


class Lease:
    """The process's live engine: taken at build, given back at close (even after an error).

    ``num_threads``: torch intra-op threads while the engine is alive (restored on release). The
    default 1 is deliberate: decode-sized ops are latency-bound, and on a loaded 2-core host
    intra-op threads made one FIA call ~40x slower (spin-waiting). ``None`` leaves it alone.
    """

    _holder: Lease | None = None

    def __init__(self, owner: str, num_threads: int | None = 1) -> None:
        if Lease._holder is not None:
            raise RuntimeError(
                f"another harness engine ({Lease._holder.owner}) is alive in this process; "
                "close() it first (engines share vllm-ascend's module-level GraphParams)"
            )
        ensure()
        Lease._holder = self
        self.owner = owner
        self._threads_before = torch.get_num_threads()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        reset_process_state()

    def release(self, drop_graphs: Callable[[], None]) -> None:
        """Close the engine (idempotent): drain the device, let the engine drop its graphs (and
        anything else it set), reset the process for the next engine."""
        if Lease._holder is not self:
            return
        from torch_npu_sim import runtime

        try:
            torch.npu.synchronize()
        except Exception:  # a test may leave a deliberately blocked replay behind
            pass
        try:
            drop_graphs()
            reset_process_state()
        finally:
            runtime.reset()
            torch.set_num_threads(self._threads_before)
            Lease._holder = None
