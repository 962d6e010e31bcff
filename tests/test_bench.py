"""The benchmark's --quick path runs and prints its table and ratios (no timing asserts)."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torch_npu_sim.bench import command, core, projection


@pytest.fixture(autouse=True)
def _overlay_off_after() -> Iterator[None]:
    """The bench enables the overlay in-process; later test modules expect it off."""
    yield
    from ascend_graph_patch import activation

    activation.disable()


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_bench_prints_ratios_and_writes_json(tmp_path: Path, capfd):
    out = tmp_path / "bench.json"
    rc = command.run(
        _args(
            "--quick",
            "--layers",
            "1,4",
            "--batches",
            "1,4",
            "--rounds",
            "2",
            "--inner",
            "2",
            "--no-startup",
            "--no-capture",
            "--no-progress",
            "--json",
            str(out),
            "--project",
            "--cost",
            "relaunch_fia=120",
        )
    )
    text = capfd.readouterr().out
    assert rc == 0, text
    assert "overlay/stock" in text and "overlay/floor" in text
    assert "not measured" not in text
    data = json.loads(out.read_text())
    assert data["schema"] == command.SCHEMA == 2
    assert isinstance(data["all_met"], bool)
    for p in data["points"]:
        assert p["target_vs_stock"] == (0.5 if p["layers"] >= 28 else 1.0)
        assert p["target_vs_floor"] is None  # 1 and 4 layers: below the amortised range
        assert p["met"] == (p["vs_stock"] <= p["target_vs_stock"])
    # the projection is labelled as such, in the table and in the JSON
    assert "PROJECTION to an Ascend host, NOT a measurement" in text
    projected = data["projection"]
    assert projected["label"] == "projection, not a measurement"
    assert projected["costs_us"]["relaunch_fia"] == 120.0
    assert len(projected["rows"]) == len(projection.SHAPES) + len(projection.MLA_SHAPES)
    kinds = {p["kind"] for p in data["points"]}
    assert kinds == set(core.KINDS) and core.MTP_KIND in kinds
    assert len(data["points"]) == len(core.KINDS) * 4
    for p in data["points"]:
        assert p["error"] is None, p
        # the floor and the overlay drive exactly the captured tasks: one per layer per step
        assert p["steps"] == (core.MTP_STEPS if p["kind"] in core.DRAFT_KINDS else 1)
        assert p["tasks"] == p["layers"] * p["steps"]
        assert p["stock_us"] > 0 and p["overlay_us"] > 0 and p["floor_us"] > 0
        assert p["vs_stock"] == p["overlay_us"] / p["stock_us"]
        assert p["vs_floor"] == p["overlay_us"] / p["floor_us"]
    # the MTP rows are in the printed table, with both ratios (4 layers x 3 steps = 12 tasks)
    mtp_rows = [line.split() for line in text.splitlines() if line.startswith(core.MTP_KIND)]
    assert len(mtp_rows) == 4, text
    for row in mtp_rows:
        layers, tasks = int(row[2]), int(row[4])
        assert tasks == 3 * layers
        assert len(row) >= 10 and all(_number(v) for v in row[5:8]), row


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_mtp_point_is_a_draft_update(mocker):
    """The MTP kind updates under a draft context with the proposer's draft_attn_metadatas."""
    core._prepare()  # imports vllm_ascend in its working order (attention_v1 alone is circular)
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackendImpl

    from ascend_graph_patch import state

    engine = core._engine(core.KINDS[core.MTP_KIND](2, (4,)))
    seen = []
    real = core._stock_update()

    def stock(*args):
        seen.append(args)
        return real(*args)

    mocker.patch.object(core, "_stock_update", return_value=stock)
    try:
        before = state.STATE.counters["updates.owned"]
        point = core.measure_point(engine, core.MTP_KIND, 2, 4, rounds=1, inner=1)
        overlay_updates = state.STATE.counters["updates.owned"] - before
    finally:
        engine.close()
    assert point.error is None and point.tasks == 6 and point.steps == 3
    assert point.vs_stock is not None and point.vs_floor is not None
    assert overlay_updates >= 1 + 3 + 1  # warm-up, owned check, one round: never stock
    stream, fc, num_tokens, _cfg, _spec, dcp, per_step = seen[0]
    assert fc.is_draft_model and num_tokens == 4 and dcp is None
    assert len(per_step) == 3 and all(len(step) == 2 for step in per_step)
    assert AscendAttentionBackendImpl.update_graph_params is not real


ATTN = "language_model.model.layers.{}.self_attn.attn"


def install_verify_interceptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify's interceptors on what stock's FIA update calls, as verify mode installs them:
    once the graphs are captured, so the overlay's templates hold the op itself (verify compares
    the op a relaunch calls, and an interceptor is not stock's op)."""
    import torch
    import torch_npu

    from ascend_graph_patch.aspects import verify

    for target, wrapper in (
        ((torch_npu.npu_fused_infer_attention_score, "out"), verify.fia_out),
        ((torch.npu, "graph_task_update_begin"), verify.update_begin),
        ((torch.npu, "graph_task_update_end"), verify.update_end),
    ):
        real = getattr(*target)
        monkeypatch.setattr(*target, lambda *a, _w=wrapper, _r=real, **k: _w(_r, None, a, k))
    record = torch.npu.ExternalEvent.record

    def recorded(event: Any, *args: Any, **kwargs: Any) -> Any:  # the event each update records
        return verify.event_record(functools.partial(record, event), event, args, kwargs)

    monkeypatch.setattr(torch.npu.ExternalEvent, "record", recorded)


def test_hybrid_point_drives_stock_as_the_release_drives_an_mtp_hybrid(
    mocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hybrid kind's metadata as v1 lays out a Qwen3.5 + MTP target's: the attention keys
    first, the MTP draft's key in their group (one object), then three GDN keys per attention
    key, group by group as vLLM groups them; stock is called with method "mtp". Stock then
    binds the MTP key to the first task and every task to the previous layer's key (its
    ``_ATTN_KEYS_BUFFER``), which is harmless here (one object): verify's comparison of stock's
    update with the overlay's finds nothing. Negative control: the MTP key on another object (a
    draft in a KV group of its own) and stock's first task reads it: verify reports that task."""
    import copy

    from ascend_graph_patch.aspects import verify
    from ascend_graph_patch.aspects.capture import current_role
    from ascend_graph_patch.core.graph import TargetSource
    from ascend_graph_patch.core.registry import REGISTRY
    from ascend_graph_patch.lines.v0_23 import LINE

    core._prepare()  # imports vllm_ascend in its working order (attention_v1 alone is circular)
    from vllm_ascend.attention import attention_v1

    engine = core._engine(core.KINDS[core.HYBRID_KIND](3, (4,)))
    install_verify_interceptors(monkeypatch)
    seen = []
    real = core._stock_update()
    mocker.patch.object(core, "_stock_update", return_value=lambda *a: seen.append(a) or real(*a))
    try:
        with core.point_calls(engine, core.HYBRID_KIND, 3, 4) as (point, calls):
            calls["stock"]()
            args = seen[-1]
            fc, spec = args[1], args[4]
            metadata = fc.attn_metadata
            owned = REGISTRY.lookup(current_role(fc), fc.batch_descriptor)
            assert owned is not None
            dry, error = verify.dry_run(real, args, {})
            assert error is None
            problems = verify.compare(owned.resolve(TargetSource(metadata)), dry, LINE.layouts)
            buffer = list(attention_v1._ATTN_KEYS_BUFFER)
            moved = copy.copy(metadata[core.HYBRID_MTP_KEY])
            moved.seq_lens_list = [n + 1 for n in moved.seq_lens_list]
            metadata[core.HYBRID_MTP_KEY] = moved
            dry, error = verify.dry_run(real, args, {})
            wrong = verify.compare(owned.resolve(TargetSource(metadata)), dry, LINE.layouts)
    finally:
        engine.close()
    assert point.tasks == 3 and point.steps == 1
    assert spec.method == "mtp"
    keys = list(metadata)
    attention = [ATTN.format(4 * i + 3) for i in range(3)]
    assert keys[:4] == [*attention, core.HYBRID_MTP_KEY]
    linear = keys[4:]
    assert len(linear) == 3 * len(attention) and all(k.endswith(".linear_attn") for k in linear)
    assert len({id(metadata[k]) for k in linear}) == 3  # 9 GDN layers in groups of 4: 3 groups
    assert buffer == [core.HYBRID_MTP_KEY, *attention[:2]]  # shifted by one: the MTP key first
    assert problems == []
    assert len(wrong) == 1 and ATTN.format(3) in wrong[0] and "actual_seq_lengths_kv" in wrong[0]


def test_kind_aliases():
    assert command._kind("mtp") == command._kind(" MTP k=3 ") == core.MTP_KIND
    assert command._kind("mla") == core.MLA_KIND
    assert command._kind("mla+mtp") == command._kind("MLA+MTP k=3") == core.MLA_MTP_KIND
    assert command._kind("hybrid") == command._kind("hybrid+mtp") == core.HYBRID_KIND
    assert command._kind("fia-v2") == "FIA-v2" and command._kind("nope") == "nope"


def test_capture_overhead_reports_both_arms():
    cap = core.capture_overhead(layers=2, sizes=(4, 8), repeats=2)
    assert cap["stock_ms"] > 0 and cap["overlay_ms"] > 0 and cap["ratio"] > 0


def test_unknown_kind_is_a_usage_error(capfd):
    assert command.run(_args("--kinds", "FIA,nope", "--no-progress")) == 2
    assert "unknown kind" in capfd.readouterr().err


def test_targets_per_point():
    """Never slower than stock anywhere; the tighter targets only from 28 layers up."""
    one = core.Point("PA", 1, 64, tasks=1, stock_us=6.0, overlay_us=5.9, floor_us=1.7)
    assert one.target_vs_stock == 1.0 and one.target_vs_floor is None and one.met
    slower = core.Point("PA", 1, 64, tasks=1, stock_us=6.0, overlay_us=6.1, floor_us=1.7)
    assert not slower.met
    deep = core.Point("FIA", 28, 64, tasks=28, stock_us=100.0, overlay_us=32.0, floor_us=24.0)
    assert deep.target_vs_stock == 0.5 and deep.target_vs_floor == 1.3
    assert deep.vs_floor is not None and deep.vs_floor > 1.3 and not deep.met
    assert core.Point("FIA", 28, 64, tasks=28, stock_us=100.0, overlay_us=30.0, floor_us=24.0).met
    assert not core.Point("FIA", 28, 64, error="boom").met


def _points() -> list[core.Point]:
    """Two layer counts per kind: stock glue 3 us/task + 5, overlay 0.2 us/task + 4."""
    out = []
    for kind, steps in (("FIA", 1), ("PA", 1), (core.MTP_KIND, 3)):
        for layers in (1, 28):
            tasks = layers * steps
            floor = 0.9 * tasks
            out.append(
                core.Point(
                    kind,
                    layers,
                    64,
                    tasks=tasks,
                    steps=steps,
                    stock_us=floor + 5 + 3 * tasks,
                    overlay_us=floor + 4 + 0.2 * tasks,
                    floor_us=floor,
                )
            )
    return out


def test_projection_adds_glue_to_call_costs_and_counts_avoided_getters():
    costs = projection.CallCosts()
    data = projection.project(_points(), costs)
    rows = {r["shape"]: r for r in data["rows"]}
    fia, pa = rows["28 layers FIA"], rows["28 layers PA"]
    per_fia = costs.update_begin + costs.relaunch_fia + costs.update_end + costs.event_record
    assert fia["stock_ms"] == pytest.approx((5 + 3 * 28 + 28 * per_fia) / 1000)
    assert fia["overlay_ms"] == pytest.approx((4 + 0.2 * 28 + 28 * per_fia) / 1000)
    assert fia["saved_by_calls_ms"] == 0 and fia["stock_getter_calls"] == 0
    # PA: stock calls the workspace getter per layer, the overlay once per KV group
    assert (pa["stock_getter_calls"], pa["overlay_getter_calls"]) == (28, 1)
    assert pa["saved_by_calls_ms"] == pytest.approx(27 * costs.pa_workspace_getter / 1000)
    assert pa["saved_ms"] == pytest.approx(pa["saved_by_glue_ms"] + pa["saved_by_calls_ms"])
    # MTP k=3 adds one draft layer's 3 tasks to the step, with the draft kind's glue
    mtp = rows["28 layers FIA + MTP k=3"]
    assert mtp["tasks"] == 31
    assert mtp["stock_ms"] - fia["stock_ms"] == pytest.approx((5 + 3 * 3 + 3 * per_fia) / 1000)


def test_projection_adds_deepseek_shapes_when_the_mla_kinds_were_measured():
    """61 MLA layers (DeepSeek V3 / R1), alone and with its MTP layer at k=1: MLA's relaunch
    cost, the MLA kinds' glue; left out of a run that did not measure them."""
    costs = projection.CallCosts(relaunch_mla=100.0)
    assert "61 layers MLA" not in {r["shape"] for r in projection.project(_points(), costs)["rows"]}
    points = _points()
    for kind, steps in ((core.MLA_KIND, 1), (core.MLA_MTP_KIND, 3)):
        for layers in (1, 28):
            tasks = layers * steps
            floor = 0.9 * tasks
            points.append(
                core.Point(
                    kind,
                    layers,
                    64,
                    tasks=tasks,
                    steps=steps,
                    stock_us=floor + 5 + 3 * tasks,
                    overlay_us=floor + 4 + 0.2 * tasks,
                    floor_us=floor,
                )
            )
    rows = {r["shape"]: r for r in projection.project(points, costs)["rows"]}
    per_mla = costs.update_begin + 100.0 + costs.update_end + costs.event_record
    mla, mtp = rows["61 layers MLA"], rows["61 layers MLA + MTP k=1"]
    assert mla["stock_ms"] == pytest.approx((5 + 3 * 61 + 61 * per_mla) / 1000)
    assert mla["overlay_ms"] == pytest.approx((4 + 0.2 * 61 + 61 * per_mla) / 1000)
    assert mtp["tasks"] == 62
    assert mtp["stock_ms"] - mla["stock_ms"] == pytest.approx((5 + 3 + per_mla) / 1000)


def test_projection_needs_every_kind_and_valid_costs():
    with pytest.raises(ValueError, match="missing PA"):
        projection.project([p for p in _points() if p.kind != "PA"], projection.CallCosts())
    assert projection.CallCosts.parse(["relaunch-pa=12.5"]).relaunch_pa == 12.5
    for bad in ("nope=1", "relaunch_pa", "relaunch_pa=x", "relaunch_pa=-1"):
        with pytest.raises(ValueError, match="--cost"):
            projection.CallCosts.parse([bad])


def test_cost_without_project_is_a_usage_error(capfd):
    assert command.run(_args("--cost", "relaunch_fia=1", "--no-progress")) == 2
    assert "--cost is used by --project" in capfd.readouterr().err
    assert command.run(_args("--project", "--kinds", "FIA", "--no-progress")) == 2
    assert "--project needs the kinds" in capfd.readouterr().err
