"""The graph model on its own: resolution is pure, apply is exactly-once, keys are not positions."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from ascend_graph_patch.core.graph import (
    CaptureRefused,
    DraftSource,
    MetadataFault,
    OwnedGraph,
    ResolutionError,
    RuntimeFault,
    StepFault,
    TargetSource,
    UpdateTask,
)
from ascend_graph_patch.core.kinds import DRAFT, FIA, FIA_V2, PA, TARGET
from ascend_graph_patch.core.registry import GraphRegistry
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
    fields = SimpleNamespace(sliding_window=sliding_window)
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


def test_tasks_of_one_kv_group_relaunch_in_capture_order_with_the_group_s_values(runtime):
    graph = OwnedGraph(role="target", descriptor=4)
    t0, l0 = make_task(runtime, "layers.0", "layers.0")
    t1, l1 = make_task(runtime, "layers.1", "layers.1")
    graph.add(t0)
    graph.add(t1)
    group = metadata([4], [9])
    graph.apply(graph.resolve(TargetSource({"layers.1": group, "layers.0": group})), "u", runtime)
    assert [c[:2] for c in runtime.calls if c[0] in ("begin", "op", "record")] == [
        ("begin", "h-layers.0-0"),
        ("op", "layers.0"),
        ("record", "e-layers.0-0"),
        ("begin", "h-layers.1-0"),
        ("op", "layers.1"),
        ("record", "e-layers.1-0"),
    ]
    assert l0[0]["actual_seq_lengths_kv"] == l1[0]["actual_seq_lengths_kv"] == [9]
    assert l0[0]["query"] == l1[0]["query"] == "q" and len(l0) == len(l1) == 1


def two_tasks(runtime, **kw):
    graph = OwnedGraph(role="target", descriptor=4, **kw)
    graph.add(make_task(runtime, "layers.0", "layers.0")[0])
    graph.add(make_task(runtime, "layers.1", "layers.1")[0])
    return graph


@pytest.mark.parametrize(
    ("metadata_of_layer_1", "error"),
    [
        ("missing", KeyError),  # the key is not in the dict
        (None, AttributeError),  # the entry is None
        (SimpleNamespace(num_actual_tokens=4), AttributeError),  # another kind of metadata
    ],
)
def test_unreadable_metadata_is_a_step_fault_carrying_stock_s_error(
    runtime, metadata_of_layer_1, error
):
    """Stock reads the same fields of the same entry: it raises the same kind of error."""
    md = {"layers.0": metadata([4], [1])}
    if metadata_of_layer_1 != "missing":
        md["layers.1"] = metadata_of_layer_1
    with pytest.raises(MetadataFault, match="layers.1") as caught:
        two_tasks(runtime).resolve(TargetSource(md))
    assert isinstance(caught.value.error, error)
    assert runtime.calls == []  # before any runtime call


def test_metadata_that_is_not_a_mapping_is_a_step_fault(runtime):
    with pytest.raises(MetadataFault) as caught:
        two_tasks(runtime).resolve(TargetSource(None))
    assert isinstance(caught.value.error, TypeError)


def test_a_provider_bug_is_a_resolution_error_not_a_step_fault(runtime):
    class Broken:
        kind = "fia"
        group = -1
        value_keys = ()

        def values(self, md):
            raise RuntimeError("boom")

    graph = OwnedGraph(role="target", descriptor=4)
    graph.add(make_task(runtime, "layers.0", "layers.0", provider=Broken())[0])
    with pytest.raises(ResolutionError, match="boom") as caught:
        graph.resolve(TargetSource({"layers.0": metadata([4], [1])}))
    assert not isinstance(caught.value, StepFault)  # stock, on intact metadata, takes the step


def pa_template() -> dict:
    """A PA task's captured relaunch arguments, but the lengths and the workspace."""
    return {
        "query": torch.zeros(4, 2, 8),
        "key_cache": torch.zeros(3, 16, 1, 8),
        "value_cache": torch.zeros(3, 16, 1, 8),
        "block_table": torch.zeros(4, 2, dtype=torch.int32),
        "num_kv_heads": 1,
        "num_heads": 2,
        "out": torch.zeros(4, 2, 8),
    }


def test_a_failing_workspace_getter_is_a_runtime_fault(runtime):
    def getter(**kw):
        raise RuntimeError("aclnn workspace failed")

    template = pa_template()
    runtime_ns = SimpleNamespace(_npu_paged_attention_get_workspace=getter)
    pa = provider(PA, runtime=runtime_ns, template=template)
    graph = OwnedGraph(role="target", descriptor=4)
    graph.add(make_task(runtime, "layers.0", "layers.0", provider=pa, kind=PA)[0])
    with pytest.raises(RuntimeFault) as caught:
        graph.resolve(TargetSource({"layers.0": metadata([4], [1, 2, 3, 4])}))
    assert str(caught.value.error) == "aclnn workspace failed"


@pytest.mark.parametrize(
    "kind, role", [(FIA, TARGET), (FIA, DRAFT), (FIA_V2, TARGET), (PA, TARGET)]
)
def test_a_provider_returns_exactly_the_keys_its_tasks_leave_out_of_their_static_arguments(
    kind, role
):
    """Each update writes ``values`` (and the steady value, the graph's workspace, when it
    changes) over the task's launch arguments: a key listed in ``value_keys`` but neither
    returned nor steady would relaunch its captured (stale) value, one returned but not listed
    would be counted static (verify and the benchmark's floor read ``static``)."""
    template = {**pa_template(), "sparse_mode": 3, "context_lens": [1], "workspace": None}
    runtime_ns = SimpleNamespace(_npu_paged_attention_get_workspace=lambda **kw: "pa-ws")
    p = provider(kind, role, runtime=runtime_ns, template=template)
    values = p.values(metadata([4], [1, 2, 3, 4]))
    steady = {} if p.steady is None else {p.steady[0]: p.steady[1]()}
    assert not set(values) & set(steady)
    assert set(values) | set(steady) == set(p.value_keys)
    values = {**values, **steady}
    task = UpdateTask(
        kind=kind, metadata_key="l0", step=0, layer_name="l0", handle=0, event=None,
        op=lambda **kw: kw, template=template, provider=p,
    )  # fmt: skip
    assert not set(task.static) & set(values)
    task.template.update(values)  # what each update does before the relaunch
    assert task.op(**task.template) == {**task.static, **values}


#: How the three tasks' values are shared when the failure meets them: "each" reads one metadata
#: object per task (apply's paired loop); "one" one KV-cache group (one run); "runs" two groups,
#: [a] and [b, c], configured apart (two runs, the failure in the second).
SHARING = ["each", "one", "runs"]


def three_tasks_failing_at_b(runtime, replay_first=True, fail="op", sharing="each"):
    def failing(**kw):
        raise RuntimeError("launch failed")

    first = provider(workspace=lambda: "ws-a") if sharing == "runs" else None
    graph = OwnedGraph(role="target", descriptor=4, replay_first=replay_first)
    graph.add(make_task(runtime, "a", "a", provider=first)[0])
    task_b = make_task(runtime, "b", "b", op=failing if fail == "op" else None)[0]
    if fail == "record":
        task_b.event = SimpleNamespace(record=lambda s: (_ for _ in ()).throw(OSError("record")))
    graph.add(task_b)
    graph.add(make_task(runtime, "c", "c")[0])
    if sharing == "one":  # one metadata object: every task relaunches with one values dict
        md = dict.fromkeys("abc", metadata([4], [1]))
    elif sharing == "runs":
        md = {"a": metadata([4], [1]), **dict.fromkeys("bc", metadata([4], [2]))}
    else:
        md = {k: metadata([4], [1]) for k in "abc"}
    resolved = graph.resolve(TargetSource(md))
    distinct = {id(v) for v in resolved.values}
    assert len(distinct) == {"each": 3, "one": 1, "runs": 2}[sharing]  # dicts the tasks share
    # the runs loop (no per-task pairing) runs exactly when each bucket shares one values dict
    runs = graph._runs[1] if graph._runs and graph._runs[0] is resolved.values else None
    assert [len(run) for run, _ in runs or ()] == {"each": [], "one": [3], "runs": [1, 2]}[sharing]
    return graph, resolved


@pytest.mark.parametrize("sharing", SHARING)
def test_a_failed_relaunch_raises_after_recording_what_a_launched_replay_waits_on(runtime, sharing):
    graph, resolved = three_tasks_failing_at_b(runtime, sharing=sharing)
    with pytest.raises(RuntimeError, match="launch failed") as caught:
        graph.apply(resolved, "upd", runtime)
    records = [c[1] for c in runtime.calls if c[0] == "record"]
    assert records == ["e-a-0", "e-b-0", "e-c-0"]  # a updated; b and c released, not updated
    assert runtime.calls.count(("end",)) == 2  # the failed update scope is closed too
    assert any("fia b (2 of 3) failed; 2 pending event(s)" in n for n in caught.value.__notes__)


@pytest.mark.parametrize("sharing", SHARING)
def test_when_the_runner_updates_first_nothing_is_recorded_after_a_failure(runtime, sharing):
    """ENPU / 310P order: no replay waits yet, and the failure stops it from being launched;
    a record now would be a second one when the next step's update records again."""
    graph, resolved = three_tasks_failing_at_b(runtime, replay_first=False, sharing=sharing)
    with pytest.raises(RuntimeError, match="launch failed"):
        graph.apply(resolved, "upd", runtime)
    assert [c[1] for c in runtime.calls if c[0] == "record"] == ["e-a-0"]


@pytest.mark.parametrize("sharing", SHARING)
def test_after_a_failed_record_nothing_more_is_recorded(runtime, sharing):
    """The replay waits at b's event whatever is recorded after it; recording c's would leave
    it set with nothing to consume it (a step behind for good, once the hang is cleared)."""
    graph, resolved = three_tasks_failing_at_b(runtime, fail="record", sharing=sharing)
    with pytest.raises(OSError, match="record"):
        graph.apply(resolved, "upd", runtime)
    assert [c[1] for c in runtime.calls if c[0] == "record"] == ["e-a-0"]


def test_release_records_every_event_unless_the_runner_updates_first(runtime):
    assert two_tasks(runtime).release("upd") == 2
    assert [c[1] for c in runtime.calls if c[0] == "record"] == ["e-layers.0-0", "e-layers.1-0"]
    runtime.calls.clear()
    assert two_tasks(runtime, replay_first=False).release("upd") == 0
    assert runtime.calls == []


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


@pytest.mark.parametrize("step_major", [True, False])
def test_draft_steps_of_one_kv_group_relaunch_in_capture_order_with_their_step_s_values(
    runtime, step_major
):
    """A merged MTP draft of one KV-cache group: each step's tasks share one values dict. Captured
    step-major, each step's tasks are one run (no per-task pairing); captured in another order,
    the paired loop. Either way each task relaunches once, in capture order, with its step's."""
    graph = OwnedGraph(role="draft", descriptor=4)
    launched = {}
    order = [(s, n) for s in range(3) for n in ("mtp.0", "mtp.1")]
    if not step_major:
        order = sorted(order, key=lambda sn: sn[1])
    ws = provider(role=DRAFT, workspace=lambda: None)
    for step, name in order:
        task, launched[(name, step)] = make_task(runtime, name, name, step, ws)
        graph.add(task)
    per_step = [dict.fromkeys(("mtp.1", "mtp.0"), metadata([4], [10 + s])) for s in range(3)]
    resolved = graph.resolve(DraftSource(per_step))
    runs = graph._runs[1] if graph._runs and graph._runs[0] is resolved.values else None
    assert [len(run) for run, _ in runs or ()] == ([2, 2, 2] if step_major else [])
    graph.apply(resolved, "upd", runtime)
    assert [c[1] for c in runtime.calls if c[0] == "begin"] == [f"h-{n}-{s}" for s, n in order]
    for (name, step), calls in launched.items():
        assert len(calls) == 1 and calls[0]["actual_seq_lengths_kv"] == [10 + step], (name, step)


def test_draft_with_too_few_steps_is_a_step_fault(runtime):
    graph = OwnedGraph(role="draft", descriptor=4)
    graph.add(make_task(runtime, "mtp.0", "mtp.0", step=1)[0])
    with pytest.raises(MetadataFault, match=r"draft step 1 \(1 step\(s\) given\)") as caught:
        graph.resolve(DraftSource([{"mtp.0": metadata([1], [1])}]))
    assert isinstance(caught.value.error, IndexError)


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


def bound(provider, md, launch=None):
    """What a step writes over a task's launch arguments: its values and its steady value."""
    launch = {} if launch is None else launch
    launch.update(provider.values(md))
    if provider.steady is not None:
        key, read = provider.steady
        launch[key] = read()
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


def test_tasks_of_one_kv_group_share_one_computation_of_their_values(runtime):
    """The layers of a KV-cache group read one metadata object: the fresh values are computed
    once for all of them (the graph's workspace once per step), each task relaunches with its
    own dict."""
    reads = []
    getter = lambda: reads.append(1) or "ws"  # noqa: E731
    graph = OwnedGraph(role="target", descriptor=4)
    launched = {}
    for i in range(5):
        task, launched[i] = make_task(
            runtime, f"l{i}", f"l{i}", provider=provider(FIA_V2, workspace=getter)
        )
        graph.add(task)
    shared_md = metadata([4], [1])
    other_md = metadata([4], [2])
    md = {"l0": shared_md, "l1": shared_md, "l2": other_md, "l3": shared_md, "l4": other_md}
    graph.apply(graph.resolve(TargetSource(md)), "upd", runtime)
    assert len(reads) == 1  # the graph's, as stock reads it (stock: once per task)
    assert all(launched[i][0]["workspace"] == "ws" for i in range(5))
    kvs = [launched[i][0]["actual_seq_kvlen"] for i in range(5)]
    assert kvs == [[1], [1], [2], [1], [2]]
    launches = [launched[i][0] for i in range(5)]
    assert len({id(launch) for launch in launches}) == 5


class WriteLog(dict):
    """A template that logs the keys written one by one (``|=`` merges bypass ``__setitem__``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.writes = []

    def __setitem__(self, key, value):
        self.writes.append(key)
        super().__setitem__(key, value)


@pytest.mark.parametrize("sharing", ["one", "each"])
def test_the_steady_workspace_is_written_when_it_changes_and_every_task_relaunches_it(
    runtime, sharing
):
    """The graph's workspace is read every step (as stock reads it) but written into the
    templates only when it is a new object; every relaunch passes the current one, also when
    the layers read distinct metadata objects (the paired path)."""
    workspaces = iter(["ws1", "ws1", "ws2", "ws2"])
    p = provider(FIA_V2, workspace=lambda: next(workspaces))
    graph = OwnedGraph(role="target", descriptor=4)
    launched = {}
    for i in range(3):
        task, launched[i] = make_task(runtime, f"l{i}", f"l{i}", provider=p)
        task.template = WriteLog(task.template)
        graph.add(task)
    for step in range(4):
        one = metadata([4], [step + 1])
        md = {f"l{i}": one if sharing == "one" else metadata([4], [step + 1]) for i in range(3)}
        graph.apply(graph.resolve(TargetSource(md)), "upd", runtime)
    expected = ["ws1", "ws1", "ws2", "ws2"]
    for i in range(3):
        assert [kw["workspace"] for kw in launched[i]] == expected
        assert [kw["actual_seq_kvlen"] for kw in launched[i]] == [[1], [2], [3], [4]]
        assert graph.tasks[i].template.writes == ["workspace", "workspace"]  # steps 0 and 2


def test_a_graph_without_a_captured_workspace_binds_none(runtime):
    graph = OwnedGraph(role="target", descriptor=4)
    task, launched = make_task(
        runtime, "l0", "l0", provider=provider(FIA_V2, workspace=lambda: None)
    )
    graph.add(task)
    graph.apply(graph.resolve(TargetSource({"l0": metadata([4], [1])})), "upd", runtime)
    assert launched[0]["workspace"] is None


def test_pa_workspace_recomputed_from_context_lens_and_shared_by_signature(runtime):
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
    wider = template_with(torch.zeros(4, 8, dtype=torch.int32))
    runtime_ns = SimpleNamespace(_npu_paged_attention_get_workspace=get_workspace)
    graph = OwnedGraph(role="target", descriptor=4)
    launched = {}
    for name, tmpl in (("a", template), ("b", template), ("c", wider)):
        pa = provider(PA, runtime=runtime_ns, template=tmpl)
        task, launched[name] = make_task(runtime, name, name, provider=pa, kind=PA)
        graph.add(task)
    md = metadata([4], [5, 6, 7, 8])
    graph.apply(graph.resolve(TargetSource({"a": md, "b": md, "c": md})), "upd", runtime)
    a, b, c = (launched[n][0] for n in "abc")
    assert a["context_lens"] is md.seq_lens and a["workspace"] is b["workspace"]
    # a block table of another shape is another signature: never handed the same workspace
    assert c["workspace"] is not a["workspace"]
    assert len(calls) == 2 and calls[0] is md.seq_lens
    other = metadata([4], [1, 1, 1, 1])
    graph.apply(graph.resolve(TargetSource({"a": other, "b": other, "c": md})), "upd", runtime)
    assert launched["a"][-1]["workspace"].numel() == 4 and len(calls) == 4


# --- the registry: a rebuilt engine's graphs are found, not an old one's ------------------------


class Owner:
    """A graph wrapper stand-in (weakly referenceable, like ACLGraphWrapper)."""


class Graph:
    """An NPUGraph stand-in."""


def registered(registry, owner, descriptor=4, role="target"):
    graph = Graph()
    owned = OwnedGraph(role=role, descriptor=descriptor)
    registry.register(owner, graph, owned)
    return graph, owned


def test_the_replaying_owner_finds_its_own_graph_while_an_older_one_is_alive():
    registry = GraphRegistry()
    old_owner, new_owner = Owner(), Owner()
    old = registered(registry, old_owner)
    new = registered(registry, new_owner)
    assert registry.live_owners("target", 4) == 2
    assert registry.lookup("target", 4, old_owner) is old[1]
    assert registry.lookup("target", 4, new_owner) is new[1]
    assert registry.lookup("target", 4) is new[1]  # no owner known: the newest
    assert registry.lookup("draft", 4) is None and registry.lookup("target", 8) is None


def test_an_owner_whose_graph_was_refused_gets_none_not_another_engine_s_graph():
    registry = GraphRegistry()
    owner, other = Owner(), Owner()
    keep = registered(registry, other)
    registry.refuse(owner, "target", 4, "an attention kind it does not own")
    assert registry.lookup("target", 4, owner) is None
    assert registry.refused[("target", 4)] == "an attention kind it does not own"
    assert keep


def test_dropped_graphs_leave_the_registry():
    import gc

    registry = GraphRegistry()
    old_owner, new_owner = Owner(), Owner()
    old_graph, _ = registered(registry, old_owner)
    new = registered(registry, new_owner)
    del old_graph, old_owner
    gc.collect()
    assert registry.live_owners("target", 4) == 1
    assert registry.graphs() == [new[1]]


def test_the_last_lookup_shortcut_never_outlives_a_registration_or_a_dropped_graph():
    """A lookup repeated with the same descriptor object takes a shortcut: a newer engine's
    registration, a refusal and a dropped graph must each still change the answer."""
    import gc
    from dataclasses import make_dataclass

    registry = GraphRegistry()
    descriptor = make_dataclass("BatchDescriptor", ["num_tokens"], frozen=True)(4)
    old_owner, new_owner = Owner(), Owner()
    old = registered(registry, old_owner, descriptor)
    assert registry.lookup("target", descriptor) is old[1]
    assert registry.lookup("target", descriptor) is old[1]  # the shortcut
    new_graph, new_owned = registered(registry, new_owner, descriptor)
    assert registry.lookup("target", descriptor) is new_owned  # registration forgot it
    assert registry.lookup("target", descriptor, old_owner) is old[1]
    del new_graph
    gc.collect()
    assert registry.lookup("target", descriptor) is old[1]  # the newest is gone: the older
    registry.refuse(old_owner, "target", descriptor, "refused")
    assert registry.lookup("target", descriptor, old_owner) is None
