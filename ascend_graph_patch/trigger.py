"""Wait for vllm_ascend's first import, touching nothing else (stdlib only).

With the toggle on, the bootstrap runs in every Python process, most of which never load
vllm-ascend (pip, tools, scripts). Until ``vllm_ascend`` starts to load, only this meta-path
finder is installed; its loader calls back (the installer registers its post-import hooks then)
before the package body runs, and then steps aside: ``module.__loader__`` is the original again.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing itself costs ~7 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

PACKAGE = "vllm_ascend"


class _CallbackLoader:
    """The package's own loader, which first calls back (then steps aside)."""

    def __init__(self, inner: Any, callbacks: list[Callable[[], None]]) -> None:
        self._inner = inner
        self._callbacks = callbacks

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        for callback in self._callbacks:
            callback()  # must not raise: each callback contains its own errors
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Trigger:
    """Meta-path finder answering for nothing: it only notices the first import of PACKAGE."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != PACKAGE:
            return None
        disarm()  # safe: a found spec ends the import system's scan
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _CallbackLoader(spec.loader, self.callbacks)
                return spec
        return None


def arm(callback: Callable[[], None]) -> None:
    """Call ``callback`` when vllm_ascend starts to load (now, if it already has)."""
    if PACKAGE in sys.modules:
        callback()
        return
    trigger = next((f for f in sys.meta_path if isinstance(f, Trigger)), None)
    if trigger is None:
        trigger = Trigger()
        sys.meta_path.insert(0, trigger)
    if callback not in trigger.callbacks:
        trigger.callbacks.append(callback)


def disarm() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Trigger)]
