"""Arguments are checked before any work: a bad value is one usage line and exit status 2.

Each case below was accepted by the commands before issue 27 and then cost a run (every arm of
``ab --model /no/such/dir`` started, ``--timeout -5`` killed every arm at once, ``bench --json
DIR`` lost 47 s of results at the end, ``soak --steps 0`` said "unknown scenarios: []").
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ascend_graph_patch import argtypes, cli


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_numbers_have_their_ranges() -> None:
    assert argtypes.int_at_least(1)("3") == 3
    assert argtypes.positive_float("0.5") == 0.5
    assert argtypes.rate("inf") == float("inf")
    assert argtypes.probability("1") == 1.0
    for convert, text in [
        (argtypes.int_at_least(1), "0"),
        (argtypes.int_at_least(0), "-1"),
        (argtypes.int_at_least(1), "2.5"),
        (argtypes.positive_float, "-5"),
        (argtypes.positive_float, "0"),
        (argtypes.positive_float, "nan"),
        (argtypes.positive_float, "inf"),
        (argtypes.non_negative_float, "-0.1"),
        (argtypes.rate, "0"),
        (argtypes.probability, "1.5"),
        (argtypes.probability, "0"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(text)


def test_a_model_folder_must_exist_and_hold_a_config(model_dir: Path, tmp_path: Path) -> None:
    assert argtypes.model(str(model_dir)) == str(model_dir)
    assert argtypes.model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # a hub id: vLLM's to resolve
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for text, why in [
        (str(tmp_path / "missing"), "no such model folder"),
        ("./missing", "no such model folder"),
        ("~/no/such/model", "no such model folder"),
        (str(tmp_path / "empty"), "without a config.json"),
        (str(tmp_path / "file"), "is a file"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            argtypes.model(text)


def test_output_paths_are_of_the_right_kind(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert argtypes.output_dir(str(tmp_path / "new" / "report")) == str(tmp_path / "new/report")
    assert argtypes.output_file(str(tmp_path / "new" / "out.json")).endswith("out.json")
    with pytest.raises(argparse.ArgumentTypeError, match="not a directory"):
        argtypes.output_dir(str(tmp_path / "file"))
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory"):
        argtypes.output_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="not a directory"):
        argtypes.output_file(str(tmp_path / "file" / "out.json"))


def test_long_and_unprintable_values_are_shortened() -> None:
    assert argtypes.quote("abc") == "'abc'"
    long = argtypes.quote("x" * 5000)
    assert long.endswith("... (5000 characters)") and len(long) < 100
    assert "\\x1b" in argtypes.quote("\x1b[31mred")


@pytest.fixture
def command_runs(mocker: Any) -> list[argparse.Namespace]:
    """Every command ``cli.main`` loads, with its ``run`` (all its work) replaced by a recorder:
    the arguments of each run that started, so "no work" is what a test can see."""
    started: list[argparse.Namespace] = []
    real_load = cli.load_command

    def load(target: str) -> Any:
        command = real_load(target)

        def run(args: argparse.Namespace) -> int:
            started.append(args)
            return 0

        return SimpleNamespace(
            add_arguments=command.add_arguments, run=run, HELP=getattr(command, "HELP", None)
        )

    mocker.patch.object(cli, "load_command", side_effect=load)
    return started


@pytest.mark.parametrize(
    "argv",
    [
        ["ab", "--timeout", "-5"],
        ["ab", "--steps", "0"],
        ["ab", "--max-tokens", "0"],
        ["ab", "--jobs", "0"],
        ["ab", "--model", "/no/such/model/folder"],
        ["ab", "--model", "./no-such-model"],
        ["ab", "--serve", "--model", "m", "--temperature", "0.5", "--top-p", "1.5"],
        ["bench", "--json", "{tmp}"],
        ["bench", "--rounds", "0"],
        ["soak", "--steps", "0"],
        ["soak", "--faults", "2"],
        ["soak", "--out", "{tmp}"],
    ],
)
def test_the_commands_refuse_bad_values_before_any_work(
    argv: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command_runs: list[argparse.Namespace],
) -> None:
    report = tmp_path / "report"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "ab":
        argv += ["--out", str(report)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "error:" in x]  # one line says what is wrong
    assert line.startswith(f"ascend-graph-patch {argv[0]}: error: argument "), line
    assert "Traceback" not in err
    assert command_runs == []  # the command's run, where all its work is, never started
    assert not report.exists()  # nor did parsing make ab's report folder


@pytest.mark.parametrize(
    "argv",
    [
        ["ab", "--timeout", "5", "--out", "{tmp}/report"],
        ["bench", "--json", "{tmp}/bench.json", "--rounds", "1"],
        ["soak", "--steps", "1", "--out", "{tmp}/soak.json"],
    ],
)
def test_good_values_reach_the_commands_run(
    argv: list[str], tmp_path: Path, command_runs: list[argparse.Namespace]
) -> None:
    """Negative control for the test above: with the bad value put right, each command's run
    starts (recorded, not run), so an empty record there means the value stopped it."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv) == 0
    assert len(command_runs) == 1 and command_runs[0].subcommand == argv[0]
