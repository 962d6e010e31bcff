"""The benchmark's --quick path runs and prints its table and ratios (no timing asserts)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ascend_graph_patch.bench import command, core


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_bench_prints_ratios_and_writes_json(tmp_path: Path, capfd):
    out = tmp_path / "bench.json"
    rc = command.run(_args("--quick", "--layers", "1,4", "--batches", "1,4", "--rounds", "2",
                           "--inner", "2", "--no-startup", "--no-capture", "--no-progress",
                           "--json", str(out)))
    text = capfd.readouterr().out
    assert rc == 0, text
    assert "overlay/stock" in text and "overlay/floor" in text
    data = json.loads(out.read_text())
    kinds = {p["kind"] for p in data["points"]}
    assert kinds == set(core.KINDS)
    assert len(data["points"]) == len(core.KINDS) * 4
    for p in data["points"]:
        assert p["error"] is None, p
        # the floor and the overlay drive exactly the captured tasks: one per layer
        assert p["tasks"] == p["layers"]
        assert p["stock_us"] > 0 and p["overlay_us"] > 0 and p["floor_us"] > 0
        assert p["vs_stock"] == p["overlay_us"] / p["stock_us"]


def test_capture_overhead_reports_both_arms():
    cap = core.capture_overhead(layers=2, batch=4, repeats=2)
    assert cap["stock_ms"] > 0 and cap["overlay_ms"] > 0 and cap["ratio"] > 0


def test_unknown_kind_is_a_usage_error(capfd):
    assert command.run(_args("--kinds", "FIA,nope", "--no-progress")) == 2
    assert "unknown kind" in capfd.readouterr().err


def test_startup_fallback_parses_importtime(monkeypatch):
    from ascend_graph_patch import _bootstrap

    monkeypatch.delattr(_bootstrap, "measure_startup", raising=False)
    result = core.startup_cost(1)
    assert result["off_ms"] is not None and result["off_ms"] >= 0
