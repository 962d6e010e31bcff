"""Verify mode survives torch_npu's ATB swap, in the order a real vLLM worker starts.

The overlay is enabled and its verify interceptors are installed when vllm-ascend loads; then
``NPUWorker.__init__`` calls ``_register_atb_extensions()``, which replaces ``torch_npu.
_npu_paged_attention`` (and the PA workspace getter) with new objects; then graphs are captured and
replayed. An interceptor left on the old attribute no longer sees stock's PA relaunches.
"""

from __future__ import annotations

from typing import Any

import pytest

from ascend_graph_patch import installer
from ascend_graph_patch.aspects import verify
from tests.overlay_support import assert_bitwise, overlay_arm
from torch_npu_sim.harness import scenarios

STEPS = 12


def _swap_after_install() -> None:
    """What NPUWorker.__init__ does, once the overlay is in place and before any capture."""
    import torch_npu
    from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions

    assert "verify.pa" in installer.installed()
    before = torch_npu._npu_paged_attention
    assert before.__name__ == "_npu_paged_attention" and hasattr(before, "__wrapped__")  # ours
    _register_atb_extensions()
    assert torch_npu._npu_paged_attention is not before  # the interceptor is left behind


def _swapped_engine() -> Any:
    """The engine is built (and captures) only after the swap, as in a real worker."""
    _swap_after_install()
    return scenarios.build("paged_attention")


@pytest.fixture
def stock_pa(atb_lazy: Any) -> Any:
    return overlay_arm("paged_attention", "off", steps=STEPS)


def test_verify_checks_pa_after_the_swap(atb_lazy: Any, stock_pa: Any, monkeypatch: Any) -> None:
    atb_lazy.restore_lazy()
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_STRICT", "1")
    arm = overlay_arm("paged_attention", "verify", steps=STEPS, build=_swapped_engine)
    assert arm.error is None  # strict: any mismatch would have raised
    assert arm.counters["verify.tasks"] > 0 and "verify.mismatches" not in arm.counters
    assert arm.counters["verify.reattached"] >= 1  # the PA interceptor was re-attached
    assert arm.snapshot["tasks_per_kind"].get("pa", 0) > 0
    assert_bitwise(arm, stock_pa)


def test_negative_control_interceptors_left_on_the_swapped_attribute_miss_every_pa_task(
    atb_lazy: Any, stock_pa: Any, monkeypatch: Any, mocker: Any
) -> None:
    """The old wrapping: interceptors stay where they were installed, never re-attached."""
    atb_lazy.restore_lazy()
    mocker.patch.object(installer, "reattach", return_value=0)
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_STRICT", "1")
    arm = overlay_arm("paged_attention", "verify", steps=STEPS, build=_swapped_engine)
    assert arm.run.error_type == verify.VerifyMismatch.__name__
    message = arm.run.traceback.rsplit("VerifyMismatch: ", 1)[1]  # the whole message
    problems = [p for p in message.splitlines()[1:] if p.strip()]
    assert len(problems) == 3  # the PA graph's three layers, each one missed
    assert all(p.strip().startswith("pa ") for p in problems)
    # stock opened each task's update, but its relaunch ran unseen, on the swapped attribute
    missed = "stock relaunched nothing in its update, not one _npu_paged_attention"
    assert all(p.endswith(missed) for p in problems), problems
