"""The wheel: loader files at the purelib root, metadata, and a real install into a throwaway venv.

The build runs on a copy of the project files so concurrent work in the tree (and ``build/``
leftovers) cannot leak into it. One module-scoped wheel serves every test (~5 s in total).
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in PROJECT_FILES:
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("loader", "ascend_graph_patch"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheelhouse")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=180, env=clean_env(PIP_NO_INPUT="1"),
    )
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("ascend_graph_patch-*.whl")
    return whl


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
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=120, capture_output=True, env=clean_env())
    site = Path(subprocess.run([str(py), "-c", "import sysconfig;print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True)
                .stdout.strip())
    for name in LOADER:
        assert (site / name).is_file()

    probe = ("import json, sys; b = sys.modules.get('ascend_graph_patch._bootstrap'); "
             "print(json.dumps([getattr(b, 'MODE', None), getattr(b, '__file__', '')]))")
    # An invalid value makes the bootstrap speak, which proves the wheel's .pth ran it.
    proc = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                          env=clean_env(ASCEND_GRAPH_PATCH="bogus"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    mode, path = json.loads(proc.stdout)
    assert mode == "off" and Path(path).is_relative_to(site)
    assert proc.stderr.count("ascend-graph-patch: ") == 1

    subprocess.run([*pip, "uninstall", "-y", "-q", "ascend-graph-patch"], check=True, timeout=120,
                   capture_output=True, env=clean_env())
    for name in LOADER:
        assert not (site / name).exists()
