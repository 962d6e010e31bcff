"""``report.png``: the correctness matrix first (case x arm), then host update time where any.

The matrix is what the A/B is for (does the overlay give stock's / eager's tokens, and where is
stock itself wrong); the timing panels appear only when some timed arm has samples (a real host, or
the simulator's harness workloads), so an arm that crashed or a run without timing never breaks
the picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ascend_graph_patch.ab.compare import TIMED_ARMS, Summary, case_state
from ascend_graph_patch.ab.orchestrate import ABConfig

_COLORS = {"stock": "tab:red", "patched": "tab:blue", "stream": "tab:purple", "verify": "tab:green"}
_ARMS = ("eager", "stock", "patched", "stream", "verify")
_GOOD, _KNOWN, _BAD, _NONE = "#9bd69b", "#f5c77e", "#ef8a8a", "#eeeeee"


def cell(text: str | None) -> tuple[str, str]:
    """(short label, colour) of one correctness entry."""
    if not text:
        return "-", _NONE
    if text in ("equal", "reference"):
        return text, _GOOD
    if text.startswith("fails (known)"):
        parts = text.split(": ")
        return "fails (known)" + (f"\n{parts[1]}" if len(parts) > 1 else ""), _KNOWN
    if text.startswith("differs"):
        return "DIFFERS", _BAD
    if "token(s) differ" in text:
        return "DIFFERS", _BAD
    return text.split(":", 1)[0], _BAD


def details(figures: dict[str, Any]) -> list[str]:
    """What the arm's overlay did and its acceptance rate, under its correctness label."""
    lines = []
    if figures.get("graphs_owned") is not None:
        lines.append(
            f"{figures['graphs_owned']} graphs / {figures.get('tasks_updated') or 0} tasks"
        )
    if figures.get("verify_tasks") is not None:
        lines[-1:] = [f"verify: {figures.get('verify_mismatches') or 0} mismatches"]
    if figures.get("fallbacks"):
        lines.append(f"{figures['fallbacks']} fallbacks")
    if figures.get("acceptance") is not None:
        lines.append(f"acceptance {figures['acceptance']:.2f}")
    return lines


def _samples(cfg: ABConfig, run: Any) -> tuple[list[int], list[float]]:
    xs: list[int] = []
    ys: list[float] = []
    x = 0
    for name in cfg.cases:
        state, case = case_state(run, name)
        samples = case.get("update_ns", []) if state == "ok" and case else []
        for i, ns in enumerate(samples):
            if i >= cfg.warmup:
                xs.append(x + i)
                ys.append(ns / 1000.0)
        x += max(len(samples), 1)
    return xs, ys


def render(cfg: ABConfig, summary: Summary, runs: list[Any], path: Path) -> None:
    """Raises ImportError without matplotlib (the caller then skips the picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = {r.index: _samples(cfg, r) for r in runs if r.arm in TIMED_ARMS}
    has_timing = any(ys for _, ys in timed.values())
    arms = [a for a in _ARMS if any(a in c.correctness for c in summary.cases)]
    n = max(len(summary.cases), 1)
    height = 1.2 + 0.45 * n + (3.2 if has_timing else 0.0)
    fig = plt.figure(figsize=(10, height))
    grid = fig.add_gridspec(
        2 if has_timing else 1,
        2,
        height_ratios=[0.45 * n + 0.6, 3.0] if has_timing else [1],
        width_ratios=[2.2, 1],
    )
    ax = fig.add_subplot(grid[0, :])
    columns = [*arms, "verdict"]
    for row, case in enumerate(summary.cases):
        for col, arm in enumerate(columns):
            if arm == "verdict":
                label = case.verdict
                color = _GOOD if case.verdict.startswith("PASS") else _BAD
            else:
                label, color = cell(case.correctness.get(arm))
                label = "\n".join([label, *details(case.figures.get(arm) or {})])
            ax.add_patch(plt.Rectangle((col, row), 1, 1, facecolor=color, edgecolor="white"))
            ax.text(col + 0.5, row + 0.5, label, ha="center", va="center", fontsize=6.5)
    ax.set_xlim(0, len(columns))
    ax.set_ylim(n, 0)
    ax.set_xticks([i + 0.5 for i in range(len(columns))], columns, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(summary.cases))], [c.name for c in summary.cases])
    ax.tick_params(axis="y", labelsize=7, length=0)
    ax.tick_params(axis="x", length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    what = "every request's output" if cfg.workload == "serve" else "greedy tokens"
    ax.set_title(f"{what} against the reference (eager)", fontsize=9, pad=18)

    if has_timing:
        ax1 = fig.add_subplot(grid[1, 0])
        ax2 = fig.add_subplot(grid[1, 1])
        labelled: set[str] = set()
        for run in runs:
            xs, ys = timed.get(run.index, ([], []))
            if not ys:
                continue
            label = run.arm if run.arm not in labelled else None
            labelled.add(run.arm)
            ax1.plot(xs, ys, ".", ms=2, alpha=0.6, color=_COLORS.get(run.arm), label=label)
        ax1.set_yscale("log")
        ax1.set_xlabel("replay step (cases back to back)", fontsize=8)
        ax1.set_ylabel("host update time [us]", fontsize=8)
        ax1.legend(loc="lower right", fontsize=7)
        names, speedups, errs = [], [], []
        for case in summary.cases:
            if case.ratio:
                names.append(case.name)
                speedups.append(1.0 / case.ratio)
                errs.append((case.noise or 0.0) / case.ratio)
        if names:
            ax2.barh(names, speedups, xerr=errs, color="tab:blue", alpha=0.8)
            ax2.invert_yaxis()
            ax2.tick_params(axis="y", labelsize=6)
        ax2.axvline(1.0, color="k", lw=0.8)
        ax2.set_xlabel("speedup (stock / patched); bar = A-A", fontsize=8)
    fig.suptitle(f"ascend-graph-patch ab: {summary.verdict}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
