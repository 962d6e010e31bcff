"""Implementation of ``install()``: the ``torch_npu`` module tree and the CPU import shims.

vllm-ascend imports ``torch_npu`` everywhere and reads ``torch.npu`` through ``getattr``; on a CPU
host neither exists. ``install()`` builds the module tree vllm-ascend and vLLM import (found by
grepping both), backed by ``runtime`` for the graph path and by cheap, harmless answers for
config-time probes. Ops that are not simulated exist (``hasattr`` probes see a real torch_npu)
but raise ``SimulatorError`` when called, so a missing reference op is loud, never silent.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from . import atb, lifetimes, runtime, torch_additions
from . import engine as engine_shims
from .runtime import SimulatorError

_MODULE: types.ModuleType | None = None
#: The torch-npu release the simulator stands in for (vllm-ascend 0.23.0.post1 pins it): the
#: same string (it enters vllm-ascend's compile-cache key); ``torch_npu.__simulated__`` marks us.
SIM_VERSION = "2.10.0.post4"


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Ops vllm-ascend names on torch_npu that the simulator does not implement (beyond ops.py).
_UNSIMULATED = _words(
    """
npu_quant_matmul npu_format_cast_ npu_dynamic_quant npu_grouped_matmul npu_dynamic_mx_quant
npu_rms_norm npu_swiglu npu_rotary_mul npu_moe_token_unpermute npu_convert_weight_to_int4pack
npu_moe_init_routing_v2 npu_transpose_batchmatmul npu_scatter_pa_kv_cache npu_scatter_nd_update_
npu_moe_token_permute npu_lightning_indexer npu_kv_rmsnorm_rope_cache npu_fusion_attention
npu_add_rms_norm _npu_rotary_embedding npu_weight_quant_batchmatmul npu_quantize
npu_mm_reduce_scatter_base npu_kronecker_quant npu_interleave_rope
npu_grouped_matmul_swiglu_quant_v2 npu_attention_update npu_apply_rotary_pos_emb
npu_transpose_quant_batchmatmul npu_quant_grouped_matmul_dequant
npu_prompt_flash_attention npu_moe_gating_top_k_softmax npu_mla_prolog_v3
npu_matmul_compress_dequant _npu_matmul_add_fp32 _npu_flash_attention_unpad npu_sign_bits_unpack
npu_recurrent_gated_delta_rule npu_quant_lightning_indexer npu_prefetch npu_mrope
npu_moe_gating_top_k npu_moe_finalize_routing npu_moe_distribute_dispatch_v2
npu_moe_distribute_dispatch npu_moe_distribute_combine_v2 npu_moe_distribute_combine
npu_mm_all_reduce_base npu_mla_prolog_v2 npu_kv_quant_sparse_flash_attention
npu_grouped_matmul_swiglu_quant npu_gather_pa_kv_cache npu_fast_gelu npu_dynamic_block_quant
_npu_paged_attention_splitfuse _npu_group_topk _npu_flash_attention
npu_fused_infer_attention_score npu_fused_infer_attention_score_v2 _npu_paged_attention
_npu_reshape_and_cache
"""
)
_UNSIMULATED_OUT = {"npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2"}
_UNSIMULATED_HOST = _words(
    """
_npu_fused_infer_attention_score_get_max_workspace
_npu_fused_infer_attention_score_v2_get_max_workspace _npu_paged_attention_get_workspace
"""
)


def installed() -> bool:
    return _MODULE is not None


def install() -> types.ModuleType:
    """Register the simulator as ``torch_npu`` (idempotent); returns the module."""
    global _MODULE
    if _MODULE is not None and sys.modules.get("torch_npu") is _MODULE:
        return _MODULE
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch

    _torchvision_workaround(torch)
    mod = _build(torch)
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    torch.npu = mod.npu
    sys.modules["torch.npu"] = mod.npu
    torch_additions.install(torch)
    runtime.install_collective_wait(torch)
    _pin_memory_shim(torch)
    _stub_acl()
    _MODULE = mod
    engine_shims.apply()  # post-import hooks for the real vLLM engine (CPU device, ops, ...)
    return mod


# --------------------------------------------------------------------------------------------


def _torchvision_workaround(torch: Any) -> None:
    """Define ``torchvision::nms``/``qnms`` when torchvision's CUDA-linked ``_C`` cannot load.

    Otherwise torchvision's meta registrations fail at import ("operator torchvision::nms does
    not exist"), which breaks ``vllm.config`` and ``torchvision.transforms``.
    """
    if "torchvision" in sys.modules or getattr(_torchvision_workaround, "done", False):
        return
    _torchvision_workaround.done = True  # type: ignore[attr-defined]
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    if _has_op(torch, "nms"):
        return
    for location in spec.submodule_search_locations:
        for name in sorted(os.listdir(location)):
            if name.startswith("_C") and name.endswith((".so", ".pyd")):
                try:
                    torch.ops.load_library(os.path.join(location, name))
                    return
                except OSError:
                    pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _torchvision_workaround.lib = lib  # type: ignore[attr-defined]  # keep the defs alive


def _has_op(torch: Any, name: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel(f"torchvision::{name}") or hasattr(
            torch.ops.torchvision, name
        )
    except Exception:
        return False


def _pin_memory_shim(torch: Any) -> None:
    """Make ``Tensor.pin_memory()`` a no-op when no accelerator backs it (CPU-only torch).

    vllm-ascend's metadata builders stage host buffers with ``.pin_memory()``; a CPU torch raises
    there ("register PrivateUse1HooksInterface first"). Pinning only speeds up H2D copies, and
    every tensor is already on the host here, so returning the tensor keeps semantics.
    """
    original = torch.Tensor.pin_memory
    if getattr(original, "_agp_sim", False):
        return
    try:
        torch.zeros(1).pin_memory()
        return  # a real backend pins: leave it alone
    except RuntimeError:
        pass

    def pin_memory(self: Any, device: Any = None) -> Any:
        return self

    def is_pinned(self: Any, device: Any = None) -> bool:
        return False

    pin_memory._agp_sim = True  # type: ignore[attr-defined]
    pin_memory.__wrapped__ = original  # type: ignore[attr-defined]
    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned


def _stub_acl() -> None:
    """``acl``/``acl.rt`` (CANN's Python runtime) as vllm-ascend's UT conftest stubs them."""
    if "acl" in sys.modules:
        return
    acl = types.ModuleType("acl")
    rt = types.ModuleType("acl.rt")

    def _unsupported(*_a: Any, **_k: Any) -> Any:
        raise SimulatorError("acl.rt is not simulated")

    for name in ("memcpy", "malloc", "free", "memset", "get_device", "set_device"):
        setattr(rt, name, _unsupported)
    acl.rt = rt  # type: ignore[attr-defined]
    sys.modules["acl"] = acl
    sys.modules["acl.rt"] = rt


def _module(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = __file__
    spec = importlib.util.spec_from_loader(name, loader=None, is_package=package)
    mod.__spec__ = spec
    if package:
        mod.__path__ = []  # type: ignore[attr-defined]
    for key, value in attrs.items():
        setattr(mod, key, value)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def _unsupported_op(name: str) -> Callable[..., Any]:
    def op(*_a: Any, **_k: Any) -> Any:
        raise SimulatorError(f"torch_npu.{name} is not simulated")

    op.__name__ = name
    op.__qualname__ = name
    op.sim_unsupported = True  # type: ignore[attr-defined]
    return op


class Format(enum.IntEnum):
    """``torch_npu.Format``: storage formats (everything is ND on CPU)."""

    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    FRACTAL_NZ = 29


class _DeviceProperties(types.SimpleNamespace):
    pass


def _npu_namespace(torch: Any) -> dict[str, Any]:
    """``torch_npu.npu`` (== ``torch.npu``): runtime graph API plus harmless device probes."""
    total = 64 * 1024**3

    @contextlib.contextmanager
    def device(device: Any) -> Iterator[None]:
        yield

    def set_device(device: Any) -> None:
        return None

    def get_device_properties(_d: Any = None) -> _DeviceProperties:
        return _DeviceProperties(
            name="Ascend910B1 (simulated)",
            total_memory=total,
            multi_processor_count=24,
            cube_core_num=24,
            vector_core_num=48,
            major=2,
            minor=2,
        )

    ns: dict[str, Any] = {
        # graph path
        "NPUGraph": runtime.NPUGraph,
        "graph": runtime.graph,
        "graph_pool_handle": runtime.graph_pool_handle,
        "Stream": runtime.Stream,
        "Event": runtime.Event,
        "ExternalEvent": runtime.ExternalEvent,
        "current_stream": runtime.current_stream,
        "default_stream": runtime.default_stream,
        "set_stream": runtime.set_stream,
        "stream": runtime.stream,
        "synchronize": runtime.synchronize,
        "graph_task_group_begin": runtime.graph_task_group_begin,
        "graph_task_group_end": runtime.graph_task_group_end,
        "graph_task_update_begin": runtime.graph_task_update_begin,
        "graph_task_update_end": runtime.graph_task_update_end,
        "is_current_stream_capturing": runtime.is_current_stream_capturing,
        # device probes: cheap, harmless answers
        "is_available": lambda: False,
        "is_initialized": lambda: True,
        "init": lambda: None,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": set_device,
        "device": device,
        "get_device_name": lambda _d=None: "Ascend910B1 (simulated)",
        "get_device_properties": get_device_properties,
        "get_soc_version": lambda: 220,
        "set_compile_mode": lambda *a, **k: None,
        "empty_cache": lambda: None,
        "mem_get_info": lambda _d=None: (total, total),
        "memory_stats": lambda _d=None: {},
        "memory_allocated": lambda _d=None: 0,
        "max_memory_allocated": lambda _d=None: 0,
        "memory_reserved": lambda _d=None: 0,
        "max_memory_reserved": lambda _d=None: 0,
        "reset_peak_memory_stats": lambda _d=None: None,
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "seed": lambda: None,
        "utilization": lambda _d=None: 0,
    }
    return ns


class _MemPool:
    def __init__(self, allocator: Any = None) -> None:
        self.allocator = allocator
        self.id = runtime.graph_pool_handle()


class _NPUPluggableAllocator:
    def __init__(
        self, path_to_so_file: str = "", alloc_fn_name: str = "", free_fn_name: str = ""
    ) -> None:
        self.path = path_to_so_file

    def allocator(self) -> None:
        return None


@contextlib.contextmanager
def _use_mem_pool(pool: Any = None, device: Any = None) -> Iterator[None]:
    yield


class _ProfilerLevel(enum.Enum):
    Level_none = "Level_none"
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"


class _ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


class _ExportType(enum.Enum):
    Text = "text"
    Db = "db"


class _AiCMetrics(enum.Enum):
    AiCoreNone = "none"
    PipeUtilization = "PipeUtilization"
    ArithmeticUtilization = "ArithmeticUtilization"
    Memory = "Memory"


class _ExperimentalConfig:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.kwargs = kwargs


class _Profile:
    """``torch_npu.profiler.profile``: a no-op profiler (nothing to trace on CPU)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __enter__(self) -> _Profile:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def step(self) -> None:
        return None


class _ProcessGroupHCCL:
    class Options:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.kwargs = kwargs

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise SimulatorError("ProcessGroupHCCL is not simulated (use gloo on CPU)")


def _get_npu_format(input: Any) -> int:
    return int(Format.ND)


def _npu_format_cast(
    input: Any,
    acl_format: int,
    *,
    customize_dtype: int | None = None,
    input_dtype: int | None = None,
) -> Any:
    return input  # every tensor is ND on CPU


def _empty_with_format(
    size: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: bool | None = None,
    acl_format: int = 2,
    base_addr_aligned_kb: int | None = None,
) -> Any:
    import torch

    return torch.empty(size, dtype=dtype)


def _reference_ops() -> tuple[dict[str, Callable[..., Any]], set[str]]:
    """One op table: the attention ops (``ops``), the model-layer ops (``model_ops``,
    ``moe_ops``, ``mla_ops``) and the sampler's (``sample_ops``)."""
    from . import mla_ops, model_ops, moe_ops, sample_ops

    layers = {
        **model_ops.REFERENCE_OPS,
        **moe_ops.REFERENCE_OPS,
        **mla_ops.REFERENCE_OPS,
        **sample_ops.REFERENCE_OPS,
    }
    try:
        from . import ops
    except ImportError:
        return layers, set()
    table = {**getattr(ops, "REFERENCE_OPS", {}), **layers}
    return table, set(getattr(ops, "HOST_FUNCTIONS", set()))


def _attach_ops(mod: types.ModuleType, atb_module: types.ModuleType) -> None:
    table, host = _reference_ops()
    atb.build(mod, atb_module, table, host, _unsupported_op)  # the ATB ops: lazy, then swapped
    for name in _UNSIMULATED:
        if name in atb.API_LIST:
            continue
        if name in _UNSIMULATED_OUT:
            setattr(
                mod,
                name,
                runtime.make_op(
                    name,
                    _unsupported_op(name),
                    runtime.make_op(name + ".out", _unsupported_op(name + ".out")),
                ),
            )
        else:
            setattr(mod, name, runtime.make_op(name, _unsupported_op(name)))
    for name in _UNSIMULATED_HOST:
        if name not in atb.API_LIST:
            setattr(mod, name, _unsupported_op(name))
    for name, fn in table.items():
        if name.endswith(".out") or name in atb.API_LIST or name in atb.ATB_API_LIST:
            continue  # ATB's ops are attached by ``atb.build`` (``torch_npu.atb`` ones there only)
        if name in host:
            setattr(mod, name, fn)
            continue
        out = table.get(name + ".out")
        out_op = runtime.make_op(name + ".out", out) if out is not None else None
        setattr(mod, name, runtime.make_op(name, fn, out_op))
    for name, fn in table.items():  # an ``.out`` without a functional base entry
        base = name[: -len(".out")] if name.endswith(".out") else None
        if base and base not in table:
            getattr(mod, base).out = runtime.make_op(name, fn)


def _build(torch: Any) -> types.ModuleType:
    for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
        del sys.modules[name]
    mod = _module(
        "torch_npu",
        package=True,
        __version__=SIM_VERSION,
        __simulated__=True,
        Format=Format,
        SimulatorError=SimulatorError,
        _sim_runtime=runtime,
        get_npu_format=_get_npu_format,
        npu_format_cast=_npu_format_cast,
        empty_with_format=_empty_with_format,
    )
    _attach_ops(mod, _module("torch_npu.atb", package=True))
    npu = _module("torch_npu.npu", package=True, **_npu_namespace(torch))
    _module(
        "torch_npu.npu.memory",
        NPUPluggableAllocator=_NPUPluggableAllocator,
        use_mem_pool=_use_mem_pool,
        MemPool=_MemPool,
        memory_snapshot=lambda: [],
        empty_cache=npu.empty_cache,
        memory_stats=npu.memory_stats,
    )
    _module("torch_npu.npu.config", allow_internal_format=False)
    _module(
        "torch_npu.npu.graphs",
        NPUGraph=runtime.NPUGraph,
        graph=runtime.graph,
        graph_pool_handle=runtime.graph_pool_handle,
    )
    _module(
        "torch_npu.npu.streams",
        Stream=runtime.Stream,
        Event=runtime.Event,
        ExternalEvent=runtime.ExternalEvent,
    )
    _module(
        "torch_npu._C",
        package=True,
        _NPUTaskGroupHandle=runtime._NPUTaskGroupHandle,
        _weak_ref_tensor=lifetimes.weak_ref_tensor,
    )
    _module("torch_npu._C._distributed_c10d", ProcessGroupHCCL=_ProcessGroupHCCL)
    _module(
        "torch_npu.distributed",
        package=True,
        is_hccl_available=torch_additions.is_hccl_available,
        reinit_process_group=torch_additions.reinit_process_group,
    )
    _module(
        "torch_npu.profiler",
        package=True,
        profile=_Profile,
        ProfilerLevel=_ProfilerLevel,
        ProfilerActivity=_ProfilerActivity,
        ExportType=_ExportType,
        AiCMetrics=_AiCMetrics,
        _ExperimentalConfig=_ExperimentalConfig,
        tensorboard_trace_handler=lambda *a, **k: lambda *_a, **_k: None,
        schedule=lambda *a, **k: lambda *_a, **_k: None,
        supported_activities=lambda: [_ProfilerActivity.CPU],
    )
    _module(
        "torch_npu.profiler.dynamic_profile",
        init=lambda *a, **k: None,
        step=lambda *a, **k: None,
        start=lambda *a, **k: None,
    )
    _module("torch_npu.op_plugin", package=True)
    _module("torch_npu.op_plugin.atb", package=True)
    _module(
        "torch_npu.op_plugin.atb._atb_ops",
        API_LIST=list(atb.API_LIST),
        ATB_API_LIST=list(atb.ATB_API_LIST),
        _register_atb_extensions=atb._register_atb_extensions,
        _patch_atb_ops=atb._patch_atb_ops,
        _patch_atb_and_loadso=atb._patch_atb_and_loadso,
    )
    _module("torch_npu.multiprocessing", package=True)

    def rebuild_npu_tensor(*_a: Any, **_k: Any) -> Any:
        raise SimulatorError("NPU IPC tensors are not simulated")

    _module("torch_npu.multiprocessing.reductions", rebuild_npu_tensor=rebuild_npu_tensor)
    _module("torch_npu.contrib", package=True)
    _module("torch_npu.utils", package=True)
    return mod
