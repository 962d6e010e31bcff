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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import hooks

ENV_VAR = "TORCH_NPU_SIM_REPAIRS"
STEP3P5_PAD_CALL = "step3p5-pad-call"


def enabled(name: str) -> bool:
    return name in os.environ.get(ENV_VAR, "").split(",")


def _pad_call_with_buffer(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    if enabled(STEP3P5_PAD_CALL) and args and isinstance(args[0], int):
        runner = call.args[0]  # type: ignore[attr-defined] - the bound receiver (hooks.wrap)
        return call(runner.query_start_loc, *args, **kwargs)
    return call(*args, **kwargs)


def _install_runner(module: Any) -> None:
    hooks.wrap(module, "NPUModelRunner._pad_query_start_loc_for_fia", _pad_call_with_buffer)


def install() -> None:
    """Register the repairs' post-import hooks (each inert unless its case names it)."""
    hooks.when_imported("vllm_ascend.worker.model_runner_v1", _install_runner)
