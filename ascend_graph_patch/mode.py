"""Parse the ``ASCEND_GRAPH_PATCH*`` environment variables.

Stdlib only and side-effect free: the bootstrap imports this module in every Python process (via
the ``.pth`` loader), so it must cost next to nothing. Every reader takes an optional ``environ``
mapping so tests and the CLI can evaluate a configuration without touching ``os.environ``.

The mode is a start-time decision: captured graphs keep whatever behaviour they were captured
with, so nothing here is meant to be re-read while an engine runs.
"""

import os

# No __future__/typing/collections imports: this module loads at every interpreter start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_MODE = "ASCEND_GRAPH_PATCH"
ENV_STRICT = "ASCEND_GRAPH_PATCH_STRICT"
ENV_FORCE = "ASCEND_GRAPH_PATCH_FORCE"
ENV_SIM = "ASCEND_GRAPH_PATCH_SIM"
ENV_DISABLE = "ASCEND_GRAPH_PATCH_DISABLE"
ENV_DEBUG = "ASCEND_GRAPH_PATCH_DEBUG"

OFF = "off"
ON = "on"
OBSERVE = "observe"
VERIFY = "verify"
#: Every mode the overlay can run in, ``off`` first (the default).
MODES: tuple[str, ...] = (OFF, ON, OBSERVE, VERIFY)

#: Spellings (after ``strip().lower()``) that mean off; unset counts as off too.
OFF_VALUES: frozenset[str] = frozenset({"", "0", "off", "false"})
#: Spellings that mean on; also the truthy set of the boolean flags below.
ON_VALUES: frozenset[str] = frozenset({"1", "on", "true"})
#: Human-readable list of accepted values, used in the invalid-value warning.
ACCEPTED = "off (default; also 0, false, empty), on (1, true), observe, verify"

#: ``ASCEND_GRAPH_PATCH_DISABLE=*`` disables every aspect (OpenTelemetry convention).
ALL_ASPECTS = "*"


def _env(environ: "Mapping[str, str] | None") -> "Mapping[str, str]":
    return os.environ if environ is None else environ


def parse(value: str | None) -> tuple[str, str | None]:
    """Map a raw ``ASCEND_GRAPH_PATCH`` value to ``(mode, warning)``.

    ``warning`` is ``None`` for an accepted value, else one line (without the
    ``ascend-graph-patch:`` prefix) for the caller to print; an unknown value always means off,
    because a typo must never switch the overlay on.
    """
    norm = (value or "").strip().lower()
    if norm in OFF_VALUES:
        return OFF, None
    if norm in ON_VALUES:
        return ON, None
    if norm in (OBSERVE, VERIFY):
        return norm, None
    return OFF, f"ignoring {ENV_MODE}={value!r}: accepted values are {ACCEPTED}; staying off"


def mode(environ: "Mapping[str, str] | None" = None) -> str:
    """The effective mode from the environment (invalid values read as ``off``, silently)."""
    return parse(_env(environ).get(ENV_MODE))[0]


def _flag(name: str, environ: "Mapping[str, str] | None") -> bool:
    return _env(environ).get(name, "").strip().lower() in ON_VALUES


def strict(environ: "Mapping[str, str] | None" = None) -> bool:
    """``ASCEND_GRAPH_PATCH_STRICT``: ``verify`` raises on a mismatch instead of counting."""
    return _flag(ENV_STRICT, environ)


def force(environ: "Mapping[str, str] | None" = None) -> bool:
    """``ASCEND_GRAPH_PATCH_FORCE``: install the aspects even if the compatibility gate refuses."""
    return _flag(ENV_FORCE, environ)


def sim_requested(environ: "Mapping[str, str] | None" = None) -> bool:
    """``ASCEND_GRAPH_PATCH_SIM``: let the simulator stand in for ``torch_npu`` in this process."""
    return _flag(ENV_SIM, environ)


def debug(environ: "Mapping[str, str] | None" = None) -> bool:
    """``ASCEND_GRAPH_PATCH_DEBUG``: print tracebacks with our warnings and CLI errors."""
    return _flag(ENV_DEBUG, environ)


def disabled_aspects(environ: "Mapping[str, str] | None" = None) -> frozenset[str]:
    """Aspect names listed in ``ASCEND_GRAPH_PATCH_DISABLE`` (comma-separated, case-insensitive).

    May contain :data:`ALL_ASPECTS`; use :func:`aspect_disabled` to test one name.
    """
    raw = _env(environ).get(ENV_DISABLE, "")
    return frozenset(part.strip().lower() for part in raw.split(",") if part.strip())


def aspect_disabled(name: str, environ: "Mapping[str, str] | None" = None) -> bool:
    """Whether the aspect ``name`` is switched off by ``ASCEND_GRAPH_PATCH_DISABLE``."""
    disabled = disabled_aspects(environ)
    return ALL_ASPECTS in disabled or name.strip().lower() in disabled
