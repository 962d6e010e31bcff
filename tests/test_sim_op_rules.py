"""The simulator refuses the launches the real ops refuse (``torch_npu_sim.op_rules``).

Each rule is shown twice: a launch as vllm-ascend makes it is accepted, and the same launch with
one thing wrong (the negative control, named ``test_rule_<rule>...``) is refused with the rule's
name, eagerly and, where the real op checks it at the host side of a relaunch, inside a task
update before the task's arguments are replaced. Before these rules the simulator ran each
refused launch, or failed it with an unrelated error only at replay. Sources: ``op_rules``'s
docstrings and ``docs/simulator.md``, "What the simulated ops refuse".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch_npu

from torch_npu_sim import runtime
from torch_npu_sim.op_rules import OpRefused

Launch = tuple[Callable[..., Any], tuple, dict[str, Any]]


def _cache(blocks: int, bs: int, heads: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(blocks, bs, heads, dim, generator=gen)


def fia_decode(gen: torch.Generator) -> Launch:
    """FIA v1 ``.out`` as ``full_graph_fia`` relaunches it: TND, one token per request, paged."""
    batch, heads, kv_heads, dim, bs = 3, 4, 2, 8, 4
    key = _cache(6, bs, kv_heads, dim, gen).view(6, bs, kv_heads * dim)
    value = _cache(6, bs, kv_heads, dim, gen).view(6, bs, kv_heads * dim)
    query = torch.randn(batch, heads, dim, generator=gen)
    kwargs: dict[str, Any] = dict(
        query=query,
        key=key,
        value=value,
        block_table=torch.tensor([[0, 1], [2, 0], [3, 4]], dtype=torch.int32),
        input_layout="TND",
        block_size=bs,
        actual_seq_lengths=[1, 2, 3],
        actual_seq_lengths_kv=[5, 3, 8],
        num_key_value_heads=kv_heads,
        num_heads=heads,
        scale=0.3,
        sparse_mode=0,
    )
    kwargs["workspace"] = torch_npu._npu_fused_infer_attention_score_get_max_workspace(**kwargs)
    kwargs["out"] = [torch.zeros(batch, heads, dim), torch.zeros(1)]
    return torch_npu.npu_fused_infer_attention_score.out, (), kwargs


def mla_spec_target(gen: torch.Generator) -> Launch:
    """MLA's FIA v2 ``.out`` as ``AscendMLAImpl.update_graph_params`` relaunches an MTP target
    (k = 1): TND_NTD, 2 query rows per request, the latent cache as key and value, rope split."""
    heads, latent, rope, bs = 2, 16, 8, 8
    k_nope = torch.randn(5, 1, bs, latent, generator=gen)
    kwargs: dict[str, Any] = dict(
        query_rope=torch.randn(4, heads, rope, generator=gen),
        key_rope=torch.randn(5, 1, bs, rope, generator=gen),
        num_query_heads=heads,
        num_key_value_heads=1,
        input_layout="TND_NTD",
        atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1),
        sparse_mode=3,
        softmax_scale=0.25,
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        block_size=bs,
        actual_seq_kvlen=[6, 11],
        actual_seq_qlen=[2, 4],
    )
    args = (torch.randn(4, heads, latent, generator=gen), k_nope, k_nope)
    kwargs["workspace"] = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(
        *args, **kwargs
    )
    kwargs["out"] = [torch.zeros(heads, 4, latent), torch.zeros(1)]
    return torch_npu.npu_fused_infer_attention_score_v2.out, args, kwargs


def mla_decode(gen: torch.Generator) -> Launch:
    """A plain MLA target's decode: BNSD_NBSD, the batch is the query's first dimension."""
    heads, latent, rope, bs = 2, 16, 8, 8
    k_nope = torch.randn(5, 1, bs, latent, generator=gen)
    kwargs: dict[str, Any] = dict(
        query_rope=torch.randn(3, heads, 1, rope, generator=gen),
        key_rope=torch.randn(5, 1, bs, rope, generator=gen),
        num_query_heads=heads,
        num_key_value_heads=1,
        input_layout="BNSD_NBSD",
        sparse_mode=0,
        softmax_scale=0.25,
        block_table=torch.tensor([[0], [1], [2]], dtype=torch.int32),
        block_size=bs,
        actual_seq_kvlen=[6, 1, 8],
    )
    args = (torch.randn(3, heads, 1, latent, generator=gen), k_nope, k_nope)
    kwargs["workspace"] = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(
        *args, **kwargs
    )
    kwargs["out"] = [torch.zeros(heads, 3, 1, latent), torch.zeros(1)]
    return torch_npu.npu_fused_infer_attention_score_v2.out, args, kwargs


def fia_sinks(gen: torch.Generator) -> Launch:
    """FIA v2 with learnable sinks (``full_graph_fia_v2``): TND, bottom-right causal."""
    heads, dim, bs = 4, 8, 4
    key = _cache(4, bs, 2, dim, gen).view(4, bs, 2 * dim)
    kwargs: dict[str, Any] = dict(
        query=torch.randn(2, heads, dim, generator=gen),
        key=key,
        value=key.clone(),
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1),
        input_layout="TND",
        block_size=bs,
        actual_seq_qlen=[1, 2],
        actual_seq_kvlen=[3, 7],
        num_key_value_heads=2,
        num_query_heads=heads,
        sparse_mode=3,
        softmax_scale=0.3,
        learnable_sink=torch.randn(heads, generator=gen),
    )
    kwargs["workspace"] = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(**kwargs)
    kwargs["out"] = [torch.zeros(2, heads, dim), torch.zeros(1)]
    return torch_npu.npu_fused_infer_attention_score_v2.out, (), kwargs


def paged_attention(gen: torch.Generator) -> Launch:
    """ATB paged attention as ``full_graph_pa`` relaunches it."""
    tokens, heads, kv_heads, dim, bs = 3, 4, 2, 8, 4
    kwargs: dict[str, Any] = dict(
        query=torch.randn(tokens, heads, dim, generator=gen),
        key_cache=_cache(6, bs, kv_heads, dim, gen),
        value_cache=_cache(6, bs, kv_heads, dim, gen),
        num_kv_heads=kv_heads,
        num_heads=heads,
        scale_value=0.3,
        block_table=torch.tensor([[0, 1], [2, 0], [3, 4]], dtype=torch.int32),
        context_lens=torch.tensor([5, 3, 8], dtype=torch.int32),
        out=torch.zeros(tokens, heads, dim),
    )
    kwargs["workspace"] = torch_npu._npu_paged_attention_get_workspace(**kwargs)
    return torch_npu._npu_paged_attention, (), kwargs


LAUNCHES = {
    "fia": fia_decode,
    "mla_spec_target": mla_spec_target,
    "mla_decode": mla_decode,
    "fia_sinks": fia_sinks,
    "pa": paged_attention,
}


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def refused(launch: Launch, rule: str) -> None:
    op, args, kwargs = launch
    with pytest.raises(OpRefused, match=rf"\[{rule}\]"):
        op(*args, **kwargs)


@pytest.mark.parametrize("name", sorted(LAUNCHES))
def test_launches_as_vllm_ascend_makes_them_are_accepted(name: str, gen, rt) -> None:
    op, args, kwargs = LAUNCHES[name](gen)
    op(*args, **kwargs)


# --- the relaunch's workspace --------------------------------------------------------------------


def _capture(launch: Launch) -> tuple[runtime.NPUGraph, Any]:
    """Capture the launch in a task group, as vllm-ascend's capture does."""
    op, args, kwargs = launch
    graph, stream = runtime.NPUGraph(), runtime.Stream()
    with runtime.stream(stream):
        graph.capture_begin()
        try:
            runtime.graph_task_group_begin(stream)
            op(*args, **kwargs)
            handle = runtime.graph_task_group_end(stream)
        except BaseException:
            graph.abandon_capture()
            raise
        graph.capture_end()
    return graph, handle


@pytest.mark.parametrize("name", ["fia", "mla_spec_target", "mla_decode", "fia_sinks"])
def test_a_none_workspace_in_a_graph_is_accepted(name, gen, rt) -> None:
    """Not a rule: the wheel does not settle that a launch inside a task group or task update
    needs a workspace (``.out``'s "需传入workspace tensor" is about the aclgraph tiling-sink case;
    the workspace is optional in the schema), and the release's model runner v2 captures its
    draft prefill's FIA ``.out`` with ``workspace=None``. Captured and relaunched without one,
    the launch runs (h-simstrict refused it, and the v2 draft prefill with it)."""
    op, args, kwargs = LAUNCHES[name](gen)
    bare = {**kwargs, "workspace": None}
    graph, handle = _capture((op, args, bare))
    update = runtime.Stream()
    runtime.graph_task_update_begin(update, handle)
    op(*args, **bare)
    runtime.graph_task_update_end(update)
    graph.replay()


def test_rule_fia_workspace_1d(gen, rt) -> None:
    op, args, kwargs = fia_decode(gen)
    refused(
        (op, args, {**kwargs, "workspace": kwargs["workspace"].view(2, -1)}), "fia-workspace-1d"
    )


# --- the length lists against the batch and the graph's size -----------------------------------


def test_rule_fia_tnd_kv_batch_refuses_mtp_kv_lengths_padded_to_the_token_count(gen, rt) -> None:
    """The MTP target's KV lengths padded to the graph's token count (4) instead of its request
    count (2): "actual_seq_qlen and actual_seq_kvlen ... the number of elements is the batch"
    (FIA v2, TND). Refused eagerly, and at the relaunch inside a task update, before the task
    is touched (on today's simulator the padded list ran, the extra entries ignored)."""
    op, args, kwargs = mla_spec_target(gen)
    padded = {**kwargs, "actual_seq_kvlen": [6, 11, 0, 0]}
    refused((op, args, padded), "fia-tnd-kv-batch")
    _, handle = _capture((op, args, kwargs))
    update = runtime.Stream()
    runtime.graph_task_update_begin(update, handle)
    with pytest.raises(OpRefused, match=r"\[fia-tnd-kv-batch\]"):
        op(*args, **padded)
    op(*args, **kwargs)
    runtime.graph_task_update_end(update)
    op_v1, args_v1, kwargs_v1 = fia_decode(gen)
    short = {**kwargs_v1, "actual_seq_lengths_kv": [5, 3]}
    refused((op_v1, args_v1, short), "fia-tnd-kv-batch")


@pytest.mark.parametrize("ends", [None, [1, 3, 2], [-1, 1, 2]], ids=["none", "falling", "neg"])
def test_rule_fia_tnd_lengths(ends, gen, rt) -> None:
    op, args, kwargs = fia_decode(gen)
    refused((op, args, {**kwargs, "actual_seq_lengths": ends}), "fia-tnd-lengths")


def test_rule_fia_lengths_count_refuses_a_short_list_for_a_batch_layout(gen, rt) -> None:
    """BNSD (a plain MLA decode): "length 1: every batch the same; at least the batch: the first
    batch entries; other lengths are not supported"."""
    op, args, kwargs = mla_decode(gen)
    refused((op, args, {**kwargs, "actual_seq_kvlen": [6, 1]}), "fia-lengths-count")
    refused((op, args, {**kwargs, "actual_seq_kvlen": [6, -1, 8]}), "fia-lengths-count")
    op(*args, **{**kwargs, "actual_seq_kvlen": [6]})  # one entry: every request the same


# --- tensor shapes and dtypes ---------------------------------------------------------------------


def test_rule_fia_paged_table(gen, rt) -> None:
    """ "block_table: int32 ... must be 2-D, its first dimension equal to B"."""
    op, args, kwargs = fia_decode(gen)
    table = kwargs["block_table"]
    refused((op, args, {**kwargs, "block_table": table.long()}), "fia-paged-table")
    refused((op, args, {**kwargs, "block_table": table[None]}), "fia-paged-table")
    refused((op, args, {**kwargs, "block_table": torch.cat([table, table])}), "fia-paged-table")


@pytest.mark.parametrize("name", ["fia", "mla_spec_target"])
def test_rule_fia_paged_block_size(name, gen, rt) -> None:
    """ "block_size需要传入非0值" (page attention, Q_S = 1): the template's block_size dropped."""
    op, args, kwargs = LAUNCHES[name](gen)
    refused((op, args, {**kwargs, "block_size": 0}), "fia-paged-block-size")


def test_rule_fia_paged_kv_shape_refuses_the_rope_cache_as_key(gen, rt) -> None:
    """The MLA template's ``key`` set to ``k_pe``: "key and value must have one shape" (page
    attention), which the latent cache and the rope cache do not."""
    op, (q_nope, k_nope, _), kwargs = mla_spec_target(gen)
    refused((op, (q_nope, kwargs["key_rope"], k_nope), kwargs), "fia-paged-kv-shape")


def test_rule_fia_rope(gen, rt) -> None:
    """ "query_rope: dtype and format of query; key_rope: of key; shapes equal but D"."""
    op, args, kwargs = mla_spec_target(gen)
    q_pe, k_pe = kwargs["query_rope"], kwargs["key_rope"]
    refused((op, args, {**kwargs, "key_rope": k_pe.double()}), "fia-rope")
    refused((op, args, {**kwargs, "query_rope": q_pe[:2]}), "fia-rope")
    refused((op, args, {**kwargs, "key_rope": None}), "fia-rope")


def test_rule_fia_heads(gen, rt) -> None:
    op, args, kwargs = fia_decode(gen)
    refused((op, args, {**kwargs, "num_key_value_heads": 3}), "fia-heads")


def test_rule_fia_sink(gen, rt) -> None:
    """ "learnable_sink: shape (Q_N,); TND and NTD_TND only"."""
    op, args, kwargs = fia_sinks(gen)
    refused((op, args, {**kwargs, "learnable_sink": kwargs["learnable_sink"][:2]}), "fia-sink")


def test_rule_pa_context_lens(gen, rt) -> None:
    """ "Invalid context_lens: negative value encountered" (``libop_plugin_atb.so``)."""
    op, args, kwargs = paged_attention(gen)
    refused((op, args, {**kwargs, "context_lens": torch.tensor([5, -1, 8])}), "pa-context-lens")


def test_rule_pa_block_table(gen, rt) -> None:
    """ "block_table: int32, shape [num_tokens, max_num_blocks_per_query]"."""
    op, args, kwargs = paged_attention(gen)
    table = kwargs["block_table"]
    refused((op, args, {**kwargs, "block_table": table.long()}), "pa-block-table")
    refused((op, args, {**kwargs, "block_table": table[0]}), "pa-block-table")


def test_rule_pa_heads_and_out(gen, rt) -> None:
    op, args, kwargs = paged_attention(gen)
    refused((op, args, {**kwargs, "num_kv_heads": 3}), "pa-heads")
    refused((op, args, {**kwargs, "out": kwargs["out"][:2]}), "pa-out")
