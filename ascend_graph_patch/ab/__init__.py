"""Process-level A/B of the overlay against stock replay (``ascend-graph-patch ab``).

One orchestration (:mod:`.orchestrate`) runs the same workload in a fresh process per arm (stock =
toggle off, patched = on, optionally verify), in ABBA order, each arm with its own compile cache,
and compares what the workers (:mod:`.worker_sim`, :mod:`.worker_vllm`) wrote: greedy tokens,
logits (simulator), eager reference, per-step host update time. :mod:`.report` turns that into the
verdict table, ``report.json``, ``report.md`` and ``update_time.png``.
"""
