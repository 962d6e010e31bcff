"""The ``_C_ascend`` ops (vllm-ascend's CANN extension, ``vllm_ascend_C``) that tiny models reach.

On hardware ``import vllm_ascend.vllm_ascend_C`` registers the ``torch.ops._C_ascend`` library;
vllm-ascend calls some of its ops without asking ``enable_custom_op()`` first (the A2 device
adaptor's ``npu_gemma_rms_norm``, which Step3.5's ``GemmaRMSNorm`` layers reach). Here the
simulator defines those ops, each a composition of simulated torch_npu ops (one task each under
capture), with a fake kernel for dynamo. Only the ops below exist: any other ``_C_ascend`` op
still fails loudly, as before. Each is checked against a float64 oracle in
``tests/test_sim_model_ops.py``.
"""

from __future__ import annotations

from typing import Any

_LIBRARY: Any = None

#: The ops' schemas as the extension registers them (``csrc/torch_binding.cpp``).
SCHEMAS = {
    "npu_gemma_rms_norm": "npu_gemma_rms_norm(Tensor x, Tensor gamma, float epsilon=1e-06) "
    "-> (Tensor, Tensor)",
    "moe_gating_top_k": "moe_gating_top_k(Tensor x, *, int k, int k_group=1, int group_count=1, "
    "int group_select_mode=0, int renorm=0, int norm_type=0, bool out_flag=False, "
    "float routed_scaling_factor=1.0, float eps=1e-20, Tensor? bias_opt=None) "
    "-> (Tensor, Tensor, Tensor)",
    "npu_moe_init_routing_custom": "npu_moe_init_routing_custom(Tensor x, Tensor expert_idx, *, "
    "Tensor? scale=None, Tensor? offset=None, int active_num=-1, int expert_capacity=-1, "
    "int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, "
    "bool expert_tokens_num_flag=False, int quant_mode=-1, int[2] active_expert_range=[], "
    "int row_idx_type=0) -> (Tensor, Tensor, Tensor, Tensor)",
}


def npu_gemma_rms_norm(x: Any, gamma: Any, epsilon: float = 1e-6) -> tuple[Any, Any]:
    """Gemma's RMSNorm: ``x * rsqrt(mean(x^2) + eps) * (1 + gamma)``; returns (y, rstd)."""
    from .. import model_ops

    return model_ops.npu_rms_norm(x, 1.0 + gamma, epsilon)


def _gemma_rms_norm_fake(x: Any, gamma: Any, epsilon: float = 1e-6) -> tuple[Any, Any]:
    import torch

    shape = list(x.shape[: x.dim() - gamma.dim()]) + [1] * gamma.dim()
    return x.new_empty(x.shape), x.new_empty(shape, dtype=torch.float32)


def _gating_fake(x: Any, *, k: int, out_flag: bool = False, **_: Any) -> tuple[Any, Any, Any]:
    import torch

    rows = x.shape[0]
    out = x.new_empty(x.shape) if out_flag else x.new_empty(0)
    return x.new_empty(rows, k), x.new_empty(rows, k, dtype=torch.int32), out


def _init_routing_fake(x: Any, expert_idx: Any, *, expert_num: int = -1, **kw: Any) -> tuple:
    import torch

    slots = expert_idx.numel()
    first, last = kw.get("active_expert_range") or (0, expert_num)
    return (
        x.new_empty(slots, x.shape[-1]),
        x.new_empty(slots, dtype=torch.int32),
        x.new_empty(last - first, dtype=torch.int64),
        x.new_empty(0),
    )


def _references() -> dict[str, tuple[Any, Any]]:
    from .. import moe_ops

    return {
        "npu_gemma_rms_norm": (npu_gemma_rms_norm, _gemma_rms_norm_fake),
        "moe_gating_top_k": (moe_ops.moe_gating_top_k, _gating_fake),
        "npu_moe_init_routing_custom": (moe_ops.npu_moe_init_routing_v2, _init_routing_fake),
    }


def install() -> None:
    """Define the ``_C_ascend`` ops above (once per process): each CPU kernel a simulated NPU op
    (one task under capture, re-run at replay), each with a fake kernel for dynamo."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    import torch

    from .. import runtime

    library = torch.library.Library("_C_ascend", "FRAGMENT")
    for name, (reference, fake) in _references().items():
        if hasattr(torch.ops._C_ascend, name):  # a real extension (never with the simulator)
            continue
        library.define(SCHEMAS[name])
        library.impl(name, runtime.make_op(f"_C_ascend.{name}", reference), "CPU")
        torch.library.register_fake(f"_C_ascend::{name}", fake, lib=library)
    _LIBRARY = library
