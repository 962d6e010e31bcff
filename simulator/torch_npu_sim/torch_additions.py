"""What ``import torch_npu`` adds to ``torch`` itself, as the real package does, for the CPU host.

The real torch-npu 2.10.0.post4 patches torch at import (``torch_npu/_init``): it renames the
PrivateUse1 backend ``npu`` and registers ``torch.npu``, generates the ``npu`` methods of tensors,
modules and storages, registers the ``hccl`` and ``lccl`` process-group backends, and puts its own
functions under ``torch.distributed`` (``is_hccl_available``, ``reinit_process_group``, and HCCL
variants of ``gather``, ``gather_object`` and ``batch_isend_irecv``). vLLM's general plugins
from vllm-ascend import some of these from ``torch`` (``from torch.distributed import
is_hccl_available``, in the model-loader plugin every ``vllm serve`` loads), so a stand-in that
leaves them out fails at start-up where the real package does not.

Here every public name the real package adds is present with the real signature (checked against
the wheel by ``tests/test_sim_torch_additions.py``): ``is_hccl_available`` is the real body (the
``hccl`` backend is not registered here, HCCL being not simulated, so it answers False and vLLM
keeps gloo, as it does when HCCL is absent); ``reinit_process_group`` raises (HCCL links); the
collectives keep the real signatures and run torch's own (gloo) implementation. What is left out is
listed in :data:`NOT_SIMULATED` with the reason.
"""

from __future__ import annotations

from typing import Any

from .runtime import SimulatorError

#: What the real package adds to torch that the simulator leaves out, and why.
NOT_SIMULATED: dict[str, str] = {
    "backend:hccl": "HCCL is not simulated: collectives run on gloo (CPU tensors)",
    "backend:lccl": "LCCL is not simulated: collectives run on gloo (CPU tensors)",
    "torch.distributed.nn.functional._AllGatherBase.backward": "autograd of all-gather: training",
    "storage:npu": "no NPU storage: the simulated device's memory is CPU memory",
    "torch.distributed.distributed_c10d.gather": (
        "torch's own stays in distributed_c10d: torch's gather_object (which the simulator keeps "
        "behind the real signature) calls it with group_dst, which the real signature lacks; "
        "torch.distributed.gather has the real one"
    ),
}


def is_hccl_available() -> bool:
    """Whether the ``hccl`` process-group backend is registered (the real package's body)."""
    import torch.distributed as dist

    return "hccl" in dist.Backend.backend_list


def reinit_process_group(group: Any = None, rebuild_link: bool = True) -> Any:
    """Rebuild or resume a group's HCCL links: there are none here."""
    raise SimulatorError("torch.distributed.reinit_process_group: HCCL links are not simulated")


def _collectives(dist: Any) -> dict[str, Any]:
    """The real package's ``gather``, ``gather_object`` and ``batch_isend_irecv`` signatures, run
    by torch's own implementations (``dist``'s, before they are replaced)."""
    torch_gather, torch_gather_object = dist.gather, dist.gather_object
    torch_batch = dist.batch_isend_irecv

    def gather(
        tensor: Any,
        gather_list: Any = None,
        dst: int = 0,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        return torch_gather(tensor, gather_list, dst=dst, group=group, async_op=async_op)

    def gather_object(
        obj: Any, object_gather_list: Any = None, dst: int = 0, group: Any = None
    ) -> Any:
        return torch_gather_object(obj, object_gather_list, dst=dst, group=group)

    def batch_isend_irecv(p2p_op_list: Any) -> Any:
        return torch_batch(p2p_op_list)

    return {
        "gather": gather,
        "gather_object": gather_object,
        "batch_isend_irecv": batch_isend_irecv,
    }


def _module_npu(self: Any, device: Any = None) -> Any:
    """``Module.npu()``: every parameter and buffer through ``Tensor.npu`` (the generated
    method's body; the simulated device is CPU memory)."""
    return self._apply(lambda t: t.npu(device))


def install(torch: Any) -> None:
    """Add to ``torch`` what the real ``import torch_npu`` adds (idempotent)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if getattr(dist, "_torch_npu_sim_additions", False):
        return
    for name, fn in _collectives(dist).items():
        setattr(dist, name, fn)
        if f"torch.distributed.distributed_c10d.{name}" not in NOT_SIMULATED:
            setattr(c10d, name, fn)
    dist.is_hccl_available = is_hccl_available
    dist.reinit_process_group = reinit_process_group
    if not hasattr(torch.nn.Module, "npu"):
        torch.nn.Module.npu = _module_npu
    dist._torch_npu_sim_additions = True


__all__ = ["NOT_SIMULATED", "install", "is_hccl_available", "reinit_process_group"]
