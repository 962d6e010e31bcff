"""Every ``ASCEND_GRAPH_PATCH*`` environment variable, its accepted values, parsed in one place.

Stdlib only and side-effect free: the bootstrap imports this module in every Python process where
the toggle is on, so it must cost next to nothing. Each reader takes an optional ``environ``
mapping, so tests and the CLI can evaluate a configuration without touching ``os.environ``.

A value outside the documented set never switches anything on: the variable reads as its default
and :func:`problems` names it with the accepted values (the bootstrap prints each once per
process). The mode is a start-time decision: captured graphs keep the behaviour they were
captured with, so nothing here is meant to be re-read while an engine runs.

The ``.pth`` loader repeats :data:`OFF_VALUES` inline (it must not import anything when off); a
test keeps the two copies equal.
"""

import os

# No __future__/typing/collections imports: this module loads at interpreter start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

PREFIX = "ASCEND_GRAPH_PATCH"
ENV_MODE = PREFIX
ENV_STRICT = PREFIX + "_STRICT"
ENV_FORCE = PREFIX + "_FORCE"
ENV_DISABLE = PREFIX + "_DISABLE"
ENV_DEBUG = PREFIX + "_DEBUG"
ENV_STATUS_DIR = PREFIX + "_STATUS_DIR"
ENV_TP_FAULT = PREFIX + "_TP_FAULT"
ENV_STALE_GRAPH = PREFIX + "_STALE_GRAPH"
ENV_REPLAY_SYNC = PREFIX + "_REPLAY_SYNC"

OFF = "off"
ON = "on"
OBSERVE = "observe"
VERIFY = "verify"
#: Every mode the overlay can run in, ``off`` first (the default).
MODES: tuple[str, ...] = (OFF, ON, OBSERVE, VERIFY)

#: Spellings (after ``strip().lower()``) that mean off / false; unset counts as off too.
OFF_VALUES: frozenset[str] = frozenset({"", "0", "off", "false"})
#: Spellings that mean on / true.
ON_VALUES: frozenset[str] = frozenset({"1", "on", "true"})

ACCEPTED_MODE = "off (default; also 0, false, empty), on (1, true), observe, verify"
ACCEPTED_FLAG = "1, on, true to enable; 0, off, false or empty (the default) to disable"

#: The boolean flags and what each one does (the README's table, and the warnings, use these).
FLAGS: dict[str, str] = {
    ENV_STRICT: "verify raises on the first mismatch instead of counting it",
    ENV_FORCE: "install the aspects even where the compatibility gate refuses",
    ENV_DEBUG: "print tracebacks with the overlay's warnings and CLI errors",
}

#: ``ASCEND_GRAPH_PATCH_DISABLE=*`` disables every aspect (OpenTelemetry's convention).
ALL_ASPECTS = "*"

#: ``ASCEND_GRAPH_PATCH_TP_FAULT``: what a tensor-parallel worker does after the overlay raised an
#: update error the executor would not read (``fail_fast``): end itself, so the job fails now
#: (the default), or wait like stock until a collective times out.
TP_FAIL = "fail"
TP_WAIT = "wait"

#: ``ASCEND_GRAPH_PATCH_STALE_GRAPH``: what the overlay does when a FULL graph's capture ran
#: attention outside its graph path (``aspects/stale.py``): fail with one error naming the cause
#: (the default), or let the graph replay with its capture-time parameters, as stock does.
STALE_FAIL = "fail"
STALE_REPLAY = "replay"

#: ``ASCEND_GRAPH_PATCH_REPLAY_SYNC``: how a FULL replay is ordered after the previous step's
#: (``aspects/replay_order.py``): stock's host barrier, the whole device synchronised before
#: every replay (the default), or, for graphs the overlay owns, the update stream waiting on the
#: compute stream on the device (opt-in until proven on a device).
SYNC_DEVICE = "device"
SYNC_STREAM = "stream"

#: The variables that pick one of a few values: name -> (the values, the default first; what an
#: invalid value does). An invalid value reads as the default, the safe choice, with one line.
CHOICES: "dict[str, tuple[tuple[str, ...], str]]" = {
    ENV_TP_FAULT: ((TP_FAIL, TP_WAIT), "failing fast"),
    ENV_STALE_GRAPH: ((STALE_FAIL, STALE_REPLAY), "failing on a stale graph"),
    ENV_REPLAY_SYNC: ((SYNC_DEVICE, SYNC_STREAM), "keeping stock's barrier before every replay"),
}

#: Messages show at most this many characters of an environment value (then its length).
SHOWN_CHARS = 40


def _env(environ: "Mapping[str, str] | None") -> "Mapping[str, str]":
    return os.environ if environ is None else environ


def shown(value: str, limit: int = SHOWN_CHARS, quote: bool = True) -> str:
    """``value`` for a message: whole (quoted, unless ``quote`` is false) if short and printable,
    else a quoted prefix and the length (a 5,000-character or escape-laden variable must not flood
    or garble a warning line)."""
    if len(value) <= limit and value.isprintable():
        return repr(value) if quote else value
    printable = "".join(c if c.isprintable() else "?" for c in value[:limit])
    what = "characters" if value.isprintable() else "characters, not all printable"
    return f"{printable!r}... ({len(value)} {what})"


def parse_mode(value: "str | None") -> "tuple[str, str | None]":
    """Map a raw ``ASCEND_GRAPH_PATCH`` value to ``(mode, problem)``.

    ``problem`` is ``None`` for an accepted value, else one line for the caller to print; an
    unknown value always means off, because a typo must never switch the overlay on.
    """
    norm = (value or "").strip().lower()
    if norm in OFF_VALUES:
        return OFF, None
    if norm in ON_VALUES:
        return ON, None
    if norm in (OBSERVE, VERIFY):
        return norm, None
    return (
        OFF,
        f"ignoring {ENV_MODE}={shown(value or '')}: accepted values are {ACCEPTED_MODE}; "
        "staying off",
    )


def parse_flag(name: str, value: "str | None") -> "tuple[bool, str | None]":
    """Map a raw boolean flag to ``(enabled, problem)``; an invalid value reads as disabled."""
    norm = (value or "").strip().lower()
    if norm in ON_VALUES:
        return True, None
    if norm in OFF_VALUES:
        return False, None
    return (
        False,
        f"ignoring {name}={shown(value or '')}: accepted values are {ACCEPTED_FLAG}; left disabled",
    )


def mode(environ: "Mapping[str, str] | None" = None) -> str:
    """The effective mode (an invalid value reads as ``off``)."""
    return parse_mode(_env(environ).get(ENV_MODE))[0]


def _flag(name: str, environ: "Mapping[str, str] | None") -> bool:
    return parse_flag(name, _env(environ).get(name))[0]


def strict(environ: "Mapping[str, str] | None" = None) -> bool:
    """``ASCEND_GRAPH_PATCH_STRICT``: ``verify`` raises on a mismatch instead of counting."""
    return _flag(ENV_STRICT, environ)


def force(environ: "Mapping[str, str] | None" = None) -> bool:
    """``ASCEND_GRAPH_PATCH_FORCE``: install the aspects even if the compatibility gate refuses."""
    return _flag(ENV_FORCE, environ)


def debug(environ: "Mapping[str, str] | None" = None) -> bool:
    """``ASCEND_GRAPH_PATCH_DEBUG``: print tracebacks with our warnings and CLI errors."""
    return _flag(ENV_DEBUG, environ)


def status_dir(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """``ASCEND_GRAPH_PATCH_STATUS_DIR``: where each process writes its status file, or None."""
    value = _env(environ).get(ENV_STATUS_DIR, "").strip()
    return value or None


def parse_choice(name: str, value: "str | None") -> "tuple[str, str | None]":
    """Map a raw value of the choice variable ``name`` (:data:`CHOICES`) to ``(value, problem)``;
    unset, empty or invalid reads as the default (a typo never picks the other behaviour)."""
    values, fallback = CHOICES[name]
    norm = (value or "").strip().lower()
    if norm in ("", *values):
        return norm or values[0], None
    accepted = f"{values[0]} (default; also empty), " + ", ".join(values[1:])
    return values[0], (
        f"ignoring {name}={shown(value or '')}: accepted values are {accepted}; {fallback}"
    )


def choice(name: str, environ: "Mapping[str, str] | None" = None) -> str:
    """The effective value of the choice variable ``name``."""
    return parse_choice(name, _env(environ).get(name))[0]


def tp_fault(environ: "Mapping[str, str] | None" = None) -> str:
    """``ASCEND_GRAPH_PATCH_TP_FAULT``: ``fail`` (end the worker at once) or ``wait`` (stock's)."""
    return choice(ENV_TP_FAULT, environ)


def stale_graph(environ: "Mapping[str, str] | None" = None) -> str:
    """``ASCEND_GRAPH_PATCH_STALE_GRAPH``: ``fail`` (a stale graph ends the engine's start-up with
    one error) or ``replay`` (stock's: it replays with its capture-time attention parameters)."""
    return choice(ENV_STALE_GRAPH, environ)


def replay_sync(environ: "Mapping[str, str] | None" = None) -> str:
    """``ASCEND_GRAPH_PATCH_REPLAY_SYNC``: ``device`` (stock's barrier before every FULL replay)
    or ``stream`` (owned graphs: the update stream waits on the compute stream instead)."""
    return choice(ENV_REPLAY_SYNC, environ)


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


def unknown_aspects(known: "Iterable[str]", environ: "Mapping[str, str] | None" = None) -> str:
    """A problem line naming the ``_DISABLE`` entries that match no aspect, or ``""``."""
    names = {n.lower() for n in known}
    unknown = sorted(n for n in disabled_aspects(environ) if n != ALL_ASPECTS and n not in names)
    if not unknown:
        return ""
    named = ", ".join(shown(n, quote=False) for n in unknown)
    return (
        f"{ENV_DISABLE}: no aspect named {named} (ignored); "
        f"known aspects: {', '.join(sorted(names))}, or * for all"
    )


def problems(environ: "Mapping[str, str] | None" = None) -> list[str]:
    """One line per variable whose value is not accepted, and per unknown variable name."""
    env = _env(environ)
    found = []
    _, problem = parse_mode(env.get(ENV_MODE))
    if problem:
        found.append(problem)
    for name in FLAGS:
        _, problem = parse_flag(name, env.get(name))
        if problem:
            found.append(problem)
    for name in CHOICES:
        _, problem = parse_choice(name, env.get(name))
        if problem:
            found.append(problem)
    # ASCEND_GRAPH_PATCH_SIM is the simulator's (torch-npu-sim) older name for TORCH_NPU_SIM.
    known = {
        ENV_MODE,
        ENV_DISABLE,
        ENV_STATUS_DIR,
        *CHOICES,
        *FLAGS,
        PREFIX + "_SIM",
    }
    for name in sorted(env):
        if name.startswith(PREFIX + "_") and name not in known:
            found.append(
                f"unknown variable {shown(name, quote=False)} (ignored); "
                f"known: {', '.join(sorted(known))}"
            )
    return found
