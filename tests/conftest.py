"""Fixtures for tests that drive the real vllm-ascend graph code through the simulated harness.

The root ``conftest.py`` has already installed the simulator as ``torch_npu``; the harness is
imported lazily here so that test modules which never build an engine do not pay for vLLM.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from torch_npu_sim.workload import Workload


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Whatever a test's code sets in ``os.environ`` is undone after it. Commands run in-process
    set defaults for their own process (``bench`` sets ``VLLM_LOGGING_LEVEL=ERROR``); left in
    place they reach every server and engine a later test starts (CI: a served A/B's servers
    logged nothing at INFO after tests/test_bench.py had run a bench)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def build() -> Iterator[Callable[..., Workload]]:
    """Build harness workloads by catalogue name or scenario (with field overrides).

    Only one engine is alive at a time (engines share vllm-ascend's module globals): building a
    new one closes the previous one, and every engine is closed at teardown.
    """
    engines: list[Workload] = []

    def make(workload: str | Any, **overrides: Any) -> Workload:
        from torch_npu_sim.harness import scenarios

        for engine in engines:
            engine.close()
        engine = scenarios.build(workload, **overrides)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture
def atb_lazy() -> Iterator[Any]:
    """torch_npu's ATB ops as at import (lazy functions), swapped back to that after the test.

    Yields the simulator's ``atb`` module: ``_register_atb_extensions()`` performs the swap.
    """
    from torch_npu_sim import atb

    atb.restore_lazy()
    yield atb
    atb.restore_lazy()


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A seed, stable per test (from the test id), different across tests."""
    return zlib.crc32(request.node.nodeid.encode())


@pytest.fixture
def rng(seed: int) -> random.Random:
    """A random stream from ``seed``."""
    return random.Random(seed)


@pytest.fixture
def rt() -> Iterator[Any]:
    """The simulator's runtime, reset before and after the test (graphs, queues, counters)."""
    from torch_npu_sim import runtime

    runtime.reset()
    yield runtime
    runtime.reset()


@pytest.fixture
def detector(rt: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The runtime with the happens-before race detector counting (fresh state)."""
    from torch_npu_sim import happens_before

    monkeypatch.setenv(happens_before.ENV_VAR, "count")
    rt.reset()
    yield rt
    monkeypatch.delenv(happens_before.ENV_VAR)
    rt.reset()
