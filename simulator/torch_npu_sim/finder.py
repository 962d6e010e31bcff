"""Serve ``torch_npu`` from the simulator in fresh interpreters (stdlib only, imports no torch).

vLLM inspects model architectures in a subprocess, spawns its engine core and workers, and the A/B
harness runs arms in fresh processes: an in-process ``sys.modules`` entry does not reach them. The
``torch_npu_sim.pth`` line calls :func:`activate_from_env` at start-up when ``TORCH_NPU_SIM`` (or
its older name ``ASCEND_GRAPH_PATCH_SIM``) is set, and ``import torch_npu`` then runs
``install()``. It never shadows a real torch_npu: if one is importable, activation warns once and
does nothing. The finder is appended to ``sys.meta_path`` (after ``PathFinder``), so even a
torch_npu that appears on the path later wins over the simulator.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

ENV_VAR = "TORCH_NPU_SIM"
#: The name the variable had while the simulator shipped inside ascend-graph-patch.
ENV_VAR_OLD = "ASCEND_GRAPH_PATCH" + "_SIM"
#: Accepted spellings (after ``strip().lower()``); the ``.pth`` line repeats OFF_VALUES.
ON_VALUES = frozenset({"1", "on", "true"})
OFF_VALUES = frozenset({"", "0", "off", "false"})
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message in _warned:
        return
    _warned.add(message)
    try:
        sys.stderr.write(f"torch-npu-sim: {message}\n")
    except Exception:  # a closed stderr must not break start-up
        pass


class _SimLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        from torch_npu_sim.install import install

        return install()

    def exec_module(self, module: types.ModuleType) -> None:
        return None  # install() built it completely


class SimTorchNpuFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder answering only for the top-level ``torch_npu``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch_npu":
            return None  # submodules are registered in sys.modules by install()
        return importlib.machinery.ModuleSpec(
            "torch_npu", _SimLoader(), origin="torch_npu_sim", is_package=True
        )


def setting(environ: dict[str, str] | None = None) -> tuple[str, str]:
    """``(variable name, raw value)`` of the simulator toggle: the first non-empty of the new
    name and the old one (as the ``.pth`` line reads it)."""
    env = os.environ if environ is None else environ
    for name in (ENV_VAR, ENV_VAR_OLD):
        if env.get(name):
            return name, env[name]
    return ENV_VAR, ""


def is_active() -> bool:
    return any(isinstance(f, SimTorchNpuFinder) for f in sys.meta_path)


def real_torch_npu_present() -> bool:
    """Whether a real torch_npu is importable from the path (the simulator then never serves)."""
    return importlib.machinery.PathFinder.find_spec("torch_npu") is not None


def activate() -> bool:
    """Append the simulator's finder; refuse (one warning, returns False) if torch_npu is real."""
    if is_active():
        return True
    if real_torch_npu_present():
        _warn_once(f"a real torch_npu is installed; the simulator stays off ({ENV_VAR} ignored)")
        return False
    sys.meta_path.append(SimTorchNpuFinder())
    return True


def activate_from_env(environ: dict[str, str] | None = None) -> bool:
    """The ``.pth`` entry: activate when asked; warn once about a value that means nothing."""
    name, raw = setting(environ)
    value = raw.strip().lower()
    if value in ON_VALUES:
        return activate()
    if value not in OFF_VALUES:
        _warn_once(
            f"ignoring {name}={raw!r}: accepted values are 1, on, true to serve torch_npu from "
            "the simulator; 0, off, false or empty (the default) to leave it alone"
        )
    return False
