"""Containment: an error inside an aspect degrades to stock, is counted, and warns once."""

from __future__ import annotations

from ascend_graph_patch import state


def aspect_error(aspect: str, exc: BaseException) -> None:
    state.count(f"errors.{aspect}")
    state.warn_once(
        f"error:{aspect}:{type(exc).__name__}",
        f"internal error in aspect {aspect} ({type(exc).__name__}: {exc}); "
        "falling back to the stock path",
    )
