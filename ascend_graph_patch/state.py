"""Per-process overlay state: what was installed, what ran, and the counters `status` reports.

One module-level `STATE` object, because post-import hooks, aspects and the CLI all live in one
process and must agree on it; tests reset it through `reset()`.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class OverlayState:
    mode: str = "off"
    strict: bool = False
    gate: dict[str, dict[str, str]] = field(default_factory=dict)  # group -> {verdict, reason}
    aspects_installed: list[str] = field(default_factory=list)
    aspects_effective: list[str] = field(default_factory=list)
    modules_seen: list[str] = field(default_factory=list)
    counters: Counter = field(default_factory=Counter)
    warned: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


STATE = OverlayState()


def reset() -> None:
    """Forget everything (tests only)."""
    global STATE
    fresh = OverlayState()
    STATE.__dict__.update(fresh.__dict__)


_listeners: list = []  # called after every count (status_files' throttled writer)


def on_count(listener) -> None:  # noqa: ANN001 - a no-argument callable
    """Call ``listener()`` after every counter update (it must be cheap and never raise)."""
    _listeners.append(listener)


def count(name: str, n: int = 1) -> None:
    STATE.counters[name] += n
    for listener in _listeners:
        listener()


def count_update(tasks: int) -> None:
    """One owned update of ``tasks`` tasks: the replay hot path's two counters in one call."""
    counters = STATE.counters
    counters["updates.owned"] += 1
    counters["tasks.updated"] += tasks
    for listener in _listeners:
        listener()


def mark_effective(aspect: str) -> None:
    """Record the first time an aspect really ran (its wrapper took its non-trivial path)."""
    if aspect not in STATE.aspects_effective:
        with STATE.lock:
            if aspect not in STATE.aspects_effective:
                STATE.aspects_effective.append(aspect)


def warn_once(key: str, message: str) -> None:
    """One line on stderr per distinct `key` per process: visible, never noisy."""
    if key in STATE.warned:
        return
    STATE.warned.add(key)
    print(f"ascend-graph-patch: {message}", file=sys.stderr, flush=True)
