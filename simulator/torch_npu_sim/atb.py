"""The ATB op plugin, wired as torch-npu 2.10.0.post4 wires it (``op_plugin/atb/_atb_ops.py``).

At import, ``torch_npu.<name>`` (``API_LIST``) and ``torch_npu.atb.<name>`` (``ATB_API_LIST``) are
lazy Python functions. The first call of any of them, or ``_register_atb_extensions()`` (which
vllm-ascend's ``NPUWorker.__init__`` calls after the attention modules were imported), swaps every
one of them for the registered op ``torch.ops.atb.<name>``: new objects under the same names.
Anything that wrapped the attribute before the swap (an interceptor, a profiler) is silently left
behind. Here ``ATB_OPS`` stands in for ``torch.ops.atb`` (the simulator registers no
``torch.library`` ops): a namespace of simulated ops, distinct from the lazy functions, with the
same graph capture and update semantics. An op with an ``.out`` overload in the reference table
is one simulated op that runs whichever overload the call's arguments select.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types
from collections.abc import Callable
from typing import Any

from . import runtime

API_LIST = (
    "_npu_matmul_add_fp32",
    "_npu_quant_rms_norm",
    "_npu_group_topk",
    "_npu_paged_attention",
    "_npu_paged_attention_mla",
    "_npu_paged_attention_quant",
    "_npu_quantize_per_tensor",
    "_npu_reshape_and_cache",
    "_npu_reshape_and_cache_siso",
    "_npu_rotary_embedding",
    "_npu_flash_attention",
    "_npu_flash_attention_v3",
    "_npu_flash_attention_unpad",
    "_npu_flash_attention_unpad_v2",
    "_npu_paged_attention_splitfuse",
    "_npu_paged_attention_splitfuse_v2",
    "_npu_flash_attention_qlens",
    "_npu_paged_attention_get_workspace",
)
ATB_API_LIST = (
    "npu_paged_cache_load",
    "npu_multi_head_latent_attention",
    "_npu_multi_head_latent_attention_get_workspace",
    "_npu_paged_attention_v2",
    "_npu_paged_attention_v2_get_workspace",
    "_npu_flash_attention_v2",
    "_npu_flash_attention_prefix_v2",
    "npu_fused_add_topk_div",
    "npu_ring_mla",
    "npu_self_attention_prefix_encoder",
    "npu_mla_preprocess",
)

#: Stand-in for ``torch.ops.atb``: filled by ``build``.
ATB_OPS = types.SimpleNamespace()
_targets: dict[str, Any] = {}  # "torch_npu" / "atb" -> the module the swap writes into
_lazy: dict[str, Callable[..., Any]] = {}  # name -> its lazy function (made once, at build)


def build(
    torch_npu: types.ModuleType,
    atb_module: types.ModuleType,
    reference: dict[str, Callable[..., Any]],
    host: set[str],
    unsupported: Callable[[str], Callable[..., Any]],
) -> None:
    """Fill ``ATB_OPS`` and put the lazy functions on ``torch_npu`` and ``torch_npu.atb``."""
    for name in itertools.chain(API_LIST, ATB_API_LIST):
        fn = reference.get(name)
        out = reference.get(name + ".out")
        if fn is not None and out is not None:
            fn = _overloads(fn, out)
        if fn is None:
            op: Any = runtime.make_op(name, unsupported(name))
        elif name in host:
            op = _host_op(name, fn)
        else:
            op = runtime.make_op(name, fn)
        setattr(ATB_OPS, name, op)
        _lazy[name] = _create_lazy_atb_function(name)
    _targets["torch_npu"], _targets["atb"] = torch_npu, atb_module
    _register_atb_extensions.cache_clear()
    _patch_atb_and_loadso()


def _overloads(base: Callable[..., Any], out: Callable[..., Any]) -> Callable[..., Any]:
    """One op for both overloads, as ``torch.ops.atb.<name>`` resolves them: a call naming an
    argument only the ``.out`` overload has (its outputs) runs it, any other runs ``base``.
    ``overloads`` names both, in the registry's order (base first)."""
    only_out = frozenset(inspect.signature(out).parameters) - set(
        inspect.signature(base).parameters
    )

    @functools.wraps(base)
    def op(*args: Any, **kwargs: Any) -> Any:
        if only_out.intersection(kwargs):
            return out(*args, **kwargs)
        return base(*args, **kwargs)

    op.overloads = (base, out)  # type: ignore[attr-defined]
    return op


def _host_op(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A host-side ATB op (a workspace getter): a function of its own, like each registered op."""

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    op.__name__ = op.__qualname__ = name
    return op


def _create_lazy_atb_function(name: str) -> Callable[..., Any]:
    def generated_function(*args: Any, **kwargs: Any) -> Any:
        _register_atb_extensions()
        return getattr(ATB_OPS, name)(*args, **kwargs)

    generated_function.__name__ = generated_function.__qualname__ = name
    return generated_function


@functools.lru_cache(None)
def _register_atb_extensions() -> None:
    """Swap the lazy functions for the registered ops (once per process, as in torch_npu)."""
    _patch_atb_ops()


def _patch_atb_ops() -> None:
    for name in API_LIST:
        setattr(_targets["torch_npu"], name, getattr(ATB_OPS, name))
    for name in ATB_API_LIST:
        setattr(_targets["atb"], name, getattr(ATB_OPS, name))


def _patch_atb_and_loadso() -> None:
    """The state at ``import torch_npu``: lazy functions under every name (tests restore it)."""
    for name in API_LIST:
        setattr(_targets["torch_npu"], name, _lazy[name])
    for name in ATB_API_LIST:
        setattr(_targets["atb"], name, _lazy[name])


def restore_lazy() -> None:
    """Undo the swap (test isolation): lazy functions again, and the next registration swaps."""
    _register_atb_extensions.cache_clear()
    _patch_atb_and_loadso()
