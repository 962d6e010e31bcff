"""``torch.accelerator`` answered by the simulator.

With the PrivateUse1 backend renamed to ``npu`` (and no C++ device hooks behind it), torch reports
``npu`` as the current accelerator, and every ``torch.accelerator`` call that reaches the device
hooks raises "PyTorch is not linked with support for npu devices" (vLLM and vllm-ascend make about
130 such calls). On hardware torch_npu registers those hooks. Here synchronisation and streams go
to the simulated runtime and the memory figures to the simulated ``torch.npu``. ``is_available()``
stays False: when it is True, dynamo asks the accelerator for a real stream object.

``torch.distributed`` asks ``torch._C._get_accelerator()`` which device its collectives use
(``barrier`` does, and vLLM's TP start-up calls it); without device hooks that raises too. It is
answered CPU, the simulated device's memory, so gloo (vLLM's fallback from HCCL) gets CPU tensors.
"""

from __future__ import annotations

from typing import Any

from .. import runtime


def _npu() -> Any:
    import torch

    return torch.npu


def _none(*_a: Any, **_k: Any) -> None:
    return None


ANSWERS: dict[str, Any] = {
    "current_device_index": lambda: 0,
    "current_device_idx": lambda: 0,
    "set_device_index": _none,
    "set_device_idx": _none,
    "get_device_capability": lambda _d=None: {},
    "current_stream": lambda _d=None: runtime.current_stream(),
    "set_stream": runtime.set_stream,
    "synchronize": lambda _d=None: runtime.synchronize(),
    "empty_cache": _none,
    "get_memory_info": lambda _d=None: _npu().mem_get_info(),
    "memory_stats": lambda _d=None: {},
    "memory_allocated": lambda _d=None: 0,
    "max_memory_allocated": lambda _d=None: 0,
    "memory_reserved": lambda _d=None: 0,
    "max_memory_reserved": lambda _d=None: 0,
    "reset_accumulated_memory_stats": _none,
    "reset_peak_memory_stats": _none,
}


def _get_accelerator_or_cpu(original: Any) -> Any:
    def get_accelerator() -> Any:
        try:
            return original()
        except RuntimeError as exc:  # "Please register PrivateUse1HooksInterface ... first."
            if "PrivateUse1HooksInterface" not in str(exc):
                raise
            import torch

            return torch.device("cpu")

    get_accelerator._torch_npu_sim_original = original  # type: ignore[attr-defined]
    return get_accelerator


def install() -> None:
    """Replace the ``torch.accelerator`` functions the simulated device cannot serve (once)."""
    import torch

    accelerator = torch.accelerator
    if getattr(accelerator, "_torch_npu_sim", False):
        return
    for name, answer in ANSWERS.items():
        if hasattr(accelerator, name):
            setattr(accelerator, name, answer)
    torch._C._get_accelerator = _get_accelerator_or_cpu(torch._C._get_accelerator)
    accelerator._torch_npu_sim = True  # type: ignore[attr-defined]
