"""The loader: runs in every Python process, decides whether the overlay wakes up.

Three ways in, one idempotent body: the ``ascend_graph_patch.pth`` line (every interpreter that
processes site-packages: engine core, spawned workers, Ray workers, vLLM's model-inspection
subprocess), the PEP 829 ``ascend_graph_patch.start`` entry (Python >= 3.15, where ``import`` lines
in ``.pth`` files are deprecated) and vLLM's ``vllm.general_plugins`` entry point (a second chance
where the ``.pth`` was not processed, e.g. site-packages reached through ``PYTHONPATH``).

Because it runs everywhere, the off path must cost nothing measurable: the ``.pth`` line repeats
:func:`definitely_off` inline and then imports nothing at all; the ``.start`` and plugin ways in
import only this module (see :func:`measure_startup`). Nothing heavy (torch, vllm, wrapt) is
touched unless the toggle is on. Whatever happens, the host program never sees an exception
from here: failures become one ``ascend-graph-patch: ...`` line on stderr and the process stays
stock.
"""

import os
import sys

from ascend_graph_patch import loader_state

_PREFIX = "ascend-graph-patch: "
#: Module name prefixes counted by :func:`measure_startup` (our own code and the patch primitive).
_STARTUP_MODULES = ("ascend_graph_patch", "wrapt")


def definitely_off() -> bool:
    """True when the toggle is off and no status directory is asked for: nothing to load at all
    (the ``.pth`` line's test)."""
    from ascend_graph_patch import settings

    env = os.environ
    return (
        env.get(settings.ENV_MODE, "").strip().lower() in settings.OFF_VALUES
        and not env.get(settings.ENV_STATUS_DIR, "").strip()
    )


def _warn(message: str) -> None:
    """One line on stderr; a traceback too when ``ASCEND_GRAPH_PATCH_DEBUG`` is set."""
    from ascend_graph_patch import settings

    try:
        sys.stderr.write(_PREFIX + message + "\n")
        if settings.debug() and sys.exc_info()[0] is not None:
            import traceback

            traceback.print_exc()
        sys.stderr.flush()
    except Exception:  # a closed or missing stderr must not break start-up either
        pass


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def bootstrap() -> None:
    """Read the toggle once per process; when it is on, hand over to ``activation.enable``.

    Idempotent: the first caller wins (normally the ``.pth``); later calls, such as vLLM's
    ``load_general_plugins`` in the same process, return at once. Never raises. What it decided
    is kept in ``loader_state``.
    """
    outcome = loader_state
    if outcome.BOOTSTRAPPED:
        return
    outcome.BOOTSTRAPPED = True
    if definitely_off():
        outcome.MODE = "off"
        return
    try:
        from ascend_graph_patch import settings

        outcome.MODE = settings.mode()
        for problem in settings.problems():
            _warn(problem)
        directory = settings.status_dir()
        if directory is not None:  # measurement, in every mode (off included): see status_files
            from ascend_graph_patch import status_files

            status_files.start(directory)
        if outcome.MODE == settings.OFF:
            return
        from ascend_graph_patch import activation

        activation.enable(outcome.MODE)
    except Exception as exc:  # the host program must never break because of us
        outcome.ENABLE_ERROR = _describe(exc)
        _warn(
            f"activation failed (mode={outcome.MODE}), continuing without the overlay: "
            f"{outcome.ENABLE_ERROR}"
        )


def _sum_importtime(stderr: str, prefixes: tuple[str, ...] = _STARTUP_MODULES) -> float:
    """Milliseconds spent importing ``prefixes`` modules, from ``-X importtime`` output.

    Takes the *cumulative* time of each outermost matching import, so stdlib modules pulled in
    on our behalf count and nested matches are not counted twice. Lines are printed children
    first, hence the walk from the end (parents before children).
    """
    total_us = 0
    stack: list[tuple[int, bool]] = []  # (depth, inside a counted import)
    for line in reversed(stderr.splitlines()):
        if not line.startswith("import time:") or "|" not in line:
            continue
        fields = line[len("import time:") :].split("|")
        if len(fields) != 3 or not fields[1].strip().isdigit():
            continue  # the header line
        cumulative = int(fields[1])
        raw_name = fields[2]
        name = raw_name.strip()
        depth = (len(raw_name) - len(raw_name.lstrip(" "))) // 2
        while stack and stack[-1][0] >= depth:
            stack.pop()
        covered = bool(stack) and stack[-1][1]
        matched = name.split(".")[0] in prefixes
        if matched and not covered:
            total_us += cumulative
        stack.append((depth, covered or matched))
    return total_us / 1000.0


def measure_startup(
    mode: str, repeats: int = 5, python: str | None = None, env: dict[str, str] | None = None
) -> float:
    """Median start-up cost of the loader in ms for ``ASCEND_GRAPH_PATCH=mode``.

    Runs ``python -X importtime -c pass`` ``repeats`` times (the ``.pth`` must be installed in
    that interpreter's site-packages) and sums the import time of ``ascend_graph_patch*`` and
    ``wrapt*``. Import time is what the loader adds to every process; the call itself is
    negligible next to it. One warm-up run keeps ``.pyc`` compilation out of the numbers.
    """
    import statistics
    import tempfile

    from ascend_graph_patch import supervisor  # stdlib only; its children end with this process

    run_env = dict(os.environ if env is None else env)
    run_env["ASCEND_GRAPH_PATCH"] = mode
    # Installed wheels have .pyc files; a dev shell with PYTHONDONTWRITEBYTECODE would measure
    # compilation instead. A private pycache keeps the source tree clean.
    run_env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [python or sys.executable, "-X", "importtime", "-c", "pass"]
    samples = []
    with tempfile.TemporaryDirectory(prefix="agp-pycache-") as cache:
        run_env["PYTHONPYCACHEPREFIX"] = cache
        for i in range(repeats + 1):
            proc = supervisor.run(cmd, env=run_env, timeout=120)
            proc.check_returncode()
            if i:
                samples.append(_sum_importtime(proc.stderr))
    return statistics.median(samples)
