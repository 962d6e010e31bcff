"""Process-level A/B of the overlay against stock replay (``ascend-graph-patch ab``).

One orchestration (:mod:`.orchestrate`) runs the same workload in a fresh process per arm (an
eager reference where needed, stock = toggle off, patched = on, optionally verify), stock and
patched in ABBA order, each arm with its own compile cache, and compares (:mod:`.compare`) what
the workers wrote (the simulator's, found by entry point, or :mod:`.worker_vllm`) and what every
process of the arm left in its status file: greedy tokens, logits (harness), the eager reference,
the overlay's counters, per-step host update time. :mod:`.report` turns that into the verdict
table, ``report.json``, ``report.md`` and ``report.png``.
"""
