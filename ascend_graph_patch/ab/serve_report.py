"""The served A/B's own table: per load and run, outputs, the client's figures, the server's counts.

The correctness table of the report (one row per case) says whether every arm's outputs equal the
eager server's. This table adds, per run of each arm: the outputs against eager's, requests
completed, the client's throughput and latency (``vllm bench serve``: median and p99), the engine
steps of the load (``/metrics``), how many of them replayed a FULL graph (calls of the runner's
update entry point, from the status files of the server's processes, read live before and after
the load), the overlay's owned updates and its fallbacks. On the simulator the client's times are
the simulated device's (the host CPU), not hardware: the heading says so.
"""

from __future__ import annotations

from typing import Any

from ascend_graph_patch.ab.compare import Summary

COLUMNS = (
    "case",
    "arm",
    "run",
    "outputs",
    "requests",
    "req/s",
    "out tok/s",
    "TTFT ms p50/p99",
    "TPOT ms p50/p99",
    "ITL ms p50",
    "E2E ms p50",
    "steps",
    "replays",
    "owned updates",
    "fallbacks",
)


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pair(client: dict[str, Any], name: str) -> str:
    p50, p99 = client.get(f"median_{name}_ms"), client.get(f"p99_{name}_ms")
    if p50 is None:
        return "-"
    return f"{p50:.0f}/{p99:.0f}" if p99 is not None else f"{p50:.0f}"


def _outputs(text: str) -> str:
    return "DIFFERS" if text.startswith("differs at ") else text.split(":", 1)[0]


def rows(summary: Summary) -> list[list[str]]:
    out = []
    for case in summary.cases:
        for row in case.served:
            client = row.get("client") or {}
            out.append(
                [
                    case.name,
                    row["arm"],
                    str(row["run"]),
                    _outputs(row["outputs"]),
                    row["requests"],
                    _num(client.get("request_throughput"), ".2f"),
                    _num(client.get("output_throughput"), ".1f"),
                    _pair(client, "ttft"),
                    _pair(client, "tpot"),
                    _num(client.get("median_itl_ms"), ".0f"),
                    _num(client.get("median_e2el_ms"), ".0f"),
                    _num(row.get("engine_steps"), "d"),
                    _num(row.get("replays"), "d"),
                    _num(row.get("updates_owned"), "d"),
                    _num(row.get("fallbacks"), "d"),
                ]
            )
    return out


def heading(simulated: bool | None) -> str:
    where = (
        "simulator times: the simulated device runs on the host CPU, not hardware"
        if simulated
        else "times measured by the client"
    )
    return (
        f"served: per load and run ({where}); steps = engine steps of the load, replays = "
        "steps that replayed a FULL graph, owned updates / fallbacks = the overlay's, from the "
        "server's processes"
    )


RANK_COLUMNS = (
    "case",
    "arm",
    "run",
    "rank",
    "outputs",
    "dummy batches",
    "draft dummy runs",
    "replays",
    "owned updates",
    "fallbacks",
    "verify mismatches",
)


def rank_rows(summary: Summary) -> list[list[str]]:
    """Per load, run and distributed rank (data or tensor parallelism): what that rank's
    processes counted during the load. Empty when no run had more than one rank."""
    if not any(len(row.get("ranks") or {}) > 1 for case in summary.cases for row in case.served):
        return []
    out = []
    for case in summary.cases:
        for row in case.served:
            for rank, figures in (row.get("ranks") or {}).items():
                mism, checked = figures.get("verify_mismatches"), figures.get("verify_tasks")
                out.append(
                    [
                        case.name,
                        row["arm"],
                        str(row["run"]),
                        rank,
                        _outputs(row["outputs"]),
                        str(figures.get("dummy_batches", 0)),
                        str(figures.get("draft_dummy_runs", 0)),
                        str(figures.get("replays", 0)),
                        str(figures.get("updates_owned", 0)),
                        str(figures.get("fallbacks", 0)),
                        "-" if checked is None else f"{mism or 0} of {checked}",
                    ]
                )
    return out


RANK_HEADING = (
    "served, per rank: what each data- or tensor-parallel rank's processes counted during the "
    "load (dummy batches: the worker's execute_dummy_batch, which an idle data-parallel rank runs "
    "in step with a busy one; replays: update calls, dummy batches' included; outputs: the "
    "run's, every rank's requests together)"
)


def divergences(summary: Summary) -> list[str]:
    """Every run whose outputs differ from the eager server's, with the first difference."""
    return [
        f"{case.name}, {row['arm']} run {row['run']}: {row['outputs']}"
        for case in summary.cases
        for row in case.served
        if row["outputs"].startswith("differs at ")
    ]


def any_served(summary: Summary) -> bool:
    return any(case.served for case in summary.cases)
