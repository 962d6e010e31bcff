"""The real vLLM engine on the simulator: shims, tiny models and the arm process.

``apply()`` (called by the simulator's ``install()``, so only when the simulator *is* torch_npu)
registers post-import hooks that give vLLM and vllm-ascend what a CPU host lacks: a CPU worker
device, CPU kernels for the custom ops, ``torch.accelerator`` answers, torch references behind the
Triton launches. The graph capture / update code of vllm-ascend is never touched.
"""

from __future__ import annotations

__all__ = ["apply"]


def apply() -> None:
    """Register every engine shim's post-import hook (idempotent).

    Also arms the tests' negative controls and the one-rank fault when their variables are set
    (see ``control``, ``barrier``, ``order_wait`` and ``rank_fault``).
    """
    from . import ascend_c_ops, barrier, control, gdn_path, order_wait, rank_fault, repairs, shims

    control.install()
    barrier.install()
    order_wait.install()
    rank_fault.install()
    shims.apply()
    ascend_c_ops.install()
    gdn_path.install()  # Gated DeltaNet (Qwen3.5): its own ops, kernels and shims
    repairs.install()
