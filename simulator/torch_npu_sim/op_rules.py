"""What the real attention ops refuse at launch, so the simulator refuses it too.

The kernels' own checks live in CANN, not in the torch-npu wheel; what torch-npu 2.10.0.post4
says about them is its operator documentation (``torch_npu/_op_plugin_docs.py`` for FIA and FIA
v2, ``torch_npu/op_plugin/atb/_atb_api_docs.py`` for ATB's paged attention), its meta
registrations (``op_plugin/meta/_meta_registrations.py``), its own graph handlers
(``npu/_npugraph_handlers/``) and the error strings of ``lib/libop_plugin_atb.so``. Each rule
below names its source; ``docs/simulator.md`` lists them with their negative controls, and what
the wheel leaves open.

A rule runs wherever the real op's host side would check it: at every eager launch (the op
bodies call it), at a capture inside a task group and at every relaunch inside a task update
(``runtime.SimOp`` calls it with ``in_graph=True``, before the task is recorded or its arguments
replaced). A refusal is an :class:`OpRefused` naming the op and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

Tensor = torch.Tensor

#: Layouts whose query is ``(T, N, D)``: the batch is the number of cumulative query ends.
TND_LIKE = frozenset({"TND", "TND_NTD", "NTD_TND"})
#: The query/key heads ratio FIA accepts at most ("num_heads与num_key_value_heads的比值不能大于64").
MAX_GQA_RATIO = 64


class OpRefused(RuntimeError):
    """A launch the real op refuses (aclnn's host-side check fails: a RuntimeError there too)."""

    def __init__(self, op: str, rule: str, detail: str) -> None:
        super().__init__(f"{op} refuses this launch [{rule}]: {detail}")
        self.op = op
        self.rule = rule


def _host_list(x: Any) -> list[int] | None:
    if x is None:
        return None
    if isinstance(x, Tensor):
        return [int(v) for v in x.reshape(-1).tolist()]
    return [int(v) for v in x]


def _in_layout(layout: str) -> str:
    return layout.split("_", 1)[0] if layout not in TND_LIKE else layout


def fia_rules(op: str, a: Mapping[str, Any], *, v2: bool, in_graph: bool) -> None:
    """FIA (v1) and FIA v2, functional and ``.out``; ``a`` maps every parameter to its value."""
    query, key, value = a["query"], a["key"], a["value"]
    layout = a["input_layout"]
    num_heads = a["num_query_heads" if v2 else "num_heads"]
    num_kv_heads = a["num_key_value_heads"] or num_heads
    q_name, kv_name = (
        ("actual_seq_qlen", "actual_seq_kvlen")
        if v2
        else ("actual_seq_lengths", "actual_seq_lengths_kv")
    )
    q_lens, kv_lens = _host_list(a[q_name]), _host_list(a[kv_name])
    block_table = a["block_table"]
    query_rope, key_rope = a["query_rope"], a["key_rope"]

    def refuse(rule: str, detail: str) -> None:
        raise OpRefused(op, rule, detail)

    # heads: the meta registration's check, and the documented GQA limits
    if num_heads <= 0:
        refuse("fia-heads", f"num_heads should be greater than 0, got {num_heads}")
    if num_heads % num_kv_heads or num_heads // num_kv_heads > MAX_GQA_RATIO:
        refuse(
            "fia-heads",
            f"num_heads {num_heads} must be a multiple of num_key_value_heads {num_kv_heads}, "
            f"at most {MAX_GQA_RATIO} times it",
        )

    # the relaunch's workspace (.out): "workspace: 一维Device侧的Input Tensor". Whether a launch
    # inside a graph may leave it out (workspace=None) the wheel does not settle: the docstring's
    # "需传入workspace tensor" is about the aclgraph tiling-sink case only, and the release's
    # model runner v2 captures its draft prefill's FIA .out with workspace=None. Accepted.
    workspace = a.get("workspace")
    if workspace is not None and workspace.dim() != 1:
        refuse("fia-workspace-1d", f"workspace must be 1-D, got {tuple(workspace.shape)}")

    # lengths against the batch
    tnd = layout in TND_LIKE
    if tnd:
        if q_lens is None:
            refuse("fia-tnd-lengths", f"input_layout {layout} needs {q_name}")
        batch = len(q_lens)
        if any(v < 0 for v in q_lens) or any(
            b < p for p, b in zip(q_lens, q_lens[1:], strict=False)
        ):
            refuse(
                "fia-tnd-lengths",
                f"{q_name} must be non-negative cumulative ends, non-decreasing: {q_lens}",
            )
        if kv_lens is None:
            refuse("fia-tnd-lengths", f"input_layout {layout} needs {kv_name}")
        if len(kv_lens) != batch:
            refuse(
                "fia-tnd-kv-batch",
                f"{kv_name} has {len(kv_lens)} entries, the batch ({q_name}) {batch}: with "
                "input_layout TND their counts are equal",
            )
    else:
        batch = query.shape[0]
        for name, lens in ((q_name, q_lens), (kv_name, kv_lens)):
            if lens is not None and len(lens) != 1 and len(lens) < batch:
                refuse(
                    "fia-lengths-count",
                    f"{name} has {len(lens)} entries for a batch of {batch}: one, or at least "
                    "the batch",
                )
    if kv_lens is not None and any(v < 0 for v in kv_lens):
        refuse("fia-lengths-count", f"{kv_name} must be non-negative: {kv_lens}")

    # page attention: the block table and the caches
    if block_table is not None:
        if kv_lens is None:
            refuse("fia-paged-table", f"page attention needs {kv_name}")
        if block_table.dim() != 2 or block_table.dtype != torch.int32:
            refuse(
                "fia-paged-table",
                f"block_table must be a 2-D int32 tensor, got {tuple(block_table.shape)} "
                f"{block_table.dtype}",
            )
        if a["block_size"] <= 0:
            refuse(
                "fia-paged-block-size",
                f"page attention needs a block_size (non-zero), got {a['block_size']}",
            )
        if block_table.shape[0] != batch:
            refuse(
                "fia-paged-table",
                f"block_table has {block_table.shape[0]} rows, the batch is {batch}",
            )
        if key.shape != value.shape:
            refuse(
                "fia-paged-kv-shape",
                f"key {tuple(key.shape)} and value {tuple(value.shape)} must have one shape",
            )

    # MLA's rope split
    if (query_rope is None) != (key_rope is None):
        refuse("fia-rope", "query_rope and key_rope are given together or not at all")
    if query_rope is not None:
        for name, rope, base in (("query_rope", query_rope, query), ("key_rope", key_rope, key)):
            base_name = "query" if base is query else "key"
            if rope.dtype != base.dtype:
                refuse("fia-rope", f"{name} {rope.dtype} must have the dtype of {base_name}")
            if tuple(rope.shape[:-1]) != tuple(base.shape[:-1]):
                refuse(
                    "fia-rope",
                    f"{name} {tuple(rope.shape)} must match {base_name} "
                    f"{tuple(base.shape)} in every dimension but the last",
                )

    sinks = a.get("learnable_sink")
    if sinks is not None:
        if _in_layout(layout) not in ("TND", "NTD_TND"):
            refuse("fia-sink", f"learnable_sink takes input_layout TND or NTD_TND, not {layout}")
        if tuple(sinks.shape) != (num_heads,):
            refuse("fia-sink", f"learnable_sink must be ({num_heads},), got {tuple(sinks.shape)}")


def pa_rules(op: str, a: Mapping[str, Any], *, in_graph: bool) -> None:
    """ATB paged attention (``_npu_paged_attention``)."""
    query, key_cache, block_table, out = a["query"], a["key_cache"], a["block_table"], a["out"]
    num_heads, num_kv_heads = a["num_heads"], a["num_kv_heads"]

    def refuse(rule: str, detail: str) -> None:
        raise OpRefused(op, rule, detail)

    lens = _host_list(a["context_lens"])
    if lens is not None and any(v < 0 for v in lens):
        refuse("pa-context-lens", "Invalid context_lens: negative value encountered")
    # How many context lengths a launch may pass against its query tokens and block-table rows
    # the wheel does not settle (``_npu_paged_attention`` has no documentation; the v2 binding's
    # gives context_lens ``[batch]`` beside query and block_table ``[num_tokens, ...]``), so it
    # is not refused: under the one-long metadata fault stock relaunches 17 context lengths for
    # 16 query tokens and block-table rows (docs/simulator.md, "What the wheel does not settle").
    if block_table.dim() != 2 or block_table.dtype != torch.int32:
        refuse(
            "pa-block-table",
            f"block_table must be 2-D int32 [num_tokens, max_blocks], got "
            f"{tuple(block_table.shape)} {block_table.dtype}",
        )
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
        refuse(
            "pa-heads", f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}"
        )
    if query.dim() == 3 and query.shape[1] != num_heads:
        refuse("pa-heads", f"query {tuple(query.shape)} does not have num_heads={num_heads} heads")
    if key_cache.dim() == 4 and key_cache.shape[2] != num_kv_heads:
        refuse(
            "pa-heads",
            f"key_cache {tuple(key_cache.shape)} does not have num_kv_heads={num_kv_heads} heads",
        )
    tokens = query.shape[0]
    if out.shape[0] != tokens:
        refuse("pa-out", f"out {tuple(out.shape)} must have one row per query token ({tokens})")
