"""The A/B command: orchestration against a fake worker, the vLLM worker against the real vLLM
API (engine call mocked), and one tiny real simulator A/B in subprocesses. No timing asserts."""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import pytest

from ascend_graph_patch.ab import command, compare, model_runner, orchestrate, report
from ascend_graph_patch.ab.orchestrate import ABConfig

FAKE_WORKER = textwrap.dedent('''
    """Fake arm worker: behaviour per arm from FAKE_* env vars (arm = the toggle it sees)."""
    import os, sys, time
    from array import array
    from ascend_graph_patch.ab.protocol import worker_main

    ARM = {"off": "stock", "on": "patched", "verify": "verify"}

    def engine_core(n):  # a model runner in another process, ending in os._exit (vLLM's)
        from ascend_graph_patch import state
        for _ in range(n):
            state.count("updates.owned")

    def run(spec, progress, out_dir):
        arm = spec["arm"] if spec["arm"] == "eager" else ARM[os.environ["ASCEND_GRAPH_PATCH"]]
        if os.environ.get("ASCEND_GRAPH_PATCH_REPLAY_SYNC") == "stream":
            arm = "stream"
        if os.environ.get("FAKE_ENGINE_CORE") and arm == "patched":
            import multiprocessing
            proc = multiprocessing.get_context("fork").Process(target=engine_core, args=(9,))
            proc.start()
            proc.join()
        if os.environ.get("FAKE_CRASH") == arm:
            os._exit(7)
        if os.environ.get("FAKE_SLEEP") == arm:
            time.sleep(60)
        cases = []
        engine = os.environ.get("FAKE_ENGINE")
        wrong = os.environ.get("FAKE_EXPECT", "").startswith("wrong")
        for name in spec["cases"]:
            if engine:  # a real engine's shape: steps x requests x positions, no eager run
                tokens = [[[r, r + 1, r + 2] for r in range(3)] for _ in range(spec["steps"])]
                if os.environ.get("FAKE_DIFF") == arm:
                    tokens[0][1][2] = 99
                if wrong and arm == "stock":
                    tokens[0][0][0] = 77
                logits = array("f")
            else:
                tokens = [[step % 5, (step * 3) % 5] for step in range(spec["steps"])]
                if wrong and arm in ("stock", "verify"):  # verify applies stock's update
                    tokens[0][0] = 4
                logits = array("f", [float(t) for row in tokens for t in row])
                if os.environ.get("FAKE_DIFF") == arm:
                    tokens[-1][0] += 1
            if os.environ.get("FAKE_LOGITS") == arm:
                logits[0] += 0.5
            with open(out_dir / f"{name}.f32", "wb") as f:
                logits.tofile(f)
            counters = {"updates.owned": spec["steps"]} if arm != "stock" else {}
            if arm == "patched" and os.environ.get("FAKE_INEFFECTIVE"):
                counters = {}
            if arm == "stream" and not os.environ.get("FAKE_UNORDERED"):
                counters["replay_order.barrier.first_replay"] = 2
                counters["replay_order.stream"] = spec["steps"] - 2
            case = {"name": name, "expect": os.environ.get("FAKE_EXPECT", "ok"), "status": "ok",
                    "tokens": tokens, "logits_file": f"{name}.f32",
                    "eager": {"token_mismatches": 0, "near_ties": 0, "max_abs": 0.0},
                    "update_ns": [(2000 if arm == "stock" else 1000) + i
                                  for i in range(spec["steps"])],
                    "counters": counters, "env_hashseed": os.environ.get("PYTHONHASHSEED")}
            case["step_ms"] = {"stock": 10.0, "stream": 8.0}.get(arm, 9.0)
            if os.environ.get("FAKE_NO_TIMING"):
                case["update_ns"] = []
                del case["step_ms"]
            if engine:
                case.update(kind="engine", reference="eager arm", logits_file=None)
                del case["eager"]
            if wrong and not engine:
                bad = arm in ("stock", "verify") or os.environ.get("FAKE_DIFF") == arm
                case["eager"]["token_mismatches"] = 3 if bad else 0
            if arm == "stock" and os.environ.get("FAKE_STOCK_ERROR"):
                case.update(status="error", error=os.environ["FAKE_STOCK_ERROR"],
                            tokens=[], update_ns=[])
            cases.append(case)
            progress.advance(spec["steps"])
        return {"workload": "fake", "cases": cases}

    sys.exit(worker_main(run))
''')


@pytest.fixture
def fake_worker(tmp_path: Path) -> Path:
    path = tmp_path / "fake_worker.py"
    path.write_text(FAKE_WORKER)
    return path


@pytest.fixture
def fake_cfg(tmp_path: Path, fake_worker: Path):
    def make(**kw) -> ABConfig:
        import sys

        env = kw.pop("env", {})
        cfg = ABConfig(
            out=tmp_path / "out",
            cases=["alpha", "beta"],
            steps=6,
            seed=11,
            progress=False,
            timeout=30,
            worker_cmd=[sys.executable, str(fake_worker)],
            extra_env=env,
            warmup=1,
        )
        for key, value in kw.items():
            setattr(cfg, key, value)
        return cfg

    return make


def _run(cfg: ABConfig) -> tuple[list[orchestrate.ArmRun], compare.Summary]:
    runs = orchestrate.run_ab(cfg)
    return runs, compare.summarize(cfg, runs)


# --- schedule and environment ----------------------------------------------------------------


def test_schedule_is_abba_repeated_then_verify():
    assert orchestrate.schedule(1, False) == ["stock", "patched", "patched", "stock"]
    assert orchestrate.schedule(2, True) == ["stock", "patched", "patched", "stock"] * 2 + [
        "verify"
    ]
    with pytest.raises(ValueError):
        orchestrate.schedule(0, False)


def test_stream_order_adds_a_stream_arm_inside_each_abba_block(tmp_path: Path):
    """ABCCBA: the stream arm sits between the patched runs, so a linear drift cancels for all
    three; only its processes get the setting, whatever the caller's environment says."""
    assert orchestrate.schedule(1, True, eager=True, stream=True) == [
        "eager", "stock", "patched", "stream", "stream", "patched", "stock", "verify"
    ]  # fmt: skip
    cfg = ABConfig(out=tmp_path, cases=["x"], stream=True)
    base = {"PATH": "/bin", "ASCEND_GRAPH_PATCH_REPLAY_SYNC": "stream"}
    envs = {r.arm: orchestrate.arm_env(base, cfg, r) for r in orchestrate.plan_runs(cfg)}
    assert {a: e.get("ASCEND_GRAPH_PATCH_REPLAY_SYNC") for a, e in envs.items()} == {
        "stock": None,
        "patched": None,
        "stream": "stream",
    }
    assert envs["stream"]["ASCEND_GRAPH_PATCH"] == "on"


def test_the_stream_arm_is_compared_timed_and_explained(fake_cfg):
    _, summary = _run(fake_cfg(stream=True))
    assert summary.verdict == compare.PASS, summary.problems
    case = summary.cases[0]
    assert case.correctness["stream"] == "equal"
    assert case.step_ms["stream"] == [8.0, 8.0]
    (note,) = [n for n in case.notes if n.startswith("stream run 2 ")]
    assert "4 replay(s) stream-ordered" in note and "first replay 2" in note
    cols, rows = report.timing_table(summary)
    assert cols[-1] == report.STREAM_COLUMN and rows[0][-1] == "8.00 (A-A 0.0%)"


def test_a_stream_arm_whose_setting_did_not_take_is_ineffective(fake_cfg):
    """The negative control: updates owned, no replay counted by stream order at all: the A/B
    would have measured the patched arm twice."""
    _, summary = _run(fake_cfg(stream=True, env={"FAKE_UNORDERED": "1"}))
    assert summary.verdict == compare.INEFFECTIVE and summary.exit_code == 1
    assert any("did not take effect" in p for p in summary.problems), summary.problems


def test_replays_without_a_barrier_in_stock_are_noted_not_failed():
    """Merged draft graphs (and ENPU) have no barrier in stock: counted, left alone, a pass."""
    res = compare.CaseResult(name="mtp")
    run = orchestrate.ArmRun(2, "stream", "on", 0, Path("."), Path("."))
    counters = {"updates.owned": 9, "replay_order.no_barrier": 9}
    compare._check_stream(res, run, counters)
    assert res.verdict == compare.PASS
    (note,) = res.notes
    assert "no replay(s) stream-ordered" in note and "9 replay(s) without a barrier" in note


def test_arm_env_differs_only_in_toggle_and_cache(tmp_path: Path):
    cfg = ABConfig(out=tmp_path, cases=["x"], seed=5)
    runs = orchestrate.plan_runs(cfg)
    base = {
        "PATH": "/bin",
        "ASCEND_GRAPH_PATCH": "verify",
        "ASCEND_GRAPH_PATCH_STRICT": "1",
        "ASCEND_GRAPH_PATCH_DISABLE": "*",
        "VLLM_CACHE_ROOT": "/shared",
    }
    envs = [orchestrate.arm_env(base, cfg, r) for r in runs]
    assert [e["ASCEND_GRAPH_PATCH"] for e in envs] == ["off", "on", "on", "off"]
    assert all(
        "ASCEND_GRAPH_PATCH_STRICT" not in e and "ASCEND_GRAPH_PATCH_DISABLE" not in e for e in envs
    )
    assert {e["PYTHONHASHSEED"] for e in envs} == {"5"}
    caches = [e["VLLM_CACHE_ROOT"] for e in envs]
    assert caches[0] == caches[3] != caches[1] == caches[2]
    assert "/shared" not in caches


# --- fake-worker runs ------------------------------------------------------------------------


def test_pass_run_order_caches_seed_and_reports(fake_cfg):
    cfg = fake_cfg(verify=True)
    runs, summary = _run(cfg)
    assert [r.status for r in runs] == ["ok"] * 5
    seen = [r.result["mode_env"] for r in runs]
    assert seen == ["off", "on", "on", "off", "verify"]  # the order the processes really ran
    assert len({r.result["pid"] for r in runs}) == 5  # a fresh process per arm
    roots = {r.arm: set() for r in runs}
    for r in runs:
        roots[r.arm].add(r.result["cache_root"])
    assert all(len(v) == 1 for v in roots.values())
    assert len(set().union(*roots.values())) == 3  # one compile cache per arm, none shared
    assert {r.result["seed"] for r in runs} == {11}
    assert {c["env_hashseed"] for r in runs for c in r.result["cases"]} == {"11"}
    assert summary.verdict == compare.PASS and summary.exit_code == 0
    alpha = summary.cases[0]
    assert alpha.ratio == pytest.approx(0.5, rel=0.01)  # fake: patched 1000 ns vs stock 2000 ns
    assert alpha.noise is not None
    assert alpha.step_ms == {"stock": [10.0, 10.0], "patched": [9.0, 9.0]}
    assert report.timing_rows(summary)[0][-2:] == ["10.00 (A-A 0.0%)", "9.00 (A-A 0.0%)"]

    paths = report.write(cfg, summary, runs)
    data = json.loads(paths["json"].read_text())
    assert data["verdict"] == "PASS" and data["exit_code"] == 0
    assert [r["arm"] for r in data["runs"]] == ["stock", "patched", "patched", "stock", "verify"]
    assert "VERDICT: PASS" in paths["md"].read_text()
    if paths["png"] is not None:
        assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = report.text_table(cfg, summary)
    assert "alpha" in table and "VERDICT: PASS" in table


@pytest.mark.parametrize(
    "knob,verdict",
    [("FAKE_DIFF", compare.DIFF), ("FAKE_LOGITS", compare.DIFF), ("FAKE_CRASH", compare.CRASH)],
)
def test_difference_or_crash_is_never_a_pass(fake_cfg, knob, verdict):
    runs, summary = _run(fake_cfg(env={knob: "patched"}))
    assert summary.verdict == verdict
    assert summary.exit_code == (3 if verdict == compare.CRASH else 1)
    assert all(c.verdict == verdict for c in summary.cases)
    if knob == "FAKE_CRASH":
        assert [r.status for r in runs] == ["ok", "crash", "crash", "ok"]
        assert "exit status 7" in runs[1].error


def test_timeout_is_a_crash(fake_cfg):
    runs, summary = _run(
        fake_cfg(env={"FAKE_SLEEP": "patched"}, timeout=2, order=["stock", "patched"])
    )
    assert runs[1].status == "timeout"
    assert summary.verdict == compare.CRASH and summary.exit_code == 3


def test_known_stock_failure_vs_unexpected(fake_cfg):
    env = {"FAKE_EXPECT": "crash: ValueError: boom", "FAKE_STOCK_ERROR": "ValueError: boom"}
    _, summary = _run(fake_cfg(env=env))
    assert summary.verdict == compare.PASS and summary.exit_code == 0
    assert all(c.verdict == compare.PASS_KNOWN for c in summary.cases)
    assert summary.cases[0].arms["stock"] == "fails (known)"

    env["FAKE_STOCK_ERROR"] = "KeyError: other"  # a different exception is not the known one
    _, summary = _run(fake_cfg(env=env))
    assert summary.verdict == compare.CRASH and summary.exit_code == 3


def test_ineffective_overlay_fails(fake_cfg):
    _, summary = _run(fake_cfg(env={"FAKE_INEFFECTIVE": "1"}))
    assert summary.verdict == compare.INEFFECTIVE and summary.exit_code == 1


def test_stock_known_wrong_passes_only_where_patched_is_right_or_as_stock(fake_cfg):
    env = {"FAKE_EXPECT": "wrong: positional pairing"}
    _, summary = _run(fake_cfg(env=env, verify=True, order=["stock", "patched", "verify"]))
    assert summary.verdict == compare.PASS and summary.exit_code == 0, summary.problems
    assert all(c.verdict == compare.PASS_WRONG for c in summary.cases)
    assert summary.cases[0].correctness["patched"] == "equal"
    assert summary.cases[0].correctness["stock"].startswith("3 token(s) differ")
    assert summary.cases[0].correctness["verify"].startswith("3 token(s) differ")  # as stock

    env["FAKE_DIFF"] = "patched"  # negative control: patched equals neither eager nor stock
    _, summary = _run(fake_cfg(env=env, order=["stock", "patched"]))
    assert summary.verdict == compare.DIFF and summary.exit_code == 1


def test_engine_cases_are_judged_against_the_eager_arm(fake_cfg):
    cfg = fake_cfg(env={"FAKE_ENGINE": "1"}, eager=True, steps=2)
    runs, summary = _run(cfg)
    assert [r.arm for r in runs] == ["eager", "stock", "patched", "patched", "stock"]
    assert summary.verdict == compare.PASS, summary.problems
    assert summary.cases[0].correctness == {
        "eager": "reference",
        "stock": "equal",
        "patched": "equal",
    }

    diff = {"FAKE_ENGINE": "1", "FAKE_DIFF": "patched"}
    _, summary = _run(fake_cfg(env=diff, order=["eager", "patched"]))
    assert summary.verdict == compare.DIFF and summary.exit_code == 1
    where = summary.cases[0].correctness["patched"]
    assert where == "differs at step 0, request 1, position 2: 3 vs 99"

    crash = {"FAKE_ENGINE": "1", "FAKE_CRASH": "eager"}
    _, summary = _run(fake_cfg(env=crash, order=["eager", "stock", "patched"]))
    assert summary.verdict == compare.CRASH and summary.exit_code == 3  # no reference


def test_empty_timing_still_writes_every_report(fake_cfg):
    cfg = fake_cfg(env={"FAKE_NO_TIMING": "1"}, order=["stock", "patched"])
    runs, summary = _run(cfg)
    assert summary.verdict == compare.PASS and summary.speed == "no timing"
    paths = report.write(cfg, summary, runs)
    assert paths["plot_error"] is None or "matplotlib" in paths["plot_error"]
    assert "No timing samples." in paths["md"].read_text()
    assert json.loads(paths["json"].read_text())["exit_code"] == 0


def test_a_crashed_arm_still_gets_a_report_and_exit_3(
    fake_worker: Path, tmp_path: Path, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_CRASH", "patched")
    argv = ("--worker", str(fake_worker), "--scenarios", "alpha", "--no-progress", "--out")
    assert command.run(_args(*argv, str(tmp_path / "c"))) == 3
    data = json.loads((tmp_path / "c" / "report.json").read_text())
    assert data["verdict"] == "CRASH" and data["exit_code"] == 3
    assert "CRASH" in (tmp_path / "c" / "report.md").read_text()


def test_counters_of_a_separate_engine_core_process_are_merged(fake_cfg):
    """vLLM's engine core runs the model runner in a child that ends in ``os._exit``: its
    status file, not the worker's own counters, carries what the overlay did."""
    cfg = fake_cfg(
        env={"FAKE_ENGINE_CORE": "1", "FAKE_INEFFECTIVE": "1"},
        workload="vllm",
        model="fake",
        order=["stock", "patched"],
    )
    runs, summary = _run(cfg)
    patched = runs[1].result
    assert patched["processes"]["count"] == 2  # the worker and its engine core
    (core,) = [p for p in patched["processes"]["per_process"] if p["counters"]]
    assert core["pid"] != patched["pid"]
    assert patched["cases"][0]["counters"]["updates.owned"] == 9
    assert summary.verdict == compare.PASS, summary.problems


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_command_exit_codes(fake_worker: Path, tmp_path: Path, monkeypatch, capsys):
    base = (
        "--worker",
        str(fake_worker),
        "--scenarios",
        "alpha",
        "--steps",
        "3",
        "--no-progress",
        "--out",
    )
    assert command.run(_args(*base, str(tmp_path / "a"))) == 0
    out = capsys.readouterr().out
    assert "VERDICT: PASS" in out and (tmp_path / "a" / "report.json").is_file()
    monkeypatch.setenv("FAKE_DIFF", "patched")
    assert command.run(_args(*base, str(tmp_path / "b"))) == 1
    monkeypatch.setenv("FAKE_CRASH", "stock")
    assert command.run(_args(*base, str(tmp_path / "c"))) == 3
    assert "CRASH" in capsys.readouterr().out
    assert (tmp_path / "c" / "report.json").is_file() and (tmp_path / "c" / "report.md").is_file()


def test_usage_errors(tmp_path: Path, capsys):
    assert command.run(_args("--scenarios", "no_such_scenario", "--out", str(tmp_path))) == 2
    assert command.run(_args("--prompts", str(tmp_path / "p.jsonl"))) == 2
    with pytest.raises(SystemExit) as refused:  # a bad value: refused while parsing
        _args("--steps", "0")
    assert refused.value.code == 2
    assert command.run(_args("--model", "m", "--prompts", str(tmp_path / "missing"))) == 2
    assert "error" in capsys.readouterr().err


def test_prompts_file_and_engine_args(tmp_path: Path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "Hello"}\n"World"\n\n')
    cfg = command.build_config(
        _args("--model", "org/m", "--prompts", str(p), "--", "--max-model-len", "1024")
    )
    assert cfg.workload == "vllm" and cfg.prompts == ["Hello", "World"]
    assert cfg.engine_args == ["--max-model-len", "1024"]
    assert cfg.cases == ["vllm:org/m"]


# --- the vLLM worker against the real vLLM 0.23.0 API ----------------------------------------


def test_vllm_worker_real_api_engine_mocked(mocker, tmp_path: Path):
    import vllm
    from vllm.outputs import CompletionOutput, RequestOutput

    from ascend_graph_patch.ab import worker_vllm
    from ascend_graph_patch.ab.protocol import Progress

    init = mocker.patch.object(vllm.LLM, "__init__", return_value=None)

    def fake_generate(self, prompts, sampling_params=None, **kwargs):
        assert isinstance(sampling_params, vllm.SamplingParams)
        return [
            RequestOutput(
                request_id=str(i),
                prompt=p,
                prompt_token_ids=[1, 2],
                prompt_logprobs=None,
                finished=True,
                outputs=[
                    CompletionOutput(
                        index=0,
                        text=f"out{i}",
                        token_ids=[i, i + 1],
                        cumulative_logprob=-0.5,
                        logprobs=None,
                        finish_reason="length",
                    )
                ],
            )
            for i, p in enumerate(prompts)
        ]

    gen = mocker.patch.object(vllm.LLM, "generate", autospec=True, side_effect=fake_generate)
    spec = {
        "model": "org/tiny",
        "seed": 3,
        "max_tokens": 7,
        "prompts": ["a", "b"],
        "engine_args": ["--max-model-len", "2048", "--enforce-eager"],
        "cases": ["vllm:x"],
    }
    body = worker_vllm.run(spec, Progress(None, 2), tmp_path)

    _, kwargs = init.call_args
    assert kwargs["model"] == "org/tiny" and kwargs["seed"] == 3
    assert kwargs["max_model_len"] == 2048 and kwargs["enforce_eager"] is True
    params = gen.call_args.args[2]
    assert params.temperature == 0.0 and params.max_tokens == 7
    case = body["cases"][0]
    assert case["status"] == "ok" and case["tokens"] == [[[0, 1], [1, 2]]]  # one step
    assert case["texts"] == ["out0", "out1"]
    assert case["step_ms"] == pytest.approx(case["generate_seconds"] * 1000 / 2)  # 2 steps


def test_vllm_worker_records_engine_error(mocker, tmp_path: Path):
    import vllm

    from ascend_graph_patch.ab import worker_vllm
    from ascend_graph_patch.ab.protocol import Progress

    mocker.patch.object(vllm.LLM, "__init__", side_effect=RuntimeError("no NPU"))
    body = worker_vllm.run(
        {"model": "m", "seed": 0, "cases": ["vllm:m"]}, Progress(None, 8), tmp_path
    )
    assert body["cases"][0]["status"] == "error"
    assert "RuntimeError: no NPU" in body["cases"][0]["error"]


# --- one tiny real simulator A/B, end to end in subprocesses ----------------------------------


def test_real_sim_ab_end_to_end(tmp_path: Path):
    cfg = ABConfig(
        out=tmp_path / "real",
        cases=["dense_gqa"],
        steps=3,
        seed=0,
        progress=False,
        timeout=240,
        warmup=0,
        order=["stock", "patched"],
    )
    runs, summary = _run(cfg)
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    case = summary.cases[0]
    assert case.verdict == compare.PASS, case.reasons
    assert case.tokens.startswith("equal") and case.eager == "ok"
    patched = runs[1].result["cases"][0]
    assert patched["counters"].get("updates.owned", 0) >= 3
    assert runs[0].result["cases"][0]["counters"] == {}  # toggle off: the overlay never ran
    assert len(patched["update_ns"]) == 3 and case.ratio is not None
    paths = report.write(cfg, summary, runs)
    assert json.loads(paths["json"].read_text())["verdict"] == "PASS"


# --- the --model path, end to end on the simulator with a tiny local model --------------------

#: vLLM engine args for the tiny model on this CPU host (as the engine cases set them).
TINY_ENGINE_ARGS = (
    "--skip-tokenizer-init",
    "--dtype",
    "float32",
    "--max-model-len",
    "256",
    "--max-num-seqs",
    "4",
    "--no-enable-prefix-caching",
    "--no-async-scheduling",  # one thread drives the simulated device
    "--kv-cache-memory-bytes",
    str(64 << 20),
    "--compilation-config",
    '{"mode": 3, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}',
)


def test_model_path_end_to_end_on_the_simulator(tmp_path: Path, monkeypatch, capsys):
    """``ab --model DIR``: real vLLM in every arm, the engine core in its own process (vLLM's
    default), its counters merged from the status files; eager, stock and patched arms."""
    from torch_npu_sim.engine import models
    from torch_npu_sim.engine.cases import ASCEND_COMPILATION  # no Huawei compiler packages

    model = models.materialize("qwen3", tmp_path / "models")
    extra = {"ascend_compilation_config": ASCEND_COMPILATION}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('[5, 17, 300, 41]\n[900, 12, 7]\n{"prompt_token_ids": [33, 44, 55, 66]}\n')
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = _args(
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        "--max-tokens",
        "6",
        "--eager",
        "--jobs",
        "3",  # the three arms at once: the suite's time, not host timing, matters here
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
        "--",
        *TINY_ENGINE_ARGS,
        "--additional-config",
        json.dumps(extra),
    )
    cfg = command.build_config(args)
    assert cfg.simulate is True  # no real torch_npu here: the arms run on the simulator
    cfg.order = ["eager", "stock", "patched"]
    runs = orchestrate.run_ab(cfg)
    assert [r.status for r in runs] == ["ok"] * 3, [r.error for r in runs]
    summary = compare.summarize(cfg, runs)
    assert summary.verdict == compare.PASS, summary.problems
    case = summary.cases[0]
    assert case.correctness == {"eager": "reference", "stock": "equal", "patched": "equal"}
    patched = runs[2].result
    worker_pid = patched["pid"]
    runners = patched["cases"][0]["runner_processes"]
    assert runners and all(r["pid"] != worker_pid for r in runners)  # the engine core's
    assert case.figures["patched"]["graphs_owned"] == 3
    assert case.figures["patched"]["updates_owned"] > 0
    assert patched["cases"][0]["update_ns"]  # timed in the engine core, toggle on
    assert runs[1].result["cases"][0]["update_ns"]  # and off
    assert len(patched["cases"][0]["tokens"][0]) == 3
    paths = report.write(cfg, summary, runs)
    assert json.loads(paths["json"].read_text())["exit_code"] == 0


# --- --model-runner v2: the A/B on model runner v2 by the simulator's opt-in repairs ----------


def test_model_runner_v2_sets_the_variable_and_the_repairs_in_every_arm(tmp_path: Path) -> None:
    """``--model-runner v2`` (vLLM's ``--runner`` is the runner type, hence the name): every
    arm's environment gets the variable and the simulator's repair by name, and the report says
    so: opt-in, unsupported by the release, which repairs. The default (v1) adds nothing."""
    from torch_npu_sim.engine import cases, repairs

    cfg = command.build_config(
        _args("--model", "org/m", "--model-runner", "v2", "--out", str(tmp_path))
    )
    assert cfg.simulate is True and cfg.model_runner == "v2"
    run = orchestrate.plan_runs(cfg)[0]
    env = orchestrate.arm_env({}, cfg, run)
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    # the names the overlay passes are the simulator's own (it never imports them)
    assert env[repairs.ENV_VAR] == cases.V2_REPAIR
    line = model_runner.report_line(cfg.model_runner)
    assert line and all(
        part in line
        for part in ("model runner v2", "unsupported by vllm-ascend", "v2-model-runner")
    )
    summary = compare.Summary(
        verdict=compare.PASS,
        exit_code=0,
        cases=[],
        runs=[],
        ratio=None,
        noise=None,
        speed="-",
        problems=[],
    )
    assert line in report.text_table(cfg, summary).splitlines()[1]
    assert f"Model runner: {line}." in report.markdown(cfg, summary, None)
    assert report.config_json(cfg)["model_runner"] == "v2"
    # the default: the release's own runner, nothing added, no line
    plain = command.build_config(_args("--model", "org/m", "--out", str(tmp_path)))
    plain_env = orchestrate.arm_env({}, plain, orchestrate.plan_runs(plain)[0])
    assert "VLLM_USE_V2_MODEL_RUNNER" not in plain_env and repairs.ENV_VAR not in plain_env
    assert "model runner" not in report.text_table(plain, summary)


def test_model_runner_v2_is_refused_where_no_repair_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On an Ascend host (not the simulator) the release cannot run v2 and no repair exists;
    without --model the engine cases name their runner themselves."""
    monkeypatch.setenv("TORCH_NPU_SIM", "0")
    assert command.run(_args("--model", "org/m", "--model-runner", "v2")) == 2
    assert "needs the simulator's opt-in repairs" in capsys.readouterr().err
    monkeypatch.setenv("TORCH_NPU_SIM", "1")
    assert command.run(_args("--model-runner", "v2", "--scenarios", "x")) == 2
    assert "selects the runner of --model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args("--model", "org/m", "--model-runner", "v3")
