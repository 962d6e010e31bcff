"""Tensor parallelism on the real engine: ``tensor_parallel_size=2``, one worker process per rank.

A module fixture runs the arms of ``torch_npu_sim.engine.tp`` once, each in a fresh interpreter
and process tree, two at a time: eager TP=1 (the reference), stock, overlay, verify and the
negative control, each at TP=2 with workers started by fork (with vLLM's async scheduling) and by
spawn (the overlay arm; the others run fork only), on one model with PA graph sizes, over batches
that change every step. Then:

- every TP=2 graph arm's greedy tokens equal eager TP=1's;
- in every rank's worker process (read by ``collective_rpc``), the overlay owned every graph the
  simulated device captured, made (or, in verify, checked) every update, and applied every task
  update; each worker also wrote its status file under its pid and rank;
- verify finds no mismatch on any rank, and no rank has a happens-before race;
- the negative control (every relaunch skipped) gives other tokens: the comparison can fail;
- a relaunch raising on rank 1 only: the overlay raises it as stock would, records it in the rank's
  status file and ends that worker, so vLLM fails the job at once (fork and spawn; the collective
  timeout there is longer than a case may run, so waiting cannot pass); stock waits in a
  collective until its timeout (30 s here), and so does the overlay told to
  (``ASCEND_GRAPH_PATCH_TP_FAULT=wait``), the negative control.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ascend_graph_patch import status_files
from torch_npu_sim.engine import race_table, rank_fault, tp

pytestmark = pytest.mark.timeout(1200)

GRAPH_ARMS = ("stock", "overlay", "verify")


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("engine-tp")
    results = tp.run(root, root / "models")
    table = tp.table(results) + "\n\n" + tp.fault_table(root, results, status_files.read_dir)
    (root / "table.md").write_text(table + "\n")
    print("\n" + table)
    yield root, results


@pytest.fixture(scope="module")
def results(tp_run: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    return tp_run[1]


def _cases(results: dict[str, Any], arm: str) -> dict[str, Any]:
    data = results[arm]
    assert not data.get("error"), f"arm {arm} did not run: {data['error']}"
    return data["cases"]


def test_eager_tp1_reference_runs(results: dict[str, Any]) -> None:
    tokens = tp.reference_tokens(results)
    assert tokens, _cases(results, "eager")
    requests = tokens[0]
    assert len({tuple(r) for r in requests}) == len(requests)
    assert len({t for r in requests for t in r}) >= len(requests) * 2


@pytest.mark.parametrize("arm", GRAPH_ARMS)
def test_tp2_graph_arm_tokens_equal_eager_tp1(results: dict[str, Any], arm: str) -> None:
    reference = tp.reference_tokens(results)
    records = _cases(results, arm)
    bad = []
    for case in tp.graph_cases(arm):
        record = records.get(case.name) or {"error": "missing"}
        if record.get("error"):
            bad.append(f"{case.name}: crashed: {record['error']}")
        elif record["tokens"] != reference:
            bad.append(f"{case.name}: tokens {record['tokens']} != eager TP=1 {reference}")
        elif len(tp.ranks(record)) != 2:
            bad.append(f"{case.name}: figures from {len(tp.ranks(record))} workers, not 2")
    assert not bad, "\n".join(bad)


def test_no_rank_has_a_race(results: dict[str, Any]) -> None:
    """The happens-before race detector (on in every arm, ``engine.race_table``), per rank: no
    task update, run or event record a device could reorder, fork with async scheduling and
    spawn alike (its negative control on the engine: ``test_engine``'s no-barrier case)."""
    bad = []
    for arm in GRAPH_ARMS:
        for case in tp.graph_cases(arm):
            record = _cases(results, arm).get(case.name) or {}
            if record.get("error"):
                continue  # covered by the tokens test
            for row in tp.ranks(record):
                found = race_table.races({"runners": [row]})
                if found is None or any(found.values()):
                    bad.append(f"{arm} | {case.name} | rank {row.get('rank')}: races {found}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("arm", ("overlay", "verify"))
def test_every_rank_owns_its_graphs_and_updates_every_task(
    tp_run: tuple[Path, dict[str, Any]], arm: str
) -> None:
    """Per rank, in its worker process: owned graphs = captured graphs, overlay updates (or
    verify's checks) = replays, tasks updated or checked = task updates the device applied,
    nothing left to stock or a fallback; and a status file under that worker's pid and rank."""
    root, results = tp_run
    files = {s.get("pid"): s for s in status_files.read_dir(root / arm / "status")}
    bad = []
    for case in tp.graph_cases(arm):
        record = _cases(results, arm).get(case.name) or {}
        if record.get("error"):
            continue  # covered by the tokens test
        rows = tp.ranks(record)
        if [r.get("rank") for r in rows] != [0, 1] or record["arm_pid"] in {r["pid"] for r in rows}:
            bad.append(f"{case.name}: ranks {[(r.get('rank'), r.get('pid')) for r in rows]}")
            continue
        for row in rows:
            where = f"{case.name} rank {row['rank']} (pid {row['pid']})"
            counters = (row.get("overlay") or {}).get("counters") or {}
            sim = row.get("sim") or {}
            if counters.get("graphs.owned") != sim.get("captures") or not sim.get("captures"):
                bad.append(
                    f"{where}: owned {counters.get('graphs.owned')} of {sim.get('captures')}"
                )
            updates = "verify.updates" if arm == "verify" else "updates.owned"
            if counters.get(updates) != sim.get("replays") or not sim.get("replays"):
                bad.append(
                    f"{where}: {updates} {counters.get(updates)}, {sim.get('replays')} replays"
                )
            tasks = counters.get("tasks.updated", 0) + counters.get("verify.tasks", 0)
            if tasks != sim.get("updates") or not tasks:
                bad.append(
                    f"{where}: {tasks} tasks updated or checked, {sim.get('updates')} applied"
                )
            leaks = {k: v for k, v in counters.items() if k.startswith(("errors.", "fallback."))}
            if counters.get("updates.stock.unowned"):
                leaks["updates.stock.unowned"] = counters["updates.stock.unowned"]
            if leaks:
                bad.append(f"{where}: went elsewhere: {leaks}")
            written = files.get(row["pid"])
            if written is None:
                bad.append(f"{where}: no status file under its pid")
            elif written.get("rank") != row["rank"]:
                bad.append(f"{where}: status file says rank {written.get('rank')}")
            elif written.get("graphs_owned") != counters.get("graphs.owned"):
                bad.append(f"{where}: status file owns {written.get('graphs_owned')} graphs")
    assert not bad, "\n".join(bad)


def test_status_from_the_arm_directory_shows_one_row_per_rank(
    tp_run: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """``ascend-graph-patch status --from DIR`` over the overlay arm's status directory: a row per
    process, the TP workers' with their ranks and owned graphs."""
    import json

    from ascend_graph_patch import cli

    root, results = tp_run
    assert cli.main(["status", "--from", str(root / "overlay" / "status"), "--json"]) == 0
    rows = {r["pid"]: r for r in json.loads(capsys.readouterr().out)["per_process"]}
    fork = _cases(results, "overlay")[tp.CASES[0].name]
    shown = [(rows.get(r["pid"]) or {}).get("rank") for r in tp.ranks(fork)]
    assert shown == [0, 1], rows
    for record in _cases(results, "overlay").values():
        for worker in tp.ranks(record):
            assert (rows.get(worker["pid"]) or {}).get("graphs_owned") == 3, rows


def test_verify_finds_no_mismatch_on_any_rank(results: dict[str, Any]) -> None:
    bad = []
    for case in tp.graph_cases("verify"):
        record = _cases(results, "verify").get(case.name) or {}
        if record.get("error"):
            continue  # covered by the tokens test
        for row in tp.ranks(record):
            counters = (row.get("overlay") or {}).get("counters") or {}
            found = (counters.get("verify.mismatches", 0), counters.get("verify.stock_failed", 0))
            if found != (0, 0) or not counters.get("verify.tasks"):
                bad.append(f"{case.name} rank {row.get('rank')}: mismatches, failed: {found}")
    assert not bad, "\n".join(bad)


def test_negative_control_differs_from_eager_tp1(results: dict[str, Any]) -> None:
    """Every relaunch skipped on both ranks, events still recorded: other tokens, or the
    comparison above could not fail."""
    record = _cases(results, "control")[tp.CONTROL_CASE.name]
    assert not record.get("error"), record["error"]
    assert record["tokens"] != tp.reference_tokens(results)
    skipped = [(r.get("sim") or {}).get("relaunches_skipped") for r in tp.ranks(record)]
    assert len(skipped) == 2 and all(skipped), skipped


@pytest.fixture(scope="module")
def faults(tp_run: tuple[Path, dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The fault cases' rows (``tp.fault_rows``) by (arm, case name)."""
    return {(r["arm"], r["case"]): r for r in tp.fault_rows(*tp_run, status_files.read_dir)}


def _fault_record(root: Path, arm: str, record: dict[str, Any]) -> dict[str, Any] | None:
    """The fault record in the status file of the case's rank 1."""
    ranks = [
        s
        for s in status_files.read_dir(root / arm / "status")
        if s["pid"] in tp.case_pids(record) and s.get("rank") == 1
    ]
    return ranks[0].get("fault") if len(ranks) == 1 else {"ranks found": len(ranks)}


def _fired(results: dict[str, Any], arm: str, case: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The case's record, after checking that its job ended with an error (not killed by the
    arm's case timeout) and that the fault fired on rank 1."""
    record = _cases(results, arm)[case.name]
    error = record.get("error") or ""
    assert error, f"{case.name}: no error, tokens {record.get('tokens')}"
    assert "timed out after" not in error and "without a result" not in error, error
    assert rank_fault.MESSAGE.format(n=3, rank=1) in row["log"], "the fault never fired"
    return record


_ENDED = "(VllmWorker-1 pid=7) ascend-graph-patch: rank 1 of 2: ... ending this worker now so ..."
_MONITOR = "(EngineCore pid=5) ERROR Worker proc VllmWorker-1 died unexpectedly, shutting down"
_PEER = (
    "(EngineCore pid=5) RuntimeError: Worker failed with error "
    "'[pair.cc:547] Connection closed by peer [127.0.0.1]:58533', please"
)
_WAITED = "(EngineCore pid=5) RuntimeError: [gloo] Timed out waiting 30000ms for recv operation"


@pytest.mark.parametrize(
    ("lines", "outcome"),
    [
        ((_ENDED, _MONITOR), "worker ended by the overlay; vLLM failed the job"),
        ((_ENDED, _PEER), "worker ended by the overlay; vLLM failed the job"),
        ((_ENDED, _MONITOR, _PEER), "worker ended by the overlay; vLLM failed the job"),
        ((_MONITOR, _PEER), "other"),
        ((_ENDED,), "other"),
        ((_WAITED,), "collective timed out (30 s)"),
    ],
    ids=["monitor-first", "peer-first", "both", "not-ended-by-overlay", "job-not-failed", "waited"],
)
def test_fault_outcome_accepts_either_way_vllm_notices_the_ended_worker(
    lines: tuple[str, ...], outcome: str
) -> None:
    """After the overlay ends rank 1, vLLM's worker monitor and rank 0's collective with the dead
    peer race to fail the job (CI, 2026-12-05: the collective first, no monitor line logged);
    either is the job ending at once. An overlay that did not end the worker is not that."""
    assert tp.fault_outcome("\n".join(lines)) == outcome


@pytest.mark.parametrize("case", [tp.FAULT_CASE, tp.FAULT_SPAWN_CASE], ids=["fork", "spawn"])
def test_a_failed_update_on_one_rank_ends_the_job_at_once(
    tp_run: tuple[Path, dict[str, Any]], faults: dict[tuple[str, str], dict[str, Any]], case: Any
) -> None:
    """Rank 1's third relaunch raises. The overlay raises that error as stock would, records it,
    and ends rank 1's worker (rank 0 is the one the executor reads): vLLM's worker monitor fails
    the job. The collective timeout is longer than the case may run: waiting cannot pass. The
    user sees the original error (type, message, rank, graph size, task) in the line that ends
    the job and in the rank's status file."""
    root, results = tp_run
    row = faults[("overlay", case.name)]
    record = _fired(results, "overlay", case, row)
    assert row["outcome"] == "worker ended by the overlay; vLLM failed the job", row["log"][-3000:]
    assert "Timed out waiting" not in row["log"]
    (line,) = [x for x in row["log"].splitlines() if "ending this worker now" in x]
    for part in ("rank 1 of 2", "RuntimeError: " + rank_fault.MESSAGE.format(n=3, rank=1)):
        assert part in line, line
    fault = _fault_record(root, "overlay", record)
    assert fault is not None and {k: fault.get(k) for k in ("type", "message", "rank")} == {
        "type": "RuntimeError",
        "message": rank_fault.MESSAGE.format(n=3, rank=1),
        "rank": 1,
    }, fault
    assert fault["world_size"] == 2 and fault["action"] == "ended this worker", fault
    assert fault["graph_size"] in (1, 2, 4) and f"size {fault['graph_size']}" in line, fault
    assert "model.layers." in fault["task"] and fault["task"] in line, fault


def test_stock_waits_for_the_collective_timeout(
    tp_run: tuple[Path, dict[str, Any]], faults: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """Stock, the same fault: rank 0 waits in a collective rank 1 never joins until it times out
    (the difference with the overlay is real)."""
    row = faults[("stock", tp.STOCK_FAULT_CASE.name)]
    _fired(tp_run[1], "stock", tp.STOCK_FAULT_CASE, row)
    assert row["outcome"] == f"collective timed out ({tp.WAIT_TIMEOUT} s)", row["log"][-3000:]
    assert "died unexpectedly" not in row["log"]


def test_told_to_wait_the_overlay_waits_as_stock_does(
    tp_run: tuple[Path, dict[str, Any]], faults: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """The negative control: ``ASCEND_GRAPH_PATCH_TP_FAULT=wait`` keeps stock's behaviour (the
    fault still raised and recorded in the rank's status file). In the control arm (relaunches
    skipped, the fault raising at the third all the same): see ``tp.WAIT_FAULT_CASE``."""
    root, results = tp_run
    row = faults[("control", tp.WAIT_FAULT_CASE.name)]
    record = _fired(results, "control", tp.WAIT_FAULT_CASE, row)
    assert row["outcome"] == f"collective timed out ({tp.WAIT_TIMEOUT} s)", row["log"][-3000:]
    assert "ending this worker" not in row["log"] and "died unexpectedly" not in row["log"]
    fault = _fault_record(root, "control", record)
    assert fault is not None and fault.get("action") == "raised into the engine", fault
    assert fault.get("message") == rank_fault.MESSAGE.format(n=3, rank=1), fault


# --- the A/B on the real engine at TP=2 ------------------------------------------------------


def test_ab_with_a_model_at_tp2_end_to_end(tmp_path: Path) -> None:
    """``ab --model DIR -- --tensor-parallel-size 2 ...`` on the simulator: stock and patched arms
    (the CLI's configuration, two arms instead of its ABBA four), tokens compared; every rank's
    status file reaches the A/B's status directory under its pid and rank, the patched arm's
    workers owning their graphs, the stock arm's running with the overlay off."""
    import json

    from ascend_graph_patch.ab import compare, orchestrate
    from torch_npu_sim.engine import cases, models

    model = models.materialize("qwen3", tmp_path / "models")
    additional = {"ascend_compilation_config": cases.ASCEND_COMPILATION, "pa_shape_list": [1, 4]}
    compilation = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}
    engine_args = [
        "--tensor-parallel-size", "2",
        "--dtype", "float32",
        "--max-model-len", "256",
        "--max-num-seqs", "4",
        "--kv-cache-memory-bytes", str(64 << 20),
        "--no-async-scheduling",
        "--additional-config", json.dumps(additional),
        "--compilation-config", json.dumps(compilation),
    ]  # fmt: skip
    cfg = orchestrate.ABConfig(
        out=tmp_path / "ab",
        workload="vllm",
        model=str(model),
        cases=[f"vllm:{model}"],
        prompts=["The capital of France is", "def fibonacci(n):", "Q: 17 * 23?"],
        max_tokens=12,
        engine_args=engine_args,
        timeout=600,
        warmup=0,
        progress=False,
        order=["stock", "patched"],
        extra_env={
            "VLLM_WORKER_MULTIPROC_METHOD": "fork",
            "OMP_NUM_THREADS": "1",
        },
    )
    runs = orchestrate.run_ab(cfg)
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    summary = compare.summarize(cfg, runs)
    case = summary.cases[0]
    assert case.verdict == compare.PASS, case.reasons
    assert case.tokens.startswith("equal"), case.tokens
    workers = [
        s
        for run in runs
        for s in status_files.read_dir(run.dir / "status")  # the A/B's per-arm status directory
        if s.get("rank") is not None
    ]
    by_mode = {
        mode: sorted(s["rank"] for s in workers if s.get("mode") == mode) for mode in ("on", "off")
    }
    assert by_mode == {"on": [0, 1], "off": [0, 1]}, workers
    assert all(s.get("graphs_owned") == 3 for s in workers if s.get("mode") == "on"), workers
