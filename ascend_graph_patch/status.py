"""What the overlay did in this process, as a dict (Python API) and as text (`status`).

`snapshot()` reports: mode, the gate's verdict and reason per aspect group, aspects installed and
effective (first time each really ran), graphs owned and refused (with reasons), tasks per kind,
and the counters (updates owned / left to stock, fallbacks, verify mismatches, aspect errors).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from typing import Any

from ascend_graph_patch import mode as mode_env

DISTS = ("torch", "vllm", "vllm-ascend", "wrapt", "ascend-graph-patch")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def simulator_in_use() -> bool:
    module = sys.modules.get("torch_npu")
    if module is None:
        return False
    return bool(getattr(module, "__ascend_graph_patch_sim__", False)) or str(
        getattr(module, "__version__", "")
    ).endswith("+sim")


def real_torch_npu_present() -> bool:
    import importlib.machinery

    return importlib.machinery.PathFinder.find_spec("torch_npu") is not None


def _check_now() -> None:
    """Import the v1 seams here (through the simulator if asked) so the gate runs in-process."""
    from ascend_graph_patch import activation

    if mode_env.sim_requested() and "torch_npu" not in sys.modules:
        from ascend_graph_patch import sim

        sim.install()
    activation.enable(mode_env.mode() if mode_env.mode() != "off" else "observe")
    # vllm_ascend.ops first: importing attention_v1 first hits a circular import.
    for name in ("vllm_ascend.ops", "vllm_ascend.attention.attention_v1",
                 "vllm_ascend.compilation.acl_graph"):  # fmt: skip
        importlib.import_module(name)


def snapshot(check: bool = False) -> dict[str, Any]:
    from ascend_graph_patch import _bootstrap, state
    from ascend_graph_patch.core.registry import REGISTRY

    if check:
        _check_now()
    graphs = REGISTRY.graphs() if "ascend_graph_patch.aspects.context" in sys.modules else []
    tasks: dict[str, int] = {}
    for graph in graphs:
        for kind, n in graph.kinds().items():
            tasks[kind] = tasks.get(kind, 0) + n
    s = state.STATE
    gates = dict(s.gate)
    if s.mode != "off":
        from ascend_graph_patch.aspects import GROUPS

        for group, modules in GROUPS.items():
            if group not in gates:
                waiting = ", ".join(m for m in modules if m not in s.modules_seen)
                gates[group] = {"verdict": "pending", "reason": f"modules not loaded: {waiting}"}
    return {
        "mode": s.mode if s.mode != "off" else (getattr(_bootstrap, "MODE", None) or "off"),
        "env_mode": mode_env.mode(),
        "strict": mode_env.strict(),
        "force": mode_env.force(),
        "simulator": simulator_in_use(),
        "simulator_requested": mode_env.sim_requested(),
        "versions": {d: _version(d) for d in DISTS},
        "gate": gates,
        "aspects_installed": list(s.aspects_installed),
        "aspects_effective": list(s.aspects_effective),
        "modules_seen": list(s.modules_seen),
        "graphs_owned": len(graphs),
        "graphs_refused": {str(k): v for k, v in REGISTRY.refused.items()},
        "tasks_per_kind": tasks,
        "counters": dict(sorted(s.counters.items())),
    }


def format_text(snap: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    for key, value in snap.items():
        if isinstance(value, dict):
            if not value:
                rows.append((key, "-"))
            for sub, v in value.items():
                rows.append((f"{key}.{sub}", str(v)))
        elif isinstance(value, list):
            rows.append((key, ", ".join(map(str, value)) or "-"))
        else:
            rows.append((key, str(value)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
