"""``ascend-graph-patch ab --serve``: the served path, end to end, with the real server and client.

Each arm is a fresh ``vllm serve`` of the simulator's tiny Qwen3 (vLLM 0.23.0 with every plugin of
vllm-ascend 0.23.0.post1, ``VLLM_PLUGINS`` unset), loaded by ``vllm bench serve``: a greedy load
and a seeded top-p load, each a case judged against the eager server's outputs. The servers are
expensive (each pays vLLM's imports in three processes), so one module-scoped A/B (eager, stock,
patched, run at once) serves every end-to-end assertion, and the negative control is one more
server: a patched arm whose relaunches the simulator skips, judged against the same eager arm.

The cheap tests at the top check the configuration, the client's and the server's command lines,
what the worker reads from ``/metrics`` and the status files, and the verdicts and report of a
served A/B on made-up results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ascend_graph_patch import status_files
from ascend_graph_patch.ab import (
    command,
    compare,
    engine_args,
    orchestrate,
    report,
    served,
    worker_serve,
)
from ascend_graph_patch.ab.orchestrate import ABConfig, ArmRun
from tests import process_support


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


# --- configuration ---------------------------------------------------------------------------


def test_serve_with_a_model_is_one_case_per_load(tmp_path: Path) -> None:
    cfg = command.build_config(
        _args(
            "--serve",
            "--model",
            "org/m",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--also-greedy",
            "--sampling-seed",
            "5",
            "--num-prompts",
            "3",
            "--out",
            str(tmp_path),
            "--",
            "--max-model-len",
            "512",
        )
    )
    assert cfg.workload == "serve" and cfg.model == "org/m"
    assert cfg.engine_args == ["--max-model-len", "512"]
    assert cfg.cases == ["greedy", "sampled (T 0.7, top-p 0.9, seed 5)"]
    greedy, sampled = cfg.serve["loads"]
    assert greedy["temperature"] == 0.0 and greedy["num_prompts"] == 3
    assert sampled["sampling_seed"] == 5 and sampled["top_p"] == 0.9
    assert cfg.eager and cfg.timeout == served.DEFAULT_TIMEOUT
    assert orchestrate.schedule(cfg.repeats, cfg.verify, cfg.eager) == [
        "eager",
        "stock",
        "patched",
        "patched",
        "stock",
    ]
    spec = orchestrate.spec_for(cfg, orchestrate.plan_runs(cfg)[0])
    assert spec["enforce_eager"] and spec["serve"] == cfg.serve and spec["model"] == "org/m"


def test_prompts_file_becomes_the_clients_custom_dataset(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"Hello"\n{"prompt": "World"}\n')
    cfg = command.build_config(
        _args("--serve", "--model", "m", "--prompts", str(prompts), "--out", str(tmp_path / "o"))
    )
    (load,) = cfg.serve["loads"]
    assert load["num_prompts"] == 2
    lines = Path(load["prompts_file"]).read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == ["Hello", "World"]


@pytest.mark.parametrize(
    "argv",
    [
        ("--num-prompts", "3"),  # a served option without --serve
        ("--serve", "--model", "m", "--top-p", "0.9"),  # sampling without a temperature
        ("--serve", "--model", "m", "--temperature", "0.5", "--top-p", "1.5"),
        ("--serve", "--model", "m", "--num-prompts", "0"),
        ("--serve", "--model", "m", "--request-rate", "0"),
        ("--serve", "--scenarios", "qwen3/compile/decode-only"),
        ("--serve", "--model", "m", "--max-tokens", "5"),  # --output-len with --serve
    ],
)
def test_usage_errors_exit_2(argv: tuple[str, ...], tmp_path: Path, capsys) -> None:
    """A bad value is refused while parsing (argparse exits 2), a bad combination by the
    command (it returns 2): either way before any arm starts."""
    try:
        args = _args(*argv, "--out", str(tmp_path))
    except SystemExit as exc:
        assert exc.code == 2
    else:
        assert command.run(args) == 2
    assert "error" in capsys.readouterr().err


def test_token_id_prompts_are_refused(tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("[1, 2, 3]\n")
    argv = ("--serve", "--model", "m", "--prompts", str(prompts), "--out", str(tmp_path))
    assert command.run(_args(*argv)) == 2
    assert "text prompts only" in capsys.readouterr().err


def test_client_args_custom_dataset_parse_with_vllms_parser(tmp_path: Path) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    load = {"num_prompts": 2, "output_len": 7, "prompts_file": "/p.jsonl", "temperature": 0.0}
    args = worker_serve.client_args({"model": "/m", "seed": 0}, load, "http://h:1", tmp_path / "r")
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    parsed = parser.parse_args(args)
    assert parsed.dataset_name == "custom" and parsed.dataset_path == "/p.jsonl"
    assert parsed.custom_output_len == 7 and parsed.skip_chat_template and parsed.disable_shuffle
    assert parsed.temperature == 0.0 and parsed.extra_body is None


# --- the worker's command lines and readings -------------------------------------------------


def test_server_args_eager_arm_shutdown_timeout_and_seed() -> None:
    spec = {"engine_args": ["--max-model-len", "64"], "enforce_eager": True, "seed": 3}
    args = worker_serve.server_args(spec)
    assert args[:2] == ["--max-model-len", "64"] and "--enforce-eager" in args
    assert engine_args.option(args, "--shutdown-timeout") == "10"
    assert engine_args.option(args, "--seed") == "3"
    mine = {"engine_args": ["--shutdown-timeout=30", "--seed", "9"], "seed": 3}
    args = worker_serve.server_args(mine)
    assert args == ["--shutdown-timeout=30", "--seed", "9"]  # the user's own win


def test_client_args_random_dataset_and_seeded_sampling(tmp_path: Path) -> None:
    spec = {"model": "/m", "seed": 4, "engine_args": ["--served-model-name", "x"]}
    load = {
        "num_prompts": 6,
        "input_len": 10,
        "output_len": 5,
        "max_concurrency": 2,
        "request_rate": None,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": None,
        "sampling_seed": 4,
    }
    args = worker_serve.client_args(spec, load, "http://127.0.0.1:1234", tmp_path / "r.json")
    text = " ".join(args)
    assert "--base-url http://127.0.0.1:1234" in text and "--served-model-name x" in text
    assert "--dataset-name random --random-range-ratio 0" in text and "--seed 4" in text
    assert "--ignore-eos --temperature 0.8 --top-p 0.9" in text and "--top-k" not in text
    assert args[args.index("--extra-body") + 1] == '{"seed": 4}'
    assert "--request-rate" not in args  # all at once
    from vllm.benchmarks.serve import add_cli_args  # vLLM's own parser accepts every one
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    parsed = parser.parse_args(args)
    assert parsed.num_prompts == 6 and parsed.max_concurrency == 2 and parsed.save_detailed
    assert parsed.extra_body == {"seed": 4} and parsed.random_output_len == 5


def test_engine_steps_from_metrics() -> None:
    text = (
        "# HELP vllm:iteration_tokens_total ...\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="1.0"} 3.0\n'
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 34.0\n'
        'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 200.0\n'
    )
    assert worker_serve.engine_steps(text) == 34
    assert worker_serve.engine_steps("") is None


def test_live_figures_sum_counters_and_take_the_most_replays(tmp_path: Path) -> None:
    for pid, rank, calls, owned in ((10, 0, 30, 30), (11, 1, 30, 30), (12, None, None, 0)):
        snap = {"pid": pid, "rank": rank, "counters": {"updates.owned": owned} if owned else {}}
        if calls is not None:
            snap["update_calls"] = calls
        (tmp_path / f"status-{pid}.json").write_text(json.dumps(snap))
    live = worker_serve.live_figures(tmp_path)
    assert live["counters"] == {"updates.owned": 60}  # summed over the ranks
    assert live["replays"] == 30  # every rank replays the same steps
    assert live["pids"] == [10, 11] and live["processes"] == 3


FAKE_SERVER = """
import http.server, sys
port, log = int(sys.argv[1]), sys.argv[2]
if sys.argv[3] == "taken":
    open(log, "a").write("OSError: [Errno 98] Address already in use\\n")
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_port_taken_meanwhile_is_retried_once_with_another(tmp_path: Path, monkeypatch) -> None:
    """Between choosing a free port and binding it another run may take it: the server exits
    saying so, and the worker starts it once more on another port (and stops each by pid)."""
    import sys

    from ascend_graph_patch.ab import server

    started: list[server.Server] = []

    def fake_start(model: str, args: list[str], env: dict, log: Path) -> server.Server:
        port = server.free_port()
        mode = "taken" if not started else "serve"
        cmd = [sys.executable, "-c", FAKE_SERVER, str(port), str(log), mode]
        started.append(server.Server(server.spawn(cmd, env, log), port, log))
        return started[-1]

    monkeypatch.setattr(server, "start", fake_start)
    calls: list[int] = []
    srv, value = server.start_ready(
        "m", [], dict(os.environ), tmp_path / "log", 60, lambda: calls.append(1) or "ok"
    )
    try:
        assert value == "ok" and calls == [1]  # the work done meanwhile is not repeated
        assert len(started) == 2 and srv is started[1] and srv.get("/health")[0] == 200
        assert started[0].proc.poll() == 1
    finally:
        server.stop(srv.proc, grace=5)
    assert srv.proc.poll() is not None


# --- verdicts and report on made-up results --------------------------------------------------


def _case(name: str, tokens: list[list[int]], owned: int, replays: int = 7) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "serve",
        "expect": "ok",
        "status": "ok",
        "reference": "eager arm",
        "tokens": [tokens],
        "load": {"num_prompts": len(tokens)},
        "client": {"completed": len(tokens), "request_throughput": 1.5, "median_ttft_ms": 20.0},
        "counters": {"updates.owned": owned} if owned else {},
        "replays": replays,
        "engine_steps": 8,
    }


def _served_runs(tmp_path: Path, patched: dict[str, Any]) -> tuple[ABConfig, list[ArmRun]]:
    cfg = ABConfig(out=tmp_path, workload="serve", cases=["greedy"], eager=True, simulate=True)
    cfg.warmup = 0  # as served.configure sets it
    cfg.order = ["eager", "stock", "patched"]
    runs = orchestrate.plan_runs(cfg)
    good = [[1, 2, 3], [4, 5, 6]]
    cases = [_case("greedy", good, 0, 0), _case("greedy", good, 0), patched]
    for run, case in zip(runs, cases, strict=True):
        run.status, run.result = "ok", {"ok": True, "cases": [case], "processes": {"count": 3}}
    return cfg, runs


def test_a_served_ab_passes_and_reports_clients_and_servers_figures(tmp_path: Path) -> None:
    cfg, runs = _served_runs(tmp_path, _case("greedy", [[1, 2, 3], [4, 5, 6]], 7))
    summary = compare.summarize(cfg, runs)
    assert summary.verdict == compare.PASS
    (case,) = summary.cases
    assert [r["outputs"] for r in case.served] == ["reference", "equal", "equal"]
    assert [r["replays"] for r in case.served] == [0, 7, 7]
    table = report.text_table(cfg, summary)
    assert "simulator times" in table and "owned updates" in table and "1.50" in table


def test_on_a_host_the_served_update_times_are_compared(tmp_path: Path) -> None:
    """Off the simulator the update calls' host times of each load (from the status files) go
    into the timing part, as for ``--model``; on the simulator they mean nothing and are left
    out, with the reason."""
    cfg, runs = _served_runs(tmp_path, _case("greedy", [[1, 2, 3], [4, 5, 6]], 7))
    for run, ns in zip(runs[1:], (2000, 1000), strict=True):
        case = run.result["cases"][0]
        case["update_ns"], case["update_calls"] = [ns] * 7, [1] * 7
    assert compare.summarize(cfg, runs).cases[0].timing == {}  # simulated
    cfg.simulate = False
    case = compare.summarize(cfg, runs).cases[0]
    assert case.ratio == pytest.approx(0.5) and case.timing["patched"].n == 7


def test_a_served_ab_whose_overlay_owned_nothing_is_not_a_pass(tmp_path: Path) -> None:
    cfg, runs = _served_runs(tmp_path, _case("greedy", [[1, 2, 3], [4, 5, 6]], 0))
    assert compare.summarize(cfg, runs).verdict == compare.INEFFECTIVE


def test_a_served_divergence_is_named_request_and_position(tmp_path: Path) -> None:
    cfg, runs = _served_runs(tmp_path, _case("greedy", [[1, 2, 3], [4, 9, 6]], 7))
    summary = compare.summarize(cfg, runs)
    assert summary.verdict == compare.DIFF
    where = "step 0, request 1, position 1: 5 vs 9"
    assert summary.cases[0].correctness["patched"] == f"differs at {where}"
    assert f"patched run 2: differs at {where}" in report.text_table(cfg, summary)


# --- end to end: real servers, the real client -----------------------------------------------

#: Small loads: one wave of four requests (the engine's batch), eight tokens each, so seven of
#: each load's eight engine steps are pure decode and replay a FULL graph.
PROMPTS, TOKENS = 4, 8


def _environment(home: Path, mark: str) -> dict[str, str]:
    """The caller's environment without ``VLLM_PLUGINS`` (every plugin loads, as for a user);
    ``HOME`` apart, where vllm-ascend's service-profiling plugin writes its file; a mark that
    every process the A/B starts inherits (to find any left behind)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    env["HOME"] = str(home)
    env[process_support.MARK] = mark
    env.setdefault("OMP_NUM_THREADS", "1")
    env["VLLM_LOGGING_LEVEL"] = "INFO"  # the plugin check reads the servers' INFO lines
    return env


def _share_model_inspection(out: Path) -> None:
    """The arms' model inspection cache is the session's (``VLLM_CACHE_ROOT``, set by the root
    conftest): an engine test that already inspected Qwen3 spares every server that subprocess."""
    session = Path(os.environ["VLLM_CACHE_ROOT"]) / "modelinfos"
    session.mkdir(parents=True, exist_ok=True)
    (out / "cache").mkdir(parents=True, exist_ok=True)
    (out / "cache" / "modelinfos").symlink_to(session, target_is_directory=True)


@pytest.fixture(scope="module")
def served_ab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One served A/B: eager, stock and patched servers at once, a greedy and a seeded top-p
    load each (the CLI's own configuration path), and the negative control's server."""
    root = tmp_path_factory.mktemp("serve")
    out = root / "ab"
    _share_model_inspection(out)
    argv = ["--serve", "--temperature", "0.8", "--top-p", "0.9", "--also-greedy"]
    argv += ["--num-prompts", str(PROMPTS), "--output-len", str(TOKENS), "--jobs", "3"]
    cfg = command.build_config(_args(*argv, "--no-progress", "--timeout", "900", "--out", str(out)))
    cfg.order = ["eager", "stock", "patched"]
    mark = process_support.new_mark()
    env = _environment(root / "home", mark)
    runs = orchestrate.run_ab(cfg, env)
    summary = compare.summarize(cfg, runs)
    paths = report.write(cfg, summary, runs)

    # The negative control: a patched server whose relaunches the simulator skips (every event
    # still recorded), the greedy load only, judged against the eager server above.
    control_out = root / "control"
    _share_model_inspection(control_out)
    control = command.build_config(_args(*argv[:1], *argv[6:], "--out", str(control_out)))
    control.order, control.progress, control.timeout = ["patched"], False, 900.0
    control.extra_env = {"TORCH_NPU_SIM_TEST_SKIP_RELAUNCH": "1"}
    control.serve = {"loads": [cfg.serve["loads"][0]]}
    control.cases = ["greedy"]
    (control_run,) = orchestrate.run_ab(control, env)
    control_run = dataclasses.replace(control_run, index=len(runs))  # numbered after the A/B's
    control_summary = compare.summarize(control, [runs[0], control_run])
    return {
        "cfg": cfg,
        "runs": runs,
        "summary": summary,
        "paths": paths,
        "home": root / "home",
        "control_run": control_run,
        "control_summary": control_summary,
        "control_cfg": control,
        "mark": mark,
    }


def test_served_ab_passes_greedy_and_seeded_top_p(served_ab: dict[str, Any]) -> None:
    """Every request's output of the stock and the patched server equals the eager server's, in
    the greedy load and in the seeded top-p load (sampled with torch_npu.npu_top_k_top_p)."""
    runs, summary = served_ab["runs"], served_ab["summary"]
    assert [r.status for r in runs] == ["ok"] * 3, [r.error for r in runs]
    assert summary.verdict == compare.PASS, summary.problems
    greedy, sampled = summary.cases
    assert sampled.name == "sampled (T 0.8, top-p 0.9, seed 0)"
    for case in (greedy, sampled):
        assert case.correctness == {"eager": "reference", "stock": "equal", "patched": "equal"}
        assert all(r["requests"] == f"{PROMPTS}/{PROMPTS}" for r in case.served)
    eager = runs[0].result["cases"]
    assert eager[0]["texts"] != eager[1]["texts"]  # sampling did sample
    assert all(len(t) == TOKENS for t in eager[1]["tokens"][0])  # word tokens, one each
    assert json.loads(served_ab["paths"]["json"].read_text())["verdict"] == "PASS"


def test_graphs_replayed_and_the_overlay_owned_the_updates(served_ab: dict[str, Any]) -> None:
    """Pure-decode steps replay FULL graphs in both graph arms; in the patched arm the engine
    core (not the API server, not the worker) counted one owned update per replay."""
    runs, summary = served_ab["runs"], served_ab["summary"]
    for case in summary.cases:
        rows = {r["arm"]: r for r in case.served}
        assert rows["eager"]["replays"] == 0
        for arm in ("stock", "patched"):
            steps, replays = rows[arm]["engine_steps"], rows[arm]["replays"]
            # At most one step per request holds a prefill; every other step is pure decode.
            assert steps - PROMPTS <= replays <= steps and replays >= TOKENS - 2, rows[arm]
        assert rows["patched"]["updates_owned"] == rows["patched"]["replays"]
        assert rows["stock"]["updates_owned"] == 0 and rows["patched"]["fallbacks"] == 0
        client = rows["patched"]["client"]
        assert client["output_throughput"] > 0 and client["median_ttft_ms"] > 0
    patched = runs[2].result
    (engine_core,) = patched["cases"][0]["runner_pids"]
    assert engine_core not in (patched["pid"], patched["server"]["pid"])
    assert summary.cases[0].figures["patched"]["graphs_owned"] == 3


def test_live_status_files_agree_with_the_final_ones(served_ab: dict[str, Any]) -> None:
    """What the worker read while the server served (``status --from`` reads the same files the
    same way) already held every count: equal to the files after the server exited."""
    patched = served_ab["runs"][2]
    cases = patched.result["cases"]
    live_owned = sum(c["counters"].get("updates.owned", 0) for c in cases)
    snaps = status_files.read_dir(patched.dir / "status")
    final = status_files.merge(snaps)
    assert live_owned == final["counters"]["updates.owned"] == sum(c["replays"] for c in cases)
    last = cases[-1]["live"]["after"]
    assert last["counters"] == final["counters"]
    assert last["replays"] == max(s.get("update_calls") or 0 for s in snaps) > 0


def test_vllm_serve_started_with_every_plugin_and_no_vllm_plugins(
    served_ab: dict[str, Any],
) -> None:
    """``VLLM_PLUGINS`` unset in every arm (the orchestrator no longer sets it); vllm-ascend's
    general plugins ran in the servers: the model-loader plugin (which imports
    ``torch.distributed.is_hccl_available``) registered its loaders in the engine core, and the
    service-profiling plugin wrote its file under the arms' ``HOME``."""
    for run in served_ab["runs"]:
        assert run.result["server"]["vllm_plugins"] is None
        log = Path(run.result["server"]["log"]).read_text()
        assert "Failed to load plugin" not in log
        registered = [line for line in log.splitlines() if "Registered model loader" in line]
        assert any(
            line.startswith("(EngineCore") and "`netloader`" in line for line in registered
        ), (run.result["server"]["log"], registered, log[:2000])
    config = served_ab["home"] / ".config" / "vllm_ascend"
    assert any(p.name.startswith("service_profiling_symbols") for p in config.iterdir())


def test_negative_control_relaunches_skipped_outputs_differ_verdict_fail(
    served_ab: dict[str, Any],
) -> None:
    run = served_ab["control_run"]
    assert run.status == "ok", run.error
    summary = served_ab["control_summary"]
    assert summary.verdict == compare.DIFF and summary.exit_code == 1
    (case,) = summary.cases
    assert case.correctness["patched"].startswith("differs at step 0, request ")
    (row,) = [r for r in case.served if r["arm"] == "patched"]
    assert row["updates_owned"] == row["replays"] > 0  # it updated; the relaunches were skipped
    text = report.text_table(served_ab["control_cfg"], summary)
    assert "VERDICT: DIFF" in text and f"first divergence: greedy, patched run {run.index}" in text


def test_every_process_the_served_ab_started_is_gone(served_ab: dict[str, Any]) -> None:
    """Servers, engine cores, workers, their guardians: none outlives the A/B."""
    assert process_support.wait_gone(served_ab["mark"], 30.0) == {}
