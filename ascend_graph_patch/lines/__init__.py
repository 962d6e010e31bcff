"""Supported vllm-ascend release lines, as data: versions, seams, op handles, tuple layouts.

Adding a line (say the late-2026 main, with its 21-field FIA tuple and PA wrapper class) means
adding one module here and listing it in `LINES`; the gate and the aspects read only this data.
"""

from __future__ import annotations

import functools
import importlib.metadata

from ascend_graph_patch.lines.base import Check, Line
from ascend_graph_patch.lines.v0_23 import LINE as V0_23

LINES: tuple[Line, ...] = (V0_23,)


@functools.cache
def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None (read once per process)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


__all__ = ["LINES", "Check", "Line", "installed_version"]
