"""CPU simulator of the ``torch_npu`` surface vllm-ascend's graph path uses.

Attributes resolve lazily so that ``torch_npu_sim.finder`` (imported by the loader at
interpreter start-up) costs nothing: torch is imported only by ``install()`` or ``runtime``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Binding the function after the submodule import makes ``sim.install`` the function, not the
# ``sim/install.py`` module (which the import system would otherwise leave as the attribute).
from .install import install, installed

if TYPE_CHECKING:
    from .runtime import SimulatorError

__all__ = ["SimulatorError", "install", "installed", "runtime"]


def __getattr__(name: str) -> Any:
    if name == "runtime":
        import importlib

        return importlib.import_module(f"{__name__}.runtime")
    if name == "SimulatorError":
        from .runtime import SimulatorError

        return SimulatorError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
