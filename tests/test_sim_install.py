"""Installing the simulator as torch_npu: in-process registration, vllm-ascend imports, finder."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import torch_npu_sim as sim
from torch_npu_sim import runtime
from torch_npu_sim.runtime import SimOp, SimulatorError

REPO = Path(__file__).resolve().parents[1]


def test_install_is_idempotent_and_torch_npu_is_shared() -> None:
    mod = sim.install()
    assert sim.install() is mod
    assert sys.modules["torch_npu"] is mod
    assert torch.npu is mod.npu is sys.modules["torch_npu"].npu
    assert sys.modules["torch.npu"] is mod.npu
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.device("npu").type == "npu"
    assert torch.npu.is_available() is False  # transformers probes it
    assert mod._C._NPUTaskGroupHandle is runtime._NPUTaskGroupHandle
    assert torch.npu.NPUGraph is runtime.NPUGraph
    t = torch.ones(2)
    assert mod._C._weak_ref_tensor(t).data_ptr() == t.data_ptr()


def test_reference_ops_are_launchable_and_host_functions_are_not(atb_lazy: Any) -> None:
    mod = sim.install()
    fia = mod.npu_fused_infer_attention_score
    assert isinstance(fia, SimOp) and isinstance(fia.out, SimOp)
    assert fia.out.name == "npu_fused_infer_attention_score.out"
    assert not isinstance(mod._npu_paged_attention, SimOp)  # ATB: lazy until registered
    atb_lazy._register_atb_extensions()
    assert isinstance(mod._npu_paged_attention, SimOp)
    try:
        from torch_npu_sim import ops
    except ImportError:
        pytest.skip("sim/ops.py not available")
    for name in ops.HOST_FUNCTIONS:
        assert not isinstance(getattr(mod, name), SimOp), name
    for name in ops.REFERENCE_OPS:
        base, dot_out, _ = name.partition(".out")
        obj = getattr(getattr(mod, base), "out") if dot_out else getattr(mod, name)
        assert getattr(obj, "__wrapped__", obj) is ops.REFERENCE_OPS[name], name


def test_unsimulated_ops_exist_but_fail_loudly() -> None:
    mod = sim.install()
    assert hasattr(mod, "npu_moe_distribute_dispatch_v2")
    with pytest.raises(SimulatorError, match="not simulated"):
        mod.npu_quant_matmul(torch.ones(1))
    assert not hasattr(mod, "hifloat8")  # optional dtypes are read with a default


def test_cpu_shims_are_registered() -> None:
    sim.install()
    from acl.rt import memcpy  # noqa: F401
    from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions
    from torch_npu.profiler import dynamic_profile

    _register_atb_extensions()
    dynamic_profile.step()
    import torchvision.transforms  # noqa: F401  (the nms/qnms workaround)

    t = torch.arange(3)
    assert t.pin_memory() is t  # metadata builders pin host buffers; CPU torch cannot


@pytest.mark.parametrize(
    "name",
    [
        "vllm_ascend",
        "vllm_ascend.compilation.acl_graph",
        "vllm_ascend.attention.attention_v1",
        "vllm_ascend.worker.model_runner_v1",
        "vllm_ascend.spec_decode",
        "vllm_ascend.worker.v2.aclgraph_utils",
    ],
)
def test_vllm_ascend_modules_import(name: str) -> None:
    sim.install()
    importlib.import_module("vllm_ascend.ops")  # first: circular import (research item 2)
    importlib.import_module(name)


# --------------------------------------------------------------------------------------------
# fresh processes: only through the finder, never over a real torch_npu

_PROBE = textwrap.dedent(
    """
    import importlib.util, sys
    before = "torch" in sys.modules
    from torch_npu_sim import finder
    assert "torch" not in sys.modules or before, "importing the finder imported torch"
    try:
        import torch_npu
        print("EARLY", getattr(torch_npu, "__file__", None))
    except ModuleNotFoundError:
        print("MISSING")
    print("ACTIVATE", finder.activate())
    import torch_npu, torch
    print("FROM", type(torch_npu.__spec__.loader).__module__)
    print("SHARED", getattr(torch, "npu", None) is torch_npu.npu)
    print("FILE", torch_npu.__file__)
    """
)


def _run_probe(env_extra: dict[str, str]) -> tuple[list[str], str]:
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env_extra.get("PYTHONPATH"), str(REPO)) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n"), proc.stderr


def test_fresh_process_gets_torch_npu_only_through_the_finder() -> None:
    # TORCH_NPU_SIM=0 keeps the loader's bootstrap from activating the finder first.
    lines, _ = _run_probe({"TORCH_NPU_SIM": "0", "ASCEND_GRAPH_PATCH": "0"})
    assert "MISSING" in lines
    assert "ACTIVATE True" in lines
    assert "FROM torch_npu_sim.finder" in lines
    assert "SHARED True" in lines


def test_finder_refuses_to_shadow_a_real_torch_npu(tmp_path: Path) -> None:
    fake = tmp_path / "torch_npu"
    fake.mkdir()
    (fake / "__init__.py").write_text("npu = None\n")
    lines, err = _run_probe(
        {"TORCH_NPU_SIM": "1", "ASCEND_GRAPH_PATCH": "0", "PYTHONPATH": str(tmp_path)}
    )
    assert f"EARLY {fake / '__init__.py'}" in lines
    assert "ACTIVATE False" in lines
    assert f"FILE {fake / '__init__.py'}" in lines
    assert err.count("real torch_npu is installed") == 1


# --------------------------------------------------------------------------------------------
# the simulator's own loader line (torch_npu_sim.pth), in fresh interpreters

_FINDERS = "import sys; print(any(type(f).__name__ == 'SimTorchNpuFinder' for f in sys.meta_path))"


def _start(tmp_path: Path, **env: str) -> tuple[str, str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("TORCH_NPU_SIM", "ASCEND_GRAPH_PATCH_SIM")
    }
    clean.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", _FINDERS],
        env=clean,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr


@pytest.mark.parametrize(
    ("env", "active"),
    [
        ({}, "False"),
        ({"TORCH_NPU_SIM": "1"}, "True"),
        ({"TORCH_NPU_SIM": "On"}, "True"),
        ({"ASCEND_GRAPH_PATCH_SIM": "true"}, "True"),  # the older name still works
        ({"TORCH_NPU_SIM": "0", "ASCEND_GRAPH_PATCH_SIM": "1"}, "False"),  # the new name wins
        ({"TORCH_NPU_SIM": "off"}, "False"),
    ],
)
def test_pth_activates_the_finder_only_when_asked(tmp_path: Path, env: dict, active: str) -> None:
    out, err = _start(tmp_path, **env)
    assert (out, err) == (active, "")


def test_pth_warns_once_about_a_value_that_means_nothing(tmp_path: Path) -> None:
    out, err = _start(tmp_path, TORCH_NPU_SIM="yes")
    assert out == "False"
    lines = err.splitlines()
    assert len(lines) == 1 and "TORCH_NPU_SIM='yes'" in lines[0] and "1, on, true" in lines[0]


def test_pth_prefilter_matches_the_finder() -> None:
    from torch_npu_sim import finder

    pth = (REPO / "simulator" / "loader" / "torch_npu_sim.pth").read_text()
    assert {"", "0", "off", "false"} == finder.OFF_VALUES
    assert '("", "0", "off", "false")' in pth
    assert finder.ENV_VAR in pth and finder.ENV_VAR_OLD in pth
