"""Post-import hooks and attribute wrappers for the engine shims, with the standard library only.

The simulator loads nothing beyond torch for them (no wrapt): in a simulated process with the
overlay off, the overlay's promise that nothing of its world is imported stays checkable.

:func:`when_imported` runs a hook once a module has executed: at once if it already has, after
its ``exec_module`` if it is imported later (a meta-path finder chains its loader). A module
still executing when the hook is registered (``install()`` runs from inside the first module that
imports torch_npu, e.g. ``vllm_ascend.platform``) gets its hook at the next import statement
anywhere, by which time it has finished. :func:`wrap` replaces ``owner.attr`` with a function that
calls ``wrapper(call, args, kwargs)``, where ``call`` is the original, bound as it would have been
(instance and class methods keep their receiver).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

Hook = Callable[[types.ModuleType], None]
Wrapper = Callable[[Callable[..., Any], tuple, dict], Any]
MARK = "_torch_npu_sim_shim"


def initializing(module: types.ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def when_imported(name: str, hook: Hook) -> None:
    """Run ``hook(module)`` once module ``name`` has executed (now, or when it is imported)."""
    module = sys.modules.get(name)
    if module is not None and not initializing(module):
        hook(module)
        return
    _FINDER.hooks.setdefault(name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


class _ChainedLoader(importlib.abc.Loader):
    """The module's own loader, then its hooks."""

    def __init__(self, loader: Any, finder: _PostImportFinder) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: Any) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.finder.fire(module.__name__, module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the real loader
        return getattr(self.loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {}
        self.busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        self.fire_finished()
        if fullname not in self.hooks or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ChainedLoader(spec.loader, self)
        return spec

    def fire(self, name: str, module: types.ModuleType) -> None:
        for hook in self.hooks.pop(name, []):
            hook(module)

    def fire_finished(self) -> None:
        """Hooks of modules that were mid-import when registered and have finished since."""
        for name in list(self.hooks):
            module = sys.modules.get(name)
            if module is not None and not initializing(module):
                self.fire(name, module)


_FINDER = _PostImportFinder()


def wrap(module: types.ModuleType, target: str, wrapper: Wrapper) -> None:
    """Replace ``module.<target>`` (``"func"`` or ``"Class.method"``) with ``wrapper``'s shim."""
    *path, attr = target.split(".")
    owner: Any = module
    for part in path:
        owner = getattr(owner, part)
    raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    if getattr(raw, MARK, False) or getattr(getattr(raw, "__func__", None), MARK, False):
        return  # already shimmed (a second install in one process)
    if isinstance(raw, (classmethod, staticmethod)):
        func = raw.__func__
        if isinstance(raw, classmethod):

            def shim(cls: Any, /, *args: Any, **kwargs: Any) -> Any:
                return wrapper(functools.partial(func, cls), args, kwargs)

        else:

            def shim(*args: Any, **kwargs: Any) -> Any:
                return wrapper(func, args, kwargs)

        functools.update_wrapper(shim, func)
        setattr(shim, MARK, True)
        setattr(owner, attr, type(raw)(shim))
        return
    if isinstance(owner, type):

        def shim(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return wrapper(functools.partial(raw, self), args, kwargs)

    else:

        def shim(*args: Any, **kwargs: Any) -> Any:
            return wrapper(raw, args, kwargs)

    functools.update_wrapper(shim, raw)
    setattr(shim, MARK, True)
    setattr(owner, attr, shim)
