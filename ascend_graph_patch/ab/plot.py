"""``update_time.png``: per-step host update time per arm run, and the speedup per case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ascend_graph_patch.ab.compare import Summary, case_state
from ascend_graph_patch.ab.orchestrate import ABConfig

_COLORS = {"stock": "tab:red", "patched": "tab:blue", "verify": "tab:green"}


def update_time(cfg: ABConfig, summary: Summary, runs: list[Any], path: Path) -> None:
    """Raises ImportError without matplotlib (the caller then skips the picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2.2, 1]})
    boundaries: list[tuple[int, str]] = []
    labelled: set[str] = set()
    for run in runs:
        if run.arm == "verify":
            continue  # verify computes both updates: not a timing arm
        xs, ys, x = [], [], 0
        for name in cfg.cases:
            state, case = case_state(run, name)
            if run.index == 0:
                boundaries.append((x, name))
            n = cfg.steps if cfg.workload == "sim" else 0
            if state == "ok" and case:
                samples = case.get("update_ns", [])
                n = max(n, len(samples))
                for i, ns in enumerate(samples):
                    if i >= cfg.warmup:
                        xs.append(x + i)
                        ys.append(ns / 1000.0)
            x += n
        label = run.arm if run.arm not in labelled else None
        labelled.add(run.arm)
        ax1.plot(xs, ys, ".", ms=3, alpha=0.6, color=_COLORS.get(run.arm), label=label)
    for x0, name in boundaries:
        ax1.axvline(x0, color="0.85", lw=0.8)
        ax1.text(
            x0,
            1.0,
            " " + name,
            transform=ax1.get_xaxis_transform(),
            fontsize=7,
            rotation=90,
            va="top",
            color="0.4",
        )
    ax1.set_yscale("log")
    ax1.set_xlabel("replay step (cases back to back)")
    ax1.set_ylabel("host update time per step [us]")
    ax1.set_title("per-step host update time per arm")
    ax1.legend(loc="lower right")

    names, speedups, errs = [], [], []
    for case in summary.cases:
        if case.ratio:
            names.append(case.name)
            speedups.append(1.0 / case.ratio)
            errs.append((case.noise or 0.0) / case.ratio)
    if names:
        ax2.barh(names, speedups, xerr=errs, color="tab:blue", alpha=0.8)
        ax2.invert_yaxis()
    ax2.axvline(1.0, color="k", lw=0.8)
    ax2.set_xlabel("speedup (stock / patched median); bar = A-A noise")
    ax2.set_title("speedup of the host update")
    fig.suptitle(f"ascend-graph-patch ab ({summary.verdict})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
