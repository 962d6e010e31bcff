"""Turn the arms' results into per-case verdicts, timing statistics and the overall verdict.

Rules (docs/ab.md explains them for users):

* the first stock run is the reference; every other run (stock A-A, patched, verify) must give
  exactly the same greedy tokens and, where logits exist (simulator), logits within ``atol``;
* every run's graph output must match its own eager reference (tokens; logits within
  ``eager_atol``; a flipped argmax whose top-2 logits are within ``eager_atol`` is a near tie);
* a scenario on which the stock update is KNOWN to fail (the scenario says so) may fail in the
  stock arm with that exception type: then the patched arm is judged against eager alone;
* any other exception, a dead or timed-out arm, is a CRASH, never a pass;
* a scenario on which stock is KNOWN to be wrong (``wrong: ...``) may differ from eager in the
  stock arm: stock and verify (which applies stock's update) are compared among themselves, the
  other arms among themselves, and each run must equal eager or, never worse than stock,
  reproduce stock's tokens exactly (noted); verify's mismatches with the wrong stock update are
  expected and noted;
* workloads without an in-process eager run (real engines) are compared with the ``eager`` arm:
  equal tokens, or the first divergence (step, request, position, tokens) fails the case;
* the patched arm must really have owned updates (else the A/B compared stock with stock);
* the verify arm must report zero mismatches.
"""

from __future__ import annotations

import statistics
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ascend_graph_patch.ab.orchestrate import MODEL_WORKLOADS, ABConfig, ArmRun
from ascend_graph_patch.ab.timing import percentile
from ascend_graph_patch.aspects import replay_order

PASS, PASS_KNOWN, PASS_WRONG, DIFF, CRASH, INEFFECTIVE, INTERRUPTED = (
    "PASS",
    "PASS (stock fails, known)",
    "PASS (stock wrong, known)",
    "DIFF",
    "CRASH",
    "INEFFECTIVE",
    "INTERRUPTED",
)
PASSES = (PASS, PASS_KNOWN, PASS_WRONG)
_RANK = {PASS: 0, PASS_KNOWN: 0, PASS_WRONG: 0, INEFFECTIVE: 1, DIFF: 2, CRASH: 3, INTERRUPTED: 4}
#: INTERRUPTED: the command's own exit status replaces 130 (128 + the signal's number).
EXIT_CODES = {
    PASS: 0,
    PASS_KNOWN: 0,
    PASS_WRONG: 0,
    INEFFECTIVE: 1,
    DIFF: 1,
    CRASH: 3,
    INTERRUPTED: 130,
}
#: Run statuses of an interrupted A/B: stopped while it ran, or never started.
UNFINISHED = ("interrupted", "not run")
#: The arms whose host update time is compared.
TIMED_ARMS = ("stock", "patched", "stream")
#: Why a real engine on the simulator shows no host timing.
SIMULATOR_TIMING_NOTE = (
    "no host timing on the simulator: the update call also drains the blocked replay on the "
    "host (see `ascend-graph-patch bench` for host cost)"
)


@dataclass
class ArmTiming:
    median_us: float | None = None
    p90_us: float | None = None
    n: int = 0
    run_medians_us: list[float] = field(default_factory=list)


@dataclass
class CaseResult:
    name: str
    verdict: str = PASS
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    arms: dict[str, str] = field(default_factory=dict)  # arm -> state summary
    steps: int = 0
    tokens: str = "-"
    logits_max_abs: float | None = None
    eager_max_abs: float | None = None
    eager: str = "-"
    timing: dict[str, ArmTiming] = field(default_factory=dict)
    ratio: float | None = None  # patched / stock median host update time
    noise: float | None = None  # A-A relative spread of per-run medians (max over arms)
    kind: str = "harness"  # harness | engine | vllm
    #: arm -> tokens against the reference: "equal", "reference", the first divergence, a crash
    correctness: dict[str, str] = field(default_factory=dict)
    #: arm -> graphs owned, tasks updated, fallbacks, verify mismatches, acceptance (first run)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    timing_note: str | None = None
    expect: str = "ok"  # how stock is known to behave on the case
    #: arm -> per-run step latency in ms (vLLM: generate time / longest output), where measured
    step_ms: dict[str, list[float]] = field(default_factory=dict)
    #: served A/B: one row per run (outputs vs eager, the client's figures, the server's counts)
    served: list[dict[str, Any]] = field(default_factory=list)

    def fail(self, verdict: str, reason: str) -> None:
        if _RANK[verdict] > _RANK[self.verdict]:  # failures outrank both passes
            self.verdict = verdict
        self.reasons.append(reason)


@dataclass
class Summary:
    verdict: str
    exit_code: int
    cases: list[CaseResult]
    runs: list[dict[str, Any]]
    ratio: float | None
    noise: float | None
    speed: str
    problems: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "ratio": self.ratio,
            "noise": self.noise,
            "speed": self.speed,
            "problems": self.problems,
            "runs": self.runs,
            "cases": [asdict(c) for c in self.cases],
        }


# --- per-run case state ----------------------------------------------------------------------


def _expected_error_type(expect: str) -> str | None:
    """``"crash: ValueError: ..."`` -> ``"ValueError"``; ``"ok"`` -> None."""
    if not expect.startswith("crash:"):
        return None
    return expect[len("crash:") :].strip().split(":", 1)[0].strip() or None


def _known_wrong(expect: str) -> bool:
    return expect.startswith("wrong:")


def case_state(run: ArmRun, name: str) -> tuple[str, dict[str, Any] | None]:
    """(state, case) with state in ok / known_fail / error / crash / missing / interrupted."""
    if run.status in UNFINISHED:
        return "interrupted", None
    if run.status != "ok" or run.result is None:
        return "crash", None
    case = next((c for c in run.result.get("cases", []) if c.get("name") == name), None)
    if case is None:
        return "missing", None
    if case.get("status") == "ok":
        return "ok", case
    expected = _expected_error_type(str(case.get("expect", "ok")))
    actual = str(case.get("error", "")).split(":", 1)[0].strip()
    if expected is not None and actual == expected:
        return "known_fail", case
    return "error", case


def _logits(run: ArmRun, case: dict[str, Any]) -> array | None:
    name = case.get("logits_file")
    if not name:
        return None
    data = array("f")
    path = Path(run.dir) / name
    try:
        with open(path, "rb") as f:
            data.frombytes(f.read())
    except OSError:
        return None
    return data


def _max_abs(a: array, b: array) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=False)), default=0.0)


def first_divergence(ref: list, other: list) -> str | None:
    """Where two runs' tokens (per step, request, position) first differ, or None if equal."""
    for step, (a, b) in enumerate(zip(ref, other, strict=False)):
        if a == b:
            continue
        if not (isinstance(a, list) and isinstance(b, list)):
            return f"step {step}: {a} vs {b}"
        for req, (x, y) in enumerate(zip(a, b, strict=False)):
            if x == y:
                continue
            if isinstance(x, list) and isinstance(y, list):
                pos = _first_token_diff(x, y)
                assert pos is not None
                tx = x[pos] if pos < len(x) else "(end)"
                ty = y[pos] if pos < len(y) else "(end)"
                return f"step {step}, request {req}, position {pos}: {tx} vs {ty}"
            return f"step {step}, request {req}: {x} vs {y}"
        return f"step {step}: {len(a)} vs {len(b)} requests"
    if len(ref) != len(other):
        return f"{len(ref)} vs {len(other)} steps"
    return None


def _first_token_diff(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# --- one case --------------------------------------------------------------------------------


def judge_case(cfg: ABConfig, runs: list[ArmRun], name: str) -> CaseResult:
    res = CaseResult(name=name)
    all_states = {run.index: case_state(run, name) for run in runs}
    eager_runs = [r for r in runs if r.arm == "eager"]
    runs = [r for r in runs if r.arm != "eager"]  # the eager arm is the reference, judged below
    states = {r.index: all_states[r.index] for r in runs}
    by_arm: dict[str, list[ArmRun]] = {}
    for run in runs:
        by_arm.setdefault(run.arm, []).append(run)
    for arm, arm_runs in by_arm.items():
        labels = sorted({_label(states[r.index][0]) for r in arm_runs})
        res.arms[arm] = "/".join(labels)

    # crashes and errors first: they decide the verdict whatever the outputs say
    for run in runs:
        state, case = states[run.index]
        where = f"{run.arm} arm (run {run.index})"
        if state == "interrupted":
            res.fail(INTERRUPTED, f"{where} {run.status}")
        elif state == "crash":
            res.fail(CRASH, f"{where} crashed: {run.error}")
        elif state == "missing":
            res.fail(CRASH, f"{where} did not run the case")
        elif state == "error" or (state == "known_fail" and run.arm != "stock"):
            res.fail(CRASH, f"{where} raised: {case.get('error')}")
        elif (
            state == "ok"
            and run.arm == "stock"
            and _expected_error_type(str(case.get("expect", "ok")))
        ):
            res.notes.append(f"stock passed although expected to fail ({case.get('expect')})")

    stock_states = {states[r.index][0] for r in by_arm.get("stock", [])}
    if stock_states == {"known_fail"}:
        if res.verdict == PASS:
            res.verdict = PASS_KNOWN
        res.notes.append(f"stock: {states[by_arm['stock'][0].index][1].get('error')}")
    elif "known_fail" in stock_states and "ok" in stock_states:
        res.fail(DIFF, "stock arm is not deterministic: it failed in one run, passed in another")

    first = next((c for _, c in states.values() if c), None) or {}
    res.kind = str(first.get("kind") or ("vllm" if cfg.workload == "vllm" else "harness"))
    res.timing_note = first.get("timing_note")
    res.expect = str(first.get("expect", "ok"))
    wrong = _known_wrong(res.expect)
    ok_runs = [r for r in runs if states[r.index][0] == "ok"]
    for run in runs:
        state, case = states[run.index]
        if run.arm not in res.correctness and state != "ok":
            res.correctness[run.arm] = _label(state) + (
                f": {case.get('error')}" if case and case.get("error") else ""
            )
    if ok_runs:
        if wrong:  # verify applies stock's update: its outputs are stock's
            stock = [r for r in ok_runs if r.arm in ("stock", "verify")]
            others = [r for r in ok_runs if r.arm not in ("stock", "verify")]
            for group in (stock, others):
                if group:
                    _compare_outputs(cfg, res, group, states)
            res.tokens = "stock wrong (known): arms compared with eager"
        else:
            _compare_outputs(cfg, res, ok_runs, states)
        _check_eager(cfg, res, ok_runs, states, wrong)
        _check_eager_arm(cfg, res, ok_runs, states, eager_runs, all_states, wrong)
        _check_overlay(cfg, res, ok_runs, states, wrong)
    _figures(res, eager_runs + runs, all_states)
    _served(res, eager_runs + runs, all_states)
    if wrong and res.verdict == PASS:
        res.verdict = PASS_WRONG
    if cfg.workload in MODEL_WORKLOADS and cfg.simulate:
        res.timing_note = SIMULATOR_TIMING_NOTE
    else:
        _timing(cfg, res, runs, states)
    return res


def _label(state: str) -> str:
    return {
        "ok": "ok",
        "known_fail": "fails (known)",
        "error": "ERROR",
        "crash": "CRASH",
        "missing": "missing",
        "interrupted": "interrupted",
    }[state]


def _compare_outputs(
    cfg: ABConfig, res: CaseResult, ok_runs: list[ArmRun], states: dict[int, tuple[str, Any]]
) -> None:
    ref = ok_runs[0]  # the first stock run if stock worked (schedule starts with stock)
    ref_case = states[ref.index][1]
    ref_tokens = ref_case.get("tokens", [])
    ref_logits = _logits(ref, ref_case)
    res.steps = len(ref_tokens)
    worst = 0.0 if ref_logits is not None else None
    token_diffs = []
    for run in ok_runs[1:]:
        case = states[run.index][1]
        tokens = case.get("tokens", [])
        first = _first_token_diff(ref_tokens, tokens)
        if first is not None:
            token_diffs.append(
                f"{run.arm} run {run.index} differs from {ref.arm} run {ref.index} at step {first}"
            )
        if ref_logits is not None:
            other = _logits(run, case)
            if other is None or len(other) != len(ref_logits):
                if first is None:
                    res.fail(DIFF, f"{run.arm} run {run.index}: logits missing or of another shape")
                continue
            diff = _max_abs(ref_logits, other)
            worst = max(worst or 0.0, diff)
            if diff > cfg.atol:
                res.fail(
                    DIFF,
                    f"{run.arm} run {run.index}: logits differ by {diff:.3g} "
                    f"(> atol {cfg.atol:g}) from {ref.arm} run {ref.index}",
                )
    for text in token_diffs:
        res.fail(DIFF, "tokens: " + text)
    res.logits_max_abs = worst
    compared = len(ok_runs) - 1
    if not compared:
        res.tokens = f"{res.steps} steps (1 run)"
    elif token_diffs:
        res.tokens = "DIFFER"
    else:
        res.tokens = f"equal ({res.steps} steps x {compared + 1} runs)"


def _stock_tokens(ok_runs: list[ArmRun], states: dict[int, tuple[str, Any]]) -> list | None:
    stock = next((r for r in ok_runs if r.arm == "stock"), None)
    return None if stock is None else states[stock.index][1].get("tokens")


def _check_eager(
    cfg: ABConfig,
    res: CaseResult,
    ok_runs: list[ArmRun],
    states: dict[int, tuple[str, Any]],
    wrong: bool = False,
) -> None:
    worst, bad = 0.0, []
    seen = False
    stock_tokens = _stock_tokens(ok_runs, states)
    for run in ok_runs:
        case = states[run.index][1]
        ev = case.get("eager")
        if not ev:
            continue
        seen = True
        worst = max(worst, float(ev.get("max_abs", 0.0)))
        mism = ev.get("token_mismatches")
        res.correctness.setdefault(
            run.arm,
            "equal"
            if not mism
            else f"{mism} token(s) differ (first at step {ev.get('first_mismatch')})",
        )
        if mism and wrong and run.arm == "stock":
            res.notes.append(f"stock run {run.index}: {mism} token(s) differ from eager (known)")
        elif mism and wrong and case.get("tokens") == stock_tokens:
            res.notes.append(
                f"{run.arm} run {run.index}: reproduces stock's tokens exactly "
                "(never worse than stock)"
            )
        elif mism:
            bad.append(
                f"{run.arm} run {run.index}: {ev['token_mismatches']} token(s) differ "
                f"from eager (first at step {ev.get('first_mismatch')})"
            )
        elif float(ev.get("max_abs", 0.0)) > cfg.eager_atol:
            bad.append(
                f"{run.arm} run {run.index}: logits differ from eager by "
                f"{float(ev['max_abs']):.3g} (> {cfg.eager_atol:g})"
            )
        if ev.get("near_ties"):
            res.notes.append(f"{run.arm} run {run.index}: {ev['near_ties']} near tie(s) vs eager")
    if not seen:
        return
    res.eager_max_abs = worst
    res.eager = "ok" if not bad else "DIFFER"
    for text in bad:
        res.fail(DIFF, "eager: " + text)


def _check_eager_arm(
    cfg: ABConfig,
    res: CaseResult,
    ok_runs: list[ArmRun],
    states: dict[int, tuple[str, Any]],
    eager_runs: list[ArmRun],
    all_states: dict[int, tuple[str, Any]],
    wrong: bool,
) -> None:
    """Runs without an in-process eager reference, against the eager arm's tokens."""
    needing = [r for r in ok_runs if states[r.index][1].get("reference") == "eager arm"]
    if not needing and not eager_runs:
        return
    if not eager_runs:
        if needing:
            res.notes.append("no eager arm: tokens are compared between the arms only")
        return
    eager = eager_runs[0]
    state, case = all_states[eager.index]
    if state == "missing" and not needing:
        return  # a workload with its own eager reference: the eager arm had nothing to run
    if state != "ok" or case is None:
        detail = eager.error if state == "crash" else (case or {}).get("error", state)
        res.correctness["eager"] = f"{_label(state)}: {detail}"
        verdict = INTERRUPTED if state == "interrupted" else CRASH
        res.fail(verdict, f"eager arm (run {eager.index}) has no reference: {detail}")
        return
    res.correctness["eager"] = "reference"
    ref = case.get("tokens", [])
    stock_tokens = _stock_tokens(ok_runs, states)
    bad = []
    for run in ok_runs:
        tokens = states[run.index][1].get("tokens", [])
        where = first_divergence(ref, tokens)
        if where is None:
            res.correctness.setdefault(run.arm, "equal")
            continue
        res.correctness.setdefault(run.arm, f"differs at {where}")
        if wrong and (run.arm == "stock" or tokens == stock_tokens):
            res.notes.append(f"{run.arm} run {run.index}: differs from eager at {where} (as stock)")
        else:
            bad.append(f"{run.arm} run {run.index} differs from eager at {where}")
    res.eager = "equal" if not bad else "DIFFER"
    for text in bad:
        res.fail(DIFF, "eager arm: " + text)


def _figures(res: CaseResult, runs: list[ArmRun], states: dict[int, tuple[str, Any]]) -> None:
    """What each arm's overlay did (first run of the arm that ran the case)."""
    for run in runs:
        state, case = states[run.index]
        if run.arm in res.figures or case is None:
            continue
        counters = case.get("counters") or {}
        res.figures[run.arm] = {
            "graphs_owned": case.get("graphs_owned", counters.get("graphs.owned")),
            "tasks_updated": counters.get("tasks.updated"),
            "updates_owned": counters.get("updates.owned"),
            "fallbacks": fallbacks(counters),
            "verify_tasks": counters.get("verify.tasks"),
            "verify_mismatches": counters.get("verify.mismatches"),
            "verify_stock_failed": counters.get("verify.stock_failed"),
            "acceptance": case.get("acceptance"),
            "replays": case.get("replays"),
            "engine_steps": case.get("engine_steps"),
        }


def _served(res: CaseResult, runs: list[ArmRun], states: dict[int, tuple[str, Any]]) -> None:
    """Per run of a served case: its outputs against the eager server's, what the client
    measured, and what the server's processes counted during the load."""
    eager = next(
        (states[r.index][1] for r in runs if r.arm == "eager" and states[r.index][0] == "ok"),
        None,
    )
    for run in runs:
        state, case = states[run.index]
        if case is None or case.get("kind") != "serve":
            continue
        if state != "ok":
            outputs = _label(state) + (f": {case.get('error')}" if case.get("error") else "")
        elif run.arm == "eager":
            outputs = "reference"
        elif eager is None:
            outputs = "-"
        else:
            where = first_divergence(eager.get("tokens", []), case.get("tokens", []))
            outputs = "equal" if where is None else f"differs at {where}"
        counters = case.get("counters") or {}
        client = case.get("client") or {}
        sent = (case.get("load") or {}).get("num_prompts", "?")
        res.served.append(
            {
                "arm": run.arm,
                "run": run.index,
                "outputs": outputs,
                "requests": f"{client.get('completed', 0)}/{sent}",
                "client": client,
                "engine_steps": case.get("engine_steps"),
                "replays": case.get("replays"),
                "updates_owned": counters.get("updates.owned", 0),
                "fallbacks": fallbacks(counters),
                "runner_pids": case.get("runner_pids"),
                "ranks": {
                    rank: {
                        "replays": r.get("replays", 0),
                        "dummy_batches": (r.get("calls") or {}).get("dummy_batches", 0),
                        "draft_dummy_runs": (r.get("calls") or {}).get("draft_dummy_runs", 0),
                        "updates_owned": (r.get("counters") or {}).get("updates.owned", 0),
                        "fallbacks": fallbacks(r.get("counters") or {}),
                        "verify_mismatches": (r.get("counters") or {}).get("verify.mismatches"),
                        "verify_tasks": (r.get("counters") or {}).get("verify.tasks"),
                    }
                    for rank, r in (case.get("ranks") or {}).items()
                },
            }
        )


def fallbacks(counters: dict[str, int]) -> int:
    """Updates the overlay left to stock or resolved by a fallback, and errors it absorbed."""
    return sum(
        v
        for k, v in counters.items()
        if k.startswith(("fallback.", "errors.")) or k == "updates.stock.unowned"
    )


def _check_overlay(
    cfg: ABConfig,
    res: CaseResult,
    ok_runs: list[ArmRun],
    states: dict[int, tuple[str, Any]],
    wrong: bool = False,
) -> None:
    for run in ok_runs:
        counters = states[run.index][1].get("counters") or {}
        if run.arm == "stream":
            _check_stream(res, run, counters)
        if run.arm in ("patched", "stream") and not counters.get("updates.owned"):
            msg = f"{run.arm} run {run.index}: the overlay owned no update (it was not effective)"
            seen_all = cfg.workload != "vllm" or (run.result or {}).get("processes", {}).get(
                "count"
            )
            if seen_all:
                res.fail(INEFFECTIVE, msg)
            else:  # no status files: the counters saw the worker process only
                res.notes.append(msg + " in the worker process (no status files)")
        if run.arm == "verify":
            mism = int(counters.get("verify.mismatches", 0))
            if mism and wrong:
                res.notes.append(
                    f"verify run {run.index}: {mism} mismatch(es) with the stock update, which "
                    "is known to be wrong here"
                )
            elif mism:
                res.fail(
                    DIFF,
                    f"verify run {run.index}: {mism} parameter mismatch(es) "
                    "between the overlay and stock",
                )
            elif counters.get("verify.updates"):
                res.notes.append(
                    f"verify: {counters['verify.updates']} updates checked, 0 mismatches"
                )


#: Every counter of stream-ordered replay begins so (``aspects/replay_order.py``).
_REPLAY_ORDER = "replay_order."
_KEPT_BARRIER = replay_order.BARRIER + "."


def _check_stream(res: CaseResult, run: ArmRun, counters: dict[str, int]) -> None:
    """The stream arm's setting must have taken effect (every FULL replay it saw is counted:
    stream-ordered, barrier kept with a reason, or without a barrier in stock too); the note says
    how many of each. Owned updates with nothing counted: it measured the patched arm again."""
    ordered = sum(int(counters.get(k, 0)) for k in replay_order.ORDERED)
    kept = {
        k.removeprefix(_KEPT_BARRIER): v for k, v in counters.items() if k.startswith(_KEPT_BARRIER)
    }
    untouched = int(counters.get(replay_order.NO_BARRIER, 0))
    note = (
        f"stream run {run.index} (opt-in ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream): "
        f"{ordered or 'no'} replay(s) stream-ordered, without stock's device synchronize"
    )
    if kept:
        why = ", ".join(f"{reason.replace('_', ' ')} {n}" for reason, n in sorted(kept.items()))
        note += f"; stock's barrier kept: {why}"
    if untouched:
        note += f"; {untouched} replay(s) without a barrier in stock too (merged drafts, ENPU)"
    counted = any(k.startswith(_REPLAY_ORDER) for k in counters)
    if not counted and counters.get("updates.owned"):
        res.fail(INEFFECTIVE, note + ": the setting did not take effect")
    else:
        res.notes.append(note)


def _timing(
    cfg: ABConfig, res: CaseResult, runs: list[ArmRun], states: dict[int, tuple[str, Any]]
) -> None:
    for arm in TIMED_ARMS:
        pooled: list[float] = []
        medians: list[float] = []
        for run in runs:
            state, case = states[run.index]
            if run.arm != arm or state != "ok":
                continue
            samples = [ns / 1000.0 for ns in case.get("update_ns", [])[cfg.warmup :]]
            if not samples:
                continue
            pooled += samples
            medians.append(statistics.median(samples))
        if pooled:
            res.timing[arm] = ArmTiming(
                median_us=statistics.median(pooled),
                p90_us=percentile(pooled, 90),
                n=len(pooled),
                run_medians_us=medians,
            )
    st, pa = res.timing.get("stock"), res.timing.get("patched")
    if st and pa and st.median_us:
        res.ratio = pa.median_us / st.median_us
        res.noise = aa_noise([st.run_medians_us, pa.run_medians_us])
    for run in runs:
        state, case = states[run.index]
        if run.arm in TIMED_ARMS and state == "ok" and case.get("step_ms") is not None:
            res.step_ms.setdefault(run.arm, []).append(float(case["step_ms"]))


def aa_noise(per_arm_medians: list[list[float]]) -> float | None:
    """A-A noise floor: the largest relative spread between runs of the same arm."""
    spreads = [max(m) / min(m) - 1.0 for m in per_arm_medians if len(m) >= 2 and min(m) > 0]
    return max(spreads) if spreads else None


# --- everything ------------------------------------------------------------------------------


def summarize(cfg: ABConfig, runs: list[ArmRun]) -> Summary:
    cases = [judge_case(cfg, runs, name) for name in cfg.cases]
    verdict = PASS
    for case in cases:
        if _RANK[case.verdict] > _RANK[verdict]:
            verdict = case.verdict
    problems = [f"{c.name}: {r}" for c in cases for r in c.reasons]
    for run in runs:  # a crash must surface even if no case names it (e.g. no cases at all)
        if run.status != "ok" and not any(f"run {run.index})" in p for p in problems):
            problems.append(f"{run.arm} arm (run {run.index}) {run.status}: {run.error}")
            verdict = (
                INTERRUPTED if run.status in UNFINISHED else max(verdict, CRASH, key=_RANK.get)
            )
    unfinished = [r for r in runs if r.status in UNFINISHED]
    if unfinished:  # the report says what finished
        verdict = INTERRUPTED
        problems.insert(
            0, f"interrupted: {len(runs) - len(unfinished)} of {len(runs)} arm runs finished"
        )
    ratio, noise = _overall_timing(cases)
    speed = speed_label(ratio, noise)
    return Summary(
        verdict=verdict,
        exit_code=EXIT_CODES[verdict],
        cases=cases,
        runs=[r.summary() for r in runs],
        ratio=ratio,
        noise=noise,
        speed=speed,
        problems=problems,
    )


def _overall_timing(cases: list[CaseResult]) -> tuple[float | None, float | None]:
    """Patched/stock of the summed per-case medians (cases both arms ran), and its A-A noise."""
    both = [c for c in cases if c.ratio is not None]
    if not both:
        return None, None
    stock = sum(c.timing["stock"].median_us or 0.0 for c in both)
    patched = sum(c.timing["patched"].median_us or 0.0 for c in both)
    per_arm = []
    for arm in ("stock", "patched"):
        n = min(len(c.timing[arm].run_medians_us) for c in both)
        per_arm.append([sum(c.timing[arm].run_medians_us[i] for c in both) for i in range(n)])
    return (patched / stock if stock else None), aa_noise(per_arm)


def speed_label(ratio: float | None, noise: float | None) -> str:
    if ratio is None:
        return "no timing"
    if noise is None:
        return f"{ratio:.2f}x (no A-A noise floor: use --repeats >= 1 with ABBA)"
    if ratio < 1.0 - noise:
        return f"faster: {ratio:.2f}x stock, beyond the A-A noise of {noise:.1%}"
    if ratio > 1.0 + noise:
        return f"slower: {ratio:.2f}x stock, beyond the A-A noise of {noise:.1%}"
    return f"within noise: {ratio:.2f}x stock, A-A noise {noise:.1%}"
