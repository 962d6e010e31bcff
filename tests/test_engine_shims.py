"""The engine shims (``torch_npu_sim.engine``): active when the simulator is torch_npu, and only
then; each gives the real engine what the CPU host lacks, and nothing else; the Triton reference
matches the kernel's statement; the post-import hooks act whatever the import order."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from torch_npu_sim.engine import hooks, shims, triton_refs
from torch_npu_sim.runtime import SimulatorError


def test_every_shim_says_what_the_host_lacks() -> None:
    from torch_npu_sim.engine import gdn_path

    for shim in (*shims.SHIMS, *gdn_path.SHIMS):
        assert shim.why and len(shim.why) > 30, shim


def test_shims_act_in_this_simulated_process() -> None:
    from vllm.platforms import current_platform
    from vllm_ascend.platform import NPUPlatform

    assert NPUPlatform.is_pin_memory_available() is False
    assert current_platform.is_pin_memory_available() is False
    x = torch.ones(2)
    assert x.npu() is x and x.is_npu is False
    torch.accelerator.synchronize()  # reaches the simulator, not the missing device hooks
    assert torch.accelerator.current_device_index() == 0


def test_custom_ops_get_a_cpu_kernel_only_for_the_npu_key() -> None:
    from vllm.utils.torch_utils import direct_register_custom_op

    assert getattr(direct_register_custom_op, hooks.MARK, False)
    lib = torch.library.Library("simshimtest", "FRAGMENT")

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    direct_register_custom_op("double", double, target_lib=lib, dispatch_key="PrivateUse1")
    assert torch.equal(torch.ops.simshimtest.double(torch.ones(2)), torch.full((2,), 2.0))

    def triple(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    direct_register_custom_op("triple", triple, target_lib=lib, dispatch_key="CPU")
    # A CPU registration stays the caller's own (a second CPU kernel would be refused).
    assert torch.equal(torch.ops.simshimtest.triple(torch.ones(2)), torch.full((2,), 3.0))


def test_context_chunk_buffers_are_allocated_unpinned_inside_the_shim_only() -> None:
    """``AscendMLAMetadataBuilder.build_chunked_metadata`` (a prefill chunk with context) asks
    ``torch.zeros`` for pinned memory: CPU torch refuses it (what stopped the engine before the
    shim), the shim's call drops the request for that call only."""
    import importlib

    with pytest.raises(RuntimeError, match="PrivateUse1HooksInterface"):
        torch.zeros(2, pin_memory=True)
    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    mla_v1 = importlib.import_module("vllm_ascend.attention.mla_v1")
    assert getattr(mla_v1.AscendMLAMetadataBuilder.build_chunked_metadata, hooks.MARK, False)

    def chunk_lengths(rows: int) -> torch.Tensor:
        return torch.zeros(rows, 3, dtype=torch.int32, pin_memory=True)

    assert shims._unpinned(chunk_lengths, (2,), {}).tolist() == [[0, 0, 0], [0, 0, 0]]
    with pytest.raises(RuntimeError, match="PrivateUse1HooksInterface"):
        chunk_lengths(2)  # the mode ended with the call
    # what it built is counted, and whether the builder's batch had decodes (bound as
    # hooks.wrap binds it), for the engine tests' check that a case chunked beside decodes
    before = dict(shims.CONTEXT_CHUNK_STEPS)
    for decodes in (0, 3):
        builder = types.SimpleNamespace(num_decodes=decodes)
        shims._unpinned(functools.partial(lambda _builder: chunk_lengths(1), builder), (), {})
    counted = dict(shims.CONTEXT_CHUNK_STEPS)
    assert counted["with_context"] == before["with_context"] + 2
    assert counted["beside_decodes"] == before["beside_decodes"] + 1


def test_yarn_rope_caches_are_built_on_the_host_and_match_transformers() -> None:
    """``AscendDeepseekScalingRotaryEmbedding`` (YaRN ``rope_scaling``: DeepSeek-V3, Kimi-K2)
    builds its cos / sin caches with ``device="npu"`` at layer init: CPU torch has no allocator
    by that name (what stopped the Kimi-K2 case's start before the shim). With the shim, the
    caches are host tensors, and they are YaRN's: transformers' own YaRN init (its inverse
    frequencies and attention factor) gives the same cos / sin."""
    import importlib

    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from vllm.config import VllmConfig, set_current_vllm_config

    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    rope = importlib.import_module("vllm_ascend.ops.rotary_embedding")
    owner = rope.AscendDeepseekScalingRotaryEmbedding
    assert getattr(owner._set_cos_sin_cache, hooks.MARK, False)
    yarn = {"beta_fast": 1.0, "beta_slow": 1.0, "mscale": 0.707}
    with set_current_vllm_config(VllmConfig()):
        built = owner(16, 16, 64, 50000, False, 4.0, torch.float32, **yarn, mscale_all_dim=1.0)
    assert built.cos_cached.device.type == "cpu" and built.cos_cached.shape == (256, 16)
    config = DeepseekV3Config(
        hidden_size=64,
        num_attention_heads=4,
        qk_rope_head_dim=16,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 50000.0,
            "factor": 4.0,
            **yarn,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 64,
        },
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    angles = torch.outer(torch.arange(256, dtype=torch.float64), inv_freq.double())
    angles = torch.cat([angles, angles], -1)
    assert factor != 1.0  # mscale 0.707 against mscale_all_dim 1: the caches are scaled
    # float32 angles up to 255 rad against float64 ones: a few 1e-6 apart
    for got, want in ((built.cos_cached, angles.cos()), (built.sin_cached, angles.sin())):
        torch.testing.assert_close(got.double(), want * factor, atol=1e-5, rtol=0)
    # the negative control: the release's own method, unshimmed, cannot allocate on "npu"
    with pytest.raises(NotImplementedError, match="npu"):
        owner._set_cos_sin_cache.__wrapped__(built, 32, device="npu", dtype=torch.float32)


def test_no_shim_without_the_simulator(tmp_path: Path) -> None:
    """A real torch_npu on the path: the finder refuses, install() never runs, nothing is
    shimmed (a stand-in package plays the real torch_npu; no vLLM import needed)."""
    fake = tmp_path / "torch_npu"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    code = textwrap.dedent(
        """
        import sys
        import torch_npu
        print(getattr(torch_npu, "REAL", False), "torch_npu_sim.engine" in sys.modules,
              "torch_npu_sim._install_impl" in sys.modules)
        """
    )
    env = {**os.environ, "TORCH_NPU_SIM": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False", "False"]


def test_post_import_hook_runs_after_the_module_executes(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "simhook_target.py").write_text("def f():\n    return 1\nVALUE = 'done'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []

    def hook(module: types.ModuleType) -> None:
        seen.append(module.VALUE)  # the module's body has run
        hooks.wrap(module, "f", lambda call, args, kwargs: call(*args, **kwargs) + 1)

    hooks.when_imported("simhook_target", hook)
    from simhook_target import f  # noqa: PLC0415 - the import under test

    assert seen == ["done"] and f() == 2
    hooks.when_imported("simhook_target", lambda m: seen.append("now"))  # already imported
    assert seen == ["done", "now"]
    sys.modules.pop("simhook_target", None)


def test_wrap_keeps_the_receiver_of_methods() -> None:
    class Owner:
        def method(self, x: int) -> tuple:
            return (self, x)

        @classmethod
        def klass(cls, x: int) -> tuple:
            return (cls, x)

    module = types.ModuleType("simhook_owner")
    module.Owner = Owner
    calls: list[tuple] = []

    def spy(call, args, kwargs):
        calls.append(args)
        return call(*args, **kwargs)

    hooks.wrap(module, "Owner.method", spy)
    hooks.wrap(module, "Owner.klass", spy)
    hooks.wrap(module, "Owner.klass", spy)  # a second install is a no-op
    owner = Owner()
    assert owner.method(3) == (owner, 3) and Owner.klass(4) == (Owner, 4)
    assert calls == [(3,), (4,)]


def slot_mapping_oracle(
    starts: list[int], positions: list[int], table: list[list[int]], block_size: int, n: int
) -> list[int]:
    slots = [-1] * n
    for r in range(len(starts) - 1):
        for t in range(starts[r], starts[r + 1]):
            pos = positions[t]
            slots[t] = table[r][pos // block_size] * block_size + pos % block_size
    return slots


def test_slot_mapping_reference_matches_the_kernels_statement() -> None:
    starts, positions = [0, 3, 4, 9], [0, 1, 2, 7, 3, 4, 5, 6, 7, 99, 99]
    table = [[5, 6, 0], [2, 1, 0], [7, 3, 4]]
    slots = torch.full((12,), 123, dtype=torch.int64)
    triton_refs.compute_slot_mapping(
        (4,), 9, 12, torch.tensor(starts, dtype=torch.int32), torch.tensor(positions),
        torch.tensor(table, dtype=torch.int32), 3, 4, slots,
        TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1,
        BLOCK_SIZE=1024,
    )  # fmt: skip
    assert slots.tolist() == slot_mapping_oracle(starts, positions, table, 4, 12)


def test_triton_launches_resolve_to_references_or_fail_loudly() -> None:
    from vllm.triton_utils import triton
    from vllm.v1.worker import block_table

    assert isinstance(block_table._compute_slot_mapping_kernel, triton_refs.KernelStub)

    @triton.jit
    def unknown_kernel(x):  # noqa: ANN001, ANN202
        return x

    with pytest.raises(SimulatorError, match="unknown_kernel has no torch reference"):
        unknown_kernel[(1,)](torch.ones(1))


# --- VLLM_USE_V2_MODEL_RUNNER: vLLM's Triton check (the stale-graph engine case) ---------------


@pytest.mark.parametrize("variable", [None, "0", "1"])
def test_the_v2_triton_check_passes_only_with_the_variable_set(
    monkeypatch: pytest.MonkeyPatch, variable: str | None
) -> None:
    """With ``VLLM_USE_V2_MODEL_RUNNER`` set, vLLM's config check reads ``HAS_TRITON`` as a device
    with triton-ascend would; unset (or 0) the host's answer (no Triton) stands, and the module's
    flag is left as it was."""
    import vllm.config.vllm as config

    if variable is None:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", variable)
    assert config.HAS_TRITON is False  # this host
    vllm_config = types.SimpleNamespace(
        _get_v2_model_runner_unsupported_features=lambda: [], reasoning_config=None
    )
    check = config.VllmConfig._validate_v2_model_runner
    assert getattr(check, hooks.MARK, False)
    if variable == "1":
        check(vllm_config)
    else:
        with pytest.raises(ValueError, match="requires Triton"):
            check(vllm_config)
    assert config.HAS_TRITON is False
