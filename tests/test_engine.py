"""The proof of record: the real vLLM engine, vllm-ascend's real runner and graph code, on the
simulator, with tiny models built here (``torch_npu_sim.engine``).

A module fixture runs every arm once, each in a fresh interpreter, two at a time: eager, stock
(overlay off), overlay (on), verify, and the negative control (overlay on, every relaunch
skipped). Each arm runs its cases (``torch_npu_sim.engine.cases``) one after another in forked
children of one process. Then:

- every graph arm's greedy tokens equal eager's, except where stock is known to fail on the
  release (the case says how; the stock arm must fail exactly so, the overlay must still equal
  eager), or where the release cannot run the case at all (both fail the same way);
- the overlay's counters, read in the process that ran the model runner (by RPC into the engine
  core when it has its own process), show it owned every captured graph and made every update;
- verify compares stock's update with the overlay's at every replay: no mismatch where stock is
  right, and stock's failures counted where it crashes;
- the draft reports its acceptance rate in every arm, equal to eager's in every graph arm (tokens
  alone cannot show a wrong draft graph: speculative decoding is lossless);
- the negative control's tokens differ from eager's: the comparison can fail;
- the happens-before race detector, on in every arm, finds no race in any graph arm, async
  scheduling included; without stock's replay barrier (in the control arm) it counts them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from torch_npu_sim.engine import arms, cases, models, race_table, report

# The module fixture runs every arm (about five minutes on two cores): its first test pays it.
pytestmark = pytest.mark.timeout(1800)

GRAPH_ARMS = ("stock", "overlay", "verify")


@pytest.fixture(scope="module")
def engine_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The arms' directory: each arm's result, log and status files under its name."""
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="module")
def results(engine_root: Path) -> Iterator[dict[str, Any]]:
    root = engine_root
    model_root = root / "models"
    for name in sorted({m for c in cases.CASES for m in (c.model, c.draft) if m}):
        models.materialize(name, model_root)
    out = arms.run_arms(root, model_root)
    table = report.table(out, cases.CASES + cases.CONTROL_ONLY_CASES + cases.OVERLAY_ONLY_CASES)
    (root / "table.md").write_text(table + "\n")
    print("\n" + table)
    yield out


def test_an_interrupted_run_leaves_no_arm_behind(
    tmp_path: Path, mocker: pytest.MockerFixture
) -> None:
    """A test's timeout or Ctrl-C while arms run stops every arm's process group: no engine
    outlives the run (a plain Popen left them, and the engine cores they start, running)."""
    started = []
    real_start = arms.supervisor.start

    def start(*args: Any, **kwargs: Any) -> Any:
        started.append(real_start(*args, **kwargs))
        return started[-1]

    mocker.patch.object(arms.supervisor, "start", side_effect=start)
    interrupt = mocker.Mock(side_effect=KeyboardInterrupt)
    mocker.patch.object(arms, "time", SimpleNamespace(sleep=interrupt, monotonic=time.monotonic))
    with pytest.raises(KeyboardInterrupt):
        arms.run_arms(tmp_path, tmp_path / "models", ("eager", "stock"), cases.CASES[:1])
    assert len(started) == 2
    for proc in started:
        assert proc.returncode is not None  # stopped and reaped
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # nothing left in its group


def _arm(results: dict[str, Any], arm: str) -> dict[str, Any]:
    data = results[arm]
    assert not data.get("error"), f"arm {arm} did not run: {data['error']}"
    return data["cases"]


def _failures(rows: list[str]) -> str:
    return "\n".join(["case | arm | what", "--- | --- | ---", *rows])


#: The arms whose updates are stock's: where stock is known to be wrong, they are too.
STOCK_UPDATES = ("stock", "verify")


def _stock_wrong(case: cases.Case, arm: str) -> bool:
    """Stock's update is known to give wrong values on ``case`` and ``arm`` applies it."""
    return case.stock.startswith("wrong: ") and arm in STOCK_UPDATES


def _expected_error(case: cases.Case, arm: str) -> str | None:
    """The error ``arm`` must fail with on ``case`` (None: it must run)."""
    if case.startup_error:
        return case.startup_error
    if case.overlay_error and arm in ("overlay", "verify"):
        return case.overlay_error
    if not case.stock.startswith("crash: ") or arm == "eager":
        return None
    if arm == "stock" or case.overlay_same_as_stock:
        return case.stock.removeprefix("crash: ")
    return None


def _check_outcome(record: dict[str, Any], case: cases.Case, arm: str, reference: Any) -> str:
    """What is wrong with ``arm``'s outcome on ``case`` (empty: nothing)."""
    expected = _expected_error(case, arm)
    error = record.get("error")
    if expected is not None:  # the first line, or further down the exception's message
        found = error and expected in error + (record.get("traceback") or "")
        return "" if found else f"expected {expected!r}, got {error}"
    if error:
        return f"crashed: {error}"
    if _stock_wrong(case, arm):  # its tokens must show it, or the case proves nothing
        same = reference is not None and record["tokens"] == reference
        return "tokens equal eager's although stock is known to be wrong here" if same else ""
    if reference is not None and record["tokens"] != reference:
        return f"tokens {record['tokens']} != eager {reference}"
    return ""


def test_eager_reference_runs_and_is_not_degenerate(results: dict[str, Any]) -> None:
    eager = _arm(results, "eager")
    bad = []
    for case in cases.eager_cases():
        record = eager.get(case.name) or {"error": "missing"}
        problem = _check_outcome(record, case, "eager", None)
        if problem or case.startup_error:
            bad += [f"{case.name} | eager | {problem}"] if problem else []
            continue
        requests = record["tokens"][0]
        distinct = {t for r in requests for t in r}
        if len(distinct) < len(requests) * 2 or len({tuple(r) for r in requests}) < len(requests):
            bad.append(f"{case.name} | eager | degenerate tokens {requests}")
    assert not bad, _failures(bad)


@pytest.mark.parametrize("arm", GRAPH_ARMS)
def test_graph_arm_tokens_equal_eager(results: dict[str, Any], arm: str) -> None:
    records, eager = _arm(results, arm), _arm(results, "eager")
    bad = []
    for case in cases.CASES:
        record = records.get(case.name) or {"error": "missing"}
        reference = (eager.get(case.reference) or {}).get("tokens")
        problem = _check_outcome(record, case, arm, reference)
        if problem:
            bad.append(f"{case.name} | {arm} | {problem}")
    assert not bad, _failures(bad)


@pytest.mark.parametrize("arm", ("overlay", "verify"))
def test_overlay_owns_every_graph_and_makes_every_update(results: dict[str, Any], arm: str) -> None:
    """In the runner's process: every captured graph owned, every replay updated by the overlay
    (or, in verify, compared), every task update the simulator applied is one the overlay made
    or checked, and nothing went to stock's path or a fallback."""
    bad = []
    for case in cases.CASES:
        record = _arm(results, arm).get(case.name) or {}
        if record.get("error"):
            continue  # covered by the tokens test
        figures = report.runner(record)
        overlay, sim = figures.get("overlay") or {}, figures.get("sim") or {}
        counters = overlay.get("counters") or {}
        problems = []
        if counters.get("graphs.owned") != sim.get("captures") or not sim.get("captures"):
            problems.append(f"owned {counters.get('graphs.owned')} of {sim.get('captures')}")
        updates = "verify.updates" if arm == "verify" else "updates.owned"
        if counters.get(updates) != sim.get("replays"):
            problems.append(f"{updates} {counters.get(updates)} for {sim.get('replays')} replays")
        # verify applies stock's update after comparing it (verify.tasks), or the overlay's where
        # stock's dry run failed (tasks.updated): together, every task update applied.
        tasks = counters.get("tasks.updated", 0) + counters.get("verify.tasks", 0)
        if tasks != sim.get("updates") or not tasks:
            problems.append(f"{tasks} tasks updated or checked for {sim.get('updates')} updates")
        leaks = {k: v for k, v in counters.items() if k.startswith(("errors.", "fallback."))}
        leaks.update({k: v for k, v in counters.items() if k == "updates.stock.unowned"})
        if leaks:
            problems.append(f"went elsewhere: {leaks}")
        if (figures.get("pid") == record.get("arm_pid")) == case.multiprocess:
            problems.append(f"figures from pid {figures.get('pid')}, not the runner's process")
        if problems:
            bad.append(f"{case.name} | {arm} | " + "; ".join(problems))
    assert not bad, _failures(bad)


def test_verify_finds_no_mismatch_where_stock_is_right(results: dict[str, Any]) -> None:
    bad = []
    for case in cases.CASES:
        record = _arm(results, "verify").get(case.name) or {}
        if record.get("error"):
            continue  # covered by the tokens test
        counters = (report.runner(record).get("overlay") or {}).get("counters") or {}
        mismatches = counters.get("verify.mismatches", 0)
        failed = counters.get("verify.stock_failed", 0)
        if case.stock == "ok" and (mismatches or failed or not counters.get("verify.tasks")):
            bad.append(f"{case.name} | verify | {mismatches} mismatches, stock failed {failed}")
        if case.stock.startswith("crash") and not failed:
            bad.append(f"{case.name} | verify | stock is known to crash but no dry run failed")
        if case.stock.startswith("wrong") and not mismatches:
            bad.append(f"{case.name} | verify | stock is known to be wrong but no mismatch seen")
    assert not bad, _failures(bad)


def test_drafts_report_acceptance_equal_to_eager(results: dict[str, Any]) -> None:
    bad = []
    for case in (c for c in cases.CASES if c.draft and not c.startup_error):
        reference = _arm(results, "eager")[case.reference].get("spec") or {}
        if not reference.get("accepted_tokens"):
            bad.append(f"{case.name} | eager | no draft token accepted: {reference}")
            continue
        for arm in GRAPH_ARMS:
            if _expected_error(case, arm) or _stock_wrong(case, arm):
                continue  # a known crash or wrong update (covered by the tokens test)
            spec = (_arm(results, arm).get(case.name) or {}).get("spec") or {}
            same = all(spec.get(k) == reference[k] for k in ("accepted_tokens", "draft_tokens"))
            if not same:
                bad.append(f"{case.name} | {arm} | acceptance {spec} != eager {reference}")
    assert not bad, _failures(bad)


STEP3P5 = "step3p5+mtp/compile/decode-only/repaired"


@pytest.mark.parametrize("arm", ("overlay", "verify"))
def test_step3p5_draft_tasks_read_their_own_kv_group(results: dict[str, Any], arm: str) -> None:
    """Step3.5 MTP: each MTP layer is in a KV-cache group of its own, and the proposer passes one
    dict per group, in its group order. Every owned draft graph holds one task per MTP layer,
    bound to the entry of the layer's own group (step = the group's place), never another's."""
    figures = report.runner(_arm(results, arm)[STEP3P5])
    groups = figures.get("draft_groups") or []
    assert len(groups) == 2 and len({g["gid"] for g in groups}) == 2, groups
    assert all(len(g["layers"]) == 1 for g in groups), groups
    own = {g["layers"][0]: place for place, g in enumerate(groups)}
    draft_tasks = (figures.get("overlay") or {}).get("draft_tasks") or []
    case = next(c for c in cases.CASES if c.name == STEP3P5)
    assert len(draft_tasks) == len(case.capture_sizes), draft_tasks  # one per size
    want = sorted((layer, layer, step) for layer, step in own.items())
    for tasks in draft_tasks:  # (layer, metadata key, step): the layer's own key, its group's step
        assert sorted(map(tuple, tasks)) == want, (tasks, groups)


CHUNKED = "deepseek-v3/chunked-prefill/compile/decode-only"


def test_chunked_case_prefills_with_context_beside_running_decodes(
    results: dict[str, Any],
) -> None:
    """The MLA chunked-prefill case did what it is for, in every arm: prefill chunks attending
    to their prompt's earlier chunks (AscendMLAImpl's context path), in batches with running
    decodes, and decode graphs replayed after them. The same figure on the case without a
    chunk budget is zero: it tells the two apart."""
    case = next(c for c in cases.CASES if c.name == CHUNKED)
    bad = []
    for arm in ("eager", *GRAPH_ARMS, "control"):
        figures = report.runner(_arm(results, arm)[case.reference if arm == "eager" else CHUNKED])
        chunks = figures.get("mla_context_chunks") or {}
        replays = (figures.get("sim") or {}).get("replays")
        if not chunks.get("with_context") or not chunks.get("beside_decodes"):
            bad.append(f"{CHUNKED} | {arm} | no context chunk beside decodes: {chunks}")
        if arm != "eager" and not replays:
            bad.append(f"{CHUNKED} | {arm} | no decode graph replayed")
    plain = report.runner(_arm(results, "stock")["deepseek-v3/compile/decode-only"])
    if plain.get("mla_context_chunks") != {"with_context": 0, "beside_decodes": 0}:
        bad.append(
            f"deepseek-v3 | stock | context chunks counted: {plain.get('mla_context_chunks')}"
        )
    assert not bad, _failures(bad)


def test_negative_control_differs_from_eager(results: dict[str, Any]) -> None:
    """Relaunches skipped, events still recorded: the outcome must change, or the tests above
    could not fail. Other tokens; or an error where a task replayed with its captured arguments
    cannot run (PA captured at kv length 6144, beyond the block table and its workspace: hardware
    would read garbage). At least one case must run to its end with other tokens."""
    control, eager = _arm(results, "control"), _arm(results, "eager")
    bad, differing = [], 0
    for name in cases.CONTROL_CASES:
        case = next(c for c in cases.CASES if c.name == name)
        record = control.get(name) or {"error": "missing"}
        sim = report.runner(record).get("sim") or {}
        if record.get("error"):
            continue  # not eager's outcome either
        if record["tokens"] == eager[case.reference]["tokens"]:
            bad.append(f"{name} | control | tokens equal eager's although no relaunch ran")
        elif not sim.get("relaunches_skipped"):
            bad.append(f"{name} | control | no relaunch was skipped: {sim}")
        else:
            differing += 1
    if not differing:
        bad.append("all | control | no case ran to its end with other tokens")
    assert not bad, _failures(bad)


def test_graph_arms_have_no_race(results: dict[str, Any]) -> None:
    """The happens-before race detector (on in every arm) finds no task update, run or event
    record that a device could reorder, in any graph arm as released, async scheduling included
    (``qwen3/compile/decode-only/async``): stock's replay barrier orders them."""
    bad = []
    for arm in GRAPH_ARMS:
        for case in cases.CASES:
            record = _arm(results, arm).get(case.name) or {}
            if not record.get("runners"):
                continue  # it did not get as far as a model runner (covered by the tokens test)
            found = race_table.races(record)
            if found is None or any(found.values()):
                bad.append(f"{case.name} | {arm} | races {found}")
    assert not bad, _failures(bad)


def test_without_the_replay_barrier_async_updates_race(results: dict[str, Any]) -> None:
    """The negative control of the test above: the same async engine with stock's replay barrier
    removed (``TORCH_NPU_SIM_TEST_NO_REPLAY_BARRIER``, in the control arm). The simulator still
    runs in program order; the detector must count the task updates and event records that the
    host may now issue before the previous replay ran."""
    record = _arm(results, "control")[cases.NO_BARRIER_CASE.name]
    assert not record.get("error"), record.get("error")
    found = race_table.races(record)
    sim = report.runner(record).get("sim") or {}
    # every FULL replay went through the wrapper's barrier, and every skip was counted (the
    # simulator's counters survive vLLM's compiled forward: runtime.SimOp._call)
    assert sim.get("replay_barriers_skipped") == sim.get("replays") > 0, sim
    assert found is not None and found["update"] > 0 and found["record"] > 0, found


def test_stream_ordered_replay_has_no_race_and_without_its_wait_races(
    results: dict[str, Any],
) -> None:
    """The overlay's opt-in stream-ordered replay (``ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream``) on
    the async engine: replays ordered without stock's barrier, no race, tokens equal eager's. Its
    negative control, the same with the overlay's ``wait_stream`` made a no-op by the simulator
    (``order_wait``): the detector counts the updates and records the wait ordered."""
    for case, clean in ((cases.STREAM_ORDER_CASE, True), (cases.STREAM_NO_WAIT_CASE, False)):
        record = _arm(results, "overlay")[case.name]
        assert not record.get("error"), record.get("error")
        assert report.cell(results, "overlay", case).get("equal") is True, case.name
        found = race_table.races(record)
        ordered, skipped = race_table.stream_order(record)
        assert ordered > 0 and found is not None, (case.name, ordered, found)
        if clean:
            assert not any(found.values()) and skipped == 0, found
        else:
            assert found["update"] > 0 and found["record"] > 0 and skipped > 0, found


def test_tiny_models_are_cached_by_recipe(tmp_path: Path) -> None:
    first = models.materialize("qwen3", tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert models.materialize("qwen3", tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert first.name == f"qwen3-{models.MODELS['qwen3'].key()}"


QWEN35_TWO_GROUPS = "qwen3.5-two-groups+mtp/k1/compile/decode-only"


@pytest.mark.parametrize("arm", ("overlay", "verify"))
def test_hybrid_tasks_are_keyed_by_their_own_layer(results: dict[str, Any], arm: str) -> None:
    """Qwen3.5 with its attention layers in two KV-cache groups (plus GDN and MTP keys in the
    metadata): every owned target graph holds one FIA task per attention layer, each resolved
    from its own layer's metadata key (stock's sort shifts them by the MTP key), and every draft
    graph one task, the MTP layer's."""
    overlay = report.runner(_arm(results, arm)[QWEN35_TWO_GROUPS]).get("overlay") or {}
    layers = {f"language_model.model.layers.{i}.self_attn.attn" for i in (1, 3)}
    targets, drafts = overlay.get("target_tasks") or [], overlay.get("draft_tasks") or []
    assert len(targets) == len(drafts) == 3, overlay  # capture sizes 2, 4, 8
    for tasks in targets:
        assert {layer for layer, _, _ in tasks} == layers, tasks
        assert all(key == layer for layer, key, _ in tasks), tasks
    for tasks in drafts:
        assert [(layer, key) for layer, key, _ in tasks] == [("mtp.layers.0.self_attn.attn",) * 2]


QWEN35 = "qwen3.5+mtp/k1/compile/decode-only"


def test_qwen35_eager_tokens_equal_transformers(results: dict[str, Any], engine_root: Path) -> None:
    """Whole-model oracle of the GDN references: the engine's eager Qwen3.5 (with its MTP draft:
    speculative decoding is lossless) gives transformers 5.5.4's greedy tokens (its own torch
    implementation of the conv, the gating and the delta rule) for every request, the one whose
    prompt was chunked beside running decodes included."""

    import transformers

    from torch_npu_sim.engine.transformers_oracle import greedy_tokens

    case = next(c for c in cases.CASES if c.name == QWEN35)
    record = _arm(results, "eager")[case.reference]
    assert not record.get("error"), record.get("error")
    directory = models.materialize(case.model, engine_root / "models")
    want = greedy_tokens(transformers.Qwen3_5ForConditionalGeneration, directory, case)
    assert record["tokens"][0] == want


# --- stale graphs: VLLM_USE_V2_MODEL_RUNNER on vLLM 0.23.0 (ascend_graph_patch/aspects/stale.py) --


def _case_status(root: Path, arm: str, record: dict[str, Any]) -> dict[str, Any]:
    """The status file the case's process (its engine core ran in it) wrote, read by the
    overlay's reader."""
    from ascend_graph_patch import status_files

    mine = [
        s for s in status_files.read_dir(root / arm / "status") if s["pid"] == record["arm_pid"]
    ]
    assert len(mine) == 1, [s.get("pid") for s in status_files.read_dir(root / arm / "status")]
    return mine[0]


@pytest.mark.parametrize("arm", ("overlay", "verify"))
def test_a_stale_graph_ends_the_overlays_start_with_its_cause(
    results: dict[str, Any], engine_root: Path, arm: str
) -> None:
    """With the v2 variable set, stock's graphs capture no attention task and replay stale (its
    tokens differ from eager's: the tokens test). The overlay's engine never starts: one error
    naming the graph, the layers, the cause, the way out and the switch; no token produced; the
    error in ``status`` (the case's status file) with the stale graph counted."""
    record = _arm(results, arm)[cases.STALE_CASE.name]
    error = (record.get("error") or "") + (record.get("traceback") or "")
    for part in (
        cases.STALE_GRAPH_ERROR,
        "model.layers.0.self_attn.attn",
        "VLLM_USE_V2_MODEL_RUNNER is set",
        "falls back to the v1 runner",
        "Unset VLLM_USE_V2_MODEL_RUNNER",
        f"{cases.STALE_GRAPH_VAR}=replay keeps stock's behaviour",
    ):
        assert part in error, (part, error[-3000:])
    assert not record.get("tokens"), record.get("tokens")
    status = _case_status(engine_root, arm, record)
    fault = status.get("fault") or {}
    assert fault.get("type") == "StaleGraph", fault
    assert cases.STALE_GRAPH_ERROR in fault.get("message", ""), fault
    assert fault.get("action") == "raised into the engine", fault
    assert status["counters"].get("graphs.stale") == 1, status["counters"]  # the first: it ends
    assert not status["counters"].get("graphs.owned"), status["counters"]


def test_stale_check_switched_off_replays_stocks_wrong_tokens(results: dict[str, Any]) -> None:
    """The negative control: ``ASCEND_GRAPH_PATCH_STALE_GRAPH=replay`` keeps stock's behaviour.
    The same engine starts, every graph is left to stock with the stale reason, and the tokens
    are stock's wrong ones, silently (no relaunch was there to skip in this arm)."""
    case = cases.STALE_REPLAY_CASE
    record = _arm(results, "control")[case.name]
    assert not record.get("error"), record.get("error")
    stock = _arm(results, "stock")[cases.STALE_CASE.name]
    assert record["tokens"] != _arm(results, "eager")[case.reference]["tokens"]
    assert record["tokens"] == stock["tokens"], (record["tokens"], stock["tokens"])
    figures = report.runner(record)
    sim, counters = figures.get("sim") or {}, (figures.get("overlay") or {}).get("counters") or {}
    assert sim.get("captures") == len(case.capture_sizes) and not sim.get("updates"), sim
    assert not sim.get("relaunches_skipped"), sim
    stale = len(case.capture_sizes)
    assert counters.get("graphs.stale") == stale and counters.get("graphs.refused") == stale
    assert not counters.get("graphs.owned") and not counters.get("updates.owned"), counters


# --- model runner v2 by the opt-in repairs (torch_npu_sim.engine.repairs: v2-model-runner) -----

V2_RUNNER = "vllm_ascend.worker.v2.model_runner.NPUModelRunner"
V1_RUNNER = "vllm_ascend.worker.model_runner_v1.NPUModelRunner"


def _runner_class(record: dict[str, Any]) -> str | None:
    return report.runner(record).get("runner")


def test_v2_case_runs_the_v2_runner_and_its_eager_equals_v1s(results: dict[str, Any]) -> None:
    """With the repair named, every arm of the v2 case ran the release's own v2 runner (its
    class, read in the runner's process), launched exactly the Triton kernels the simulator has
    v2 references for, and the v2 eager reference gives v1 eager's tokens. The contrast, which
    the same checks would fail on: the v1 case and the stale case (the variable set without the
    repair: the release's fallback) ran the v1 runner, with none of those kernels."""
    from torch_npu_sim.engine import triton_refs

    v2, v1 = cases.V2_QWEN3, cases.CASES[0]
    eager = _arm(results, "eager")
    assert eager[v2.reference]["tokens"] == eager[v1.reference]["tokens"]
    bad = []
    for arm in ("eager", *GRAPH_ARMS, "control"):
        records = _arm(results, arm)
        for case, want in ((v2, V2_RUNNER), (v1, V1_RUNNER)):
            record = records[case.reference if arm == "eager" else case.name]
            launched = set(report.runner(record).get("triton_launches") or {})
            kernels = set(triton_refs.V2_REFERENCES) if want == V2_RUNNER else set()
            if _runner_class(record) != want or launched & set(triton_refs.V2_REFERENCES) != (
                kernels
            ):
                bad.append(f"{case.name} | {arm} | {_runner_class(record)}, launched {launched}")
    stale = _arm(results, "stock")[cases.STALE_CASE.name]
    if _runner_class(stale) != V1_RUNNER:
        bad.append(f"{cases.STALE_CASE.name} | stock | {_runner_class(stale)}")
    assert not bad, _failures(bad)
