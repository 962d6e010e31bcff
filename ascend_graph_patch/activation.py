"""Activation: from the parsed mode to installed aspects, through post-import hooks and the gate.

`enable(mode)` (called by the bootstrap when the toggle is on) registers one wrapt post-import hook
per module an aspect group targets. When every module of a group has loaded, the gate checks that
group's seams; if they hold, all its wrappers are installed at once, or none (any failure unwraps
what was done). Nothing here runs when the toggle is off.

wrapt (about 50 ms of imports: asyncio, importlib.metadata), the gate and the registry are
imported only once `vllm_ascend` starts to load: until then a stdlib meta-path trigger waits for
it, so the many Python processes that never touch vllm-ascend (pip, tools, scripts) pay next to
nothing for the toggle.
"""

from __future__ import annotations

# Only these two at import time: the module runs at start-up in every process with the toggle on.
# Everything else (the gate, the registry, state, wrapt) is imported when vllm_ascend loads.
import _thread
import sys

TYPE_CHECKING = False  # typing itself costs ~7 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any


# Interceptors for verify's dry run: (name, module, target, wrapper); runtime seams.
VERIFY_INTERCEPTORS: tuple[tuple[str, str, str, str], ...] = (
    ("verify.update_begin", "torch_npu", "npu.graph_task_update_begin", "update_begin"),
    ("verify.update_end", "torch_npu", "npu.graph_task_update_end", "update_end"),
    ("verify.event_record", "torch_npu", "npu.ExternalEvent.record", "event_record"),
    ("verify.fia", "torch_npu", "npu_fused_infer_attention_score.out", "fia_out"),
    ("verify.fia_v2", "torch_npu", "npu_fused_infer_attention_score_v2.out", "fia_v2_out"),
    ("verify.pa", "torch_npu", "_npu_paged_attention", "paged_attention"),
)

_lock = _thread.RLock()
_enabled_mode: str | None = None
_loaded: set[str] = set()
_installed_groups: set[str] = set()
# aspect name -> (parent object, attribute, original attribute as stored on the parent)
_originals: dict[str, tuple[Any, str, Any]] = {}


def _load_wrapper(spec: str) -> Callable:
    import importlib

    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _wrap(name: str, module: ModuleType, target: str, wrapper: Callable) -> None:
    import wrapt

    from ascend_graph_patch import state

    parent, attribute, _ = wrapt.resolve_path(module, target)
    raw = parent.__dict__[attribute] if attribute in getattr(parent, "__dict__", {}) else None
    if raw is None:
        raw = getattr(parent, attribute)
    wrapt.wrap_function_wrapper(module, target, wrapper)
    _originals[name] = (parent, attribute, raw)
    state.STATE.aspects_installed.append(name)


def _unwrap(names: list[str]) -> None:
    from ascend_graph_patch import state

    for name in reversed(names):
        parent, attribute, raw = _originals.pop(name)
        setattr(parent, attribute, raw)
        if name in state.STATE.aspects_installed:
            state.STATE.aspects_installed.remove(name)


def _install_group(group: str) -> None:
    from ascend_graph_patch import gate, settings, state
    from ascend_graph_patch.aspects import ASPECTS, VERIFY, context

    verdict = gate.check(group, force=settings.force())
    state.STATE.gate[group] = {"verdict": verdict.label, "reason": verdict.reason}
    if not verdict.ok:
        state.warn_once(f"gate:{group}", f"not installed ({group}): {verdict.reason}")
        return
    if verdict.forced:
        state.warn_once(f"force:{group}", f"FORCED install ({group}) despite: {verdict.reason}")
    assert verdict.line is not None
    disabled = settings.disabled_aspects()
    unknown = settings.unknown_aspects(a.name for a in ASPECTS)
    if unknown:
        state.warn_once("disable:unknown", unknown)
    mode = _enabled_mode or "on"
    done: list[str] = []
    try:
        context.ACTIVE = context.ACTIVE or context.Active(
            line=verdict.line, mode=mode, strict=settings.strict()
        )
        for aspect in ASPECTS:
            if aspect.group != group or mode not in aspect.modes:
                continue
            if settings.ALL_ASPECTS in disabled or aspect.name.lower() in disabled:
                continue
            _wrap(
                aspect.name,
                sys.modules[aspect.module],
                aspect.target,
                _load_wrapper(aspect.wrapper),
            )
            done.append(aspect.name)
    except Exception as exc:
        _unwrap(done)
        state.STATE.gate[group] = {"verdict": "refused", "reason": f"install failed: {exc!r}"}
        state.warn_once(f"install:{group}", f"not installed ({group}): {exc!r}")
        return
    if mode == VERIFY and "verify" not in _installed_groups:
        _install_verify()
    _installed_groups.add(group)


def _install_verify() -> None:
    from ascend_graph_patch import state
    from ascend_graph_patch.aspects import context

    done: list[str] = []
    try:
        for name, module, target, wrapper in VERIFY_INTERCEPTORS:
            _wrap(
                name,
                sys.modules[module],
                target,
                _load_wrapper(f"ascend_graph_patch.aspects.verify:{wrapper}"),
            )
            done.append(name)
    except Exception as exc:
        _unwrap(done)
        if context.ACTIVE is not None:
            context.ACTIVE.mode = "observe"
        state.STATE.mode = "observe"
        state.warn_once("verify", f"verify unavailable ({exc!r}); running in observe mode")
        return
    _installed_groups.add("verify")


def _on_import(module: ModuleType) -> None:
    """Post-import hook: record the module, install every group it completes."""
    from ascend_graph_patch import state
    from ascend_graph_patch.aspects import GROUPS

    try:
        with _lock:
            if _enabled_mode is None:
                return
            _loaded.add(module.__name__)
            state.STATE.modules_seen.append(module.__name__)
            for group, modules in GROUPS.items():
                if group not in _installed_groups and all(m in _loaded for m in modules):
                    if group in state.STATE.gate:  # checked and refused already
                        continue
                    _install_group(group)
    except Exception as exc:  # never break the host's import
        state.warn_once("hook", f"post-import hook failed ({exc!r}); stock path kept")


TRIGGER_PACKAGE = "vllm_ascend"


def _register_hooks() -> None:
    import wrapt

    from ascend_graph_patch import settings, state
    from ascend_graph_patch.aspects import GROUPS

    state.STATE.mode = _enabled_mode or "on"
    state.STATE.strict = settings.strict()
    for name in sorted({m for mods in GROUPS.values() for m in mods}):
        wrapt.register_post_import_hook(_on_import, name)


class _HookingLoader:
    """vllm_ascend's own loader, which first registers the hooks (then steps aside)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            with _lock:
                if _enabled_mode is not None:
                    _register_hooks()
        except Exception as exc:  # never break the host's import
            from ascend_graph_patch import state

            state.warn_once("hook", f"could not register import hooks ({exc!r}); stock path kept")
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Trigger:
    """Waits for the first import of vllm_ascend; touches nothing else."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != TRIGGER_PACKAGE:
            return None
        try:
            sys.meta_path.remove(self)  # safe: a found spec ends the import system's scan
        except ValueError:
            pass
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _HookingLoader(spec.loader)
                return spec
        return None


def enable(mode: str) -> None:
    """Register post-import hooks for every module an aspect targets (idempotent)."""
    global _enabled_mode
    with _lock:
        if _enabled_mode is not None:
            return
        _enabled_mode = mode
        from ascend_graph_patch import settings

        directory = settings.status_dir()
        if directory is not None:
            from ascend_graph_patch import status_files

            status_files.start(directory)
        if TRIGGER_PACKAGE in sys.modules:
            _register_hooks()
        elif not any(isinstance(f, _Trigger) for f in sys.meta_path):
            sys.meta_path.insert(0, _Trigger())


def disable() -> None:
    """Unwrap everything and forget all graphs (tests, and `unpatch` symmetry)."""
    global _enabled_mode
    from ascend_graph_patch import state
    from ascend_graph_patch.aspects import context
    from ascend_graph_patch.core.registry import REGISTRY

    with _lock:
        _unwrap(list(_originals))
        _installed_groups.clear()
        _loaded.clear()
        _enabled_mode = None
        context.ACTIVE = None
        REGISTRY.clear()
        state.reset()


def installed() -> list[str]:
    return list(_originals)
