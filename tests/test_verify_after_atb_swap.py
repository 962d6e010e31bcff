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
from tests.overlay_support import bitwise_equal, run_arm

STEPS = 12


def _swap_after_install(engine: Any) -> None:
    """What NPUWorker.__init__ does, once the overlay is in place and before any capture."""
    import torch_npu
    from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions

    assert "verify.pa" in installer.installed()
    before = torch_npu._npu_paged_attention
    assert before.__name__ == "_npu_paged_attention" and hasattr(before, "__wrapped__")  # ours
    _register_atb_extensions()
    assert torch_npu._npu_paged_attention is not before  # the interceptor is left behind


@pytest.fixture
def stock_pa(engine_factory: Any, atb_lazy: Any) -> Any:
    return run_arm(engine_factory, "paged_attention", "off", steps=STEPS)


def test_verify_checks_pa_after_the_swap(
    engine_factory: Any, atb_lazy: Any, stock_pa: Any, monkeypatch: Any
) -> None:
    atb_lazy.restore_lazy()
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_STRICT", "1")
    arm = run_arm(
        engine_factory, "paged_attention", "verify", steps=STEPS, before_steps=_swap_after_install
    )
    assert arm.error is None  # strict: any mismatch would have raised
    assert arm.counters["verify.tasks"] > 0 and "verify.mismatches" not in arm.counters
    assert arm.counters["verify.reattached"] >= 1  # the PA interceptor was re-attached
    assert arm.snapshot["tasks_per_kind"].get("pa", 0) > 0
    assert bitwise_equal(arm.outputs, stock_pa.outputs)


def test_negative_control_interceptors_left_on_the_swapped_attribute_miss_every_pa_task(
    engine_factory: Any, atb_lazy: Any, stock_pa: Any, monkeypatch: Any, mocker: Any
) -> None:
    """The old wrapping: interceptors stay where they were installed, never re-attached."""
    atb_lazy.restore_lazy()
    mocker.patch.object(installer, "reattach", return_value=0)
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_STRICT", "1")
    arm = run_arm(
        engine_factory, "paged_attention", "verify", steps=STEPS, before_steps=_swap_after_install
    )
    assert isinstance(arm.error, verify.VerifyMismatch)
    problems = str(arm.error).splitlines()[1:]
    assert len(problems) == 3  # the PA graph's three layers, each one missed
    assert all(p.strip().startswith("pa ") for p in problems)
    assert all(p.endswith("stock did not update this task") for p in problems)
