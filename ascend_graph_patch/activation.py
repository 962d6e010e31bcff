"""Turning the overlay on and off in a process: the switch the bootstrap and tests use.

``enable(mode)`` is called by the bootstrap when the toggle is on. It costs about a millisecond:
it only arms the stdlib ``trigger``; when ``vllm_ascend`` starts to load, the ``installer``
(wrapt, the gate, the aspects) takes over. ``disable()`` removes the overlay's own layers and
forgets every graph and counter. Nothing here runs when the toggle is off.
"""

from __future__ import annotations

# Stdlib only at import time: this module loads at start-up in every process with the toggle on.
import sys
import threading

from ascend_graph_patch import loader_state

_lock = threading.RLock()
_mode: str | None = None


def start_failure(exc: BaseException) -> str:
    """The line the loader prints when the installer cannot start (``status`` shows the same)."""
    return f"could not start the installer ({exc!r}); stock"


def _start() -> None:
    """The trigger's callback: hand over to the installer (never raises into an import)."""
    mode = _mode
    if mode is None:
        return
    try:
        from ascend_graph_patch import installer

        installer.start(mode)
    except Exception as exc:
        loader_state.START_ERROR = start_failure(exc)
        sys.stderr.write(f"ascend-graph-patch: {loader_state.START_ERROR}\n")


def installer_problem() -> str | None:
    """Why the installer cannot start in this environment (the loader's line), or None.

    For ``status``: in its own process vllm_ascend never loads, so the installer never tries; this
    imports it the way the trigger's callback would (wrapt, the gate, the aspect table).
    """
    try:
        from ascend_graph_patch import installer  # noqa: F401
    except Exception as exc:
        return start_failure(exc)
    return None


def enable(mode: str) -> None:
    """Switch the overlay on in ``mode`` for this process (idempotent)."""
    global _mode
    with _lock:
        if _mode is not None:
            return
        _mode = mode
        from ascend_graph_patch import trigger

        trigger.arm(_start)


def disable() -> None:
    """Remove the overlay's layers and forget all graphs and counters (tests; ``unpatch``)."""
    global _mode
    with _lock:
        _mode = None
        from ascend_graph_patch import trigger

        trigger.disarm()
        if "ascend_graph_patch.installer" in sys.modules:
            sys.modules["ascend_graph_patch.installer"].stop()
        if "ascend_graph_patch.core.registry" in sys.modules:
            sys.modules["ascend_graph_patch.core.registry"].REGISTRY.clear()
        if "ascend_graph_patch.state" in sys.modules:
            sys.modules["ascend_graph_patch.state"].reset()


def installed() -> list[str]:
    """Names of the aspects whose wrappers are live."""
    if "ascend_graph_patch.installer" not in sys.modules:
        return []
    from ascend_graph_patch import installer

    return installer.installed()
