"""What data and expert parallelism need of a device, given by the engine shims (issue 37).

Each test fails without its shim: the DP start-up's device count (``NPUWorker._init_device``
asserts ``local_world_size <= device_count() if is_available() else 0``), the EP dispatchers'
allocation on the current NPU at layer init, and the HCCL communicator name they read from
``ProcessGroup._get_backend(npu)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from torch_npu_sim.engine import shims


def test_the_worker_sees_its_device_while_it_is_set_up_and_only_then() -> None:
    seen: list[tuple[bool, int]] = []

    def init_device() -> None:  # what the release's _init_device asks at DP > 1
        seen.append((torch.npu.is_available(), torch.npu.device_count()))

    assert shims._cpu_device(init_device, (), {}) == torch.device("cpu")
    assert seen == [(True, 1)]
    assert torch.npu.is_available() is False  # dynamo must not ask for a device stream


def test_the_workers_device_check_passes_at_data_parallelism() -> None:
    """The release's own check, read from its source, passes with the shim and fails without."""
    from vllm_ascend.worker.worker import NPUWorker

    assert getattr(NPUWorker.__dict__["_init_device"], shims.hooks.MARK, False)

    def check() -> None:
        visible = torch.npu.device_count() if torch.npu.is_available() else 0
        assert visible >= 1, "local_world_size (1) must be <= the visible devices"

    shims._cpu_device(check, (), {})
    with pytest.raises(AssertionError):
        check()


def test_an_ep_dispatcher_allocates_on_the_simulated_device() -> None:
    made: list[torch.Tensor] = []

    def dispatcher_init() -> None:  # token_dispatcher.py near line 454
        made.append(torch.tensor([0, 1], dtype=torch.int32, device=torch.npu.current_device()))

    shims._dispatcher_on_host(dispatcher_init, (), {})
    assert made[0].device == torch.device("cpu")
    assert torch.npu.current_device() == 0  # restored
    with pytest.raises((RuntimeError, NotImplementedError)):
        dispatcher_init()  # an int index means the npu device, which has no allocator here


@pytest.fixture
def group() -> Iterator[Any]:
    """A one-rank gloo group: the default one, or this process's own where an earlier test (a
    harness engine) left one initialised."""
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_the_npu_backend_names_its_hccl_communicator(group: Any) -> None:
    backend = group._get_backend(torch.device("npu"))
    name = backend.get_hccl_comm_name(0)
    assert isinstance(name, str) and name
    assert backend.get_hccl_comm_name(1) != name  # one name per rank
    cpu = group._get_backend(torch.device("cpu"))
    assert type(cpu).__name__ == "ProcessGroupGloo"  # other devices untouched
    assert backend.rank() == cpu.rank()  # everything else is the group's own backend


def test_without_the_shim_gloo_has_no_npu_backend(group: Any) -> None:
    torch_own = type(group)._get_backend._sim_torch_get_backend
    with pytest.raises(RuntimeError, match="npu"):
        torch_own(group, torch.device("npu"))
