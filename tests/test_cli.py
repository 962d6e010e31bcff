"""The CLI shell: subcommand table, status output, exit codes and error handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import ascend_graph_patch
from ascend_graph_patch import cli


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.startswith("ASCEND_GRAPH_PATCH"):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def fake_snapshot(clean_env: pytest.MonkeyPatch) -> list[bool]:
    """``status.snapshot`` stood in for, recording the ``check`` argument it was called with."""
    from ascend_graph_patch import status

    calls: list[bool] = []

    def snapshot(check: bool) -> dict:
        calls.append(check)
        verdict = "refused" if check else "supported"
        return {
            "mode": "observe",
            "gate": {"v1": {"verdict": verdict, "reason": "seams"}},
            "aspects": [1, 2],
        }

    clean_env.setattr(status, "snapshot", snapshot)
    return calls


def add_command(monkeypatch: pytest.MonkeyPatch, name: str, run) -> None:
    module = types.ModuleType(f"agp_test_{name}")
    module.HELP = f"{name} help"  # type: ignore[attr-defined]
    module.add_arguments = lambda p: p.add_argument("--n", type=int, default=0)  # type: ignore
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(cli.BUILTIN, name, module.__name__)


def test_status_text_is_aligned_key_value(clean_env, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = dict(line.split(": ", 1) for line in lines)
    assert rows["mode"].strip() == "off"
    for key in (
        "strict",
        "force",
        "simulator",
        "versions.vllm",
        "versions.torch-npu-sim",
        "versions.vllm-ascend",
        "versions.torch",
        "versions.ascend-graph-patch",
    ):
        assert key in rows, key
    assert rows["versions.ascend-graph-patch"].strip() == ascend_graph_patch.__version__
    value_columns = {len(line) - len(line.split(": ", 1)[1].lstrip()) for line in lines}
    assert len(value_columns) == 1  # every value starts in the same column


def test_status_json_parses(clean_env, capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("ASCEND_GRAPH_PATCH", "verify")
    clean_env.setenv("ASCEND_GRAPH_PATCH_STRICT", "yes")
    assert cli.main(["status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["env_mode"] == "verify" and data["strict"] is False and data["force"] is False
    assert data["versions"]["ascend-graph-patch"] == ascend_graph_patch.__version__
    assert data["versions"]["torch-npu"] is None  # no real torch_npu on this machine
    assert data["simulator"] is True  # the test session's torch_npu is the simulator
    assert any("ASCEND_GRAPH_PATCH_STRICT='yes'" in p for p in data["environment_problems"])


def test_status_uses_status_module(fake_snapshot: list[bool], capsys) -> None:
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "gate.v1.verdict:" in out and "aspects:" in out and "1, 2" in out
    assert cli.main(["status", "--json", "--check"]) == 1  # a group was refused
    assert json.loads(capsys.readouterr().out)["gate"]["v1"]["verdict"] == "refused"
    assert fake_snapshot == [False, True]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ascend-graph-patch {ascend_graph_patch.__version__}"
    assert cli.main(["-V"]) == 0


def test_unknown_subcommand_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_no_subcommand_prints_help_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "status" in capsys.readouterr().err


def test_help_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "status" in capsys.readouterr().out
    assert cli.main(["status", "--help"]) == 0
    assert "--json" in capsys.readouterr().out


def test_missing_module_is_skipped(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.BUILTIN, "ghost", "ascend_graph_patch.no_such_module.command")
    assert cli.main(["--help"]) == 0
    assert "ghost" not in capsys.readouterr().out
    assert cli.main(["ghost"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_broken_module_is_an_error_not_a_skip(monkeypatch, tmp_path: Path, capsys) -> None:
    """Only a missing *target* module skips; a missing dependency inside it is a real error."""
    (tmp_path / "agp_test_broken.py").write_text("import agp_test_no_such_dependency\n")
    (tmp_path / "agp_test_halfway.py").write_text("HELP = 'no run()'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(cli.CommandUnavailable):
        cli.load_command("agp_test_not_there")
    with pytest.raises(ModuleNotFoundError):
        cli.load_command("agp_test_broken")
    with pytest.raises(TypeError):
        cli.load_command("agp_test_halfway")
    monkeypatch.setitem(cli.BUILTIN, "broken", "agp_test_broken")
    assert cli.main(["broken"]) == 1
    assert "agp_test_no_such_dependency" in capsys.readouterr().err


def test_commands_load_lazily(monkeypatch, clean_env) -> None:
    """Running ``status`` must not import the other subcommands' modules."""

    def explode(args) -> int:
        raise AssertionError("not me")

    add_command(monkeypatch, "other", explode)
    monkeypatch.setitem(cli.BUILTIN, "trap", "agp_test_trap_never_imported")
    imported: list[str] = []
    real_import = cli.importlib.import_module

    def spy(name: str, *a, **k):
        imported.append(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(cli.importlib, "import_module", spy)
    assert cli.main(["status", "--json"]) == 0
    assert "agp_test_trap_never_imported" not in imported and "agp_test_other" not in imported
    assert not any(name.startswith("torch_npu_sim.") for name in imported)


def test_other_distributions_add_subcommands_by_entry_point(capsys) -> None:
    """torch-npu-sim adds ``bench`` and ``soak``; the overlay names neither."""
    table = cli.subcommands()
    assert table["bench"] == "torch_npu_sim.bench.command"
    assert table["soak"] == "torch_npu_sim.soak:command"
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "bench" in out and "soak" in out


def test_added_subcommand_runs(monkeypatch) -> None:
    seen = []
    add_command(monkeypatch, "extra", lambda args: seen.append(args.n) or 7)
    assert cli.main(["extra", "--n", "3"]) == 7
    assert seen == [3]


def test_errors_are_one_line(monkeypatch, clean_env, capsys: pytest.CaptureFixture[str]) -> None:
    def fail(args) -> int:
        raise ValueError("bad input\nmore detail")

    add_command(monkeypatch, "fail", fail)
    assert cli.main(["fail"]) == 1
    err = capsys.readouterr().err
    assert err == "ascend-graph-patch: error: ValueError: bad input\n"

    clean_env.setenv("ASCEND_GRAPH_PATCH_DEBUG", "1")
    assert cli.main(["fail"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_keyboard_interrupt(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupt(args) -> int:
        raise KeyboardInterrupt

    add_command(monkeypatch, "slow", interrupt)
    assert cli.main(["slow"]) == 130
    assert capsys.readouterr().err == "ascend-graph-patch: interrupted (SIGINT)\n"


def test_console_script_installed(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("ascend-graph-patch")
    proc = subprocess.run(
        [str(script), "status", "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "mode" in json.loads(proc.stdout)
