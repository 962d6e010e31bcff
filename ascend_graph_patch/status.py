"""What the overlay did in this process, as a dict (Python API) and as text (``status``).

:func:`snapshot` reports the configuration (mode, flags, problems with the environment), the
installed stack, the gate's verdict and reason per aspect group, the aspects installed and
effective (the first time each really ran), the graphs owned and refused (with reasons), tasks per
kind, and the counters (updates owned / left to stock, fallbacks, verify mismatches, errors).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ascend_graph_patch import loader_state, settings
from ascend_graph_patch.lines import installed_version

#: Distributions whose versions ``status`` reports.
DISTS = (
    "torch",
    "torch-npu",
    "torch-npu-sim",
    "vllm",
    "vllm-ascend",
    "wrapt",
    "ascend-graph-patch",
)
#: The files the loader installs into site-packages.
LOADER_FILES = ("ascend_graph_patch.pth", "ascend_graph_patch.start")


def simulator_in_use() -> bool:
    """Whether the ``torch_npu`` in this process is a simulator (it says so on the module)."""
    module = sys.modules.get("torch_npu")
    return module is not None and bool(getattr(module, "__simulated__", False))


def loader_files() -> list[str]:
    """Installed loader files in this interpreter's site directories."""
    import site
    import sysconfig

    dirs = dict.fromkeys([sysconfig.get_paths()["purelib"], *site.getsitepackages()])
    return [
        os.path.join(d, name)
        for d in dirs
        for name in LOADER_FILES
        if os.path.isfile(os.path.join(d, name))
    ]


def loader_warnings(environ: dict[str, str] | None = None) -> list[str]:
    """Where the overlay, though asked for, may not load at all (nothing of ours would run to
    say so then): said here, by ``status``."""
    env = os.environ if environ is None else environ
    found = []
    plugins = env.get("VLLM_PLUGINS")
    if settings.mode(env) != settings.OFF and plugins is not None:
        allowed = {p.strip() for p in plugins.split(",") if p.strip()}
        if "ascend_graph_patch" not in allowed:
            found.append(
                f"VLLM_PLUGINS={settings.shown(plugins)} leaves out ascend_graph_patch: an "
                "interpreter that "
                "skips the .pth loader (python -S, site-packages reached through PYTHONPATH) "
                "will not load the overlay; add ascend_graph_patch to VLLM_PLUGINS"
            )
    if settings.mode(env) != settings.OFF and not loader_files():
        found.append(
            "no ascend_graph_patch.pth in this interpreter's site-packages: only "
            "vLLM's general-plugin entry point can load the overlay here"
        )
    return found


def _check_now() -> None:
    """Import the line's seam modules here so the gate runs in this process (``status
    --check``); the line lists them in an order that imports."""
    from ascend_graph_patch import activation, gate

    mode = settings.mode()
    activation.enable(mode if mode != settings.OFF else settings.OBSERVE)
    for name in gate.candidate_line().check_imports:
        importlib.import_module(name)


def inactive(mode: str, gates: dict[str, dict[str, str]], probe: bool = False) -> list[str]:
    """Why the overlay, though asked for, is not active here: each line as the loader printed it
    (activation failed, the installer could not start, a gate group refused or failed to
    install). Empty when it is active, waiting for vllm_ascend, or off. ``probe``: also import
    the installer as the trigger would, if it has not run here (the ``status`` command)."""
    if mode == settings.OFF:
        return []
    found = []
    if loader_state.ENABLE_ERROR is not None:
        found.append(
            f"activation failed (mode={mode}), continuing without the overlay: "
            f"{loader_state.ENABLE_ERROR}"
        )
    if loader_state.START_ERROR is not None:
        found.append(loader_state.START_ERROR)
    elif probe and "ascend_graph_patch.installer" not in sys.modules:
        from ascend_graph_patch import activation

        problem = activation.installer_problem()
        if problem is not None:
            found.append(problem)
    for group, verdict in gates.items():
        if isinstance(verdict, dict) and verdict.get("verdict") == "refused":
            found.append(f"not installed ({group}): {verdict.get('reason')}")
    return found


def snapshot(check: bool = False, probe: bool = True) -> dict[str, Any]:
    """This process's report; ``probe``: see :func:`inactive` (the status files do not probe:
    every process writes one at exit, most of them never load vllm-ascend)."""
    from ascend_graph_patch import state

    if check:
        _check_now()
    graphs: list[Any] = []
    refused: dict[str, str] = {}
    if "ascend_graph_patch.core.registry" in sys.modules:
        from ascend_graph_patch.core.registry import REGISTRY

        graphs = REGISTRY.graphs()
        refused = {str(k): v for k, v in REGISTRY.refused.items()}
    tasks: dict[str, int] = {}
    for graph in graphs:
        for kind, n in graph.kinds().items():
            tasks[kind] = tasks.get(kind, 0) + n
    s = state.STATE
    gates = dict(s.gate)
    if s.mode != settings.OFF:
        from ascend_graph_patch import gate
        from ascend_graph_patch.aspects import groups

        for group, modules in groups(gate.candidate_line()).items():
            if group not in gates:
                waiting = ", ".join(m for m in modules if m not in s.modules_seen)
                gates[group] = {"verdict": "pending", "reason": f"modules not loaded: {waiting}"}
    mode = s.mode if s.mode != settings.OFF else (loader_state.MODE or settings.OFF)
    fault = getattr(sys.modules.get("ascend_graph_patch.fail_fast"), "LAST", None)
    return {
        "mode": mode,
        "inactive": inactive(settings.mode() if mode == settings.OFF else mode, gates, probe),
        "env_mode": settings.mode(),
        "strict": settings.strict(),
        "force": settings.force(),
        "stale_graph": settings.stale_graph(),
        "replay_sync": settings.replay_sync(),
        "disabled_aspects": sorted(settings.disabled_aspects()),
        "environment_problems": settings.problems() + loader_warnings(),
        "enable_error": loader_state.ENABLE_ERROR,
        "simulator": simulator_in_use(),
        "loader_files": loader_files(),
        "versions": {d: installed_version(d) for d in DISTS},
        "pid": os.getpid(),
        "gate": gates,
        "aspects_installed": list(s.aspects_installed),
        "aspects_effective": list(s.aspects_effective),
        "modules_seen": list(s.modules_seen),
        "graphs_owned": len(graphs),
        "graphs_refused": refused,
        "tasks_per_kind": tasks,
        "counters": dict(sorted(s.counters.items())),
        "fault": fault,
    }


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(data, dict) and data:
        rows = []
        for key, value in data.items():
            rows.extend(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return rows
    if isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        rows = []
        for i, value in enumerate(data):
            rows.extend(_flatten(value, f"{prefix}.{i}" if prefix else str(i)))
        return rows
    if isinstance(data, (list, tuple, set, frozenset)):
        text = ", ".join(str(v) for v in data) if data else "-"
    elif data is None or data == {}:
        text = "-"
    else:
        text = str(data)
    return [(prefix, text)]


def format_text(snap: dict[str, Any]) -> str:
    """One ``key: value`` per line, values aligned; nested dicts become dotted keys."""
    rows = _flatten(snap)
    width = max((len(k) for k, _ in rows), default=0) + 1
    return "\n".join(f"{key + ':':<{width}} {value}" for key, value in rows)


def check_failed(snap: dict[str, Any]) -> bool:
    """``status --check`` fails when any gate group's verdict is ``refused``."""
    gate = snap.get("gate") or {}
    return any(isinstance(v, dict) and v.get("verdict") == "refused" for v in gate.values())
