"""Torch references behind the Triton kernel launches the engine makes on a host without Triton.

Without Triton, vLLM's ``triton.jit`` placeholder returns the kernel's Python function, and a
launch ``kernel[grid](...)`` fails ("'function' object is not subscriptable"). On the NPU,
triton-ascend compiles and runs these kernels. Here the placeholder's decorators return a
:class:`KernelStub`: ``stub[grid](*args, **kwargs)`` runs the kernel's torch reference from
:data:`REFERENCES` (keyed by the kernel's module and name), and a kernel without one raises
naming it, so a missing reference is loud. vLLM's choice of code paths (``HAS_TRITON``) is left as
it is: only kernels launched whatever ``HAS_TRITON`` says need a reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..runtime import SimulatorError

Reference = Callable[..., None]


class KernelStub:
    """A jitted kernel's stand-in: ``stub[grid](...)`` runs its torch reference."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.key = f"{fn.__module__}.{fn.__qualname__}"
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        reference = REFERENCES.get(self.key)
        if reference is None:
            raise SimulatorError(
                f"Triton kernel {self.key} has no torch reference in the simulator"
            )
        return functools.partial(
            reference, tuple(grid) if isinstance(grid, (tuple, list)) else grid
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise SimulatorError(f"Triton kernel {self.key} called without a launch grid")

    def __repr__(self) -> str:
        return f"<triton kernel stub {self.key}>"


def _decorator(*args: Any, **kwargs: Any) -> Any:
    """``triton.jit`` / ``autotune`` / ``heuristics``, bare or with arguments."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        fn = args[0]
        return fn if isinstance(fn, KernelStub) else KernelStub(fn)
    return _decorator


def install(triton_utils: Any) -> None:
    """Point the Triton placeholder's decorators at :class:`KernelStub` (never a real Triton)."""
    from vllm.triton_utils.importing import TritonPlaceholder

    placeholder = triton_utils.triton
    if not isinstance(placeholder, TritonPlaceholder):
        return
    for name in ("jit", "autotune", "heuristics"):
        setattr(placeholder, name, _decorator)


# --------------------------------------------------------------------------------------------
# References, one per kernel: ``reference(grid, *launch args, **launch kwargs)``.


def compute_slot_mapping(
    grid: tuple[int, ...],
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_table_stride: int,
    block_size: int,
    slot_mapping: torch.Tensor,
    *,
    TOTAL_CP_WORLD_SIZE: int,  # noqa: N803 - the kernel's constexpr names
    TOTAL_CP_RANK: int,  # noqa: N803
    CP_KV_CACHE_INTERLEAVE_SIZE: int,  # noqa: N803
    PAD_ID: int,  # noqa: N803
    BLOCK_SIZE: int,  # noqa: N803
) -> None:
    """vLLM's ``_compute_slot_mapping_kernel``: one program per request plus one that pads.

    Token ``t`` of request ``r`` (``query_start_loc[r] <= t < query_start_loc[r + 1]``) gets slot
    ``block_table[r, pos // vbs] * block_size + local offset`` when this context-parallel rank holds
    it, else ``PAD_ID``; slots ``num_tokens .. max_num_tokens`` get ``PAD_ID``.
    """
    num_reqs = grid[0] - 1
    starts = query_start_loc[: num_reqs + 1].long()
    counts = starts[1:] - starts[:-1]
    req = torch.repeat_interleave(torch.arange(num_reqs), counts)  # the ranges tile the tokens
    tokens = torch.arange(int(starts[0]), int(starts[-1]))
    world, rank, interleave = TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK, CP_KV_CACHE_INTERLEAVE_SIZE
    pos = positions[tokens].long()
    virtual = block_size * world
    index = pos // virtual
    numbers = block_table.reshape(-1)[req * block_table_stride + index].long()
    offsets = pos - index * virtual
    local = (offsets // interleave) % world == rank
    local_offsets = (offsets // (world * interleave)) * interleave + offsets % interleave
    slots = torch.where(local, numbers * block_size + local_offsets, PAD_ID)
    slot_mapping[tokens] = slots.to(slot_mapping.dtype)
    slot_mapping[num_tokens:max_num_tokens] = PAD_ID


REFERENCES: dict[str, Reference] = {
    "vllm.v1.worker.block_table._compute_slot_mapping_kernel": compute_slot_mapping,
}

__all__ = ["REFERENCES", "KernelStub", "install"]
