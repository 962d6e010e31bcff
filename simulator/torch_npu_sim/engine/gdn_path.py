"""What the Gated DeltaNet path (Qwen3.5, Qwen3-Next) needs from a CPU host: its ``_C_ascend`` ops,
its Triton kernels' references, the chunked prefill at function level, and four host shims.

Kept apart from ``ascend_c_ops`` / ``triton_refs`` / ``shims`` (it only adds to them) so the GDN
path can be read, and removed, in one place. References live in ``torch_npu_sim.gdn_ops``;
schemas are the release's own registrations (``csrc/torch_binding.cpp``, vllm-ascend
0.23.0.post1: ``npu_causal_conv1d_custom`` l.2523, ``npu_recurrent_gated_delta_rule`` l.2269,
``npu_fused_gdn_gating`` l.2952). None of this touches vllm-ascend's graph capture or update code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import hooks
from .shims import Shim

#: ``torch.ops._C_ascend`` schemas, as ``csrc/torch_binding.cpp`` defines them.
SCHEMAS = {
    "npu_causal_conv1d_custom": "npu_causal_conv1d_custom(Tensor output, Tensor x, "
    "Tensor weight, Tensor conv_state, Tensor? bias_opt, Tensor? query_start_loc_opt, "
    "Tensor? cache_indices_opt, Tensor? initial_state_mode_opt, "
    "Tensor? num_accepted_tokens_opt, int activation_mode, int pad_slot_id, int run_mode"
    ") -> (Tensor output)",
    "npu_fused_gdn_gating": "npu_fused_gdn_gating(Tensor A_log, Tensor a, Tensor b, "
    "Tensor dt_bias, float beta=1.0, float threshold=20.0) -> (Tensor g, Tensor beta_output)",
    "npu_recurrent_gated_delta_rule": "npu_recurrent_gated_delta_rule(Tensor query, Tensor key, "
    "Tensor value, Tensor(a!) state, *, Tensor? beta=None, float? scale=None, "
    "Tensor? actual_seq_lengths=None, Tensor? ssm_state_indices=None, "
    "Tensor? num_accepted_tokens=None, Tensor? g=None, Tensor? gk=None) -> Tensor",
}

#: Triton kernels the Qwen3.5 / Qwen3-Next paths launch, by ``module.name``
#: (``triton_refs.KernelStub.key``).
KERNELS = {
    "vllm_ascend.ops.triton.linearnorm.split_qkv_rmsnorm_mrope.split_qkv_rmsnorm_mrope_kernel": (
        "split_qkv_rmsnorm_mrope_kernel"
    ),
    "vllm_ascend.ops.triton.layernorm_gated._layer_norm_fwd_1pass_kernel_npu": (
        "layer_norm_fwd_1pass_kernel"
    ),
    "vllm.model_executor.layers.fla.ops.l2norm.l2norm_fwd_kernel2": "l2norm_fwd_kernel2",
    "vllm_ascend.ops.triton.fla.utils._clear_ssm_states_kernel": "clear_ssm_states_kernel",
    # Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba split (ops/gdn.py's forward).
    "vllm_ascend.ops.triton.fla.fused_qkvzba_split_reshape.fused_qkvzba_split_reshape_cat_kernel": (
        "fused_qkvzba_split_reshape_cat_kernel"
    ),
}

#: Vector cores per device the Triton wrappers split work by (``triton_utils.get_vectorcore_num``
#: asks triton-ascend's driver, which is absent here); any positive count gives the same result.
VECTOR_CORES = 40


def _fakes() -> dict[str, Callable[..., Any]]:
    import torch

    def conv_fake(output: Any, *args: Any, **kwargs: Any) -> Any:
        return output.new_empty(output.shape)

    def gating_fake(A_log: Any, a: Any, b: Any, dt_bias: Any, **_: Any) -> tuple:  # noqa: N803
        shape = (1, a.shape[0], a.shape[1])
        return a.new_empty(shape, dtype=torch.float32), b.new_empty(shape)

    def recurrent_fake(query: Any, key: Any, value: Any, state: Any, **_: Any) -> Any:
        return value.new_empty(value.shape)

    return {
        "npu_causal_conv1d_custom": conv_fake,
        "npu_fused_gdn_gating": gating_fake,
        "npu_recurrent_gated_delta_rule": recurrent_fake,
    }


def define_ops(library: Any) -> None:
    """Define the GDN ``_C_ascend`` ops in ``library`` (the simulator's ``_C_ascend`` fragment):
    each a simulated NPU op (one task under capture, re-run at replay), with a fake for dynamo."""
    import torch

    from .. import gdn_ops, runtime

    for name, fake in _fakes().items():
        if hasattr(torch.ops._C_ascend, name):  # a real extension (never with the simulator)
            continue
        library.define(SCHEMAS[name])
        library.impl(name, runtime.make_op(f"_C_ascend.{name}", getattr(gdn_ops, name)), "CPU")
        torch.library.register_fake(f"_C_ascend::{name}", fake, lib=library)


def triton_references() -> dict[str, Callable[..., None]]:
    from .. import gdn_ops

    return {key: getattr(gdn_ops, name) for key, name in KERNELS.items()}


# --------------------------------------------------------------------------------------------
# Host shims (post-import hooks; installed by ``install()``)


def _vector_cores(call: Callable[..., Any], args: tuple, kwargs: dict) -> int:
    return VECTOR_CORES


def _chunked_prefill(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    from .. import gdn_ops

    return gdn_ops.chunk_gated_delta_rule(*args, **kwargs)


def _device_on_cpu(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    import torch

    device = kwargs.get("device")
    if isinstance(device, int) or (device is not None and torch.device(device).type == "npu"):
        kwargs = {**kwargs, "device": "cpu"}
    return call(*args, **kwargs)


def _register_split_qkv_op(module: Any) -> None:
    # Imported for its side effect: it registers torch.ops.vllm.triton_split_qkv_rmsnorm_mrope.
    import vllm_ascend.ops.triton.linearnorm.split_qkv_rmsnorm_mrope  # noqa: F401


def _placeholder_next_power_of_2(module: Any) -> None:
    placeholder = module.triton
    if not hasattr(placeholder, "next_power_of_2"):
        placeholder.next_power_of_2 = lambda n: 1 << (int(n) - 1).bit_length()


SHIMS: tuple[Shim, ...] = (
    Shim(
        "vllm_ascend.ops.triton.triton_utils",
        "get_vectorcore_num",
        _vector_cores,
        "triton-ascend's driver reports the NPU's vector cores; there is no driver here",
    ),
    Shim(
        "vllm_ascend.ops.gdn",
        "chunk_gated_delta_rule",
        _chunked_prefill,
        "the chunked prefill runs 7 Triton kernels and 2 AscendC ops on the NPU; here the same "
        "recurrence token by token (prefill never runs inside a FULL_DECODE_ONLY graph)",
    ),
    Shim(
        "vllm_ascend.ops.layernorm",
        "AscendRMSNormGated.__init__",
        _device_on_cpu,
        "the GDN layer builds its gated norm on current_device() (an int: the NPU); the "
        "simulated device is CPU memory",
    ),
    Shim(
        "vllm_ascend.patch.worker.patch_qwen3_5",
        "",
        _register_split_qkv_op,
        "the release registers vllm::triton_split_qkv_rmsnorm_mrope only if HAS_TRITON "
        "(ops/__init__.py) but calls it for every qwen3_5 model; triton-ascend makes that True",
    ),
    Shim(
        "vllm.triton_utils",
        "",
        _placeholder_next_power_of_2,
        "vLLM's Triton placeholder lacks next_power_of_2, which the GDN wrappers call",
    ),
)


_LIBRARY: Any = None


def install() -> None:
    """Define the GDN ``_C_ascend`` ops (a ``FRAGMENT`` of their own), register the kernels'
    references with the Triton stubs and the shims' post-import hooks (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    import torch

    from . import triton_refs

    _LIBRARY = torch.library.Library("_C_ascend", "FRAGMENT")
    define_ops(_LIBRARY)
    triton_refs.REFERENCES.update(triton_references())
    for shim in SHIMS:
        hooks.when_imported(shim.module, _installer(shim))


def _installer(shim: Shim) -> hooks.Hook:
    def install(module: Any) -> None:
        if shim.target:
            hooks.wrap(module, shim.target, shim.wrapper)
        else:
            shim.wrapper(module)

    return install
