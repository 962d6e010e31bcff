"""``ascend-graph-patch <subcommand> [options]``: the command-line shell.

Subcommands are data (:data:`SUBCOMMANDS`) and are imported only when needed, so ``status`` does
not pay for the A/B harness and a subcommand whose module is not installed simply does not exist.
A subcommand is any object (usually a module) with ``add_arguments(parser)`` and
``run(args) -> int``; an optional ``HELP`` string (else the first docstring line) is its one-line
description in ``--help``.

Errors never end in a traceback (unless ``ASCEND_GRAPH_PATCH_DEBUG=1``): one line, non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

PROG = "ascend-graph-patch"

#: name -> ``"module"`` or ``"module:attribute"`` of an object exposing add_arguments / run.
SUBCOMMANDS: dict[str, str] = {
    "status": "ascend_graph_patch.cli:_status_command",
    "ab": "ascend_graph_patch.ab.command",
    "bench": "ascend_graph_patch.bench.command",
}

#: Distributions whose versions ``status`` reports (the fallback snapshot).
VERSIONED_DISTS = ("torch", "torch-npu", "vllm", "vllm-ascend", "wrapt", "ascend-graph-patch")


class CommandUnavailable(Exception):
    """The subcommand's module is not installed (its entry is skipped)."""


def load_command(target: str) -> Any:
    """Import ``module[:attr]``; :class:`CommandUnavailable` only if that module itself is missing.

    An import error *inside* an existing module is a bug and propagates.
    """
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise CommandUnavailable(target) from exc
        raise
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    if not (callable(getattr(obj, "add_arguments", None)) and callable(getattr(obj, "run", None))):
        raise TypeError(f"{target} has no add_arguments(parser) / run(args)")
    return obj


def _help_of(command: Any) -> str | None:
    text = getattr(command, "HELP", None) or (getattr(command, "__doc__", None) or "").strip()
    return text.splitlines()[0] if text else None


def build_parser(commands: dict[str, Any]) -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per loaded command."""
    from ascend_graph_patch import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Graph-owned ACL graph task updates for vllm-ascend: status and A/B tools.",
        epilog="Enable the overlay with ASCEND_GRAPH_PATCH=on|observe|verify (default off).",
    )
    parser.add_argument("-V", "--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="<subcommand>")
    for name, command in commands.items():
        help_text = _help_of(command)
        sp = sub.add_parser(name, help=help_text, description=help_text)
        command.add_arguments(sp)
        sp.set_defaults(_run=command.run)
    return parser


def _available(names: Sequence[str]) -> dict[str, Any]:
    """Load the named commands, skipping those whose module is missing or broken."""
    loaded = {}
    for name in names:
        try:
            loaded[name] = load_command(SUBCOMMANDS[name])
        except CommandUnavailable:
            continue
        except Exception:
            if _debug():
                raise
    return loaded


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand token: the top-level options (-h, -V) take no values, so the first word."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def _debug() -> bool:
    from ascend_graph_patch import mode

    return mode.debug()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    try:
        name = _chosen(args_in)
        commands: dict[str, Any] = {}
        if name in SUBCOMMANDS:
            try:  # load only what is run; a missing module falls through to "invalid choice"
                commands = {name: load_command(SUBCOMMANDS[name])}
            except CommandUnavailable:
                commands = {}
        if not commands:  # help, version, no or unknown subcommand: list what is installed
            commands = _available(list(SUBCOMMANDS))
        parser = build_parser(commands)
        args = parser.parse_args(args_in)
        run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
        if run is None:
            parser.print_help(sys.stderr)
            return 2
        return int(run(args) or 0)
    except SystemExit as exc:  # argparse: --help / --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if _debug():
            import traceback

            traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        detail = f": {first}" if first else ""
        print(f"{PROG}: error: {type(exc).__name__}{detail}", file=sys.stderr)
        return 1


# --- status ------------------------------------------------------------------------------------


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in VERSIONED_DISTS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _loader_files() -> list[str]:
    """Installed loader files (``.pth`` / ``.start``) in this interpreter's site directories."""
    import site
    import sysconfig

    dirs = dict.fromkeys([sysconfig.get_paths()["purelib"], *site.getsitepackages()])
    found = []
    for d in dirs:
        for name in ("ascend_graph_patch.pth", "ascend_graph_patch.start"):
            path = os.path.join(d, name)
            if os.path.isfile(path):
                found.append(path)
    return found


def fallback_snapshot(check: bool = False) -> dict[str, Any]:
    """What ``status`` shows when ``ascend_graph_patch.status`` is not installed: config + stack.

    ``check`` is accepted for signature parity; this minimal view has no gate to run.
    """
    from ascend_graph_patch import _bootstrap, mode

    versions = _versions()
    return {
        "mode": mode.mode(),
        "mode_env": os.environ.get(mode.ENV_MODE),
        "strict": mode.strict(),
        "force": mode.force(),
        "disabled_aspects": sorted(mode.disabled_aspects()),
        "bootstrap_mode": _bootstrap.MODE,
        "enable_error": _bootstrap.ENABLE_ERROR,
        "sim_requested": mode.sim_requested(),
        "torch_npu_real": versions.get("torch-npu") is not None,
        "loader_files": _loader_files(),
        "versions": versions,
    }


def _snapshot(check: bool) -> dict[str, Any]:
    try:
        status = importlib.import_module("ascend_graph_patch.status")
    except ModuleNotFoundError as exc:
        if exc.name != "ascend_graph_patch.status":
            raise
        return fallback_snapshot(check)
    return dict(status.snapshot(check=check))


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(data, dict) and data:
        rows = []
        for key, value in data.items():
            rows.extend(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return rows
    if isinstance(data, (list, tuple, set, frozenset)):
        text = ", ".join(str(v) for v in data) if data else "-"
    elif data is None or data == {}:
        text = "-"
    else:
        text = str(data)
    return [(prefix, text)]


def format_text(snapshot: dict[str, Any]) -> str:
    """One ``key: value`` per line, values aligned; nested dicts become dotted keys."""
    rows = _flatten(snapshot)
    width = max((len(k) for k, _ in rows), default=0) + 1
    return "\n".join(f"{key + ':':<{width}} {value}" for key, value in rows)


def check_failed(snapshot: dict[str, Any]) -> bool:
    """``status --check`` fails on ``ok: False`` or any gate group whose verdict is ``refused``."""
    if snapshot.get("ok") is False:
        return True
    gate = snapshot.get("gate") or {}
    return any(isinstance(v, dict) and v.get("verdict") == "refused" for v in gate.values())


class _StatusCommand:
    """Show mode, environment, loader and stack versions (and the gate with --check)."""

    HELP = "show the overlay's mode, loader, gate and stack versions"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--check",
            action="store_true",
            help="also run the compatibility checks (imports vllm-ascend; slow); exit 1 on failure",
        )

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        snap = _snapshot(args.check)
        if args.json:
            print(json.dumps(snap, indent=2, sort_keys=False, default=str))
        else:
            print(format_text(snap))
        return 1 if args.check and check_failed(snap) else 0


_status_command = _StatusCommand()


if __name__ == "__main__":
    sys.exit(main())
