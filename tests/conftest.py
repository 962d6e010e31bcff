"""Fixtures for tests that drive the real vllm-ascend graph code through the simulated harness.

The root ``conftest.py`` has already installed the simulator as ``torch_npu``; the harness is
imported lazily here so that test modules which never build an engine do not pay for vLLM.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from torch_npu_sim.harness.target import Scenario, SimEngine


@pytest.fixture
def engine_factory() -> Iterator[Callable[..., SimEngine]]:
    """Build ``SimEngine``s by scenario (name or object, with field overrides).

    Only one engine is alive at a time (engines share vllm-ascend's module globals): building a
    new one closes the previous one, and every engine is closed at teardown.
    """
    engines: list[SimEngine] = []

    def make(scenario: str | Scenario, **overrides: Any) -> SimEngine:
        from torch_npu_sim.harness.scenarios import SCENARIOS
        from torch_npu_sim.harness.target import SimEngine

        for engine in engines:
            engine.close()
        sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
        if overrides:
            sc = dataclasses.replace(sc, **overrides)
        engine = SimEngine(sc)
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
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A random stream, stable per test (seeded from the test id), different across tests."""
    return random.Random(zlib.crc32(request.node.nodeid.encode()))
