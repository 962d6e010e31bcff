"""The installer: hooks on the seam modules -> the gate -> all of a group's wrappers, or none.

Imported when vllm_ascend starts to load (``trigger``), never before: wrapt and the gate cost tens
of milliseconds. For the release line that matches the installed versions it registers one wrapt
post-import hook per module an aspect group needs; when all of a group's modules have loaded,
the gate checks that group's seams and, if they hold, all its wrappers are installed at once, or
none (a failure while wrapping unwraps what was done).

Uninstalling removes only the overlay's own layers: a wrapper someone installed on top of one of
ours survives, and ours stays beneath it, inert (every aspect passes straight through once the
overlay is inactive) until the overlay is enabled again, when it is reused rather than doubled.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import wrapt

from ascend_graph_patch import gate, settings, state
from ascend_graph_patch.aspects import ASPECTS, NEEDS, VERIFY, groups, present
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.lines.base import Interceptor, Line

_lock = threading.RLock()


@dataclass
class Layer:
    """One wrapper of ours: where it sits and what it replaced."""

    name: str
    parent: Any
    attribute: str
    original: Any  # the attribute as the parent stored it (a staticmethod stays one)
    wrapper: Any


@dataclass
class _Installation:
    mode: str
    line: Line
    loaded: set[str]
    groups: set[str]


_current: _Installation | None = None
_layers: dict[str, Layer] = {}  # live layers, by aspect name
_inert: dict[str, Layer] = {}  # layers left beneath someone else's wrapper at uninstall


class StaticFunctionWrapper(wrapt.FunctionWrapper):
    """A ``FunctionWrapper`` around the function a staticmethod holds, bound as a staticmethod.

    Given a plain function, ``FunctionWrapper`` binds it as one, and then, at every call without an
    instance, first looks the function up for a ``__self__`` it does not have: an AttributeError
    raised and cleared per call, about a tenth of the overlay's fixed cost per replay step. Bound
    as a staticmethod, wrapt calls the wrapper straight away, with no instance, as the staticmethod
    itself would be called. (wrapt's public constructor infers the binding; its base class's
    takes it, as wrapt's own bound wrappers pass it.)
    """

    def __init__(self, wrapped: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
        base = wrapt.FunctionWrapper.__base__  # _FunctionWrapperBase, C or pure Python alike
        base.__init__(self, wrapped, None, wrapper, None, "staticmethod")


def _static_wrapper(function: Callable[..., Any], wrapper: Callable[..., Any]) -> Any:
    """The wrapper for a staticmethod's function (a plain ``FunctionWrapper`` if this wrapt's
    base class does not take the binding as 2.x does)."""
    try:
        return StaticFunctionWrapper(function, wrapper)
    except TypeError:
        return wrapt.FunctionWrapper(function, wrapper)


def _raw(parent: Any, attribute: str) -> Any:
    return (
        parent.__dict__[attribute]
        if attribute in getattr(parent, "__dict__", {})
        else (getattr(parent, attribute))
    )


def _in_chain(obj: Any, target: Any) -> bool:
    for _ in range(64):
        if obj is target:
            return True
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            return False
    return False


def _load(spec: str) -> Callable:
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def wrap(name: str, module: ModuleType, target: str, wrapper: Callable) -> None:
    """Install one wrapper (wrapt), or revive our inert layer still in place there."""
    parent, attribute, _ = wrapt.resolve_path(module, target)
    inert = _inert.pop(name, None)
    if inert is not None and _in_chain(_raw(parent, attribute), inert.wrapper):
        _layers[name] = inert
    else:
        original = _raw(parent, attribute)
        if isinstance(original, staticmethod):
            # Wrap the function the staticmethod holds, and keep it a staticmethod: a wrapper
            # around the descriptor would bind anew at every ``impl_cls.update_graph_params``
            # access, the replay hot path (about twice the cost of the call itself).
            replacement = staticmethod(_static_wrapper(original.__func__, wrapper))
            wrapt.apply_patch(parent, attribute, replacement)
        else:
            wrapt.wrap_function_wrapper(module, target, wrapper)
        _layers[name] = Layer(name, parent, attribute, original, _raw(parent, attribute))
    state.STATE.aspects_installed.append(name)


def unwrap(names: list[str]) -> None:
    """Remove our layers: restore the original where ours is outermost, else leave ours inert."""
    for name in reversed(names):
        layer = _layers.pop(name)
        if _raw(layer.parent, layer.attribute) is layer.wrapper:
            setattr(layer.parent, layer.attribute, layer.original)
        else:
            _inert[name] = layer
        if name in state.STATE.aspects_installed:
            state.STATE.aspects_installed.remove(name)


def install_group(installation: _Installation, group: str) -> None:
    missing = [base for base in NEEDS.get(group, ()) if base not in installation.groups]
    if missing:
        # The base group's own warning line (or its absence from the line) already says why.
        why = "; ".join(
            f"{base}: {state.STATE.gate.get(base, {}).get('reason', 'not in this release line')}"
            for base in missing
        )
        state.STATE.gate[group] = {"verdict": "refused", "reason": f"needs {why}"}
        return
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
    mode = installation.mode
    done: list[str] = []
    try:
        shared.ACTIVE = shared.ACTIVE or shared.Active(
            line=verdict.line,
            mode=mode,
            strict=settings.strict(),
            stream_order=settings.replay_sync() == settings.SYNC_STREAM,
        )
        for aspect in present(verdict.line):
            if aspect.group != group or mode not in aspect.modes:
                continue
            if settings.ALL_ASPECTS in disabled or aspect.name.lower() in disabled:
                continue
            seam = verdict.line.seams[aspect.seam]
            wrap(aspect.name, sys.modules[seam.module], seam.qualname, _load(aspect.wrapper))
            done.append(aspect.name)
    except Exception as exc:
        unwrap(done)
        reason = f"install failed: {exc!r}"  # the warning and status say the same
        state.STATE.gate[group] = {"verdict": "refused", "reason": reason}
        state.warn_once(f"install:{group}", f"not installed ({group}): {reason}")
        return
    if mode == VERIFY and "verify" not in installation.groups:
        _install_verify(installation, verdict.line)
    installation.groups.add(group)


def _install_verify(installation: _Installation, line: Line) -> None:
    done: list[str] = []
    try:
        for item in line.verify_interceptors:
            wrapper = _load(f"ascend_graph_patch.aspects.verify:{item.wrapper}")
            wrap(item.name, sys.modules[item.module], item.target, wrapper)
            done.append(item.name)
    except Exception as exc:
        unwrap(done)
        if shared.ACTIVE is not None:
            shared.ACTIVE.mode = "observe"
        state.STATE.mode = "observe"
        state.warn_once("verify", f"verify unavailable ({exc!r}); running in observe mode")
        return
    installation.groups.add("verify")


def reattach(interceptors: tuple[Interceptor, ...]) -> int:
    """Wrap again each verify interceptor whose attribute was rebound since it was installed.

    torch_npu swaps its ATB ops for the registered ones after vllm-ascend has loaded
    (``_register_atb_extensions``, from ``NPUWorker.__init__``), and batch-invariant mode rebinds
    ``torch_npu.npu_fused_infer_attention_score``: the new objects do not carry our layer. Called
    before every dry run; returns how many layers it had to re-attach.
    """
    again = 0
    with _lock:
        for item in interceptors:
            layer = _layers.get(item.name)
            if layer is None:
                continue
            module = sys.modules[item.module]
            parent, attribute, _ = wrapt.resolve_path(module, item.target)
            if _in_chain(_raw(parent, attribute), layer.wrapper):
                continue
            original = _raw(parent, attribute)
            wrapper = _load(f"ascend_graph_patch.aspects.verify:{item.wrapper}")
            wrapt.wrap_function_wrapper(module, item.target, wrapper)
            _layers[item.name] = Layer(
                item.name, parent, attribute, original, _raw(parent, attribute)
            )
            again += 1
    return again


def _on_import(module: ModuleType) -> None:
    """Post-import hook: record the module, install every group it completes."""
    try:
        with _lock:
            installation = _current
            if installation is None:
                return
            installation.loaded.add(module.__name__)
            state.STATE.modules_seen.append(module.__name__)
            table = groups(installation.line)
            progress = True
            while progress:  # a group's bases first, then the group, in one import
                progress = False
                for group, modules in table.items():
                    if group in installation.groups or group in state.STATE.gate:
                        continue  # installed, or checked and refused already
                    if not all(m in installation.loaded for m in modules):
                        continue
                    if any(b in table and b not in state.STATE.gate for b in NEEDS.get(group, ())):
                        continue  # a base group has not been checked yet
                    install_group(installation, group)
                    progress = True
    except Exception as exc:  # never break the host's import
        state.warn_once("hook", f"post-import hook failed ({exc!r}); stock path kept")


def start(mode: str) -> None:
    """Register the post-import hooks for ``mode`` (vllm_ascend is starting to load)."""
    global _current
    try:
        with _lock:
            if _current is not None:
                return
            line = gate.candidate_line()
            _current = _Installation(mode=mode, line=line, loaded=set(), groups=set())
            state.STATE.mode = mode
            state.STATE.strict = settings.strict()
            for name in sorted({m for mods in groups(line).values() for m in mods}):
                wrapt.register_post_import_hook(_on_import, name)
    except Exception as exc:  # never break the host's import
        state.warn_once("hook", f"could not register import hooks ({exc!r}); stock path kept")


def stop() -> None:
    """Remove every layer of ours (see the module docstring) and forget the installation."""
    global _current
    with _lock:
        unwrap(list(_layers))
        _current = None
        shared.ACTIVE = None


def installed() -> list[str]:
    return list(_layers)
