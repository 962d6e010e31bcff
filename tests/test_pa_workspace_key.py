"""The key under which the overlay shares one PA workspace per pass is enough.

The overlay recomputes a PA task's workspace from the step's context lengths and, within one pass
(``OwnedGraph.resolve``), computes it once per (provider group, metadata object): tasks share it
when they read the same metadata object (so the same lengths object) and have equal
``pa_signature`` (shape and dtype of query, caches, block table and output, and the head counts).
The simulator's getter sizes a workspace from every one of those, and from the lengths' values,
and a launch given a smaller workspace than its own arguments need raises. So: two tasks that
differ in any one component run correctly under the real key, a key without a signature component
hands the second task a workspace that is too small, and one without the metadata identity hands
it the first task's lengths. Values that do not size memory (the scale, the block table's entries)
may differ between tasks that share.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ascend_graph_patch.core.graph import OwnedGraph, TargetSource, UpdateTask
from ascend_graph_patch.core.providers import PA_SHAPED, LengthsWorkspaceProvider, pa_signature
from torch_npu_sim import ops


def _template(**changes: Any) -> dict[str, Any]:
    template = {
        "query": torch.randn(2, 2, 8),
        "key_cache": torch.randn(4, 4, 1, 8),
        "value_cache": torch.randn(4, 4, 1, 8),
        "num_kv_heads": 1,
        "num_heads": 2,
        "scale_value": 0.5,
        "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "context_lens": None,
        "out": torch.zeros(2, 2, 8),
        "workspace": None,
    }
    template.update(changes)
    return template


#: One component each: task "b" differs from task "a" there only, and needs a larger workspace.
VARIANTS: dict[str, dict[str, Any]] = {
    "query": {"query": torch.randn(4, 2, 8), "out": torch.zeros(4, 2, 8)},  # out must hold it
    "out": {"out": torch.zeros(2, 2, 8, dtype=torch.float64)},  # one row per query token
    "key_cache": {"key_cache": torch.randn(4, 4, 1, 8, dtype=torch.float64)},
    "value_cache": {"value_cache": torch.randn(4, 4, 1, 8, dtype=torch.float64)},
    "block_table": {"block_table": torch.zeros(2, 8, dtype=torch.int32)},
}


#: The real torch-npu 2.10.0.post4's registered schemas (read from the wheel, not installed).
FIXTURE = Path(__file__).parent / "fixtures" / "torch_npu_2.10.0.post4.json"


def _getter_tensor_arguments() -> set[str]:
    """The tensors the real PA workspace getter receives, from its registered schema: each can
    size the workspace. ``context_lens`` is the host lengths the key holds by identity."""
    schemas = json.loads(FIXTURE.read_text())["schemas"]
    schema = torch._C.parse_schema(schemas["atb::_npu_paged_attention_get_workspace"])
    tensors = {a.name for a in schema.arguments if isinstance(a.type, torch._C.TensorType)}
    return tensors - {"context_lens"}


def test_the_signature_and_the_variants_cover_every_tensor_the_real_getter_receives() -> None:
    """The signature's shaped names (and this file's one-component variants) are the real
    getter's tensor arguments, read from its schema, not a second hand list: a tensor the
    release's getter gains would be missing from both and could share a workspace too small."""
    assert set(PA_SHAPED) == _getter_tensor_arguments()
    assert set(VARIANTS) == set(PA_SHAPED)


def _task(name: str, template: dict[str, Any], shaped: tuple[str, ...] = PA_SHAPED) -> UpdateTask:
    provider = LengthsWorkspaceProvider(
        kind="pa",
        lengths_key="context_lens",
        attribute="seq_lens",
        workspace_for=ops._npu_paged_attention_get_workspace,
        template=template,
        signature=pa_signature(template, shaped),
    )
    return UpdateTask(
        kind="pa",
        metadata_key=name,
        step=0,
        layer_name=name,
        handle=None,
        event=None,
        op=ops._npu_paged_attention,
        template=template,
        provider=provider,
    )


def _one_pass(tasks: list[UpdateTask], metadata: dict[str, Any]) -> list[Any]:
    """Resolve the tasks as one replay does, then launch each with its resolved arguments."""
    graph = OwnedGraph(role="target", descriptor=None)
    for task in tasks:
        graph.add(task)
    resolved = graph.resolve(TargetSource(metadata))
    for _, launch in resolved:
        ops._npu_paged_attention(**launch)
    return [launch["workspace"] for _, launch in resolved]


def _lengths(*values: int) -> SimpleNamespace:
    return SimpleNamespace(seq_lens=torch.tensor(values))


def test_tasks_reading_other_lengths_get_their_own_workspace() -> None:
    first, second = _one_pass(
        [_task("a", _template()), _task("b", _template())],
        {"a": _lengths(2, 3), "b": _lengths(7, 8)},
    )
    assert first is not second


def test_negative_control_a_key_without_the_lengths_hands_one_task_the_others(mocker) -> None:
    """Without the metadata identity the second task would share the first one's lengths along
    with its workspace: attention over the wrong context lengths."""
    mocker.patch("ascend_graph_patch.core.graph.id", return_value=0, create=True)
    metadata = {"a": _lengths(2, 3), "b": _lengths(7, 8)}
    graph = OwnedGraph(role="target", descriptor=None)
    for name in metadata:
        graph.add(_task(name, _template()))
    (_, first), (_, second) = graph.resolve(TargetSource(metadata))
    assert second["context_lens"] is metadata["a"].seq_lens
    assert second["workspace"] is first["workspace"]


@pytest.mark.parametrize("component", sorted(VARIANTS))
def test_tasks_differing_in_one_component_get_their_own_workspace(component: str) -> None:
    shared = _lengths(2, 3)  # one metadata object: the layers of one KV-cache group
    first, second = _one_pass(
        [_task("a", _template()), _task("b", _template(**VARIANTS[component]))],
        {"a": shared, "b": shared},
    )
    assert first is not second


@pytest.mark.parametrize("component", sorted(VARIANTS))
def test_negative_control_a_key_without_the_component_shares_a_workspace_too_small(
    component: str,
) -> None:
    dropped = {"query", "out"} if component == "query" else {component}
    reduced = tuple(n for n in PA_SHAPED if n not in dropped)
    shared = _lengths(2, 3)
    with pytest.raises(RuntimeError, match="PA workspace of .* smaller"):
        _one_pass(
            [
                _task("a", _template(), reduced),
                _task("b", _template(**VARIANTS[component]), reduced),
            ],
            {"a": shared, "b": shared},
        )


def test_tasks_differing_only_in_values_that_size_nothing_share_one_workspace() -> None:
    a = _template()
    b = _template(
        scale_value=0.25,
        block_table=torch.tensor([[3, 2], [1, 0]], dtype=torch.int32),
        query=torch.randn(2, 2, 8),
        key_cache=torch.randn(4, 4, 1, 8),
    )
    shared = _lengths(5, 6)
    first, second = _one_pass([_task("a", a), _task("b", b)], {"a": shared, "b": shared})
    assert first is second


def test_the_signature_covers_every_tensor_the_real_getter_receives() -> None:
    """The getter's registered tensor inputs: the lengths come with the metadata object, the rest
    are in ``pa_signature``; a new tensor argument in the schema would need a place in the key."""
    from tests import torch_npu_conformance as conf

    tensors = {
        a.name
        for a in conf.schema("atb::_npu_paged_attention_get_workspace").arguments
        if str(a.type) == "Tensor"
    }
    assert tensors == {*PA_SHAPED, "context_lens"}
