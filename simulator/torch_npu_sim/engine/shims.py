"""What the real engine needs from a CPU host when the simulator is torch_npu.

Each shim wraps one attribute of one vLLM / vllm-ascend module (or acts on the module once it is
imported), with one line saying what the real device or torch_npu provides that the CPU host
lacks. Post-import hooks install them, registered by the simulator's ``install()``, so they act in
every process the engine spawns (the ``.pth`` finder serves ``torch_npu`` there) and never where a
real torch_npu is importable (the finder then refuses and ``install()`` never runs). None of them
touches vllm-ascend's graph capture or update code: that is the system under test.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import accelerator, hooks


@dataclass(frozen=True)
class Shim:
    """``wrapper(call, args, kwargs)`` around ``module.target``; ``why`` says what the CPU host
    lacks. With ``target`` empty, ``wrapper(module)`` runs once the module is imported."""

    module: str
    target: str
    wrapper: Callable[..., Any]
    why: str


def _cpu_device(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The release's device set-up (distributed init, seeds, probes), on a host with a device.

    While it runs, ``torch.npu.is_available()`` answers True: at data parallelism it counts the
    visible devices (``worker/worker.py`` near line 489: ``local_world_size`` must not exceed
    ``device_count() if is_available() else 0``), and a worker being set up has its device on
    hardware. Everywhere else the answer stays False (see ``accelerator``: dynamo would ask a
    device for a real stream).
    """
    import torch

    npu = torch.npu
    unavailable = npu.is_available
    npu.is_available = _available
    try:
        call(*args, **kwargs)
    finally:
        npu.is_available = unavailable
    return torch.device("cpu")


def _available() -> bool:
    return True


def _false(call: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    return False


def _dispatcher_on_host(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """An expert-parallel token dispatcher's set-up, with ``torch.npu.current_device()`` the
    simulated device's memory: it allocates ``expert_ids_per_ep_rank`` there
    (``ops/fused_moe/token_dispatcher.py`` near line 454), and an int device index means ``npu``,
    which has no allocator here."""
    import torch

    npu = torch.npu
    current = npu.current_device
    npu.current_device = _host_device
    try:
        return call(*args, **kwargs)
    finally:
        npu.current_device = current


def _host_device() -> Any:
    import torch

    return torch.device("cpu")


def _load_on_cpu(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    load_config = vllm_config.load_config
    if load_config.device is not None:
        return call(*args, **kwargs)
    load_config.device = "cpu"
    try:
        return call(*args, **kwargs)
    finally:
        load_config.device = None


def _also_for_cpu(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    from vllm.platforms import current_platform
    from vllm.utils import torch_utils

    result = call(*args, **kwargs)
    bound = inspect.signature(call).bind(*args, **kwargs)
    bound.apply_defaults()
    key = bound.arguments["dispatch_key"] or current_platform.dispatch_key
    if key == "PrivateUse1":
        library = bound.arguments["target_lib"] or torch_utils.vllm_lib
        library.impl(bound.arguments["op_name"], bound.arguments["op_func"], dispatch_key="CPU")
    return result


def _custom_ops_probed(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    from vllm_ascend.utils import enable_custom_op

    enable_custom_op()  # cached from now on: the compiled forward only reads the answer
    return call(*args, **kwargs)


def _triton_references(module: Any) -> None:
    from . import triton_refs

    triton_refs.install(module)


@functools.cache
def _host_memory_mode() -> type:
    """A torch function mode (this thread, this call only) that allocates ``device="npu"`` on
    the host (the simulated device's memory) and never pins."""
    from torch.overrides import TorchFunctionMode

    class HostMemory(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
        ) -> Any:
            kwargs = kwargs or {}
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
            if _is_npu(kwargs.get("device")):
                kwargs = {**kwargs, "device": "cpu"}
            return func(*args, **kwargs)

    return HostMemory


def _is_npu(device: Any) -> bool:
    import torch

    return isinstance(device, (str, torch.device)) and torch.device(device).type == "npu"


# --------------------------------------------------------------------------------------------
# MLA chunked prefill beside decodes (issue 33, item 6): the context chunks' host buffers


#: Prefill steps whose chunks attend to context (``build_chunked_metadata`` returned metadata),
#: and of those, steps with decodes in the same batch: the engine tests show with them that a
#: case really prefilled in chunks beside running decodes (read by ``arm.runner_figures``).
CONTEXT_CHUNK_STEPS: dict[str, int] = {"with_context": 0, "beside_decodes": 0}


def _unpinned(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run ``call`` with factory functions' ``pin_memory=True`` dropped (``Tensor.pin_memory()``
    is already the identity: ``_install_impl._pin_memory_shim``; the host-memory mode below);
    count what it built."""
    with _host_memory_mode()():
        result = call(*args, **kwargs)
    if result is not None:
        # hooks.wrap binds the builder as functools.partial(method, builder)
        builder = getattr(call, "args", (None,))[0]
        CONTEXT_CHUNK_STEPS["with_context"] += 1
        CONTEXT_CHUNK_STEPS["beside_decodes"] += getattr(builder, "num_decodes", 0) > 0
    return result


MLA_CHUNKED_PREFILL_SHIMS: tuple[Shim, ...] = (
    Shim(
        "vllm_ascend.attention.mla_v1",
        "AscendMLAMetadataBuilder.build_chunked_metadata",
        _unpinned,
        "torch_npu pins host memory for the NPU (torch.zeros(..., pin_memory=True) for the "
        "context chunks' lengths); CPU torch cannot pin without an accelerator",
    ),
)

# --- VLLM_USE_V2_MODEL_RUNNER: vLLM's config check for Triton (the stale-graph case) ----------


def _triton_for_v2(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``VllmConfig._validate_v2_model_runner`` with ``HAS_TRITON`` read as True, only while
    ``VLLM_USE_V2_MODEL_RUNNER`` is set (vllm-ascend makes the variable alone decide v2): the
    check then passes as on a device, where triton-ascend is importable."""
    import sys

    import vllm.envs as envs

    module = sys.modules["vllm.config.vllm"]
    if not envs.VLLM_USE_V2_MODEL_RUNNER or module.HAS_TRITON:
        return call(*args, **kwargs)
    module.HAS_TRITON = True
    try:
        return call(*args, **kwargs)
    finally:
        module.HAS_TRITON = False


def _on_host(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with _host_memory_mode()():
        return call(*args, **kwargs)


def _uva_buffers_on_host(module: Any) -> None:
    """vllm-ascend's ``UvaBufferWrapper`` (``patch_v2/patch_uva.py``): its constructor pins a
    host tensor and allocates its device copy with ``device="npu"``, and its ``uva`` property
    copies dirty rows ``.to(device="npu")``; both run with the host-memory mode."""
    owner = module.UvaBufferWrapper
    hooks.wrap(module, "UvaBufferWrapper.__init__", _on_host)
    prop = owner.__dict__["uva"]
    if getattr(prop.fget, hooks.MARK, False):
        return

    def uva(self: Any) -> Any:
        with _host_memory_mode()():
            return prop.fget(self)

    functools.update_wrapper(uva, prop.fget)
    setattr(uva, hooks.MARK, True)
    owner.uva = property(uva)


def _pointed(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """v2's block tables put tensors' ``data_ptr()`` in pointer tables; a device kernel
    dereferences them (Triton's ``_load_ptr``), a torch reference finds each tensor by its
    address (``triton_refs.POINTED``)."""
    from . import triton_refs

    tensors = list(args[0] if args else kwargs.pop("x"))
    for tensor in tensors:
        triton_refs.POINTED[tensor.data_ptr()] = tensor
    return call(tensors, *args[1:], **kwargs)


V2_RUNNER_SHIMS: tuple[Shim, ...] = (
    Shim(
        "vllm.config.vllm",
        "VllmConfig._validate_v2_model_runner",
        _triton_for_v2,
        "with VLLM_USE_V2_MODEL_RUNNER set, vLLM requires Triton, which triton-ascend provides on "
        "a device; here no Triton is installed (the kernels run as torch references)",
    ),
    # The rest acts only where the v2 runner runs (the ``v2-model-runner`` repair, repairs.py).
    Shim(
        "vllm_ascend.patch.worker.patch_v2.patch_uva",
        "",
        _uva_buffers_on_host,
        'torch_npu pins host memory and allocates device="npu"; CPU torch can do neither '
        "without an accelerator (the simulated device is CPU memory)",
    ),
    Shim(
        "vllm_ascend.worker.v2.model_runner",
        "NPUModelRunner.__init__",
        _on_host,
        "torch_npu pins host memory (the v2 runner's num_computed_tokens_cpu is allocated "
        "pinned); CPU torch cannot pin without an accelerator",
    ),
    Shim(
        "vllm.v1.worker.gpu.buffer_utils",
        "StagedWriteTensor.apply_write",
        _on_host,
        "torch_npu pins host memory (async_tensor_h2d's pin_memory default was decided when "
        "vllm.utils.torch_utils was imported); CPU torch cannot pin without an accelerator",
    ),
    Shim(
        "vllm.v1.worker.gpu.model_runner",
        "GPUModelRunner.load_model",
        _custom_ops_probed,
        "vllm_ascend_C (built with CANN) imports on hardware; here the import fails, and dynamo "
        "cannot trace enable_custom_op()'s failing first import: the v2 runner's probe, as the "
        "v1 runner's",
    ),
    Shim(
        "vllm.v1.worker.gpu.block_table",
        "BlockTables._make_ptr_tensor",
        _pointed,
        "a device kernel dereferences the block tables' addresses (Triton's _load_ptr); a torch "
        "reference finds the tensor by its address",
    ),
)

# --- end of VLLM_USE_V2_MODEL_RUNNER ------------------------------------------------------------


# --- YaRN rope (DeepSeek-V3 / Kimi-K2 style ``rope_scaling``): its cos / sin caches ----------

YARN_ROPE_SHIMS: tuple[Shim, ...] = (
    Shim(
        "vllm_ascend.ops.rotary_embedding",
        "AscendDeepseekScalingRotaryEmbedding._set_cos_sin_cache",
        _on_host,
        'the YaRN rope builds its cos / sin caches with device="npu" at layer init (an allocator '
        "on hardware); the simulated device is CPU memory, which CPU torch cannot reach by that "
        "name",
    ),
)

# --- end of YaRN rope ---------------------------------------------------------------------------


SHIMS: tuple[Shim, ...] = (
    Shim(
        "vllm_ascend.worker.worker",
        "NPUWorker._init_device",
        _cpu_device,
        "npu:0 is a PrivateUse1 device with an allocator on hardware; here tensors live on CPU "
        "(and the worker's device counts as visible while it is set up: the DP device check)",
    ),
    Shim(
        "vllm_ascend.platform",
        "NPUPlatform.is_pin_memory_available",
        _false,
        "torch_npu pins host memory for the NPU; CPU torch cannot pin without an accelerator",
    ),
    Shim(
        "vllm_ascend.ops.fused_moe.token_dispatcher",
        "TokenDispatcherWithAll2AllV.__init__",
        _dispatcher_on_host,
        "the EP all-to-all dispatcher allocates on the current NPU at layer init; here that is CPU "
        "memory",
    ),
    Shim(
        "vllm.model_executor.model_loader.base_loader",
        "BaseModelLoader.load_model",
        _load_on_cpu,
        "weights are built on the device (npu) on hardware; the simulated device is CPU memory",
    ),
    Shim(
        "vllm.utils.torch_utils",
        "direct_register_custom_op",
        _also_for_cpu,
        "NPU tensors dispatch custom ops to their PrivateUse1 kernel; simulated tensors are CPU",
    ),
    Shim(
        "vllm_ascend.worker.model_runner_v1",
        "NPUModelRunner.load_model",
        _custom_ops_probed,
        "vllm_ascend_C (built with CANN) imports on hardware; here the import fails, and dynamo "
        "cannot trace enable_custom_op()'s failing first import: probe it once before compiling",
    ),
    Shim(
        "vllm.triton_utils",
        "",
        _triton_references,
        "triton-ascend compiles vLLM's Triton kernels for the NPU; here torch references run them",
    ),
    *MLA_CHUNKED_PREFILL_SHIMS,
    *V2_RUNNER_SHIMS,
    *YARN_ROPE_SHIMS,
)

_applied = False


def apply(shims: tuple[Shim, ...] = SHIMS) -> None:
    """Register every shim's post-import hook and the torch-level shims (once per process)."""
    global _applied
    if _applied:
        return
    _applied = True
    for shim in shims:
        hooks.when_imported(shim.module, _installer(shim))
    _tensor_methods()
    _hccl_comm_names()
    accelerator.install()


def _installer(shim: Shim) -> hooks.Hook:
    def install(module: Any) -> None:
        if shim.target:
            hooks.wrap(module, shim.target, shim.wrapper)
        else:
            shim.wrapper(module)

    return install


def _tensor_methods() -> None:
    """``Tensor.npu()`` / ``Tensor.is_npu``: torch_npu adds them (a copy to the NPU, and whether a
    tensor lives there); the simulated device is CPU memory, so ``.npu()`` is the tensor itself
    and ``is_npu`` says what the tensor's device says."""
    import torch

    if not hasattr(torch.Tensor, "npu"):
        torch.Tensor.npu = _identity_npu  # type: ignore[attr-defined]
    if not hasattr(torch.Tensor, "is_npu"):
        torch.Tensor.is_npu = property(lambda self: self.device.type == "npu")  # type: ignore[attr-defined]


def _identity_npu(self: Any, device: Any = None, non_blocking: bool = False, **_kw: Any) -> Any:
    return self


class _SimulatedHcclBackend:
    """What ``ProcessGroup._get_backend(npu)`` gives the MoE token dispatchers: the group's
    backend (gloo here), plus the HCCL communicator name they read at layer init
    (``token_dispatcher.py`` near lines 108, 147 and 471). The name reaches only the MC2 ops
    (an EP world of 16 or more); at smaller EP sizes the release selects all-gather."""

    def __init__(self, backend: Any, group_name: str) -> None:
        self._backend = backend
        self._group_name = group_name

    def get_hccl_comm_name(self, rank: int) -> str:
        return f"sim_hccl_{self._group_name}_{rank}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def _hccl_comm_names() -> None:
    """``ProcessGroup._get_backend(torch.device("npu"))``: torch_npu registers the HCCL backend
    for the npu device; gloo has none ("No backend type associated with device type npu"), so
    the npu device gets the group's CPU backend with a communicator name (idempotent)."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return
    group_class = dist.ProcessGroup
    real = group_class._get_backend
    if getattr(real, "_sim_npu_backend", False):
        return

    def get_backend(self: Any, device: Any) -> Any:
        if torch.device(device).type != "npu":
            return real(self, device)
        try:
            return real(self, device)
        except RuntimeError:
            return _SimulatedHcclBackend(real(self, torch.device("cpu")), self.group_name)

    get_backend._sim_npu_backend = True  # type: ignore[attr-defined]
    get_backend._sim_torch_get_backend = real  # type: ignore[attr-defined]
    group_class._get_backend = get_backend
