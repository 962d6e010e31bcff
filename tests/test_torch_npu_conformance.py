"""The simulator, vllm-ascend's call sites and the overlay's relaunches against the real torch-npu.

The real torch-npu 2.10.0.post4 is data here (``tests/fixtures/torch_npu_2.10.0.post4.json``,
extracted from the wheel by ``scripts/extract-torch-npu-schemas.py``): registered op schemas, the
graph / stream / event Python API, the ATB swap lists and the capture-rule messages.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ascend_graph_patch.core.graph import OwnedGraph, TargetSource, UpdateTask
from ascend_graph_patch.core.providers import LengthsWorkspaceProvider, pa_signature
from ascend_graph_patch.core.tasks import fields_of
from ascend_graph_patch.lines import v0_23
from tests import torch_npu_conformance as conf
from torch_npu_sim import (
    _install_impl,
    atb,
    mla_ops,
    model_ops,
    moe_ops,
    ops,
    runtime,
    sample_ops,
)

# Real API the simulator does not offer, and why (vllm-ascend 0.23 never calls any of them).
NOT_SIMULATED = {
    "torch_npu.npu.graphs.make_graphed_callables": "training-style autograd graphs",
    "torch_npu.npu.graphs.super_kernel_scope_begin": "super-kernel fusion",
    "torch_npu.npu.graphs.super_kernel_scope_end": "super-kernel fusion",
    "torch_npu.npu.graphs.NPUGraph.super_kernel_optimize": "super-kernel fusion",
    "torch_npu.npu.streams.Event.from_ipc_handle": "inter-process events",
    "torch_npu.npu.streams.Event.ipc_handle": "inter-process events",
    "torch_npu.npu.streams.Event.recorded_time": "device timestamps",
    "torch_npu.npu.streams.SyncLaunchStream": "task-queue-less streams",
}


def _sim_api(qualname: str) -> Any:
    """The simulator's counterpart of a real API qualname (None if it has none)."""
    import torch_npu

    parts = qualname.split(".")
    module = ".".join(parts[:3])  # torch_npu.npu.<module>
    obj: Any = torch_npu.npu
    for part in parts[3:]:
        if part == "__new__":  # real classes take their parameters in __new__, ours in __init__
            part = "__init__"
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    assert module in conf.API_MODULES
    return obj


# --------------------------------------------------------------------------------------------
# the fixture


def test_fixture_names_its_wheel_and_the_simulator_reports_its_version() -> None:
    import torch_npu

    provenance = conf.fixture()["provenance"]
    assert provenance["wheel"] == "torch_npu-2.10.0.post4-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert re.fullmatch(r"[0-9a-f]{64}", provenance["sha256"])
    assert "extract-torch-npu-schemas.py" in provenance["regenerate"]
    assert torch_npu.__version__ == provenance["version"] == "2.10.0.post4"
    assert torch_npu.__simulated__ is True


# --------------------------------------------------------------------------------------------
# ops


def _simulated_ops() -> dict[str, Any]:
    table = {
        **ops.REFERENCE_OPS,
        **model_ops.REFERENCE_OPS,
        **moe_ops.REFERENCE_OPS,
        **mla_ops.REFERENCE_OPS,
        **sample_ops.REFERENCE_OPS,
    }
    table["get_npu_format"] = _install_impl._get_npu_format
    table["npu_format_cast"] = _install_impl._npu_format_cast
    table["empty_with_format"] = _install_impl._empty_with_format
    return table


def _installed_ops() -> set[str]:
    """Every op the installed simulator implements (not a stub), read from ``torch_npu`` and the
    ATB op table, not from the simulator's own op tables."""
    import torch_npu

    found = set()
    candidates = [(name, getattr(torch_npu, name)) for name in dir(torch_npu)]
    candidates += [(n, getattr(atb.ATB_OPS, n, None)) for n in (*atb.API_LIST, *atb.ATB_API_LIST)]
    for name, obj in candidates:
        if isinstance(obj, runtime.SimOp) and not conf.is_stub(obj):
            found.add(name)
            if obj.out is not None and not conf.is_stub(obj.out):
                found.add(name + ".out")
    return found


def test_every_op_the_installed_simulator_implements_is_checked_against_its_schema() -> None:
    """The table above is written by hand: an op module it does not name (the sampler's op was
    one) would escape the schema check. Every implemented op on the installed module is in it."""
    installed = _installed_ops()
    assert {"npu_fused_infer_attention_score", "_npu_paged_attention"} <= installed
    assert sorted(installed - set(_simulated_ops())) == []


@pytest.mark.parametrize("name", sorted(_simulated_ops()))
def test_simulated_op_matches_its_registered_schema(name: str) -> None:
    """Name, argument order, keyword-only markers, defaults, Tensor types and return arity."""
    key = conf.schema_key(name)
    assert key is not None, f"{name} is not registered by torch-npu 2.10.0.post4"
    assert conf.op_problems(key, _simulated_ops()[name]) == []


def _old_pa(
    query,
    key_cache,
    value_cache,
    num_kv_heads,
    num_heads,
    scale_value,
    block_table,
    context_lens: ops.SeqLens,
    out,
    workspace=None,
) -> torch.Tensor:
    return out


def _old_scatter(
    key,
    value,
    key_cache,
    value_cache,
    slot_mapping,
    *,
    compress_lens=None,
    compress_seq_offset=None,
    seq_lens=None,
    cache_mode="Norm",
) -> None:
    return None


def _old_group_begin(stream=None) -> None:
    return None


def test_the_checks_catch_the_differences_they_were_written_for() -> None:
    """Negative control: the simulator's signatures before these checks fail them."""
    assert conf.op_problems("atb::_npu_paged_attention", _old_pa) == [
        "workspace: keyword-only in real, positional or keyword here",
        "context_lens: Tensor in real, collections.abc.Sequence[int] | torch.Tensor | None here",
        "returns 0 value(s) in real, 1 here",
    ]
    assert conf.op_problems("npu::npu_scatter_pa_kv_cache", _old_scatter) == [
        "parameters: missing ['compress_seq_offsets'], extra ['compress_seq_offset']",
        "cache_mode: default 'PA_NZ' in real, 'Norm' here",
    ]
    real = conf.api_signature("torch_npu.npu.graphs.graph_task_group_begin")
    assert conf.differences(real, inspect.signature(_old_group_begin)) == [
        "stream: required in real, not here"
    ]


def test_every_op_the_simulator_names_is_registered_and_the_atb_lists_agree() -> None:
    named = set(_install_impl._UNSIMULATED) | set(_install_impl._UNSIMULATED_HOST)
    assert sorted(n for n in named if conf.schema_key(n) is None) == []
    real = conf.fixture()["atb"]
    assert list(atb.API_LIST) == real["API_LIST"]
    assert list(atb.ATB_API_LIST) == real["ATB_API_LIST"]


def test_unsimulated_ops_still_fail_loudly() -> None:
    assert conf.is_stub(conf.sim_object("torch_npu.npu_fast_gelu"))
    with pytest.raises(runtime.SimulatorError, match="not simulated"):
        conf.sim_object("torch_npu.npu_fast_gelu")(torch.ones(1))


# --------------------------------------------------------------------------------------------
# graph, stream and event API


def _api_names() -> list[str]:
    return sorted(q for q in conf.fixture()["python_api"] if q.startswith(conf.API_MODULES[:2]))


@pytest.mark.parametrize("qualname", _api_names())
def test_graph_stream_event_api_matches_the_real_one(qualname: str) -> None:
    """Every public function and method of npu/graphs.py and npu/streams.py."""
    if any(qualname == k or qualname.startswith(k + ".") for k in NOT_SIMULATED):
        pytest.skip(NOT_SIMULATED[next(k for k in NOT_SIMULATED if qualname.startswith(k))])
    sim = _sim_api(qualname)
    assert sim is not None, f"{qualname} is missing from the simulator"
    real = conf.api_signature(qualname)
    ours = inspect.signature(sim)
    method = qualname.count(".") == 4  # torch_npu.npu.<module>.<Class>.<method>
    if method:
        real, ours = conf.without_first(real), conf.without_first(ours)
    assert conf.differences(real, ours) == []


def test_device_and_stream_helpers_the_simulator_defines_match_npu_utils() -> None:
    import torch_npu

    checked = []
    for qualname in conf.fixture()["python_api"]:
        if not qualname.startswith("torch_npu.npu.utils.") or qualname.count(".") != 3:
            continue
        sim = getattr(torch_npu.npu, qualname.rsplit(".", 1)[1], None)
        if sim is None:
            continue
        checked.append(qualname)
        assert conf.differences(conf.api_signature(qualname), inspect.signature(sim)) == [], (
            qualname
        )
    assert {"torch_npu.npu.utils.stream", "torch_npu.npu.utils.current_stream"} <= set(checked)


def test_graph_task_api_requires_the_stream_as_torch_npu_does() -> None:
    with pytest.raises(TypeError):
        runtime.graph_task_group_begin()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        runtime.graph_task_update_end()  # type: ignore[call-arg]


def test_capture_rule_messages_are_torch_npus_own() -> None:
    messages = conf.fixture()["messages"]
    assert messages["capture_on_default_stream"] == runtime.CAPTURE_ON_DEFAULT_STREAM
    assert messages["capture_end_on_other_stream"] == runtime.CAPTURE_END_ON_OTHER_STREAM


# --------------------------------------------------------------------------------------------
# vllm-ascend's call sites


def _sites() -> list[conf.CallSite]:
    """Every torch_npu call of the release: the graph-path files (``conf.CALL_SITE_FILES``, which
    the table below covers) must all resolve in the fixture, and every other file's calls that
    the fixture knows must bind too (the model-layer, MoE and sampler ops the engine runs)."""
    return list(conf.call_sites(conf.release_files()))


def test_call_sites_are_found() -> None:
    targets = {s.target for s in _sites()}
    assert {
        "torch_npu._npu_paged_attention",
        "torch_npu.npu_fused_infer_attention_score.out",
        "torch_npu.npu.graph_task_group_begin",
        "torch_npu.npu.graph_task_update_begin",
        "torch_npu.npu.ExternalEvent",
        "torch_npu.npu.graph",
    } <= targets


# vllm-ascend 0.23.0.post1 calls that torch-npu 2.10.0.post4 would reject (not the graph path).
KNOWN_UPSTREAM_MISMATCHES = {
    ("device/device_op.py", "torch_npu.npu_grouped_matmul_swiglu_quant_v2", "swiglu_limit"): (
        "the W8A8 MoE path passes swiglu_limit and use_mxfp_quant, which the registered "
        "schema lacks (a TypeError on hardware)"
    ),
}


def _known_mismatch(site: conf.CallSite) -> str | None:
    for (file, target, keyword), why in KNOWN_UPSTREAM_MISMATCHES.items():
        if site.file == file and site.target == target and keyword in site.keywords:
            return why
    return None


@pytest.mark.parametrize("site", _sites(), ids=lambda s: f"{s.where}:{s.target}")
def test_vllm_ascend_call_site_binds_to_the_real_api_and_the_simulator(site: conf.CallSite):
    real = conf.real_api(site.target)
    if real is None:
        assert site.file not in conf.STRICT_FILES, f"{site.where}: {site.target} unknown"
        pytest.skip(f"{site.target} is outside the fixture's API")
    if _known_mismatch(site):
        with pytest.raises(TypeError):  # still broken upstream; drop the entry once it binds
            site.bind(*real[1])
        return
    site.bind(*real[1])  # TypeError: this call would fail on the real torch_npu
    sim = conf.sim_object(site.target)
    if not conf.is_stub(sim):
        site.bind(*conf.sim_signatures(sim))


# --------------------------------------------------------------------------------------------
# the overlay's relaunches


class _Tensorish:
    """A stand-in captured field: the templates only move values around."""

    shape = (4, 2, 8)
    dtype = torch.float16


def _fields(layout: Any, **overrides: Any) -> Any:
    fields = dict.fromkeys(layout.fields, _Tensorish())
    fields.update(overrides)
    return fields_of(layout, tuple(fields[name] for name in layout.fields))


_TEMPLATES = {
    "fia": (v0_23.fia_template, "npu::npu_fused_infer_attention_score.out", {}),
    "fia_c8": (
        v0_23.fia_template,
        "npu::npu_fused_infer_attention_score.out",
        {"c8_k_aq_scale": _Tensorish(), "c8_v_aq_scale": _Tensorish()},
    ),
    "fia_v2": (v0_23.fia_v2_template, "npu::npu_fused_infer_attention_score_v2.out", {}),
    "fia_v2_window": (
        v0_23.fia_v2_template,
        "npu::npu_fused_infer_attention_score_v2.out",
        {"sliding_window": 128},
    ),
    "pa": (v0_23.pa_template, "atb::_npu_paged_attention", {}),
    "mla": (
        v0_23.mla_template,
        "npu::npu_fused_infer_attention_score_v2.out",
        {"dequant_scale_q_nope": None},
    ),
    "mla_quant": (v0_23.mla_template, "npu::npu_fused_infer_attention_score_v2.out", {}),
}


@pytest.mark.parametrize("case", sorted(_TEMPLATES))
def test_relaunch_template_binds_to_the_real_schema(case: str) -> None:
    template, key, overrides = _TEMPLATES[case]
    kinds = {v0_23.fia_template: "fia", v0_23.fia_v2_template: "fia_v2", v0_23.mla_template: "mla"}
    layout = kinds.get(template, "pa")
    c8 = {"c8_k_aq_scale": overrides.get("c8_k_aq_scale")} if layout == "fia" else {}
    fields = _fields(v0_23.LAYOUTS[layout], **{"sliding_window": None, **overrides, **c8})
    kwargs = template(fields, SimpleNamespace(SWA_INT_MAX=2147483647))
    conf.schema_signature(key).bind(**kwargs)
    assert v0_23.LAYOUTS[layout].op.replace(".out", "") in key


def _recorder(sig: inspect.Signature, calls: list, name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        sig.bind(*args, **kwargs)  # TypeError: the real API would reject this call
        calls.append(name)
        return torch.empty(1, dtype=torch.uint8)

    return call


def test_the_overlays_runtime_calls_bind_to_the_real_api() -> None:
    """Run the overlay's own update (PA workspace getter, begin, relaunch, end, record) against
    recorders carrying the real signatures."""
    calls: list[str] = []
    api = conf.api_signature
    real = SimpleNamespace(
        graph_task_update_begin=_recorder(
            api("torch_npu.npu.graphs.graph_task_update_begin"), calls, "begin"
        ),
        graph_task_update_end=_recorder(
            api("torch_npu.npu.graphs.graph_task_update_end"), calls, "end"
        ),
        stream=lambda stream: (api("torch_npu.npu.utils.stream").bind(stream), _null())[1],
    )
    record = _recorder(
        conf.without_first(api("torch_npu.npu.streams.ExternalEvent.record")), calls, "record"
    )
    fields = _fields(v0_23.LAYOUTS["pa"])
    template = v0_23.pa_template(fields, None)
    template["query"] = torch.ones(4, 2, 8)
    template["key_cache"] = template["block_table"] = torch.ones(2, 2)
    template["value_cache"] = template["out"] = torch.ones(2, 2)
    provider = LengthsWorkspaceProvider(
        kind="pa",
        lengths_key="context_lens",
        attribute="seq_lens",
        workspace_for=_recorder(
            conf.schema_signature("atb::_npu_paged_attention_get_workspace"), calls, "getter"
        ),
        template=template,
        signature=pa_signature(template),
    )
    task = UpdateTask(
        kind="pa",
        metadata_key="layer.0",
        step=0,
        layer_name="layer.0",
        handle=object(),
        event=SimpleNamespace(record=record),
        op=_recorder(conf.schema_signature("atb::_npu_paged_attention"), calls, "relaunch"),
        template=template,
        provider=provider,
    )
    graph = OwnedGraph(role="target", descriptor=None)
    graph.add(task)
    metadata = {"layer.0": SimpleNamespace(seq_lens=torch.tensor([3, 5]))}
    resolved = graph.resolve(TargetSource(metadata))
    graph.apply(resolved, update_stream=object(), runtime=real)
    assert calls == ["getter", "begin", "relaunch", "end", "record"]


@contextlib.contextmanager
def _null() -> Any:
    yield


def test_conformance_table_has_a_row_per_call_target_and_all_rows_match() -> None:
    rows = conf.table()
    assert len(rows) >= 10
    assert [r for r in rows if r[4] == "no"] == []
