"""The verdict table (text), ``report.json``, ``report.md`` and the plot of a :class:`Summary`."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from ascend_graph_patch.ab import engine_args, model_runner, serve_report
from ascend_graph_patch.ab.compare import PASS_KNOWN, PASS_WRONG, PASSES, CaseResult, Summary
from ascend_graph_patch.ab.orchestrate import ABConfig

_ARMS = ("eager", "stock", "patched", "stream", "verify")
TIMING_COLUMNS = (
    "case",
    "stock us",
    "patched us",
    "ratio",
    "A-A",
    "stock step ms",
    "patched step ms",
)
#: With a stream arm (``ab --stream-order``), its step latency after the patched arm's.
STREAM_COLUMN = "stream step ms"


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def _us(case: CaseResult, arm: str) -> str:
    t = case.timing.get(arm)
    if t is None or t.median_us is None:
        return "-"
    return f"{t.median_us:.0f} (p90 {t.p90_us:.0f})"


def _short(text: str | None) -> str:
    """A correctness entry as a table cell (the full text is in the problems and notes)."""
    if not text:
        return "-"
    if text.startswith("differs at "):
        return "DIFFERS"
    if "token(s) differ" in text:
        return "DIFFERS"
    for label in ("fails (known)", "CRASH", "ERROR", "missing"):
        if text.startswith(label):
            return label
    return text


def _owned(case: CaseResult) -> str:
    fig = case.figures.get("patched") or case.figures.get("verify") or {}
    graphs, tasks = fig.get("graphs_owned"), fig.get("tasks_updated")
    if graphs is None and tasks is None:
        return "-"
    return f"{graphs if graphs is not None else '?'} / {tasks if tasks is not None else '?'}"


def _fallbacks(case: CaseResult) -> str:
    values = [f.get("fallbacks") for a, f in case.figures.items() if a in ("patched", "verify")]
    return "-" if not values else str(sum(v or 0 for v in values))


def _verify(case: CaseResult) -> str:
    fig = case.figures.get("verify")
    if not fig:
        return "-"
    text = f"{fig.get('verify_mismatches') or 0} of {fig.get('verify_tasks') or 0}"
    if fig.get("verify_stock_failed"):
        text += f", stock failed {fig['verify_stock_failed']}"
    return text


def _acceptance(case: CaseResult, arms: list[str]) -> str:
    rates = [(a, (case.figures.get(a) or {}).get("acceptance")) for a in arms]
    rates = [(a, r) for a, r in rates if r is not None]
    if not rates:
        return "-"
    return " / ".join(f"{a[0]} {r:.2f}" for a, r in rates)


def arms_shown(cfg: ABConfig, summary: Summary) -> list[str]:
    return [a for a in _ARMS if any(a in c.correctness or a in c.arms for c in summary.cases)]


def columns(arms: list[str]) -> list[str]:
    return [
        "case",
        *arms,
        "graphs / tasks owned",
        "fallbacks",
        "verify mismatches",
        "acceptance",
        "verdict",
    ]


def rows(summary: Summary, arms: list[str]) -> list[list[str]]:
    """The correctness table: tokens per arm against the reference, what the overlay did."""
    out = []
    for c in summary.cases:
        cells = [_short(c.correctness.get(a) or c.arms.get(a)) for a in arms]
        if "eager" in arms and c.kind == "harness" and "eager" not in c.correctness:
            cells[arms.index("eager")] = "(in each arm)"  # the harness runs eager in-process
        out.append(
            [
                c.name,
                *cells,
                _owned(c),
                _fallbacks(c),
                _verify(c),
                _acceptance(c, arms),
                c.verdict,
            ]
        )
    return out


def _step_ms(case: CaseResult, arm: str) -> str:
    runs = case.step_ms.get(arm)
    if not runs:
        return "-"
    spread = f" (A-A {max(runs) / min(runs) - 1:.1%})" if len(runs) > 1 and min(runs) > 0 else ""
    return f"{sorted(runs)[len(runs) // 2]:.2f}{spread}"


def timing_table(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """The timing columns and rows, less the step-latency columns where nothing measured it."""
    body = timing_rows(summary)
    cols = list(TIMING_COLUMNS)
    if any("stream" in c.step_ms for c in summary.cases):
        cols.append(STREAM_COLUMN)
        body = [[*row, _step_ms(c, "stream")] for row, c in zip(body, _timed(summary), strict=True)]
    elif not any(c.step_ms for c in summary.cases):
        cols, body = cols[:-2], [r[:-2] for r in body]
    return cols, body


def _timed(summary: Summary) -> list[CaseResult]:
    return [c for c in summary.cases if c.timing or c.step_ms]


def timing_rows(summary: Summary) -> list[list[str]]:
    """Only cases with timing: host update time per step, and (vLLM) step latency per arm."""
    out = []
    for c in _timed(summary):
        out.append(
            [
                c.name,
                _us(c, "stock"),
                _us(c, "patched"),
                "-" if c.ratio is None else f"{c.ratio:.2f}x",
                "-" if c.noise is None else f"{c.noise:.1%}",
                _step_ms(c, "stock"),
                _step_ms(c, "patched"),
            ]
        )
    return out


def timing_notes(cfg: ABConfig, summary: Summary) -> list[str]:
    untimed: dict[str, list[str]] = {}
    for c in summary.cases:
        if c.timing_note and not c.timing:
            untimed.setdefault(c.timing_note, []).append(c.name)
    notes = [
        note if len(names) == len(summary.cases) else f"{', '.join(names)}: {note}"
        for note, names in untimed.items()
    ]
    if any(c.step_ms for c in summary.cases):
        notes.append(
            "step ms: generate() wall time / longest output per run, median over runs "
            "(A-A: spread between runs of the arm)"
        )
    if cfg.jobs > 1:
        notes.append(f"{cfg.jobs} arms ran at once: their host times are not comparable")
    return notes


def stock_failures(summary: Summary) -> list[str]:
    """Every case where stock crashed or is known to be wrong, with what it did."""
    out = []
    for c in summary.cases:
        text = c.correctness.get("stock", "")
        if c.verdict.startswith("PASS (stock") or (text and text not in ("equal", "reference")):
            known = f" (known: {c.expect})" if c.expect.startswith("wrong:") else ""
            out.append(f"{c.name}: {text or c.arms.get('stock', '-')}{known}")
    return out


def title(cfg: ABConfig) -> str:
    if cfg.workload == "serve":
        loads = (cfg.serve or {}).get("loads") or [{}]
        sizes = "/".join(str(load.get("num_prompts")) for load in loads)
        what = f"vllm serve {cfg.model}, {len(loads)} load(s) x {sizes} requests (vllm bench serve)"
        dp = engine_args.option(cfg.engine_args or [], "--data-parallel-size")
        if dp is not None:
            what += f", data parallel {dp}"
            if "--enable-expert-parallel" in (cfg.engine_args or []):
                what += " with expert parallelism"
        if cfg.simulate:
            what += " (on the simulator)"
    elif cfg.workload == "vllm":
        what = f"vLLM {cfg.model}, {len(cfg.prompts or []) or 8} prompts x {cfg.max_tokens} tokens"
        if cfg.simulate:
            what += " (on the simulator)"
    else:
        what = f"simulator, {len(cfg.cases)} case(s)"
    return f"ascend-graph-patch ab: {what}, seed {cfg.seed}"


def verdict_line(summary: Summary) -> str:
    n = len(summary.cases)
    good = sum(c.verdict in PASSES for c in summary.cases)
    known = sum(c.verdict in (PASS_KNOWN, PASS_WRONG) for c in summary.cases)
    extra = f", {known} where stock fails or is wrong (known)" if known else ""
    return f"VERDICT: {summary.verdict}  ({good}/{n} cases pass{extra})"


def _text_table(cols: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *body, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(v).ljust(w) for v, w in zip(cells, widths, strict=True)).rstrip()

    return [line(cols), line(["-" * w for w in widths])] + [line(r) for r in body]


def text_table(cfg: ABConfig, summary: Summary) -> str:
    arms = arms_shown(cfg, summary)
    out = [title(cfg)]
    runner = model_runner.report_line(cfg.model_runner)
    if runner:
        out.append(runner)
    out.append(
        "arms: "
        + ", ".join(f"{r['arm']}({r['status']}, {r['seconds']:.0f}s)" for r in summary.runs)
    )
    out += _text_table(columns(arms), rows(summary, arms))
    failures = stock_failures(summary)
    if failures:
        out += ["", "stock failures:"] + [f"  - {f}" for f in failures]
    if serve_report.any_served(summary):
        out += ["", serve_report.heading(cfg.simulate)]
        out += _text_table(list(serve_report.COLUMNS), serve_report.rows(summary))
        out += [f"  first divergence: {d}" for d in serve_report.divergences(summary)]
        per_rank = serve_report.rank_rows(summary)
        if per_rank:
            out += ["", serve_report.RANK_HEADING]
            out += _text_table(list(serve_report.RANK_COLUMNS), per_rank)
    cols, timed = timing_table(summary)
    out.append("")
    if timed:
        out += _text_table(cols, timed)
        out.append(f"host update time: {summary.speed}")
    for note in timing_notes(cfg, summary):
        out.append(f"timing: {note}")
    out.append("")
    out.append(verdict_line(summary))
    for problem in summary.problems:
        out.append(f"  - {problem}")
    return "\n".join(out)


def _md_table(cols: list[str], body: list[list[str]]) -> list[str]:
    header = " | ".join(c.replace("|", "\\|") for c in cols)
    md = [f"| {header} |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |" for r in body]
    return md


def markdown(cfg: ABConfig, summary: Summary, plot_name: str | None) -> str:
    arms = arms_shown(cfg, summary)
    md = [f"# {title(cfg)}", "", f"**{verdict_line(summary)}**", ""]
    runner = model_runner.report_line(cfg.model_runner)
    if runner:
        md += [f"Model runner: {runner}.", ""]
    if summary.problems:
        md += ["## Problems", ""] + [f"- {p}" for p in summary.problems] + [""]
    md += ["## Correctness", ""] + _md_table(columns(arms), rows(summary, arms))
    md += [
        "",
        "Each arm's "
        + ("outputs, request by request," if cfg.workload == "serve" else "greedy tokens")
        + " against the reference: eager (the eager arm, or the eager run "
        "in the arm's own process). `graphs / tasks owned`: the overlay's counters in every "
        "process that ran a model runner; `acceptance`: speculative decoding's accepted share "
        "of draft tokens per arm (e = eager, s = stock, p = patched, v = verify).",
    ]
    failures = stock_failures(summary)
    if failures:
        md += ["", "## Stock failures", ""] + [f"- {f}" for f in failures]
    details = [
        f"{c.name}, {arm}: {text}"
        for c in summary.cases
        for arm, text in c.correctness.items()
        if text.startswith("differs at ")
    ]
    if details:
        md += ["", "## First divergences", ""] + [f"- {d}" for d in details]
    if serve_report.any_served(summary):
        md += ["", "## Served", "", serve_report.heading(cfg.simulate) + ".", ""]
        md += _md_table(list(serve_report.COLUMNS), serve_report.rows(summary))
        diverged = serve_report.divergences(summary)
        if diverged:
            md += ["", "First divergences from the eager server:", ""]
            md += [f"- {d}" for d in diverged]
        per_rank = serve_report.rank_rows(summary)
        if per_rank:
            md += ["", serve_report.RANK_HEADING + ".", ""]
            md += _md_table(list(serve_report.RANK_COLUMNS), per_rank)
    md += ["", "## Timing", ""]
    cols, timed = timing_table(summary)
    if timed:
        md += _md_table(cols, timed)
        md += [
            "",
            f"Host update time: {summary.speed}. Microseconds per replay step (median, p90) of "
            f"the runner's update call, first {cfg.warmup} step(s) of each case excluded; ratio "
            "= patched / stock; A-A = largest relative spread of per-run medians within one arm "
            "(the noise floor).",
        ]
    notes = timing_notes(cfg, summary)
    md += [f"- {n}" for n in notes] if notes else ([] if timed else ["No timing samples."])
    notes_by_case = [(c.name, n) for c in summary.cases for n in c.notes]
    if notes_by_case:
        md += ["", "## Notes", ""] + [f"- {name}: {n}" for name, n in notes_by_case]
    md += [
        "",
        "## Arms (in run order)",
        "",
        "| # | arm | ASCEND_GRAPH_PATCH | status | seconds | pid | processes | VLLM_CACHE_ROOT |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary.runs:
        md.append(
            f"| {r['index']} | {r['arm']} | {r['mode']} | {r['status']} | "
            f"{r['seconds']:.1f} | {r['pid'] or '-'} | {r.get('processes') or '-'} | "
            f"`{r['cache_root']}` |"
        )
    if plot_name:
        md += ["", f"![correctness matrix and timing]({plot_name})"]
    return "\n".join(md) + "\n"


def config_json(cfg: ABConfig) -> dict[str, Any]:
    return {
        "workload": cfg.workload,
        "cases": cfg.cases,
        "steps": cfg.steps,
        "seed": cfg.seed,
        "repeats": cfg.repeats,
        "verify": cfg.verify,
        "eager": cfg.eager,
        "jobs": cfg.jobs,
        "simulate": cfg.simulate,
        "timeout": cfg.timeout,
        "warmup": cfg.warmup,
        "atol": cfg.atol,
        "eager_atol": cfg.eager_atol,
        "model": cfg.model,
        "max_tokens": cfg.max_tokens,
        "engine_args": cfg.engine_args,
        "model_runner": cfg.model_runner,
        "prompts": len(cfg.prompts) if cfg.prompts else None,
    }


def write(cfg: ABConfig, summary: Summary, runs: list[Any]) -> dict[str, Any]:
    """Write report.json, report.md and report.png into cfg.out: the two reports always (a
    picture that cannot be drawn, without matplotlib or for any other reason, is left out and
    said so in ``plot_error``)."""
    from ascend_graph_patch.ab import plot

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    png: Path | None = out / "report.png"
    plot_error = None
    try:
        plot.render(cfg, summary, runs, png)
    except ImportError:
        png, plot_error = None, "matplotlib is not installed"
    except Exception as exc:  # noqa: BLE001 - the verdict must still be written
        png, plot_error = None, f"{type(exc).__name__}: {exc}"
    data = {
        "tool": "ascend-graph-patch ab",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "config": config_json(cfg),
        **summary.to_json(),
        "plot": png.name if png else None,
        "plot_error": plot_error,
    }
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "report.md").write_text(markdown(cfg, summary, png.name if png else None))
    paths: dict[str, Any] = {"json": out / "report.json", "md": out / "report.md", "png": png}
    paths["plot_error"] = plot_error
    return paths
