"""MLA graphs owned: the line's MLA layout and provider against the release's own MLA update.

The harness (``torch_npu_sim.harness``: a real ``AscendMLAImpl`` decoding through the real
``_forward_decode`` in real ``ACLGraphWrapper`` graphs, target ``mla`` and MTP draft
``mla_mtp_k2``) is covered by the suites that run every scenario (``test_overlay_scenarios``,
``test_real_code``, ``test_mtp``, ``test_v2``: overlay == stock bitwise == eager, verify without
mismatch); here, its negative control: MLA graphs replayed without their update are stale.

vllm-ascend 0.23.0.post1's ``AscendMLAImpl.update_graph_params`` runs here for real, as verify
runs it: a dry run whose relaunches, update scopes and event records are intercepted per task
handle. Its GraphParams hold 18-field tuples shaped as ``_forward_decode`` appends them; the
overlay builds its tasks from the same tuples through the line (``lines/v0_23.py``: the MLA
layout, its template, ``MLAProvider``) and resolves them from the same metadata. Verify's own
comparison must then find nothing, for a plain target graph, an MTP target graph (synthetic query
ends, KV lengths padded to the request count) and a draft graph (its steps' query ends and block
tables, sliced when the drafter's batch is not padded).

Negative controls: the overlay configured as a plain target on an MTP target graph, a draft that
does not slice where stock slices, and metadata whose key order differs from the capture order
(there stock's positional zip binds a layer's task to another layer's metadata: verify reports
stock's update differs, and the overlay's values are the layer's own). The engine tests
(``tests/test_engine.py``) are the proof of record; this reaches what they cannot vary.
"""

from __future__ import annotations

import importlib
from functools import partial, wraps
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ascend_graph_patch.aspects import verify
from ascend_graph_patch.core.graph import MetadataFault, OwnedGraph, Resolution
from ascend_graph_patch.core.kinds import DRAFT, MLA, TARGET
from ascend_graph_patch.core.tasks import build_task
from ascend_graph_patch.lines.v0_23 import LINE, MLA_FIELDS, MLAProvider

LATENT, ROPE, HEADS, BLOCK = 16, 8, 4, 128


@pytest.fixture(scope="module")
def mla_v1() -> Any:
    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    return importlib.import_module("vllm_ascend.attention.mla_v1")


def spec_config(k: int, padded: bool = True) -> Any:
    """The parts of vLLM's SpeculativeConfig both updates read (an MTP engine: ``use_eagle``)."""
    return SimpleNamespace(
        use_eagle=lambda: True, num_speculative_tokens=k, disable_padded_drafter_batch=not padded
    )


def captured(num_tokens: int, spec: bool, seed: int) -> tuple:
    """One task group's tuple as ``_forward_decode`` appends it (fields: ``MLA_FIELDS``)."""
    gen = torch.Generator().manual_seed(seed)
    layout = "TND_NTD" if spec else "BNSD_NBSD"
    q_shape = (num_tokens, HEADS, LATENT) if spec else (num_tokens, HEADS, 1, LATENT)
    fields = {
        "q_nope": torch.randn(*q_shape, generator=gen),
        "k_nope": torch.randn(4, 1, BLOCK, LATENT, generator=gen),
        "q_pe": torch.randn(*q_shape[:-1], ROPE, generator=gen),
        "k_pe": torch.randn(4, 1, BLOCK, ROPE, generator=gen),
        "num_heads": HEADS,
        "num_kv_heads": 1,
        "input_layout": layout,
        "attn_mask": None,
        "sparse_mode": 3 if spec else 0,
        "scale": 0.25,
        "block_table": torch.arange(num_tokens * 2, dtype=torch.int32).view(num_tokens, 2),
        "block_size": BLOCK,
        "seq_lens_list": [1] * num_tokens,  # the capture's dummy lengths: replaced every step
        "actual_seq_lengths": list(range(1, num_tokens + 1)) if spec else None,
        "attn_output": torch.empty(HEADS, num_tokens, LATENT),
        "softmax_lse": torch.empty(num_tokens),
        "dequant_scale_q_nope": None,
        "fak_descale": None,
    }
    return tuple(fields[name] for name in MLA_FIELDS)


def decode_metadata(lengths: list[int], query_ends: list[int] | None, rows: int) -> Any:
    return SimpleNamespace(
        decode=SimpleNamespace(
            seq_lens_list=list(lengths),
            actual_seq_lengths_q=query_ends,
            block_table=torch.arange(rows * 2, dtype=torch.int32).view(rows, 2) + 100,
        )
    )


class Event:
    """A task's event: its records go through verify's interceptor, as the installer puts it
    on ``ExternalEvent.record`` in verify mode (recorded per task in a dry run)."""

    def record(self, stream: Any) -> None:
        verify.event_record(lambda _stream: None, self, (stream,), {})


class Bench:
    """One graph's GraphParams (stock's view) and the overlay's OwnedGraph of the same tasks."""

    def __init__(self, mla_v1: Any, monkeypatch: pytest.MonkeyPatch, role: str) -> None:
        from vllm_ascend.compilation.acl_graph import GraphParams

        self.mla_v1 = mla_v1
        self.role = role
        self.params = GraphParams({}, {}, {}, {})
        getter = "get_draft_graph_params" if role == DRAFT else "get_graph_params"
        monkeypatch.setattr(mla_v1, getter, lambda: self.params)
        draft = SimpleNamespace(is_draft_model=role == DRAFT, is_draft_model_prefill=False)
        monkeypatch.setattr(mla_v1, "_EXTRA_CTX", draft)
        # verify's interceptors, on what the stock update calls (the installer puts them there
        # in verify mode): relaunches and update scopes recorded per handle, records counted
        import torch_npu

        for target, wrapper in (
            ((torch_npu.npu_fused_infer_attention_score_v2, "out"), verify.fia_v2_out),
            ((torch.npu, "graph_task_update_begin"), verify.update_begin),
            ((torch.npu, "graph_task_update_end"), verify.update_end),
        ):
            real = getattr(*target)
            intercepted = wraps(real)(lambda *a, _w=wrapper, _r=real, **k: _w(_r, None, a, k))
            monkeypatch.setattr(*target, intercepted)
        self.graph = OwnedGraph(role=role, descriptor=None)
        self.records = 0

    def add(self, num_tokens: int, layer: str, step: int, fields: tuple, spec: Any) -> None:
        params = self.params
        for bucket in (params.events, params.handles, params.attn_params):
            bucket.setdefault(num_tokens, [])
        params.workspaces[num_tokens] = torch.empty(8, dtype=torch.uint8)
        handle = object()
        event = Event()
        params.attn_params[num_tokens].append(fields)
        params.handles[num_tokens].append(handle)
        params.events[num_tokens].append(event)
        self.graph.add(
            build_task(
                LINE.layouts[MLA],
                fields,
                runtime=importlib.import_module("torch_npu"),
                attn_module=self.mla_v1,
                role=self.role,
                layer_name=layer,
                metadata_key=layer,
                step=step,
                handle=handle,
                event=event,
                graph_workspace=partial(params.workspaces.get, num_tokens),
                num_tokens=num_tokens,
                impl=SimpleNamespace(speculative_config=spec),
            )
        )

    def compare(self, num_tokens: int, metadata: Any, spec: Any) -> tuple[list[str], Resolution]:
        """Stock's update as a dry run, the overlay's resolution, verify's comparison."""
        stock = self.mla_v1.AscendMLAImpl.update_graph_params
        if self.role == DRAFT:
            args = (torch.npu.Stream(), SimpleNamespace(), num_tokens, None, spec, None, metadata)
            values = self.graph.values_draft(metadata)
        else:
            context = SimpleNamespace(attn_metadata=metadata)
            args = (torch.npu.Stream(), context, num_tokens, None, spec, None, None)
            values = self.graph.values_target(metadata)
        dry, error = verify.dry_run(stock, args, {})
        assert error is None, error
        resolved = Resolution(self.graph.tasks, values)
        return verify.compare(resolved, dry, LINE.layouts), resolved


LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def test_plain_target_graph_matches_stock(mla_v1, monkeypatch) -> None:
    """DeepSeek without a draft: every layer reads one metadata object; KV lengths padded with
    zeros to the graph's size, the captured query ends (none: BNSD) and block table kept."""
    bench = Bench(mla_v1, monkeypatch, TARGET)
    for i, layer in enumerate(LAYERS):
        bench.add(4, layer, 0, captured(4, spec=False, seed=i), None)
    shared = decode_metadata([7, 12, 3], None, 3)
    problems, resolved = bench.compare(4, dict.fromkeys(LAYERS, shared), None)
    assert problems == []
    assert resolved[0][1]["actual_seq_kvlen"] == [7, 12, 3, 0]
    assert resolved[0][1]["block_table"] is resolved[0][0].template["block_table"]  # captured


def test_mtp_target_graph_matches_stock(mla_v1, monkeypatch) -> None:
    """An MTP target (k = 2): query ends synthetic (every request 3 rows), KV lengths padded to
    the request count, not to the token count."""
    spec = spec_config(2)
    bench = Bench(mla_v1, monkeypatch, TARGET)
    for i, layer in enumerate(LAYERS):
        bench.add(12, layer, 0, captured(12, spec=True, seed=i), spec)
    shared = decode_metadata([9, 4, 30], [3, 6, 9], 3)
    problems, resolved = bench.compare(12, dict.fromkeys(LAYERS, shared), spec)
    assert problems == []
    values = resolved[1][1]
    assert values["actual_seq_qlen"] == [3, 6, 9, 12]
    assert values["actual_seq_kvlen"] == [9, 4, 30, 0]


def test_mtp_target_graph_treated_as_plain_is_caught(mla_v1, monkeypatch) -> None:
    """Negative control: the overlay configured without the speculative config (a plain
    target) on an MTP target graph pads to the token count and keeps the captured query ends:
    verify reports both, on every task."""
    spec = spec_config(2)
    bench = Bench(mla_v1, monkeypatch, TARGET)
    for i, layer in enumerate(LAYERS):
        bench.add(12, layer, 0, captured(12, spec=True, seed=i), None)
    shared = decode_metadata([9, 4, 30], [3, 6, 9], 3)
    problems, _ = bench.compare(12, dict.fromkeys(LAYERS, shared), spec)
    assert sum("actual_seq_kvlen" in p for p in problems) == len(LAYERS)
    assert sum("actual_seq_qlen" in p for p in problems) == len(LAYERS)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded-drafter"])
def test_draft_graph_matches_stock_per_step(mla_v1, monkeypatch, padded: bool) -> None:
    """An MTP draft (one MLA layer, k = 2 steps): each step's task reads that step's query ends,
    KV lengths and block table; with ``disable_padded_drafter_batch`` the table is cut to the
    step's request count, as stock cuts it."""
    spec = spec_config(2, padded=padded)
    bench = Bench(mla_v1, monkeypatch, DRAFT)
    layer = "model.layers.2.self_attn.attn"
    for step in range(2):
        bench.add(6, layer, step, captured(6, spec=True, seed=step), spec)
    per_step = [
        {layer: decode_metadata([5, 8], [1, 2], 6)},
        {layer: decode_metadata([6, 9], [1, 2], 6)},
    ]
    problems, resolved = bench.compare(6, per_step, spec)
    assert problems == []
    step1 = resolved[1][1]
    assert step1["actual_seq_kvlen"] == [6, 9]
    assert step1["block_table"].shape[0] == (6 if padded else 2)


def test_draft_that_does_not_slice_where_stock_slices_is_caught(mla_v1, monkeypatch) -> None:
    """Negative control: stock cuts the block table (unpadded drafter batch), the overlay's
    provider, configured for a padded drafter, does not: verify reports the block table."""
    bench = Bench(mla_v1, monkeypatch, DRAFT)
    layer = "model.layers.2.self_attn.attn"
    for step in range(2):
        bench.add(6, layer, step, captured(6, spec=True, seed=step), spec_config(2, padded=True))
    per_step = [{layer: decode_metadata([5, 8], [1, 2], 6)} for _ in range(2)]
    problems, _ = bench.compare(6, per_step, spec_config(2, padded=False))
    assert len(problems) == 2 and all("block_table" in p for p in problems)


def test_key_order_differing_from_capture_order_binds_stock_to_the_wrong_layer(
    mla_v1, monkeypatch
) -> None:
    """Stock zips ``list(attn_metadata.keys())`` with the captured lists by position. When the
    metadata lists the layers in another order than the capture appended them and their metadata
    differ, stock relaunches layer 0's task with layer 1's lengths: verify reports it, and the
    overlay's values are each layer's own (it resolves by key)."""
    bench = Bench(mla_v1, monkeypatch, TARGET)
    for i, layer in enumerate(LAYERS):
        bench.add(4, layer, 0, captured(4, spec=False, seed=i), None)
    own = {LAYERS[0]: decode_metadata([5], None, 1), LAYERS[1]: decode_metadata([40], None, 1)}
    reordered = {LAYERS[1]: own[LAYERS[1]], LAYERS[0]: own[LAYERS[0]]}
    problems, resolved = bench.compare(4, reordered, None)
    assert len(problems) == 2 and all("actual_seq_kvlen" in p for p in problems)
    assert [kw["actual_seq_kvlen"] for _, kw in resolved] == [[5, 0, 0, 0], [40, 0, 0, 0]]


@pytest.mark.parametrize("broken", [None, SimpleNamespace(decode=None), SimpleNamespace()])
def test_metadata_stock_cannot_read_is_a_step_fault(broken: Any) -> None:
    """What stock would raise on (no metadata object, no decode part, no decode fields) is a
    ``MetadataFault`` carrying that error, so the step raises as stock would."""
    provider = MLAProvider(MLA, "target", 4, 1, False, lambda: None)
    with pytest.raises(MetadataFault) as fault:
        provider.values(broken)
    assert isinstance(fault.value.error, AttributeError)


def quantised(num_tokens: int, seed: int) -> tuple:
    """An FA-quant layer's tuple: ``_forward_decode``'s, with its dequant scales."""
    fields = dict(zip(MLA_FIELDS, captured(num_tokens, spec=False, seed=seed), strict=True))
    fields.update(dequant_scale_q_nope=torch.rand(num_tokens, HEADS), fak_descale=torch.rand(1))
    return tuple(fields.values())


def test_quantised_layers_relaunch_as_stock_relaunches_them(mla_v1, monkeypatch) -> None:
    """An FA-quant layer's relaunch against stock's own (``AscendMLAImpl.update_graph_params``
    run as verify runs it, every argument compared): nothing differs, and stock passes the
    captured dequant scales, the very tensors of the tuple, with its quant modes."""
    bench = Bench(mla_v1, monkeypatch, TARGET)
    tuples = [quantised(4, seed=i) for i in range(len(LAYERS))]
    for layer, fields in zip(LAYERS, tuples, strict=True):
        bench.add(4, layer, 0, fields, None)
    shared = decode_metadata([7, 12, 3], None, 3)
    problems, resolved = bench.compare(4, dict.fromkeys(LAYERS, shared), None)
    assert problems == []
    scale_q = MLA_FIELDS.index("dequant_scale_q_nope")
    assert resolved[1][1]["dequant_scale_query"] is tuples[1][scale_q]


def _no_workspace(task: Any) -> None:
    task.provider.steady = ("workspace", lambda: None)  # the graph reads none


RELAUNCH_MUTATIONS = {
    "dequant_scale_key": lambda task: task.template.pop("dequant_scale_key"),
    "query_quant_mode": lambda task: task.template.update(query_quant_mode=0),
    "key": lambda task: task.template.update(key=task.template["key_rope"]),
    "softmax_scale": lambda task: task.template.update(softmax_scale=1.0),
    "workspace": _no_workspace,
}


@pytest.mark.parametrize("argument", RELAUNCH_MUTATIONS)
def test_a_relaunch_argument_other_than_stocks_is_caught(mla_v1, monkeypatch, argument) -> None:
    """Negative controls of the test above, one argument at a time on the quantised template
    (dropped, another mode, ``key`` set to ``k_pe``, the scale 1.0, no workspace): verify names
    the argument on every task. (Before it compared only the lengths and the block table, and
    each of these passed.)"""
    bench = Bench(mla_v1, monkeypatch, TARGET)
    for i, layer in enumerate(LAYERS):
        bench.add(4, layer, 0, quantised(4, seed=i), None)
    for task in bench.graph.tasks:
        RELAUNCH_MUTATIONS[argument](task)
    shared = decode_metadata([7, 12, 3], None, 3)
    problems, _ = bench.compare(4, dict.fromkeys(LAYERS, shared), None)
    assert len(problems) == len(LAYERS), problems
    for layer, problem in zip(LAYERS, problems, strict=True):
        assert problem.startswith(f"mla {layer} step 0: {argument}: "), problem


@pytest.mark.parametrize("name", ["mla", "mla_mtp_k2"])
def test_mla_graphs_replayed_without_their_update_are_stale(name: str) -> None:
    """Negative control of the harness checks: with the overlay on, a step whose MLA graph is
    replayed without its update (events recorded, arguments as last launched) differs from
    eager; the updated steps around it stay equal to eager. So equality with eager there is the
    update's doing."""
    import random

    from tests.overlay_support import overlay_arm

    extra, stale = random.Random(11), []

    def without_update(workload: Any, index: int, batch: Any, out: Any) -> None:
        if index == 2:
            extra_batch = workload.next_batch(extra)
            eager = workload.run(extra_batch, graph=False).values
            missed = workload.run_without_update(extra_batch).values
            stale.append((missed - eager).abs().max().item())

    arm = overlay_arm(name, "on", 5, seed=1234, eager=True, on_step=without_update)
    assert arm.run.ok and arm.run.steps == 5, arm.error
    assert arm.counters["updates.owned"] == 5  # the skipped step is not an update
    assert stale and stale[0] > 1e-2, f"no update, yet equal to eager ({stale})"
    assert arm.max_eager_error < 1e-5
