"""Per-step host update time, measured inside an arm's worker with ``wrapt`` wrappers.

The wrappers sit on the update entry points the runner calls (``update_full_graph_params`` as the
calling module sees it), ABOVE whatever the overlay installed underneath, so stock and patched arms
are timed at the same seam. A worker on a simulated runtime can name the runtime's task executor
as the ``device_target``: what it runs on the host on behalf of the "device" (the replayed graph
tasks an ``ExternalEvent.record`` releases) is subtracted, because on hardware it is asynchronous.
"""

from __future__ import annotations

import time
from typing import Any

import wrapt

from ascend_graph_patch import gate

#: Entry points timed in vLLM: every module that imported ``update_full_graph_params`` by name,
#: as the release line lists them (the matching line, else the newest known).
VLLM_TARGETS: tuple[str, ...] = gate.candidate_line().update_entry_points
#: Calls counted beside them (name -> ``module:attr``): an idle data-parallel rank's dummy batches.
VLLM_COUNTED: dict[str, str] = dict(gate.candidate_line().counted_entry_points)


class UpdateTimer:
    """Collects one sample (ns of host time) per timed update call."""

    def __init__(self, on_sample: Any = None) -> None:
        self.samples: list[int] = []
        self.on_sample = on_sample  # called after each sample (e.g. a throttled file writer)
        self.device_ns = 0
        self.installed: list[str] = []
        self.counts: dict[str, int] = {}
        self._depth = 0
        self._device_depth = 0

    # wrapt wrappers ---------------------------------------------------------------------------

    def _update(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if self._depth:  # nested entry point (one module calling another): time the outer one
            return wrapped(*args, **kwargs)
        self._depth += 1
        device0 = self.device_ns
        t0 = time.perf_counter_ns()
        try:
            return wrapped(*args, **kwargs)
        finally:
            elapsed = time.perf_counter_ns() - t0 - (self.device_ns - device0)
            self._depth -= 1
            self.samples.append(max(elapsed, 0))
            if self.on_sample is not None:
                self.on_sample()

    def _device(self, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if self._device_depth or not self._depth:
            return wrapped(*args, **kwargs)
        self._device_depth += 1
        t0 = time.perf_counter_ns()
        try:
            return wrapped(*args, **kwargs)
        finally:
            self.device_ns += time.perf_counter_ns() - t0
            self._device_depth -= 1

    def _counter(self, name: str) -> Any:
        def count(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            try:
                return wrapped(*args, **kwargs)
            finally:
                self.counts[name] = self.counts.get(name, 0) + 1
                if self.on_sample is not None:
                    self.on_sample()

        return count

    # installation -----------------------------------------------------------------------------

    def install(
        self,
        targets: tuple[str, ...],
        device_target: str | None = None,
        counted: dict[str, str] | None = None,
    ) -> None:
        """Wrap each ``module:attr`` when (or as soon as) its module is imported; ``counted``:
        name -> ``module:attr`` whose calls are only counted (``counts[name]``)."""
        for target in targets:
            self._hook(target, self._update)
        for name, target in (counted or {}).items():
            self._hook(target, self._counter(name))
        if device_target:
            self._hook(device_target, self._device)

    def _hook(self, target: str, wrapper: Any) -> None:
        module_name, _, attr = target.partition(":")

        def apply(module: Any) -> None:
            try:
                wrapt.wrap_function_wrapper(module, attr, wrapper)
            except AttributeError:  # seam absent in this version: not timed
                return
            self.installed.append(target)

        wrapt.register_post_import_hook(apply, module_name)

    def take(self, start: int) -> list[int]:
        """Samples recorded since index ``start``."""
        return self.samples[start:]


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in [0, 100]); ``None`` for no data."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)
