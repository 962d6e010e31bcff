"""``install()``: register the simulator as ``torch_npu`` (and ``torch.npu``) plus CPU shims.

This module stays torch-free so that ``torch_npu_sim`` can re-export ``install`` as a
function without making ``import torch_npu_sim.finder`` pay for torch; the work is in
``_install_impl``.
"""

from __future__ import annotations

import sys
import types

__all__ = ["install", "installed"]


def install() -> types.ModuleType:
    """Register the simulator as ``torch_npu`` / ``torch.npu`` (idempotent); returns it.

    Must run before anything imports ``vllm.config``. Sets ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
    if unset, renames the PrivateUse1 backend to ``npu`` once, defines torchvision's
    ``nms``/``qnms`` schemas when its ``_C`` cannot load, and stubs ``acl``/``acl.rt``.
    """
    from ._install_impl import install as _install

    return _install()


def installed() -> bool:
    """Whether the simulator is the registered ``torch_npu`` in this process."""
    impl = sys.modules.get(f"{__package__}._install_impl")
    return impl is not None and impl.installed() and sys.modules.get("torch_npu") is impl._MODULE
