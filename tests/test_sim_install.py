"""Installing the simulator as torch_npu: in-process registration, vllm-ascend imports, finder."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ascend_graph_patch import sim
from ascend_graph_patch.sim import runtime
from ascend_graph_patch.sim.runtime import SimOp, SimulatorError

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


def test_reference_ops_are_launchable_and_host_functions_are_not() -> None:
    mod = sim.install()
    fia = mod.npu_fused_infer_attention_score
    assert isinstance(fia, SimOp) and isinstance(fia.out, SimOp)
    assert fia.out.name == "npu_fused_infer_attention_score.out"
    assert isinstance(mod._npu_paged_attention, SimOp)
    try:
        from ascend_graph_patch.sim import ops
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
    from ascend_graph_patch.sim import finder
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
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env_extra.get("PYTHONPATH"), str(REPO)) if p
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n"), proc.stderr


def test_fresh_process_gets_torch_npu_only_through_the_finder() -> None:
    # ASCEND_GRAPH_PATCH_SIM=0 keeps the loader's bootstrap from activating the finder first.
    lines, _ = _run_probe({"ASCEND_GRAPH_PATCH_SIM": "0", "ASCEND_GRAPH_PATCH": "0"})
    assert "MISSING" in lines
    assert "ACTIVATE True" in lines
    assert "FROM ascend_graph_patch.sim.finder" in lines
    assert "SHARED True" in lines


def test_finder_refuses_to_shadow_a_real_torch_npu(tmp_path: Path) -> None:
    fake = tmp_path / "torch_npu"
    fake.mkdir()
    (fake / "__init__.py").write_text("npu = None\n")
    lines, err = _run_probe(
        {"ASCEND_GRAPH_PATCH_SIM": "1", "ASCEND_GRAPH_PATCH": "0", "PYTHONPATH": str(tmp_path)}
    )
    assert f"EARLY {fake / '__init__.py'}" in lines
    assert "ACTIVATE False" in lines
    assert f"FILE {fake / '__init__.py'}" in lines
    assert err.count("real torch_npu is installed") == 1
