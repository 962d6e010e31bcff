"""The two wheels: loader files at the purelib root, metadata, a real install into a throwaway
venv, and the line between them: the overlay's wheel carries no simulator code, and the overlay's
source imports nothing of the simulator.

The builds run on a copy of the project files so concurrent work in the tree (and ``build/``
leftovers) cannot leak into them. One module-scoped wheel per distribution serves every test.
"""

from __future__ import annotations

import ast
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOADER = ("ascend_graph_patch.pth", "ascend_graph_patch.start")
PROJECT_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in", "LICENSE")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_GRAPH_PATCH")}
    env.update(extra)
    return env


def build_wheel(tmp_path_factory: pytest.TempPathFactory, root: Path, package: str) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in PROJECT_FILES:
        if (root / name).is_file():
            shutil.copy2(root / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("loader", package):
        shutil.copytree(root / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheelhouse")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(PIP_NO_INPUT="1"),
    )
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob(f"{package}-*.whl")
    return whl


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory, REPO, "ascend_graph_patch")


@pytest.fixture(scope="module")
def sim_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory, REPO / "simulator", "torch_npu_sim")


def dist_info_file(whl: Path, name: str) -> str:
    with zipfile.ZipFile(whl) as zf:
        (path,) = [n for n in zf.namelist() if n.endswith(f".dist-info/{name}")]
        return zf.read(path).decode()


def test_loader_files_at_wheel_root(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for name in LOADER:
            assert name in names, sorted(names)
            assert zf.read(name).decode() == (REPO / "loader" / name).read_text()
        record = dist_info_file(wheel, "RECORD")
    for name in LOADER:  # listed in RECORD, so `pip uninstall` removes them
        assert any(line.startswith(name + ",") for line in record.splitlines())


def test_metadata_requires_wrapt_not_torch_or_vllm(wheel: Path) -> None:
    meta = email.parser.Parser().parsestr(dist_info_file(wheel, "METADATA"))
    requires = meta.get_all("Requires-Dist") or []

    def name(req: str) -> str:
        return re.match(r"[A-Za-z0-9._-]+", req).group(0).lower().replace("_", "-")

    assert [name(r) for r in requires if "extra ==" not in r] == ["wrapt"]
    assert "!=2.2.0" in next(r for r in requires if name(r) == "wrapt")
    # The overlay rides on the user's stack: never drag in (another) torch / vLLM build.
    assert not {name(r) for r in requires} & {"torch", "torch-npu", "vllm", "vllm-ascend"}


def test_entry_points_in_metadata(wheel: Path) -> None:
    text = dist_info_file(wheel, "entry_points.txt")
    assert "[vllm.general_plugins]" in text
    assert "ascend_graph_patch = ascend_graph_patch._bootstrap:bootstrap" in text
    assert "[console_scripts]" in text
    assert "ascend-graph-patch = ascend_graph_patch.cli:main" in text


def test_installed_wheel_runs_the_loader(wheel: Path, tmp_path: Path) -> None:
    """Install into a bare venv; the .pth must run at start-up and leave with ``pip uninstall``."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=120,
        capture_output=True,
        env=clean_env(),
    )
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for name in LOADER:
        assert (site / name).is_file()

    probe = (
        "import json, sys; b = sys.modules.get('ascend_graph_patch.loader_state'); "
        "print(json.dumps([getattr(b, 'MODE', None), getattr(b, '__file__', '')]))"
    )
    # An invalid value makes the bootstrap speak, which proves the wheel's .pth ran it.
    proc = subprocess.run(
        [str(py), "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(ASCEND_GRAPH_PATCH="bogus"),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    mode, path = json.loads(proc.stdout)
    assert mode == "off" and Path(path).is_relative_to(site)
    assert proc.stderr.count("ascend-graph-patch: ") == 1

    subprocess.run(
        [*pip, "uninstall", "-y", "-q", "ascend-graph-patch"],
        check=True,
        timeout=120,
        capture_output=True,
        env=clean_env(),
    )
    for name in LOADER:
        assert not (site / name).exists()


# --- the line between the overlay and the simulator ---------------------------------------------

SIM_PACKAGE = "torch_npu_sim"


def test_overlay_wheel_carries_no_simulator_code(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        sources = {n: zf.read(n).decode() for n in names if n.endswith(".py")}
    assert not [n for n in names if n.startswith(SIM_PACKAGE) or "/sim/" in n]
    # and nothing in it stands in for torch_npu: the simulator's runtime lives elsewhere
    for name, text in sources.items():
        assert "TorchDispatchMode" not in text, name
        assert "class NPUGraph" not in text, name


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value))
    return found


def test_overlay_imports_nothing_from_the_simulator() -> None:
    """Static: no import statement (nor ``import_module("...")``) in the overlay names it."""
    offenders = {
        str(path.relative_to(REPO)): sorted(m for m in mods if m.split(".")[0] == SIM_PACKAGE)
        for path in (REPO / "ascend_graph_patch").rglob("*.py")
        if (mods := _imported_modules(path))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_scan_can_fail(tmp_path: Path) -> None:
    """Negative control for the scan above: each way of importing is seen."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import torch_npu_sim.runtime\nfrom torch_npu_sim import harness\n"
        "import importlib\nimportlib.import_module('torch_npu_sim.ops')\n"
    )
    assert {m.split(".")[0] for m in _imported_modules(probe)} >= {SIM_PACKAGE}
    assert _imported_modules(probe) >= {
        "torch_npu_sim.runtime",
        "torch_npu_sim",
        "torch_npu_sim.ops",
    }


def test_simulator_wheel_ships_its_loader_and_entry_points(sim_wheel: Path) -> None:
    with zipfile.ZipFile(sim_wheel) as zf:
        names = set(zf.namelist())
        assert (
            zf.read("torch_npu_sim.pth").decode()
            == (REPO / "simulator" / "loader" / "torch_npu_sim.pth").read_text()
        )
    assert "torch_npu_sim/runtime.py" in names
    assert not [n for n in names if n.startswith("ascend_graph_patch/")]
    text = dist_info_file(sim_wheel, "entry_points.txt")
    assert "[ascend_graph_patch.commands]" in text and "bench = torch_npu_sim.bench.command" in text
    assert "[ascend_graph_patch.ab_workers]" in text and "sim = torch_npu_sim.ab_worker" in text
