"""A test switch of the simulator: one caller's call of a ``runtime.Stream`` method made a no-op.

The negative controls of the ordering checks remove one line of someone else's code, stock's
replay barrier (``barrier``) or the overlay's stream-order wait (``order_wait``), without wrapping
that code: the simulated ``Stream`` method returns at once, counted, when the frame calling it is
that line's function (its code object's name and file); every other call runs as before.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from .. import runtime


@dataclass(frozen=True)
class CallerSwitch:
    """``method`` of ``runtime.Stream`` skipped when called from ``function`` in a file ending
    with ``path``, while ``env_var`` is set in the process (or the case's environment)."""

    env_var: str
    method: str
    function: str
    path: str
    counter: str

    def requested(self, environ: dict[str, str] | None = None) -> bool:
        env = os.environ if environ is None else environ
        return env.get(self.env_var, "").strip().lower() in ("1", "on", "true")

    def is_caller(self, code: Any) -> bool:
        return code.co_name == self.function and code.co_filename.endswith(self.path)

    def install(self, environ: dict[str, str] | None = None) -> bool:
        """Skip the call in this process when asked (idempotent)."""
        if not self.requested(environ):
            return False
        if self.active():
            return True
        original = getattr(runtime.Stream, self.method)
        switch = self

        def skipping(stream: runtime.Stream, *args: Any) -> Any:
            if switch.is_caller(sys._getframe(1).f_code):
                counters = runtime._S.counters
                counters[switch.counter] = counters.get(switch.counter, 0) + 1
                return None
            return original(stream, *args)

        skipping._caller_switch = self  # type: ignore[attr-defined]
        skipping.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(runtime.Stream, self.method, skipping)
        return True

    def active(self) -> bool:
        """Whether this process skips the call."""
        return getattr(getattr(runtime.Stream, self.method), "_caller_switch", None) == self

    def uninstall(self) -> None:
        """Restore the runtime's method (tests)."""
        if self.active():
            setattr(runtime.Stream, self.method, getattr(runtime.Stream, self.method).__wrapped__)
