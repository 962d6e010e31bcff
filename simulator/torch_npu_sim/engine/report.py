"""The engine tests' table: case x arm, tokens against eager, graphs and tasks owned, verify
mismatches, acceptance rates, and the error where an arm crashed."""

from __future__ import annotations

from typing import Any

from .cases import Case


def eager_tokens(results: dict[str, Any], case: Case) -> Any:
    record = results.get("eager", {}).get("cases", {}).get(case.reference)
    return None if record is None or record.get("error") else record.get("tokens")


def runner(record: dict[str, Any]) -> dict[str, Any]:
    """The model runner's process figures (the first worker's)."""
    runners = record.get("runners") or [{}]
    return runners[0] or {}


def cell(results: dict[str, Any], arm: str, case: Case) -> dict[str, Any]:
    """One arm's outcome on one case, as the table shows it."""
    record = (
        results.get(arm, {}).get("cases", {}).get(case.name if arm != "eager" else case.reference)
    )
    if record is None:
        return {"ran": False}
    figures = runner(record)
    overlay = figures.get("overlay") or {}
    counters = overlay.get("counters") or {}
    spec = record.get("spec") or {}
    reference = eager_tokens(results, case)
    return {
        "ran": True,
        "arm": arm,
        "error": record.get("error"),
        "equal": None
        if reference is None or record.get("error")
        else record.get("tokens") == reference,
        "graphs_owned": counters.get("graphs.owned"),
        "tasks_updated": counters.get("tasks.updated"),
        "updates_owned": counters.get("updates.owned"),
        "mismatches": counters.get("verify.mismatches"),
        "stock_failed": counters.get("verify.stock_failed"),
        "verify_tasks": counters.get("verify.tasks"),
        "replays": (figures.get("sim") or {}).get("replays"),
        "captures": (figures.get("sim") or {}).get("captures"),
        "acceptance": spec.get("rate"),
        "seconds": record.get("seconds"),
    }


def _fmt(c: dict[str, Any]) -> list[str]:
    if c["error"]:
        tokens = "crash: " + c["error"][:70]
    elif c["arm"] == "eager":
        tokens = "(the reference)"
    else:
        tokens = {True: "equal", False: "DIFFER", None: "?"}[c["equal"]]
    tasks = (c["tasks_updated"] or 0) + (c["verify_tasks"] or 0)
    owned = "-" if c["graphs_owned"] is None else f"{c['graphs_owned']} / {tasks}"
    verify = "-"
    if c["verify_tasks"] is not None or c["stock_failed"]:
        verify = f"{c['mismatches'] or 0} of {c['verify_tasks'] or 0}"
        if c["stock_failed"]:
            verify += f", stock failed {c['stock_failed']}"
    rate = "-" if c["acceptance"] is None else f"{c['acceptance']:.2f}"
    replays = "-" if c["replays"] is None else str(c["replays"])
    return [tokens, owned, replays, verify, rate, str(c["seconds"])]


def table(results: dict[str, Any], cases: tuple[Case, ...]) -> str:
    """Markdown: one row per case and arm."""
    head = [
        "case",
        "arm",
        "tokens vs eager",
        "graphs owned / tasks updated",
        "replays",
        "verify mismatches",
        "acceptance",
        "s",
    ]
    rows = [head, ["---"] * len(head)]
    for case in cases:
        for arm in ("eager", "stock", "overlay", "verify", "control"):
            c = cell(results, arm, case)
            if c["ran"]:
                rows.append([case.name, arm, *_fmt(c)])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)
