"""Non-owning tensor references (``torch_npu._C._weak_ref_tensor``) and whether their owner lives.

On hardware the weak reference is a tensor over the same device memory that does not own it: once
every owning tensor is gone, the memory goes back to the caching allocator, and a graph task (or a
task update) still using that address reads or writes memory another tensor may own by then.

Here the alias shares its owner's storage, so host memory stays valid (nothing in the simulator
ever reads freed memory), but the simulator counts the owners: the storage's use count minus the
live weak aliases on it (and the one reference the count itself takes). A captured task or a task
update whose arguments include an alias without owners is a use after free; the runtime raises.

Owners are whatever holds the storage: tensors and their views; the captured aten tasks, which
keep the tensors they read and write; and a captured graph, which keeps every allocation made
while it captured (``NPUGraph._reserved``). That last one is the private memory pool: vllm-ascend
weak-references the FIA workspace after capture and keeps only a weak reference to the softmax LSE
placeholder, both allocated inside the capture, and the pool keeps that memory for its graphs (a
later capture into the same pool may reuse it, which is not modelled). Memory from outside a
capture (KV caches, persistent metadata buffers, weights) is owned by its tensors only: when they
go, a graph still using the address is a use after free. A view taken of a weak alias counts as
an owner, which is more lenient than hardware, where such a view is just as non-owning.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

_ALIAS_STORAGE: dict[int, int] = {}  # id(alias) -> its storage's key, while the alias lives
_ALIASES_PER_STORAGE: dict[int, int] = {}  # storage key -> live aliases on it


def _forget(alias_id: int, key: int) -> None:
    _ALIAS_STORAGE.pop(alias_id, None)
    left = _ALIASES_PER_STORAGE.get(key, 0) - 1
    if left > 0:
        _ALIASES_PER_STORAGE[key] = left
    else:
        _ALIASES_PER_STORAGE.pop(key, None)


def weak_ref_tensor(tensor: Any) -> Any:
    """``torch_npu._C._weak_ref_tensor``: same memory, shape and strides; owns nothing."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    alias = tensor.detach()
    try:
        key = alias.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):  # no plain storage (fake, meta)
        return alias
    _ALIAS_STORAGE[id(alias)] = key
    _ALIASES_PER_STORAGE[key] = _ALIASES_PER_STORAGE.get(key, 0) + 1
    weakref.finalize(alias, _forget, id(alias), key)
    return alias


def is_weak(tensor: Any) -> bool:
    return id(tensor) in _ALIAS_STORAGE


def weak_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
    """The weak aliases among launch arguments (top level and inside lists, e.g. ``out=[...]``)."""
    if not _ALIAS_STORAGE:
        return ()
    found = []
    for value in itertools.chain(args, kwargs.values()):
        if type(value) in (list, tuple):
            found.extend(v for v in value if id(v) in _ALIAS_STORAGE)
        elif id(value) in _ALIAS_STORAGE:
            found.append(value)
    return tuple(found)


def owners(alias: torch.Tensor) -> int:
    """How many references besides weak aliases hold ``alias``'s memory."""
    storage = alias.untyped_storage()
    uses = torch._C._storage_Use_Count(storage._cdata)
    return uses - 1 - _ALIASES_PER_STORAGE.get(storage._cdata, 0)


def freed(weak: tuple[torch.Tensor, ...]) -> str | None:
    """A description of the first alias in ``weak`` whose owner is gone, or None."""
    for alias in weak:
        if id(alias) in _ALIAS_STORAGE and owners(alias) <= 0:
            return f"tensor{tuple(alias.shape)} {alias.dtype} at {alias.data_ptr():#x}"
    return None
