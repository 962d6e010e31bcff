"""Serve ``torch_npu`` from the simulator in fresh interpreters (stdlib only, imports no torch).

vLLM inspects model architectures in a subprocess and the A/B harness runs arms in fresh
processes; an in-process ``sys.modules`` entry does not reach them. The loader's bootstrap calls
``activate()`` at start-up when ``ASCEND_GRAPH_PATCH_SIM`` is set, and ``import torch_npu`` then
runs ``install()``. It never shadows a real torch_npu: if one is importable, ``activate()``
warns once and does nothing. The finder is appended to ``sys.meta_path`` (after ``PathFinder``),
so even a torch_npu that appears on the path later wins over the simulator.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
import warnings

ENV_VAR = "ASCEND_GRAPH_PATCH_SIM"
_TRUE = {"1", "on", "true"}  # the values the .pth loader and mode.py accept
_warned = False


class _SimLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        from ascend_graph_patch.sim.install import install

        return install()

    def exec_module(self, module: types.ModuleType) -> None:
        return None  # install() built it completely


class SimTorchNpuFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder answering only for the top-level ``torch_npu``."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch_npu":
            return None  # submodules are registered in sys.modules by install()
        return importlib.machinery.ModuleSpec(
            "torch_npu", _SimLoader(), origin="ascend_graph_patch.sim", is_package=True
        )


def requested(environ: dict[str, str] | None = None) -> bool:
    """Whether ``ASCEND_GRAPH_PATCH_SIM`` asks for the simulator (``1/on/true``)."""
    value = (environ if environ is not None else os.environ).get(ENV_VAR, "")
    return value.strip().lower() in _TRUE


def is_active() -> bool:
    return any(isinstance(f, SimTorchNpuFinder) for f in sys.meta_path)


def activate() -> bool:
    """Append the simulator's finder; refuse (one warning, returns False) if torch_npu is real."""
    global _warned
    if is_active():
        return True
    if importlib.machinery.PathFinder.find_spec("torch_npu") is not None:
        if not _warned:
            _warned = True
            warnings.warn(
                "ascend_graph_patch: a real torch_npu is installed; the simulator stays off "
                f"({ENV_VAR} ignored)",
                RuntimeWarning,
                stacklevel=2,
            )
        return False
    sys.meta_path.append(SimTorchNpuFinder())
    return True


def activate_if_requested() -> bool:
    """``activate()`` when the environment asks for the simulator; for the loader bootstrap."""
    return activate() if requested() else False


def deactivate() -> None:
    """Remove the finder (``sys.modules`` entries already made stay)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, SimTorchNpuFinder)]
