"""The verdict table (text), ``report.json``, ``report.md`` and the plot of a :class:`Summary`."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from ascend_graph_patch.ab.compare import PASS, PASS_KNOWN, CaseResult, Summary
from ascend_graph_patch.ab.orchestrate import ABConfig

COLUMNS = (
    "scenario",
    "stock",
    "patched",
    "verify",
    "tokens",
    "logits |d|",
    "eager |d|",
    "stock us",
    "patched us",
    "ratio",
    "A-A",
    "verdict",
)


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def _us(case: CaseResult, arm: str) -> str:
    t = case.timing.get(arm)
    if t is None or t.median_us is None:
        return "-"
    return f"{t.median_us:.0f} (p90 {t.p90_us:.0f})"


def rows(summary: Summary, with_verify: bool) -> list[list[str]]:
    out = []
    for c in summary.cases:
        row = [
            c.name,
            c.arms.get("stock", "-"),
            c.arms.get("patched", "-"),
            c.arms.get("verify", "-"),
            c.tokens,
            _num(c.logits_max_abs),
            _num(c.eager_max_abs),
            _us(c, "stock"),
            _us(c, "patched"),
            "-" if c.ratio is None else f"{c.ratio:.2f}x",
            "-" if c.noise is None else f"{c.noise:.1%}",
            c.verdict,
        ]
        if not with_verify:
            del row[3]
        out.append(row)
    return out


def _columns(with_verify: bool) -> list[str]:
    cols = list(COLUMNS)
    if not with_verify:
        cols.remove("verify")
    return cols


def title(cfg: ABConfig) -> str:
    if cfg.workload == "vllm":
        what = f"vLLM {cfg.model}, {len(cfg.prompts or []) or 8} prompts x {cfg.max_tokens} tokens"
    else:
        what = f"simulator, {len(cfg.cases)} scenario(s) x {cfg.steps} steps"
    return f"ascend-graph-patch ab: {what}, seed {cfg.seed}"


def verdict_line(summary: Summary) -> str:
    n = len(summary.cases)
    good = sum(c.verdict in (PASS, PASS_KNOWN) for c in summary.cases)
    known = sum(c.verdict == PASS_KNOWN for c in summary.cases)
    extra = f", {known} where stock fails (known)" if known else ""
    return (
        f"VERDICT: {summary.verdict}  ({good}/{n} cases pass{extra}; "
        f"host update time: {summary.speed})"
    )


def text_table(cfg: ABConfig, summary: Summary) -> str:
    with_verify = cfg.verify
    cols = _columns(with_verify)
    body = rows(summary, with_verify)
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *body, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(v).ljust(w) for v, w in zip(cells, widths, strict=True)).rstrip()

    out = [title(cfg)]
    out.append(
        "arms: "
        + ", ".join(f"{r['arm']}({r['status']}, {r['seconds']:.0f}s)" for r in summary.runs)
    )
    out.append(line(cols))
    out.append(line(["-" * w for w in widths]))
    out += [line(r) for r in body]
    out.append("")
    out.append(verdict_line(summary))
    for problem in summary.problems:
        out.append(f"  - {problem}")
    return "\n".join(out)


def markdown(cfg: ABConfig, summary: Summary, plot_name: str | None) -> str:
    cols = _columns(cfg.verify)
    body = rows(summary, cfg.verify)
    md = [f"# {title(cfg)}", "", f"**{verdict_line(summary)}**", ""]
    if summary.problems:
        md += ["## Problems", ""] + [f"- {p}" for p in summary.problems] + [""]
    header = " | ".join(c.replace("|", "\\|") for c in cols)
    md += ["## Cases", "", f"| {header} |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |" for r in body]
    md += [
        "",
        "Host update time: microseconds per replay step (median, p90) of the runner's "
        f"update call, first {cfg.warmup} step(s) of each case excluded; ratio = patched / "
        "stock; A-A = largest relative spread of per-run medians within one arm (noise floor).",
    ]
    notes = [(c.name, n) for c in summary.cases for n in c.notes]
    if notes:
        md += ["", "## Notes", ""] + [f"- {name}: {n}" for name, n in notes]
    md += [
        "",
        "## Arms (in run order)",
        "",
        "| # | arm | ASCEND_GRAPH_PATCH | status | seconds | pid | VLLM_CACHE_ROOT |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summary.runs:
        md.append(
            f"| {r['index']} | {r['arm']} | {r['mode']} | {r['status']} | "
            f"{r['seconds']:.1f} | {r['pid'] or '-'} | `{r['cache_root']}` |"
        )
    if plot_name:
        md += ["", f"![per-step host update time]({plot_name})"]
    return "\n".join(md) + "\n"


def config_json(cfg: ABConfig) -> dict[str, Any]:
    return {
        "workload": cfg.workload,
        "cases": cfg.cases,
        "steps": cfg.steps,
        "seed": cfg.seed,
        "repeats": cfg.repeats,
        "verify": cfg.verify,
        "timeout": cfg.timeout,
        "warmup": cfg.warmup,
        "atol": cfg.atol,
        "eager_atol": cfg.eager_atol,
        "model": cfg.model,
        "max_tokens": cfg.max_tokens,
        "engine_args": cfg.engine_args,
        "prompts": len(cfg.prompts) if cfg.prompts else None,
    }


def write(cfg: ABConfig, summary: Summary, runs: list[Any]) -> dict[str, Path | None]:
    """Write report.json, report.md and update_time.png (if matplotlib is there) into cfg.out."""
    from ascend_graph_patch.ab import plot

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    png: Path | None = out / "update_time.png"
    try:
        plot.update_time(cfg, summary, runs, png)
    except ImportError:
        png = None
    data = {
        "tool": "ascend-graph-patch ab",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "config": config_json(cfg),
        **summary.to_json(),
        "plot": png.name if png else None,
    }
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "report.md").write_text(markdown(cfg, summary, png.name if png else None))
    return {"json": out / "report.json", "md": out / "report.md", "png": png}
