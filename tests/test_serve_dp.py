"""``ab --serve --data-parallel-size 2``: DeepSeek-V3 (MLA + MoE) served at data parallelism.

vLLM 0.23.0 runs a MoE model's data-parallel ranks as one job (``DPEngineCoreProc``): while one
rank has requests, every idle rank runs dummy batches in step with it (vLLM checks whether any
rank still has work only every 32 steps), and each dummy batch replays a FULL graph whose tasks
are updated with dummy metadata. The MoE layer's all-gather and reduce-scatter across the ranks
are captured in every graph.

The servers are expensive (a DP=2 server is an API server, a DP coordinator and two engine
cores with a worker each, all importing vLLM; two to three minutes to start on this shared
machine), so one module-scoped run of two servers at once serves every end-to-end assertion: the
patched server at DP=2 and the eager reference at DP=1, three loads each (one request: one rank
busy, the other idle; then eight: both busy; then the eight again as the negative control: in the
patched server the simulator skips every relaunch once a switch file exists, which the test
creates between the loads). The eager reference runs at DP=1 because it is cheaper (one engine
core) and gives the same outputs as eager at DP=2 (every request of both loads,
``scripts/dp-serve.py``: ``docs/engine.md``). Stock, verify, expert parallelism, the MTP draft
and a rank fault run by hand (``scripts/dp-serve.py``; the table is in ``docs/engine.md``).

The cheap tests at the top check the configuration and the per-rank figures on made-up files.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ascend_graph_patch.ab import command, compare, orchestrate, report, serve_report, worker_serve
from ascend_graph_patch.ab.timing import UpdateTimer
from tests import process_support
from tests.test_serve import _environment, _share_model_inspection

pytestmark = pytest.mark.timeout(600)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


# --- configuration ---------------------------------------------------------------------------


def test_data_parallel_size_reaches_vllm_serve_with_one_api_server_and_an_idle_rank_load(
    tmp_path: Path,
) -> None:
    argv = ["--serve", "--model", "org/m", "--data-parallel-size", "2", "--out", str(tmp_path)]
    cfg = command.build_config(_args(*argv, "--enable-expert-parallel", "--", "--seed", "1"))
    assert cfg.engine_args == [
        "--seed",
        "1",
        "--data-parallel-size",
        "2",
        "--api-server-count",
        "1",
        "--enable-expert-parallel",
    ]
    one, load = cfg.serve["loads"]
    assert cfg.cases == ["greedy, 1 request", "greedy"]
    assert one["num_prompts"] == one["max_concurrency"] == 1 and one["temperature"] == 0.0
    assert load["max_concurrency"] == 16 and load["num_prompts"] == 64  # every rank's batch
    # vLLM's other data-parallel options are not the size; given, the user's count is kept
    local = ["--data-parallel-size-local", "2", "--api-server-count=2"]
    cfg = command.build_config(_args(*argv, "--", *local))
    assert cfg.engine_args == [*local, "--data-parallel-size", "2"]
    # At DP=1 nothing of it: the loads and arguments of a plain served A/B.
    plain = command.build_config(_args("--serve", "--model", "org/m", "--out", str(tmp_path)))
    assert plain.cases == ["greedy"] and plain.engine_args == []
    assert plain.serve["loads"][0]["max_concurrency"] == 8


@pytest.mark.parametrize(
    "argv",
    [
        ("--serve", "--model", "m", "--data-parallel-size", "0"),
        ("--serve", "--model", "m", "--data-parallel-size", "2", "--", "--data-parallel-size", "2"),
        ("--serve", "--model", "m", "--sim-model", "deepseek-v3"),
        ("--data-parallel-size", "2"),  # a served option without --serve
    ],
)
def test_data_parallel_usage_errors_exit_2(argv: tuple[str, ...], tmp_path: Path, capsys) -> None:
    cut = argv.index("--") if "--" in argv else len(argv)
    try:
        args = _args(*argv[:cut], "--out", str(tmp_path), *argv[cut:])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        assert command.run(args) == 2
    assert "error" in capsys.readouterr().err


# --- per-rank figures ------------------------------------------------------------------------


def _snap(pid: int, rank: int | None, calls: int = 0, dummy: int = 0, **counters: int) -> dict:
    return {
        "pid": pid,
        "rank": rank,
        "update_calls": calls,
        "calls": {"dummy_batches": dummy} if dummy else {},
        "counters": {k.replace("_", "."): v for k, v in counters.items()},
        "graphs_owned": 3 if calls else 0,
    }


def test_ranks_sum_each_ranks_processes_and_leave_out_processes_without_a_rank() -> None:
    snaps = [
        _snap(10, None, updates_owned=99),  # no rank (an API server with counters): not a rank
        _snap(11, 0, calls=31, dummy=16, updates_owned=31),
        _snap(12, 1, calls=31, dummy=32, updates_owned=30, fallback_resolution=1),
        _snap(13, 1),  # a process of rank 1 that counted nothing
    ]
    ranks = worker_serve.ranks(snaps)
    assert list(ranks) == ["0", "1"]
    assert ranks["1"]["replays"] == 31 and ranks["1"]["calls"] == {"dummy_batches": 32}
    assert ranks["1"]["pids"] == [12] and ranks["0"]["counters"] == {"updates.owned": 31}
    before = worker_serve.ranks([_snap(11, 0, calls=1, dummy=1, updates_owned=1)])
    delta = worker_serve.rank_deltas(ranks, before)
    assert delta["0"]["replays"] == 30 and delta["0"]["calls"] == {"dummy_batches": 15}
    assert delta["0"]["counters"] == {"updates.owned": 30} and delta["1"]["replays"] == 31


def test_a_loads_figures_wait_until_every_rank_stopped_counting(monkeypatch) -> None:
    """After the last request a data-parallel wave runs on (dummy batches until vLLM's next
    32-step check): the load's figures are read once two readings agree, not at the first."""
    readings = iter([1, 2, 3, 3, 4])

    def live(directory: Path) -> dict[str, Any]:
        n = next(readings)
        return {"counters": {"updates.owned": n}, "replays": n, "ranks": {}}

    monkeypatch.setattr(worker_serve, "live_figures", live)
    monkeypatch.setattr(worker_serve, "SETTLE", 0.0)
    assert worker_serve.quiet_figures(Path("."), float("inf"))["replays"] == 3
    readings = itertools.count()  # never quiet: the reading at the bound
    monkeypatch.setattr(worker_serve, "QUIET_MAX", 0.05)
    assert worker_serve.quiet_figures(Path("."), float("inf"))["replays"] > 1


def _served_case(ranks: dict[str, dict[str, Any]]) -> compare.Summary:
    row = {"arm": "patched", "run": 1, "outputs": "equal", "ranks": ranks}
    case = compare.CaseResult(name="greedy")
    case.served.append(row)
    return compare.Summary("PASS", 0, [case], [], None, None, "", [])


def test_rank_rows_only_where_a_run_had_more_than_one_rank() -> None:
    figures = {"replays": 7, "dummy_batches": 2, "updates_owned": 7, "fallbacks": 0}
    assert serve_report.rank_rows(_served_case({"0": figures})) == []
    rows = serve_report.rank_rows(
        _served_case({"0": figures, "1": {**figures, "verify_mismatches": 0, "verify_tasks": 14}})
    )
    assert [r[3] for r in rows] == ["0", "1"]
    assert rows[0][5:] == ["2", "0", "7", "7", "0", "-"] and rows[1][-1] == "0 of 14"


def test_the_timer_counts_calls_of_a_counted_entry_point(monkeypatch) -> None:
    module = types.ModuleType("_dp_counted_fixture")

    class Worker:
        def execute_dummy_batch(self, fail: bool = False) -> int:
            if fail:
                raise RuntimeError("dummy batch failed")
            return 1

    module.Worker = Worker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    timer = UpdateTimer()
    timer.install((), counted={"dummy_batches": f"{module.__name__}:Worker.execute_dummy_batch"})
    worker = Worker()
    assert worker.execute_dummy_batch() == 1
    with pytest.raises(RuntimeError):
        worker.execute_dummy_batch(fail=True)
    assert timer.counts == {"dummy_batches": 2} and timer.samples == []
    untimed = UpdateTimer()  # the negative control: installed without it, nothing counts
    untimed.install(())
    worker.execute_dummy_batch()
    assert untimed.counts == {}


# --- end to end: DeepSeek-V3 at DP=2 ---------------------------------------------------------

#: Loads after the one-request load: eight requests, eight tokens (four per rank: both busy).
PROMPTS, TOKENS = 8, 8


#: The control's load: the greedy load again, on the same servers; in the patched server every
#: relaunch is skipped from its start (the switch file exists), in the eager one nothing changes.
CONTROL = "greedy, relaunches skipped (control)"


def _switch_on_after(result: Path, switch: Path, stop: threading.Event) -> None:
    """Create ``switch`` as soon as ``result`` (the second load's client result) exists: the
    worker then waits for the status files to go quiet (seconds) before the control's load."""
    while not stop.is_set():
        if result.exists():
            switch.touch()
            return
        stop.wait(0.1)


@pytest.fixture(scope="module")
def served_dp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two servers at once: the patched server at DP=2 and the eager reference at DP=1, the same
    three loads each (one request, eight, and the eight again as the negative control's: in the
    patched server, relaunches skipped while a switch file exists, created between the loads)."""
    root = tmp_path_factory.mktemp("serve-dp")
    mark = process_support.new_mark()
    env = _environment(root / "home", mark)
    base = ["--serve", "--sim-model", "deepseek-v3", "--no-progress", "--timeout", "500"]
    base += ["--num-prompts", str(PROMPTS), "--output-len", str(TOKENS)]

    def config(name: str, *more: str) -> orchestrate.ABConfig:
        _share_model_inspection(root / name)
        return command.build_config(_args(*base, *more, "--out", str(root / name)))

    cfg = config("ab", "--data-parallel-size", "2")
    cfg.order = ["patched"]
    cfg.serve["loads"].append({**cfg.serve["loads"][-1], "name": CONTROL})
    cfg.cases.append(CONTROL)
    switch = root / "skip-relaunches"
    cfg.extra_env = {"TORCH_NPU_SIM_TEST_SKIP_RELAUNCH": f"while:{switch}"}
    eager = config("eager")  # DP=1, the DP=2 configuration's loads
    eager.order, eager.serve, eager.cases = ["eager"], cfg.serve, cfg.cases
    stop = threading.Event()
    result = root / "ab" / "arms" / "00-patched" / "client-greedy.json"
    watcher = threading.Thread(target=_switch_on_after, args=(result, switch, stop), daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(1) as pool:  # the orchestrator's own loop, one per configuration
            other = pool.submit(orchestrate.run_ab, eager, env)
            (patched,) = orchestrate.run_ab(cfg, env)
            (eager_run,) = other.result()
    finally:
        stop.set()
    runs = [eager_run, dataclasses.replace(patched, index=1)]
    summary = compare.summarize(cfg, runs)
    paths = report.write(cfg, summary, runs)
    return {
        "cfg": cfg,
        "runs": runs,
        "summary": summary,
        "paths": paths,
        "switched": switch.exists(),
        "mark": mark,
    }


def _ranks(case: compare.CaseResult, arm: str) -> dict[str, dict[str, Any]]:
    (row,) = [r for r in case.served if r["arm"] == arm]
    return row["ranks"]


def test_patched_dp2_outputs_equal_eager_dp2_with_one_rank_idle_and_both_busy(
    served_dp: dict[str, Any],
) -> None:
    runs, summary = served_dp["runs"], served_dp["summary"]
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    assert [c.name for c in summary.cases] == ["greedy, 1 request", "greedy", CONTROL]
    for case in summary.cases[:2]:
        assert case.correctness == {"eager": "reference", "patched": "equal"}
        assert all(r["requests"].split("/")[0] == r["requests"].split("/")[1] for r in case.served)
    text = report.text_table(served_dp["cfg"], summary)
    assert "data parallel 2" in text and "dummy batches" in text


def test_the_idle_rank_replays_full_graphs_in_dummy_batches_and_the_overlay_owns_them(
    served_dp: dict[str, Any],
) -> None:
    """One request: one rank serves it, the other runs dummy batches in step. Both ranks replay
    FULL graphs as often (the DP-synced batch), the idle rank's replays are all dummy batches,
    and every update on both ranks was the overlay's. The eager server's ranks run dummy batches
    too but replay nothing (the count's negative control)."""
    one, both, _ = served_dp["summary"].cases
    patched = _ranks(one, "patched")
    assert list(patched) == ["0", "1"]
    replays = {rank: r["replays"] for rank, r in patched.items()}
    assert replays["0"] == replays["1"] >= TOKENS - 2, patched
    idle = [rank for rank, r in patched.items() if r["dummy_batches"] >= r["replays"]]
    assert len(idle) == 1, patched
    for rank, r in patched.items():
        assert r["updates_owned"] == r["replays"] and r["fallbacks"] == 0, (rank, r)
    assert all(r["replays"] == 0 for r in _ranks(one, "eager").values())  # eager replays nothing
    for rank, r in _ranks(both, "patched").items():
        assert r["updates_owned"] == r["replays"] > 0 and r["fallbacks"] == 0, (rank, r)


def test_negative_control_at_dp2_relaunches_skipped_outputs_differ(
    served_dp: dict[str, Any],
) -> None:
    """The same patched server, once the switch file exists: every relaunch skipped on both
    ranks (every update still made and owned), the outputs differ from eager's; the A/B says so."""
    assert served_dp["switched"]
    summary = served_dp["summary"]
    assert summary.verdict == compare.DIFF and summary.exit_code == 1
    control = summary.cases[2]
    assert control.correctness["patched"].startswith("differs at step 0, request "), control
    for rank, r in _ranks(control, "patched").items():
        assert r["updates_owned"] == r["replays"] > 0, (rank, r)


def test_the_skip_switch_file_skips_relaunches_only_while_it_exists(
    tmp_path: Path, monkeypatch
) -> None:
    from torch_npu_sim import runtime
    from torch_npu_sim.engine import control

    applied: list[str] = []
    monkeypatch.setattr(runtime, "_apply_update", lambda name, a, k: applied.append(name))
    switch = tmp_path / "switch"
    assert control.install({control.ENV_VAR: f"while:{switch}"}) and control.active()
    monkeypatch.setattr(runtime._S, "update_done", False, raising=False)
    runtime._apply_update("op", (), {})
    assert applied == ["op"]  # no file: the relaunch is applied
    switch.touch()
    runtime._apply_update("op", (), {})
    assert applied == ["op"] and runtime._S.update_done  # skipped, the scope closed as done
    assert not control.install({})  # the negative: nothing asked, nothing installed


def test_every_process_the_dp_servers_started_is_gone(served_dp: dict[str, Any]) -> None:
    assert process_support.wait_gone(served_dp["mark"], 30.0) == {}
