"""The loader: mode parsing, the bootstrap's contract, and the installed .pth in real processes.

In-process tests fake ``activation.enable``; the subprocess tests run the venv's interpreter so
the ``.pth`` installed by ``scripts/build-stack.sh`` (editable install) really runs at start-up.
Fresh interpreters here never import torch, so each one costs well under a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from ascend_graph_patch import _bootstrap, activation, loader_state, settings

REPO = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"])
ENV_PREFIX = "ASCEND_GRAPH_PATCH"

# Printed by every probe subprocess: what the loader did before any user code ran.
PROBE = textwrap.dedent(
    """
    import json, sys
    boot = sys.modules.get("ascend_graph_patch.loader_state")
    print(json.dumps({
        "heavy": [m for m in ("torch", "vllm", "vllm_ascend", "wrapt") if m in sys.modules],
        "ours": sorted(m for m in sys.modules
                       if m.startswith("ascend_graph_patch") and "editable" not in m),
        "mode": getattr(boot, "MODE", None),
        "bootstrapped": getattr(boot, "BOOTSTRAPPED", False),
    }))
    """
)


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any ASCEND_GRAPH_PATCH* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(extra)
    return env


def run_probe(*flags: str, cwd: Path, **env: str) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, *flags, "-c", PROBE],
        env=clean_env(**env),
        cwd=cwd,  # not the repo root: the package must come from site-packages, not from cwd
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A monkeypatch whose environment starts with no ASCEND_GRAPH_PATCH* variable set."""
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def fresh(env: pytest.MonkeyPatch) -> list[str]:
    """Bootstrap state reset (restored afterwards) and a recording fake ``activation.enable``."""
    for name, value in [("BOOTSTRAPPED", False), ("MODE", None), ("ENABLE_ERROR", None)]:
        env.setattr(loader_state, name, value)
    calls: list[str] = []
    env.setattr(activation, "enable", calls.append)
    return calls


# --- settings: the one home for the environment ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, "off"),
        ("", "off"),
        ("   ", "off"),
        ("0", "off"),
        ("off", "off"),
        ("OFF", "off"),
        ("false", "off"),
        (" False ", "off"),
        ("1", "on"),
        ("on", "on"),
        ("On", "on"),
        ("true", "on"),
        ("TRUE\n", "on"),
        ("observe", "observe"),
        (" Observe ", "observe"),
        ("verify", "verify"),
        ("VERIFY", "verify"),
    ],
)
def test_parse_accepted(raw: str | None, expected: str) -> None:
    assert settings.parse_mode(raw) == (expected, None)


@pytest.mark.parametrize("raw", ["2", "yes", "enable", "verify-strict", "o n", "observer"])
def test_parse_invalid_is_off_with_one_line_naming_the_values(raw: str) -> None:
    parsed, warning = settings.parse_mode(raw)
    assert parsed == "off"
    assert warning is not None and "\n" not in warning
    assert repr(raw) in warning
    for accepted in settings.MODES:
        assert accepted in warning


def test_mode_reads_the_environment(env: pytest.MonkeyPatch) -> None:
    assert settings.mode() == "off"
    env.setenv("ASCEND_GRAPH_PATCH", "verify")
    assert settings.mode() == "verify"
    assert settings.mode({"ASCEND_GRAPH_PATCH": "observe"}) == "observe"


@pytest.mark.parametrize("reader", [settings.strict, settings.force, settings.debug])
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("no", False),
        ("1", True),
        ("on", True),
        (" TRUE ", True),
    ],
)
def test_boolean_flags(reader, raw: str | None, expected: bool) -> None:
    name = {
        settings.strict: settings.ENV_STRICT,
        settings.force: settings.ENV_FORCE,
        settings.debug: settings.ENV_DEBUG,
    }[reader]
    environ = {} if raw is None else {name: raw}
    assert reader(environ) is expected


@pytest.mark.parametrize("name", [settings.ENV_STRICT, settings.ENV_FORCE, settings.ENV_DEBUG])
@pytest.mark.parametrize("raw", ["yes", "2", "enable", "of"])
def test_invalid_flag_is_a_problem_naming_the_accepted_values(name: str, raw: str) -> None:
    problems = settings.problems({name: raw})
    assert len(problems) == 1
    assert name in problems[0] and repr(raw) in problems[0]
    for accepted in ("1", "on", "true", "0", "off", "false"):
        assert accepted in problems[0]


def test_valid_settings_have_no_problems() -> None:
    environ = {
        settings.ENV_MODE: "verify",
        settings.ENV_STRICT: "1",
        settings.ENV_FORCE: "off",
        settings.ENV_DEBUG: "",
        settings.ENV_DISABLE: "replay.update",
        "ASCEND_GRAPH_PATCH_SIM": "1",
    }
    assert settings.problems(environ) == []


def test_unknown_variable_is_named() -> None:
    problems = settings.problems({"ASCEND_GRAPH_PATCH_STICT": "1"})
    assert len(problems) == 1 and "ASCEND_GRAPH_PATCH_STICT" in problems[0]
    assert settings.ENV_STRICT in problems[0]  # and the names that do exist


def test_disabled_aspects() -> None:
    environ = {settings.ENV_DISABLE: " Replay, attention,,capture "}
    assert settings.disabled_aspects(environ) == {"replay", "attention", "capture"}
    assert settings.disabled_aspects({}) == frozenset()
    assert settings.aspect_disabled("REPLAY", environ)
    assert not settings.aspect_disabled("verify", environ)
    assert settings.aspect_disabled("anything", {settings.ENV_DISABLE: "*"})


def test_unknown_aspect_names_are_named() -> None:
    known = ["replay.update", "capture.v1"]
    environ = {settings.ENV_DISABLE: "replay.update, replay.updat, *"}
    problem = settings.unknown_aspects(known, environ)
    assert "replay.updat" in problem and "capture.v1" in problem
    assert settings.unknown_aspects(known, {settings.ENV_DISABLE: "Capture.V1,*"}) == ""


def test_pth_prefilter_matches_settings() -> None:
    """The .pth's inline off-check must agree with settings.OFF_VALUES."""
    pth = (REPO / "loader" / "ascend_graph_patch.pth").read_text()
    assert "(" + ", ".join(f'"{v}"' for v in ("", "0", "off", "false")) + ")" in pth
    assert {"", "0", "off", "false"} == settings.OFF_VALUES


# --- bootstrap, in process ---------------------------------------------------------------------


def test_off_does_not_enable(fresh: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _bootstrap.bootstrap()
    assert fresh == []
    assert loader_state.MODE == "off"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", "on"), ("observe", "observe"), ("Verify", "verify")]
)
def test_enabled_mode_calls_enable(
    fresh: list[str], env: pytest.MonkeyPatch, raw: str, expected: str
) -> None:
    env.setenv("ASCEND_GRAPH_PATCH", raw)
    _bootstrap.bootstrap()
    assert (fresh, loader_state.MODE) == ([expected], expected)


def test_invalid_value_warns_once_and_stays_off(
    fresh: list[str], env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("ASCEND_GRAPH_PATCH", "maybe")
    _bootstrap.bootstrap()
    _bootstrap.bootstrap()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ascend-graph-patch: ") and "'maybe'" in err[0]
    assert fresh == [] and loader_state.MODE == "off"


def test_invalid_flag_warns_once_and_the_overlay_still_comes_up(
    fresh: list[str], env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("ASCEND_GRAPH_PATCH", "verify")
    env.setenv("ASCEND_GRAPH_PATCH_STRICT", "yes")
    _bootstrap.bootstrap()
    _bootstrap.bootstrap()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "ASCEND_GRAPH_PATCH_STRICT='yes'" in err[0]
    assert fresh == ["verify"]


def test_idempotent(fresh: list[str], env: pytest.MonkeyPatch) -> None:
    env.setenv("ASCEND_GRAPH_PATCH", "on")
    _bootstrap.bootstrap()
    _bootstrap.bootstrap()  # e.g. vllm.general_plugins after the .pth
    assert fresh == ["on"]


def test_enable_failure_is_one_warning(
    fresh: list[str], env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(mode_: str) -> None:
        raise RuntimeError("seam moved\nsecond line")

    env.setattr(activation, "enable", boom)
    env.setenv("ASCEND_GRAPH_PATCH", "on")
    _bootstrap.bootstrap()  # must not raise
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ascend-graph-patch: ")
    assert "RuntimeError: seam moved" in err[0]
    assert loader_state.ENABLE_ERROR == "RuntimeError: seam moved"


def test_debug_adds_traceback(
    fresh: list[str], env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(mode_: str) -> None:
        raise RuntimeError("seam moved")

    env.setattr(activation, "enable", boom)
    env.setenv("ASCEND_GRAPH_PATCH", "on")
    env.setenv("ASCEND_GRAPH_PATCH_DEBUG", "1")
    _bootstrap.bootstrap()
    assert "Traceback" in capsys.readouterr().err


def test_entry_point_resolves_to_bootstrap() -> None:
    eps = metadata.entry_points(group="vllm.general_plugins")
    ours = [ep for ep in eps if ep.name == "ascend_graph_patch"]
    assert len(ours) == 1
    assert ours[0].load() is _bootstrap.bootstrap


def test_start_file_resolves_to_bootstrap() -> None:
    """PEP 829 ``.start``: ``module:callable`` lines, called without arguments."""
    lines = [
        ln.strip()
        for ln in (REPO / "loader" / "ascend_graph_patch.start").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert len(lines) == 1
    ep = metadata.EntryPoint(name="start", value=lines[0], group="site.start")
    assert ep.load() is _bootstrap.bootstrap


# --- the installed .pth, in fresh interpreters ---------------------------------------------------


def test_loader_files_installed_in_site_packages() -> None:
    for name in ("ascend_graph_patch.pth", "ascend_graph_patch.start"):
        installed = SITE / name
        assert installed.is_file(), f"{installed} missing: rerun scripts/build-stack.sh"
        assert installed.read_text() == (REPO / "loader" / name).read_text(), f"{name} stale"


def test_off_imports_nothing(tmp_path: Path) -> None:
    probe, err = run_probe(cwd=tmp_path)
    assert probe["heavy"] == []
    assert probe["ours"] == []  # the .pth pre-filter does not even import the bootstrap
    assert err == ""


@pytest.mark.parametrize("raw", ["observe", "verify", "on"])
def test_pth_runs_bootstrap_at_startup(tmp_path: Path, raw: str) -> None:
    probe, err = run_probe(cwd=tmp_path, ASCEND_GRAPH_PATCH=raw)
    assert probe["bootstrapped"] and probe["mode"] == raw
    assert "ascend_graph_patch.activation" in probe["ours"]
    assert not {"torch", "vllm", "vllm_ascend"} & set(probe["heavy"])  # hooks are lazy
    assert "ascend-graph-patch" not in err


def test_without_site_nothing_runs(tmp_path: Path) -> None:
    """Negative control: ``python -S`` skips .pth files, so the probe really sees the loader."""
    probe, _ = run_probe("-S", cwd=tmp_path, ASCEND_GRAPH_PATCH="observe")
    assert probe["mode"] is None and probe["ours"] == []


def test_invalid_value_in_subprocess(tmp_path: Path) -> None:
    probe, err = run_probe(cwd=tmp_path, ASCEND_GRAPH_PATCH="bogus")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ascend-graph-patch: ")
    assert probe["mode"] == "off" and "ascend_graph_patch.activation" not in probe["ours"]


@pytest.mark.parametrize(("raw", "expect_warning"), [("", False), ("on", True)])
def test_pth_line_survives_missing_package(tmp_path: Path, raw: str, expect_warning: bool) -> None:
    """A half-installed package (the .pth left behind) must not break interpreter start-up."""
    line = (REPO / "loader" / "ascend_graph_patch.pth").read_text()
    assert len(line.splitlines()) == 1 and line.startswith("import ")
    proc = subprocess.run(
        [sys.executable, "-S", "-c", "import sys; exec(sys.argv[1]); print('alive')", line],
        env=clean_env(ASCEND_GRAPH_PATCH=raw),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "alive"
    assert ("ascend-graph-patch: loader not importable" in proc.stderr) is expect_warning
    assert "Traceback" not in proc.stderr


SPAWN_SCRIPT = """
import json, multiprocessing, sys

def child(path):
    boot = sys.modules.get("ascend_graph_patch.loader_state")
    with open(path, "w") as fh:
        json.dump({"mode": getattr(boot, "MODE", None),
                   "bootstrapped": getattr(boot, "BOOTSTRAPPED", False)}, fh)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=child, args=(sys.argv[1],))
    p.start()
    p.join(60)
    sys.exit(p.exitcode)
"""


def test_spawn_child_runs_bootstrap(tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWN_SCRIPT)
    out = tmp_path / "child.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        env=clean_env(ASCEND_GRAPH_PATCH="observe"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == {"mode": "observe", "bootstrapped": True}


# --- start-up cost -----------------------------------------------------------------------------

IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       100 |        100 |   _io
import time:       300 |        300 |     ascend_graph_patch
import time:        50 |         50 |       wrapt.nested
import time:       400 |        400 |       __future__
import time:       200 |        650 |     ascend_graph_patch.settings
import time:      1000 |       1950 |   ascend_graph_patch._bootstrap
import time:        70 |         70 |   wrapt
import time:        10 |         10 | json
"""


def test_sum_importtime_counts_outermost_matches_once() -> None:
    # _bootstrap's cumulative covers its children (incl. the stdlib __future__); wrapt separately.
    assert _bootstrap._sum_importtime(IMPORTTIME) == pytest.approx((1950 + 70) / 1000)
    assert _bootstrap._sum_importtime(IMPORTTIME, ("json",)) == pytest.approx(0.01)
    assert _bootstrap._sum_importtime("no importtime here") == 0.0


def test_startup_measurement_sees_the_loader_only_when_enabled() -> None:
    """With the toggle off the loader imports nothing, so its measured import time is exactly 0.

    The cost itself (target <= 1 ms off) is reported by `ascend-graph-patch bench`, not asserted.
    """
    off = _bootstrap.measure_startup("off", repeats=1)
    on = _bootstrap.measure_startup("observe", repeats=1)
    assert off == 0.0
    assert on > 0.0  # the measurement does see the loader's imports when enabled


# --- why the overlay is inactive: status says what the loader printed (issue 27) ---------------

BROKEN_WRAPT = "raise ImportError('wrapt is broken here')\n"


def test_status_says_the_installer_cannot_start_as_the_loader_does(tmp_path: Path) -> None:
    """wrapt unimportable: when vllm_ascend loads, the loader prints one line and stays stock;
    ``status`` in the same environment (its own process never loads vllm_ascend) says the same,
    in the text and in ``--json``, instead of ``mode: on`` and nothing else."""
    (tmp_path / "wrapt").mkdir()
    (tmp_path / "wrapt" / "__init__.py").write_text(BROKEN_WRAPT)
    (tmp_path / "vllm_ascend").mkdir()
    (tmp_path / "vllm_ascend" / "__init__.py").write_text("")
    env = clean_env(ASCEND_GRAPH_PATCH="on", PYTHONPATH=str(tmp_path))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip

    loader = run("-c", "import vllm_ascend")
    assert loader.returncode == 0, loader.stderr
    (printed,) = loader.stderr.splitlines()
    reason = printed.removeprefix("ascend-graph-patch: ")
    assert reason.startswith("could not start the installer (ImportError('wrapt is broken here'")
    as_json = run("-m", "ascend_graph_patch.cli", "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["inactive"] == [reason]
    text = run("-m", "ascend_graph_patch.cli", "status")
    assert f"inactive: {reason}" in " ".join(text.stdout.split())


@pytest.fixture
def overlay_state(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The overlay's per-process state, emptied for the test and restored after it."""
    from ascend_graph_patch import state

    for key in list(os.environ):
        if key.startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    monkeypatch.setattr(state, "STATE", state.OverlayState())
    return monkeypatch


@pytest.mark.parametrize("failure", ["gate", "install"])
def test_status_names_a_refused_or_failed_group_as_the_warning_did(
    overlay_state: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], failure: str
) -> None:
    from ascend_graph_patch import gate, installer, status
    from ascend_graph_patch.aspects import scope

    if failure == "gate":
        refusal = gate.Verdict(False, "seam drift (signature of X): moved")
        overlay_state.setattr(gate, "check", lambda group, force=False: refusal)
    else:

        def broken_wrap(*args: object) -> None:
            raise RuntimeError("cannot wrap")

        overlay_state.setattr(installer, "wrap", broken_wrap)
    overlay_state.setattr(scope, "ACTIVE", None)
    overlay_state.setenv(ENV_PREFIX, "on")
    line = gate.candidate_line()
    installer.install_group(installer._Installation("on", line, set(), set()), "v1")
    (printed,) = capsys.readouterr().err.splitlines()
    assert printed.startswith("ascend-graph-patch: not installed (v1): ")
    from ascend_graph_patch import state

    state.STATE.mode = "on"
    assert status.snapshot()["inactive"] == [printed.removeprefix("ascend-graph-patch: ")]


def test_status_names_an_activation_failure_as_the_loader_did(
    fresh: list[str], env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ascend_graph_patch import state, status

    def boom(mode_: str) -> None:
        raise RuntimeError("seam moved")

    env.setattr(activation, "enable", boom)
    env.setattr(state, "STATE", state.OverlayState())
    env.setenv("ASCEND_GRAPH_PATCH", "on")
    _bootstrap.bootstrap()
    (printed,) = capsys.readouterr().err.splitlines()
    snap = status.snapshot()
    assert snap["mode"] == "on"
    assert snap["inactive"] == [printed.removeprefix("ascend-graph-patch: ")]


def test_status_shows_nothing_inactive_when_off_or_merely_waiting(
    overlay_state: pytest.MonkeyPatch,
) -> None:
    from ascend_graph_patch import status

    assert status.snapshot()["inactive"] == []  # off
    overlay_state.setenv(ENV_PREFIX, "on")  # on, vllm_ascend not loaded here: pending, not broken
    assert status.snapshot()["inactive"] == []


# --- environment values in messages: a prefix and the length (issue 27) ------------------------


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        (settings.ENV_MODE, "on" * 2500),
        (settings.ENV_STRICT, "y" * 5000),
        (settings.ENV_TP_FAULT, "w" * 5000),
        (settings.ENV_MODE, "on\x1b[2J\x1b[31mpwned"),
    ],
)
def test_long_or_unprintable_values_are_shortened_in_warnings(name: str, raw: str) -> None:
    (problem,) = settings.problems({name: raw})
    assert f"({len(raw)} characters" in problem
    assert len(problem) < 300 and problem.isprintable(), problem


def test_short_printable_values_are_shown_whole() -> None:
    (problem,) = settings.problems({settings.ENV_MODE: "maybe"})
    assert "ASCEND_GRAPH_PATCH='maybe':" in problem
    assert settings.shown("x" * settings.SHOWN_CHARS) == repr("x" * settings.SHOWN_CHARS)


def test_a_long_unknown_variable_name_and_aspect_are_shortened() -> None:
    name = ENV_PREFIX + "_" + "X" * 4000
    (problem,) = settings.problems({name: "1"})
    assert len(problem) < 400 and "(4019 characters)" in problem
    unknown = settings.unknown_aspects(["replay.update"], {settings.ENV_DISABLE: "z" * 5000})
    assert len(unknown) < 300 and "(5000 characters)" in unknown


def test_a_long_vllm_plugins_value_is_shortened_in_status() -> None:
    from ascend_graph_patch import status

    (warning,) = [
        w
        for w in status.loader_warnings({ENV_PREFIX: "on", "VLLM_PLUGINS": "ascend," * 1000})
        if "VLLM_PLUGINS" in w
    ]
    assert "(7000 characters)" in warning and len(warning) < 400


# --- ASCEND_GRAPH_PATCH_TP_FAULT ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, "fail"), ("", "fail"), (" Fail ", "fail"), ("WAIT", "wait")]
)
def test_tp_fault_accepted(raw: str | None, expected: str) -> None:
    environ = {} if raw is None else {settings.ENV_TP_FAULT: raw}
    assert settings.tp_fault(environ) == expected
    assert settings.problems(environ) == []


@pytest.mark.parametrize("raw", ["abort", "0", "exit"])
def test_tp_fault_invalid_fails_fast_with_one_line(raw: str) -> None:
    environ = {settings.ENV_TP_FAULT: raw}
    assert settings.tp_fault(environ) == "fail"
    (problem,) = settings.problems(environ)
    assert settings.ENV_TP_FAULT in problem and "fail" in problem and "wait" in problem
