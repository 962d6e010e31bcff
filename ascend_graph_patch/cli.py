"""``ascend-graph-patch <subcommand> [options]``: the command-line shell.

The overlay brings ``status`` and ``ab``. Other distributions add subcommands through the
``ascend_graph_patch.commands`` entry-point group (the simulator, torch-npu-sim, adds ``bench``
and ``soak``), so the overlay never imports them and a subcommand whose distribution is not
installed simply does not exist. A subcommand is any object (usually a module) with
``add_arguments(parser)`` and ``run(args) -> int``; an optional ``HELP`` string (else the first
docstring line) is its one-line description in ``--help``. Only the subcommand that runs is
imported.

Errors never end in a traceback (unless ``ASCEND_GRAPH_PATCH_DEBUG=1``): one line, non-zero exit.
A subcommand runs under ``supervisor.supervise``: SIGTERM, SIGINT and SIGHUP end it like Ctrl-C
(exit status 128 + the signal's number), and every process it started stops with it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

PROG = "ascend-graph-patch"
#: Entry-point group through which other distributions add subcommands.
COMMANDS_GROUP = "ascend_graph_patch.commands"

#: The overlay's own subcommands: name -> ``"module"`` or ``"module:attribute"``.
BUILTIN: dict[str, str] = {
    "status": "ascend_graph_patch.cli:status_command",
    "ab": "ascend_graph_patch.ab.command",
}


class CommandUnavailable(Exception):
    """The subcommand's module is not installed (its entry is skipped)."""


def subcommands() -> dict[str, str]:
    """Every subcommand target: the built-ins, then those added through entry points."""
    table = dict(BUILTIN)
    for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        table.setdefault(ep.name, ep.value)
    return table


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


def _available(table: dict[str, str]) -> dict[str, Any]:
    """Load every command for ``--help``, skipping those whose module is missing or broken."""
    loaded = {}
    for name, target in table.items():
        try:
            loaded[name] = load_command(target)
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
    from ascend_graph_patch import settings

    return settings.debug()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    from ascend_graph_patch import supervisor  # stdlib only; also names an interruption below

    args_in = list(sys.argv[1:] if argv is None else argv)
    try:
        table = subcommands()
        name = _chosen(args_in)
        commands: dict[str, Any] = {}
        if name in table:
            try:  # load only what is run; a missing module falls through to "invalid choice"
                commands = {name: load_command(table[name])}
            except CommandUnavailable:
                commands = {}
        if not commands:  # help, version, no or unknown subcommand: list what is installed
            commands = _available(table)
        parser = build_parser(commands)
        args = parser.parse_args(args_in)
        run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
        if run is None:
            parser.print_help(sys.stderr)
            return 2
        # SIGTERM, SIGINT and SIGHUP end the command like Ctrl-C; every process it started
        # stops with it, also if it is killed outright (supervisor's guardian).
        with supervisor.supervise():
            return int(run(args) or 0)
    except SystemExit as exc:  # argparse: --help / --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt as exc:  # supervisor.Interrupted: 128 + the signal's number
        name, code = supervisor.interruption(exc)
        print(f"{PROG}: interrupted ({name})", file=sys.stderr)
        return code
    except Exception as exc:
        if _debug():
            import traceback

            traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        detail = f": {first}" if first else ""
        print(f"{PROG}: error: {type(exc).__name__}{detail}", file=sys.stderr)
        return 1


class _StatusCommand:
    """Show the overlay's mode, environment, loader, stack versions (and the gate with --check)."""

    HELP = "show the overlay's mode, loader, gate and stack versions"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--check",
            action="store_true",
            help="also run the compatibility checks (imports vllm-ascend; slow); exit 1 on failure",
        )
        parser.add_argument(
            "--from",
            dest="from_dir",
            metavar="DIR",
            help="merge the per-process status files written to DIR by processes that ran with "
            "ASCEND_GRAPH_PATCH_STATUS_DIR=DIR (engine core, tensor-parallel workers)",
        )

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from ascend_graph_patch import status

        if args.from_dir is not None:
            return _status_from(args.from_dir, args.json)
        snap = status.snapshot(check=args.check)
        if args.json:
            print(json.dumps(snap, indent=2, default=str))
        else:
            print(status.format_text(snap))
        return 1 if args.check and status.check_failed(snap) else 0


def _status_from(directory: str, as_json: bool) -> int:
    """``status --from DIR``: the merged status files; each one left out is named, with why."""
    from ascend_graph_patch import status, status_files

    snaps, skipped = status_files.scan(directory)
    if not snaps:
        named = "; ".join(f"{s['file']}: {s['reason']}" for s in skipped)
        print(
            f"{PROG} status: no readable status files in {directory}"
            + (f" (skipped {named})" if named else ""),
            file=sys.stderr,
        )
        return 1
    merged = status_files.merge(snaps, skipped)
    if as_json:
        print(json.dumps(merged, indent=2))
        return 0
    shown = {k: v for k, v in merged.items() if k != "skipped"}
    print(status.format_text(shown))
    for entry in merged["skipped"]:
        print(f"skipped: {entry['file']}: {entry['reason']}")
    return 0


status_command = _StatusCommand()


if __name__ == "__main__":
    sys.exit(main())
