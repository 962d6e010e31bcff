"""What ``import torch_npu`` adds to ``torch``: the simulator against the real torch-npu.

The fixture's ``torch_additions`` (``scripts/extract-torch-npu-schemas.py``, read from the
2.10.0.post4 wheel's ``_init/``) lists the ``torch.distributed`` functions the real package puts
there with their signatures, the process-group backends it registers and its device registration.
Each must be present here with the same signature, or be listed in
``torch_additions.NOT_SIMULATED`` with the reason. vLLM's general plugins from vllm-ascend import
one of them at start-up (the model-loader plugin: ``from torch.distributed import
is_hccl_available``).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest
import torch

from tests import torch_npu_conformance as conf
from torch_npu_sim import torch_additions


def _additions() -> dict[str, Any]:
    return conf.fixture()["torch_additions"]


def _real_signature(text: str) -> inspect.Signature:
    namespace: dict[str, Any] = {}
    exec(compile(f"def f{text}: pass", "<fixture>", "exec"), namespace)  # noqa: S102 - fixture
    return inspect.signature(namespace["f"])


def _resolve(dotted: str) -> Any:
    obj: Any = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def test_fixture_lists_what_the_real_package_adds() -> None:
    additions = _additions()
    assert "torch.distributed.is_hccl_available" in additions["functions"]
    assert additions["backends"] == ["hccl", "lccl"]
    assert additions["privateuse1_backend"] == "npu"


@pytest.mark.parametrize("name", sorted(_additions()["functions"]))
def test_every_distributed_function_is_here_with_the_real_signature(name: str) -> None:
    text = _additions()["functions"][name]
    if name in torch_additions.NOT_SIMULATED:
        assert torch_additions.NOT_SIMULATED[name]  # a reason
        return
    assert text is not None, f"{name}: a private hook of the real package, say why it is left out"
    sim = _resolve(name)
    assert sim is not None, f"{name} is missing"
    assert conf.differences(_real_signature(text), inspect.signature(sim)) == []


def test_the_signature_check_sees_a_difference() -> None:
    """Negative control of the check above: torch's own ``gather`` (kept in ``distributed_c10d``:
    ``dst=None``, ``group_dst``) is not the real package's."""
    import torch.distributed.distributed_c10d as c10d

    real = _real_signature(_additions()["functions"]["torch.distributed.gather"])
    problems = conf.differences(real, inspect.signature(c10d.gather))
    assert any("group_dst" in p for p in problems) and any("dst: default 0" in p for p in problems)
    assert conf.differences(real, inspect.signature(torch.distributed.gather)) == []


def test_backends_and_is_hccl_available_answer_as_the_real_body() -> None:
    """HCCL is not simulated: not registered, so ``is_hccl_available()`` (the real body) is False
    and vLLM falls back to gloo, as it does where HCCL is absent."""
    import torch.distributed as dist

    for backend in _additions()["backends"]:
        assert f"backend:{backend}" in torch_additions.NOT_SIMULATED
        assert backend not in dist.Backend.backend_list
    assert dist.is_hccl_available() is False
    assert dist.is_hccl_available is torch_additions.is_hccl_available
    from torch.distributed import is_hccl_available, reinit_process_group  # as vllm-ascend does

    assert is_hccl_available() is False
    with pytest.raises(Exception, match="HCCL links are not simulated"):
        reinit_process_group()


def test_collectives_run_torchs_own_implementation() -> None:
    """The replaced ``gather`` keeps the real signature and gathers (one gloo rank)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        out = [torch.zeros(2)]
        dist.gather(torch.tensor([1.0, 2.0]), out)  # dst=0 by default, as in torch_npu
        assert torch.equal(out[0], torch.tensor([1.0, 2.0]))
        objects: list[Any] = [None]
        dist.gather_object({"a": 1}, objects)
        assert objects == [{"a": 1}]
    finally:
        dist.destroy_process_group()


def test_device_registration_and_generated_methods() -> None:
    import torch_npu

    additions = _additions()
    assert torch._C._get_privateuse1_backend_name() == additions["privateuse1_backend"]
    assert torch.npu is torch_npu.npu
    generated = additions["generated_methods"]
    assert generated == {"for_tensor": True, "for_module": True, "for_storage": True}
    x = torch.ones(2)
    assert x.npu() is x and x.is_npu is False  # the simulated device is CPU memory
    module = torch.nn.Linear(2, 2)
    assert module.npu() is module
    assert "storage:npu" in torch_additions.NOT_SIMULATED
    assert torch_npu.distributed.is_hccl_available is torch_additions.is_hccl_available


def test_vllm_ascend_general_plugins_load_without_vllm_plugins(tmp_path) -> None:
    """Every ``vllm.general_plugins`` entry of vllm-ascend loads and runs in a fresh simulated
    process with ``VLLM_PLUGINS`` unset (its model-loader plugin imports ``is_hccl_available``
    from ``torch.distributed``)."""
    code = (
        "import importlib.metadata as m, os\n"
        "assert 'VLLM_PLUGINS' not in os.environ\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "names = sorted(e.name for e in m.entry_points(group='vllm.general_plugins') "
        "if e.value.startswith('vllm_ascend'))\n"
        "import sys\n"
        "assert 'vllm_ascend.model_loader.netloader.executor.netloader_pg' in sys.modules\n"
        "print(names)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "VLLM_PLUGINS"}
    env.update(TORCH_NPU_SIM="1", HOME=str(tmp_path))  # the profiling plugin writes under HOME
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Failed to load plugin" not in proc.stderr
    assert "ascend_model_loader" in proc.stdout and "ascend_kv_connector" in proc.stdout
