"""The graph model on its own: resolution is pure, apply is exactly-once, keys are not positions."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from ascend_graph_patch.core.graph import (
    CaptureRefused,
    DraftSource,
    OwnedGraph,
    ResolutionError,
    TargetSource,
    UpdateTask,
)
from ascend_graph_patch.core.kinds import DRAFT, FIA, FIA_V2, PA, TARGET
from ascend_graph_patch.core.tasks import make_provider
from ascend_graph_patch.lines.v0_23 import LINE


def provider(
    kind=FIA,
    role=TARGET,
    *,
    workspace=lambda: "ws",
    sliding_window=None,
    sparse_mode=3,
    runtime=None,
    template=None,
):
    """The provider the task factory builds for ``kind`` on the supported line."""
    fields = {"sliding_window": sliding_window}
    template = template if template is not None else {"sparse_mode": sparse_mode}
    return make_provider(LINE.layouts[kind], fields, template, role, runtime, workspace)


class FakeRuntime:
    """Records the update protocol as a flat list of events."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def graph_task_update_begin(self, stream, handle):
        self.calls.append(("begin", handle))

    def graph_task_update_end(self, stream):
        self.calls.append(("end",))

    @contextlib.contextmanager
    def stream(self, stream):
        self.calls.append(("stream", stream))
        yield


class FakeEvent:
    def __init__(self, runtime: FakeRuntime, name: str) -> None:
        self.runtime, self.name = runtime, name

    def record(self, stream):
        self.runtime.calls.append(("record", self.name))


def metadata(q, kv, causal=True, table=None):
    return SimpleNamespace(
        actual_seq_lengths_q=q,
        seq_lens_list=kv,
        block_tables=table if table is not None else torch.zeros(1, 1),
        causal=causal,
        seq_lens=torch.tensor(kv),
    )


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


def make_task(runtime, name, key, step=0, provider=None, op=None, kind="fia"):
    launched = []
    task = UpdateTask(
        kind=kind,
        metadata_key=key,
        step=step,
        layer_name=name,
        handle=f"h-{name}-{step}",
        event=FakeEvent(runtime, f"e-{name}-{step}"),
        op=op or (lambda **kw: (runtime.calls.append(("op", name, step)), launched.append(kw))),
        template={"query": "q", "block_table": "captured"},
        provider=provider or globals()["provider"](),
    )
    return task, launched


def test_apply_runs_the_protocol_once_per_task_in_capture_order(runtime):
    graph = OwnedGraph(role="target", descriptor=4)
    t0, l0 = make_task(runtime, "layers.0", "layers.0")
    t1, l1 = make_task(runtime, "layers.1", "layers.1")
    graph.add(t0)
    graph.add(t1)
    md = {"layers.1": metadata([4], [7]), "layers.0": metadata([4], [9])}  # order differs
    resolved = graph.resolve(TargetSource(md))
    assert runtime.calls == []  # resolution touches no runtime
    graph.apply(resolved, "upd", runtime)
    assert runtime.calls == [
        ("stream", "upd"),
        ("begin", "h-layers.0-0"),
        ("op", "layers.0", 0),
        ("end",),
        ("record", "e-layers.0-0"),
        ("begin", "h-layers.1-0"),
        ("op", "layers.1", 0),
        ("end",),
        ("record", "e-layers.1-0"),
    ]
    assert l0[0]["actual_seq_lengths_kv"] == [9] and l1[0]["actual_seq_lengths_kv"] == [7]
    assert l0[0]["workspace"] == "ws" and l0[0]["query"] == "q"


def test_missing_metadata_key_fails_before_any_runtime_call(runtime):
    graph = OwnedGraph(role="target", descriptor=4)
    graph.add(make_task(runtime, "layers.0", "layers.0")[0])
    graph.add(make_task(runtime, "layers.1", "layers.1")[0])
    with pytest.raises(ResolutionError, match="layers.1"):
        graph.resolve(TargetSource({"layers.0": metadata([4], [1])}))
    assert runtime.calls == []


def test_provider_exception_becomes_resolution_error(runtime):
    class Broken:
        kind = "fia"

        def bind(self, md, launch, cache):
            raise RuntimeError("boom")

    graph = OwnedGraph(role="target", descriptor=4)
    graph.add(make_task(runtime, "layers.0", "layers.0", provider=Broken())[0])
    with pytest.raises(ResolutionError, match="boom"):
        graph.resolve(TargetSource({"layers.0": metadata([4], [1])}))


def test_failed_launch_still_records_every_remaining_event(runtime):
    def failing(**kw):
        raise RuntimeError("launch failed")

    graph = OwnedGraph(role="target", descriptor=4)
    graph.add(make_task(runtime, "a", "a")[0])
    graph.add(make_task(runtime, "b", "b", op=failing)[0])
    graph.add(make_task(runtime, "c", "c")[0])
    md = {k: metadata([4], [1]) for k in "abc"}
    with pytest.raises(RuntimeError, match="launch failed"):
        graph.apply(graph.resolve(TargetSource(md)), "upd", runtime)
    records = [c[1] for c in runtime.calls if c[0] == "record"]
    assert records == ["e-a-0", "e-b-0", "e-c-0"]
    assert runtime.calls.count(("end",)) == 2  # the failed update scope is closed too


def test_draft_tasks_bind_by_key_and_step_not_position(runtime):
    graph = OwnedGraph(role="draft", descriptor=4)
    tasks = {}
    # captured step-major, but metadata per step lists the layers in another order
    for step in range(3):
        for name in ("mtp.0", "mtp.1"):
            task, launched = make_task(
                runtime, name, name, step, provider(role=DRAFT, workspace=lambda: None)
            )
            graph.add(task)
            tasks[(name, step)] = launched
    per_step = [
        {"mtp.1": metadata([4], [100 + s], causal=False), "mtp.0": metadata([4], [s])}
        for s in range(3)
    ]
    graph.apply(graph.resolve(DraftSource(per_step)), "upd", runtime)
    for step in range(3):
        assert tasks[("mtp.0", step)][0]["actual_seq_lengths_kv"] == [step]
        assert tasks[("mtp.1", step)][0]["actual_seq_lengths_kv"] == [100 + step]
        assert tasks[("mtp.1", step)][0]["sparse_mode"] == 0  # non-causal draft step
        assert tasks[("mtp.0", step)][0]["sparse_mode"] == 3  # the captured mode, causal step


def test_draft_with_too_few_steps_refuses(runtime):
    graph = OwnedGraph(role="draft", descriptor=4)
    graph.add(make_task(runtime, "mtp.0", "mtp.0", step=1)[0])
    with pytest.raises(ResolutionError, match="draft step 1 missing"):
        graph.resolve(DraftSource([{"mtp.0": metadata([1], [1])}]))


def test_duplicate_task_key_is_rejected(runtime):
    graph = OwnedGraph(role="draft", descriptor=4)
    graph.add(make_task(runtime, "mtp.0", "mtp.0", step=0)[0])
    with pytest.raises(CaptureRefused, match="duplicate"):
        graph.add(make_task(runtime, "mtp.0", "mtp.0", step=0)[0])


def test_kv_sharing_layers_share_a_metadata_key_but_are_distinct_tasks(runtime):
    graph = OwnedGraph(role="target", descriptor=4)
    graph.add(make_task(runtime, "layers.2", "layers.0")[0])
    graph.add(make_task(runtime, "layers.0", "layers.0")[0])
    assert len(graph.tasks) == 2


def bound(provider, md, launch=None, cache=None):
    launch = {} if launch is None else launch
    provider.bind(md, launch, {} if cache is None else cache)
    return launch


def test_sliding_window_keeps_the_captured_block_table():
    table = torch.arange(4).view(1, 4)
    md = metadata([4], [3], table=table)
    swa = bound(provider(sliding_window=64), md)
    dense = bound(provider(), md)
    draft = provider(role=DRAFT, sliding_window=64)
    assert "block_table" not in swa
    assert dense["block_table"] is table
    assert bound(draft, md)["block_table"] is table  # drafts always rebind


def test_fia_binds_the_fields_stock_binds():
    md = metadata([2, 4], [7, 9])
    launch = bound(provider(), md)
    assert launch["actual_seq_lengths"] is md.actual_seq_lengths_q
    assert launch["actual_seq_lengths_kv"] is md.seq_lens_list
    assert launch["workspace"] == "ws" and "sparse_mode" not in launch  # target: captured mode
    v2 = bound(provider(FIA_V2), md)
    assert v2["actual_seq_qlen"] is md.actual_seq_lengths_q
    assert v2["actual_seq_kvlen"] is md.seq_lens_list and "block_table" not in v2


def test_a_causal_draft_step_after_a_non_causal_one_restores_the_captured_mode():
    draft = provider(role=DRAFT, workspace=lambda: None, sparse_mode=3)
    launch = bound(draft, metadata([1], [1], causal=False))
    assert launch["sparse_mode"] == 0
    assert bound(draft, metadata([1], [1], causal=True), launch)["sparse_mode"] == 3


def test_graph_workspace_is_read_once_per_pass():
    reads = []
    getter = lambda: reads.append(1) or "ws"  # noqa: E731
    v2 = provider(FIA_V2, workspace=getter)
    cache: dict = {}
    for _ in range(5):
        assert bound(v2, metadata([4], [1]), cache=cache)["workspace"] == "ws"
    assert len(reads) == 1


def test_a_graph_without_a_captured_workspace_reads_it_once_too():
    reads = []
    v2 = provider(FIA_V2, workspace=lambda: reads.append(1))
    cache: dict = {}
    for _ in range(3):
        assert bound(v2, metadata([4], [1]), cache=cache)["workspace"] is None
    assert len(reads) == 1


def test_pa_workspace_recomputed_from_context_lens_and_shared_by_signature():
    calls = []

    def get_workspace(**kw):
        calls.append(kw["context_lens"])
        return torch.empty(int(kw["context_lens"].sum()))

    query = torch.zeros(4, 2, 8)
    cache_t = torch.zeros(3, 16, 1, 8)

    def template_with(table):
        return {
            "query": query,
            "key_cache": cache_t,
            "value_cache": cache_t,
            "num_kv_heads": 1,
            "num_heads": 2,
            "scale_value": 1.0,
            "block_table": table,
            "context_lens": None,
            "out": query,
            "workspace": None,
        }

    template = template_with(torch.zeros(4, 2, dtype=torch.int32))
    runtime = SimpleNamespace(_npu_paged_attention_get_workspace=get_workspace)
    pa = provider(PA, runtime=runtime, template=template)
    md = metadata([4], [5, 6, 7, 8])
    cache: dict = {}
    a = bound(pa, md, dict(template), cache)
    b = bound(pa, md, dict(template), cache)
    assert a["context_lens"] is md.seq_lens and a["workspace"] is b["workspace"]
    assert len(calls) == 1 and calls[0] is md.seq_lens
    other = metadata([4], [1, 1, 1, 1])
    assert bound(pa, other, dict(template), cache)["workspace"].numel() == 4
    assert len(calls) == 2
    # a block table of another shape is another signature: never handed the same workspace
    wider = template_with(torch.zeros(4, 8, dtype=torch.int32))
    pa_wide = provider(PA, runtime=runtime, template=wider)
    assert bound(pa_wide, md, dict(wider), cache)["workspace"] is not a["workspace"]
    assert len(calls) == 3
