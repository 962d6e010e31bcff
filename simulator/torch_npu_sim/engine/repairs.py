"""Repairs of release bugs that stop a case before the code under test runs, opt-in per case.

A shim gives the CPU host what the device has; a repair changes what the release does, so it is
never on by default: a case names the repairs it needs (``Case.repairs``), the arm's case process
sets :data:`ENV_VAR`, and each repair acts only when its name is listed there. The tests run the
case both ways where it matters, so the release's own failure stays asserted.

``step3p5-pad-call``: vllm-ascend 0.23.0.post1's ``AscendStep3p5MTPProposer._propose`` calls
``NPUModelRunner._pad_query_start_loc_for_fia`` with the signature it had before the runner's
refactor (no ``query_start_loc`` first): every FULL-graph draft step raises ``TypeError:
unsupported operand type(s) for *: 'CUDAGraphMode' and 'int'`` (platform-independent Python, so on
hardware too). The repair passes the runner's own ``query_start_loc``, the buffer the proposer
reads right after the call, as the generic proposer's call passes its own.

``v2-model-runner``: vllm-ascend 0.23.0.post1 does not run model runner v2 on vLLM 0.23.0 (by
design: its v2 code targets vLLM's main line). With ``VLLM_USE_V2_MODEL_RUNNER`` set, its
``NPUWorker`` warns and falls back to the v1 runner, and ``patch/worker/__init__.py`` imports none
of the ``patch_v2`` modules. The repair runs the release's own v2 code as it would run on a vLLM it
supports, in three parts (platform-independent Python, so on hardware too):

- ``NPUWorker.use_v2_model_runner`` is set back to what the configuration says after
  ``__init__`` (the fallback cleared it);
- the release's five v2 worker patches (``patch_v2.patch_uva``, ``patch_input_batch``,
  ``patch_model_state``, ``patch_block_table``, ``patch_attn_utils``) are imported at the end of
  ``vllm_ascend.patch.worker``, where the release imports them on a vLLM it supports (its
  ``patch_triton`` stays behind ``HAS_TRITON``, as released);
- vLLM 0.23.0's ``ModelCudaGraphManager.__init__`` / ``capture`` accept and drop the
  ``lora_capture_cases`` / ``lora_capture_hook`` keywords the release's ``ModelAclGraphManager``
  passes (a newer vLLM's signature; ``None`` without LoRA, so nothing is lost).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from . import hooks

ENV_VAR = "TORCH_NPU_SIM_REPAIRS"
STEP3P5_PAD_CALL = "step3p5-pad-call"
V2_MODEL_RUNNER = "v2-model-runner"
#: The release's v2 worker patches it imports itself on a vLLM it supports.
V2_PATCHES = tuple(
    f"vllm_ascend.patch.worker.patch_v2.{name}"
    for name in (
        "patch_uva",
        "patch_input_batch",
        "patch_model_state",
        "patch_block_table",
        "patch_attn_utils",
    )
)
#: Keywords of a newer vLLM's graph manager that 0.23.0's does not take.
NEWER_MANAGER_KEYWORDS = ("lora_capture_cases", "lora_capture_hook")


def enabled(name: str) -> bool:
    return name in os.environ.get(ENV_VAR, "").split(",")


def _pad_call_with_buffer(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    if enabled(STEP3P5_PAD_CALL) and args and isinstance(args[0], int):
        runner = call.args[0]  # type: ignore[attr-defined] - the bound receiver (hooks.wrap)
        return call(runner.query_start_loc, *args, **kwargs)
    return call(*args, **kwargs)


def _install_runner(module: Any) -> None:
    hooks.wrap(module, "NPUModelRunner._pad_query_start_loc_for_fia", _pad_call_with_buffer)


def _v2_as_configured(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    result = call(*args, **kwargs)
    worker = call.args[0]  # type: ignore[attr-defined] - the bound receiver (hooks.wrap)
    if enabled(V2_MODEL_RUNNER) and worker.vllm_config.use_v2_model_runner:
        worker.use_v2_model_runner = True
    return result


def _import_v2_patches(module: Any) -> None:
    if enabled(V2_MODEL_RUNNER):
        for name in V2_PATCHES:
            importlib.import_module(name)


def _drop_newer_keywords(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    if enabled(V2_MODEL_RUNNER):
        dropped = {k: kwargs.pop(k) for k in NEWER_MANAGER_KEYWORDS if k in kwargs}
        if any(v is not None for v in dropped.values()):
            raise NotImplementedError(f"{V2_MODEL_RUNNER} repair: LoRA capture {dropped}")
    return call(*args, **kwargs)


def _install_worker(module: Any) -> None:
    hooks.wrap(module, "NPUWorker.__init__", _v2_as_configured)


def _install_manager(module: Any) -> None:
    hooks.wrap(module, "ModelCudaGraphManager.__init__", _drop_newer_keywords)
    hooks.wrap(module, "ModelCudaGraphManager.capture", _drop_newer_keywords)


def install() -> None:
    """Register the repairs' post-import hooks (each inert unless its case names it)."""
    hooks.when_imported("vllm_ascend.worker.model_runner_v1", _install_runner)
    hooks.when_imported("vllm_ascend.worker.worker", _install_worker)
    hooks.when_imported("vllm_ascend.patch.worker", _import_v2_patches)
    hooks.when_imported("vllm.v1.worker.gpu.cudagraph_utils", _install_manager)
