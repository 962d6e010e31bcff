"""Release lines are data: a new line is one module, and the aspects read nothing else.

A synthetic second line, built here the way a new ``lines/<release>.py`` would be, is picked by the
gate when the installed versions say so; its seams, op handles and metadata binds are what the
overlay then uses. The installer removes only its own layers.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import wrapt

from ascend_graph_patch import activation, gate, state
from ascend_graph_patch.aspects import ASPECTS, groups
from ascend_graph_patch.core.kinds import FIA, MLA
from ascend_graph_patch.lines import LINES
from ascend_graph_patch.lines.base import OWNED, STOCK
from ascend_graph_patch.lines.v0_23 import LINE as V0_23
from tests.overlay_support import assert_bitwise, overlay_arm
from torch_npu_sim.workload import bitwise_equal

SYNTHETIC_VERSION = "9.9.9"


@pytest.fixture
def seams() -> Any:
    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    yield importlib.import_module("vllm_ascend.attention.attention_v1")
    activation.disable()


def synthetic_line(**layout_changes: Any) -> Any:
    """What a new line module would hold: versions, and its FIA layout (changed as asked)."""
    fia = dataclasses.replace(V0_23.layouts[FIA], **layout_changes)
    return dataclasses.replace(
        V0_23,
        name="synthetic",
        vllm_ascend_versions=frozenset({SYNTHETIC_VERSION}),
        layouts={**V0_23.layouts, FIA: fia},
    )


@pytest.fixture
def installed_as_synthetic(monkeypatch: pytest.MonkeyPatch):
    """Make the host report vllm-ascend 9.9.9 and list a line for it next to 0.23."""

    def use(line: Any) -> None:
        real = gate.installed_version
        monkeypatch.setattr(
            gate, "installed_version", lambda d: SYNTHETIC_VERSION if "ascend" in d else real(d)
        )
        monkeypatch.setattr(gate, "LINES", (*LINES, line))

    return use


def test_every_aspect_names_a_seam_of_the_line() -> None:
    """A line has each aspect's seam or declares it absent, with why; each layout's capture
    seam is one it has."""
    for line in LINES:
        for aspect in ASPECTS:
            assert aspect.seam in line.seams or line.absent.get(aspect.seam), (line.name, aspect)
        for layout in line.layouts.values():
            assert layout.capture_seam in line.seams
        assert set(groups(line)) == {a.group for a in ASPECTS if line.has(a.seam)}


def without_mla(line: Any) -> Any:
    """A release without MLA (say an older line): its seams declared absent, no MLA layout."""
    mla = {key for key in line.seams if key.startswith("mla.")}
    return dataclasses.replace(
        line,
        seams={k: v for k, v in line.seams.items() if k not in mla},
        absent=dict.fromkeys(mla, "this release has no MLA backend"),
        layouts={k: v for k, v in line.layouts.items() if k != MLA},
        fingerprints={k: v for k, v in line.fingerprints.items() if k != "mla"},
    )


def test_a_line_may_declare_a_seam_absent(seams, installed_as_synthetic) -> None:
    """The MLA aspects are left out on a release without MLA: no ``mla`` group to wait for, the
    v1 group installs as before, and stock's FIA graphs are still owned."""
    line = without_mla(synthetic_line())
    assert "mla" not in groups(line) and "mla" in groups(V0_23)
    installed_as_synthetic(line)
    arm = overlay_arm("dense_gqa", "on", steps=4)
    assert arm.snapshot["gate"]["v1"]["verdict"] == "supported"
    assert "mla" not in arm.snapshot["gate"]
    assert {"attention.mla", "replay.mla"}.isdisjoint(arm.snapshot["aspects_installed"])
    assert "replay.update" in arm.snapshot["aspects_installed"]
    assert arm.counters["updates.owned"] == 4


def test_a_seam_neither_present_nor_declared_absent_is_an_error() -> None:
    """Negative control for the test above: leaving a seam out without saying so is a line bug,
    caught where the line is read (not silently skipped)."""
    line = without_mla(V0_23)
    silent = dataclasses.replace(line, absent={})
    with pytest.raises(KeyError, match="mla.forward_decode"):
        groups(silent)
    assert "mla" not in groups(line)


def test_a_graph_holding_an_impl_left_to_stock_is_refused_with_the_lines_reason(
    seams, installed_as_synthetic
) -> None:
    """A line names impl classes whose graphs it leaves to stock (context-parallel, SFA, DSA):
    here, on a synthetic line, the backend's own impl. Every graph is then refused with that
    reason, visible in ``status``, and stock updates them: tokens equal stock's."""
    stock = overlay_arm("dense_gqa", "off", steps=6)
    reason = "synthetic: this impl's graphs are stock's"
    module = V0_23.seams["attention.full_graph_fia"].module
    impls = tuple(
        dataclasses.replace(f, fate=STOCK, reason=reason) if f.qualname == IMPL_NAME else f
        for f in V0_23.impls
    )
    installed_as_synthetic(dataclasses.replace(synthetic_line(), impls=impls))
    assert V0_23.fate(getattr(importlib.import_module(module), IMPL_NAME)).fate == OWNED
    arm = overlay_arm("dense_gqa", "on", steps=6)
    assert arm.refused and set(arm.refused.values()) == {reason}
    assert reason in set(arm.snapshot["graphs_refused"].values())
    assert arm.snapshot["graphs_owned"] == 0 and "updates.owned" not in arm.counters
    assert arm.counters["updates.stock.unowned"] == 6
    assert_bitwise(arm, stock)


# --- every attention impl class of the release has a fate ---------------------------------------

IMPL_NAME = "AscendAttentionBackendImpl"
#: vLLM's attention impl bases: a class of vllm_ascend deriving from one is an attention impl.
VLLM_IMPL_BASES = frozenset({"AttentionImplBase", "AttentionImpl", "MLAAttentionImpl"})


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):  # AttentionImpl[T]
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def release_impl_classes() -> set[tuple[str, str]]:
    """(module, name) of every top-level class the installed vllm_ascend defines that derives,
    through the names of its bases, from one of vLLM's attention impl bases: read from the
    source files (so a module that does not import here is enumerated too)."""
    import vllm_ascend

    root = Path(vllm_ascend.__file__).parent
    defined: list[tuple[str, str, set[str]]] = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                bases = {name for base in node.bases if (name := _base_name(base))}
                defined.append((module, node.name, bases))
    impls = set(VLLM_IMPL_BASES)
    grew = True
    while grew:
        grown = {name for _, name, bases in defined if bases & impls}
        grew = not grown <= impls
        impls |= grown
    return {(module, name) for module, name, bases in defined if bases & impls}


#: Device kernel packages a module of the release imports at its top (FA3's), absent here:
#: stood in for by an empty module while that module is imported, then taken away.
DEVICE_PACKAGES = ("flash_attn_npu_v3",)


def _class(module: str, name: str) -> type:
    importlib.import_module("vllm_ascend.ops")  # import order (circular import otherwise)
    if module in sys.modules:
        return getattr(sys.modules[module], name)
    stubs = [p for p in DEVICE_PACKAGES if p not in sys.modules]
    for package in stubs:
        stub = ModuleType(package)
        stub.__getattr__ = lambda attr, _p=package: _device_only(_p, attr)  # type: ignore[method-assign]
        sys.modules[package] = stub
    try:
        return getattr(importlib.import_module(module), name)
    finally:
        for package in stubs:
            del sys.modules[package]


def _device_only(package: str, attr: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{package}.{attr} needs an Ascend device")

    return call


def test_every_attention_impl_class_of_the_release_has_a_fate() -> None:
    """Enumerated from the installed release, not listed by hand: each concrete attention impl
    class it defines is owned, left to stock or named as capturing nothing, and the line names
    no class the release lacks. (The four names pinned here before missed AscendDSACPImpl,
    which derives from no class of theirs: its graphs were owned with no task and no reason.)"""
    found = {
        (module, name)
        for module, name in release_impl_classes()
        if not inspect.isabstract(_class(module, name))
    }
    assert ("vllm_ascend.attention.context_parallel.dsa_cp", "AscendDSACPImpl") in found
    assert ("vllm_ascend.attention.abstract", "DSAAttentionImpl") not in found  # abstract
    assert found == {(f.module, f.qualname) for f in V0_23.impls}
    assert len(V0_23.impls) == len(found)  # one fate each


def _owner_methods() -> dict[str, set[str]]:
    """Owned class -> the methods of the line's seams on it (capture and update)."""
    owners: dict[str, set[str]] = {}
    for seam in V0_23.seams.values():
        owner, _, method = seam.qualname.rpartition(".")
        if owner in {f.qualname for f in V0_23.impls if f.fate == OWNED}:
            owners.setdefault(owner, set()).add(method)
    return owners


def _evidence(fate: Any, cls: type) -> None:
    """What in the release's own code makes the fate right."""
    owners = {f.qualname: _class(f.module, f.qualname) for f in V0_23.impls if f.fate == OWNED}
    methods = _owner_methods()
    if fate.fate == OWNED:
        # captured through the line's seams: every seam method of its owner is the owner's own
        owner = next(o for name, o in owners.items() if name in methods and issubclass(cls, o))
        # (or a subclass's override that is itself a seam of the line: C8's forward)
        own_seams = methods.get(cls.__qualname__, set()) if cls is not owner else set()
        for method in methods[owner.__qualname__]:
            if method in own_seams:
                continue
            assert inspect.getattr_static(cls, method) is inspect.getattr_static(owner, method)
        return
    own_source = inspect.getsource(cls)
    if fate.fate == STOCK:
        # its own update path, which the overlay does not model
        assert "update_graph_params" in cls.__dict__
        return
    # NOTHING: no code of its own or of a non-owned base opens a task group or calls a capture
    # method; below an owned base, it replaces the method through which that base captures
    for klass in cls.__mro__:
        if klass.__module__.startswith("vllm_ascend") and klass not in owners.values():
            text = inspect.getsource(klass)
            assert "graph_task_group_begin" not in text and "full_graph_" not in text, klass
    if any(issubclass(cls, o) for o in owners.values()):
        assert "forward_impl" in cls.__dict__ and "full_graph_" not in own_source
    update = inspect.getattr_static(cls, "update_graph_params", None)
    if update is not None and "update_graph_params" in cls.__dict__:
        body = inspect.getsource(update.__func__ if isinstance(update, staticmethod) else update)
        assert body.rstrip().endswith("pass"), cls  # its own update does nothing


@pytest.mark.parametrize("fate", V0_23.impls, ids=lambda f: f.qualname)
def test_each_impl_class_meets_its_fate(fate: Any) -> None:
    """An instance of each class (made without its ``__init__``, which wants a device or a
    parallel config) is owned or refused with its reason, and the release's code shows why."""
    cls = _class(fate.module, fate.qualname)
    impl = cls.__new__(cls)
    assert V0_23.refusal(impl) == (None if fate.fate == OWNED else fate.reason)
    assert fate.reason
    _evidence(fate, cls)


def test_an_attention_impl_the_line_does_not_know_is_refused_as_unknown() -> None:
    """A subclass of an owned impl may capture otherwise (FA3, 310P): unknown, it is refused,
    never owned; a layer's ``impl`` that is no attention impl is not the line's concern."""

    class Derived(_class(V0_23.seams["attention.full_graph_fia"].module, IMPL_NAME)):  # type: ignore[misc]
        pass

    reason = V0_23.refusal(Derived.__new__(Derived))
    assert reason is not None and "Derived is unknown to line 0.23" in reason
    assert V0_23.refusal(object()) is None


def _with_extra_layer(mocker: Any, impl: Any) -> None:
    """The harness registers, next to its layers, one more whose impl is ``impl`` (a model
    whose graphs hold that impl): the capture sees it in the forward context's layers."""
    from torch_npu_sim.harness import stack

    real = stack.register

    def register(layers: Any, vllm_config: Any) -> None:
        real(layers, vllm_config)
        static = vllm_config.compilation_config.static_forward_context
        static["model.layers.99.self_attn.attn"] = SimpleNamespace(impl=impl)

    mocker.patch.object(stack, "register", register)


REFUSED = [f for f in V0_23.impls if f.fate != OWNED]


@pytest.fixture(scope="module")
def stock_dense_6() -> Any:
    return overlay_arm("dense_gqa", "off", steps=6)


@pytest.mark.parametrize("fate", REFUSED, ids=lambda f: f.qualname)
def test_a_graph_holding_an_impl_the_line_does_not_own_is_refused_with_its_reason(
    fate: Any, mocker: Any, stock_dense_6: Any
) -> None:
    """Captured for real: a graph holding an instance of each class left to stock or capturing
    nothing is refused at capture with that class's reason, in ``status``; never owned (with
    zero tasks or any); stock updates it, tokens equal stock's."""
    cls = _class(fate.module, fate.qualname)
    _with_extra_layer(mocker, cls.__new__(cls))
    arm = overlay_arm("dense_gqa", "on", steps=6)
    assert arm.error is None, arm.error
    assert arm.refused and set(arm.refused.values()) == {fate.reason}
    assert set(arm.snapshot["graphs_refused"].values()) == {fate.reason}
    assert arm.snapshot["graphs_owned"] == 0 and "updates.owned" not in arm.counters
    assert arm.counters["updates.stock.unowned"] == 6
    assert_bitwise(arm, stock_dense_6)


def test_the_extra_layer_of_an_owned_class_changes_nothing(mocker: Any) -> None:
    """Negative control for the test above: the same extra layer holding an owned class's impl
    leaves every graph owned; so the refusals there are the class's doing."""
    cls = _class(V0_23.seams["attention.full_graph_fia"].module, IMPL_NAME)
    _with_extra_layer(mocker, cls.__new__(cls))
    arm = overlay_arm("dense_gqa", "on", steps=6)
    assert arm.error is None and not arm.refused
    assert arm.counters["updates.owned"] == 6


def test_the_ops_positional_parameters_are_the_wheels() -> None:
    """Verify names the arguments stock passes by position (MLA: ``q_nope, k_nope, k_nope``)
    with each layout's ``positional``: the leading parameters of the op's schema in the real
    torch-npu 2.10.0.post4 wheel (the extracted fixture), up to its first keyword-only one."""
    schemas = json.loads((Path(__file__).parent / FIXTURE).read_text())["schemas"]
    for layout in V0_23.layouts.values():
        name = layout.op.split(".")[0] + ("." + layout.op.split(".")[1] if "." in layout.op else "")
        (schema,) = [s for key, s in schemas.items() if key.split("::")[1] == name]
        params = schema[schema.index("(") + 1 : schema.index(") ->")].split(", ")
        leading = []
        for param in params:
            if param.startswith("*"):
                break
            leading.append(param.split()[-1].split("=")[0])
        assert layout.positional == tuple(leading), (layout.kind, leading)


FIXTURE = "fixtures/torch_npu_2.10.0.post4.json"


def test_the_update_entry_points_are_every_module_importing_the_update_by_name() -> None:
    """``ab`` times the update where the runners call it: each module of the release that
    imports ``update_full_graph_params`` by name, enumerated here from the installed source
    (the others, 310P's runner, DFlash and Step3.5 proposers, call it through those modules)."""
    import vllm_ascend

    acl = V0_23.graph_params[0][0]
    root = Path(vllm_ascend.__file__).parent
    importing = set()
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = {a.name for a in node.names} if isinstance(node, ast.ImportFrom) else ()
            if "update_full_graph_params" in names and node.module == acl:  # type: ignore[union-attr]
                importing.add(f"{module}:update_full_graph_params")
    assert importing == set(V0_23.update_entry_points)


def test_the_gate_derives_its_checks_from_the_aspect_table() -> None:
    checks = gate.checks(V0_23, "v1")
    v1_seams = {V0_23.seams[a.seam].qualname for a in ASPECTS if a.group == "v1"}
    assert {c.qualname for c in checks} >= v1_seams
    update = next(c for c in checks if c.qualname.endswith("update_graph_params"))
    assert update.kind == "signature" and update.expect == V0_23.update_params


def test_a_new_line_is_picked_by_version_and_its_op_handle_is_the_one_relaunched(
    seams, installed_as_synthetic, monkeypatch
) -> None:
    import torch_npu

    stock = overlay_arm("dense_gqa", "off", steps=12)
    relaunched: list[int] = []
    real_out = torch_npu.npu_fused_infer_attention_score.out

    def spy(*args: Any, **kwargs: Any) -> Any:
        relaunched.append(1)
        return real_out(*args, **kwargs)

    # the synthetic release relaunches FIA through another handle: only the line says so
    monkeypatch.setattr(torch_npu, "agp_synthetic_fia", spy, raising=False)
    installed_as_synthetic(synthetic_line(op="agp_synthetic_fia"))
    arm = overlay_arm("dense_gqa", "on", steps=12)
    assert arm.snapshot["gate"]["v1"]["verdict"] == "supported"
    assert "line synthetic" in arm.snapshot["gate"]["v1"]["reason"]
    assert_bitwise(arm, stock)
    assert arm.counters["updates.owned"] == 12
    assert len(relaunched) == arm.counters["tasks.updated"] == 12 * 4


def test_a_new_line_decides_which_metadata_attribute_feeds_a_relaunch(
    seams, installed_as_synthetic
) -> None:
    """Negative control for the test above: bind the KV lengths from the wrong attribute (the
    query ends) and the overlay's output must leave stock's."""
    stock = overlay_arm("dense_gqa", "off", steps=12)
    wrong = (
        ("actual_seq_lengths", "actual_seq_lengths_q"),
        ("actual_seq_lengths_kv", "actual_seq_lengths_q"),
    )
    installed_as_synthetic(synthetic_line(binds=wrong))
    arm = overlay_arm("dense_gqa", "on", steps=12)
    assert arm.counters["updates.owned"] == 12
    assert not bitwise_equal(arm.run, stock.run)[0]


def test_a_seam_missing_on_the_new_line_is_a_clean_refusal(
    seams, installed_as_synthetic, capfd
) -> None:
    line = synthetic_line()
    moved = dataclasses.replace(line.seams["attention.full_graph_pa"], qualname="Gone.full_graph")
    seams_moved = {**line.seams, "attention.full_graph_pa": moved}
    installed_as_synthetic(dataclasses.replace(line, seams=seams_moved))
    activation.enable("on")
    assert state.STATE.gate["v1"]["verdict"] == "refused"
    assert "Gone.full_graph" in state.STATE.gate["v1"]["reason"]
    # nothing of the refused group is installed (the v2 group may be, if an earlier test in this
    # process loaded the v2 runner's modules: it has its own seams and its own gate verdict)
    v1 = {a.name for a in ASPECTS if a.group == "v1"}
    assert not v1 & set(activation.installed())
    assert "not installed (v1)" in capfd.readouterr().err


# --- the installer removes only its own layers --------------------------------------------------


def test_disable_star_installs_nothing(seams, monkeypatch, capfd) -> None:
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_DISABLE", "*")
    activation.enable("on")
    assert state.STATE.gate["v1"]["verdict"] == "supported"
    assert activation.installed() == []


def test_unknown_aspect_names_in_disable_are_named(seams, monkeypatch, capfd) -> None:
    monkeypatch.setenv("ASCEND_GRAPH_PATCH_DISABLE", "replay.update,attention.paa")
    activation.enable("on")
    installed = activation.installed()
    assert "replay.update" not in installed and "attention.pa" in installed
    err = capfd.readouterr().err
    assert err.count("no aspect named attention.paa") == 1


def test_a_wrapper_installed_on_top_of_ours_survives_disable(seams) -> None:
    impl = seams.AscendAttentionBackendImpl
    original = impl.__dict__["update_graph_params"]

    def theirs(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        return wrapped(*args, **kwargs)

    activation.enable("on")
    ours = impl.__dict__["update_graph_params"]
    assert ours is not original
    wrapt.wrap_function_wrapper(impl, "update_graph_params", theirs)
    top = impl.__dict__["update_graph_params"]
    activation.disable()
    assert impl.__dict__["update_graph_params"] is top  # their layer is still there ...
    assert top.__wrapped__ is ours  # ... over ours, which is now inert
    assert "replay.update" not in activation.installed()
    # enabling again revives our layer in place: no second layer of ours
    activation.enable("on")
    assert impl.__dict__["update_graph_params"] is top and top.__wrapped__ is ours
    assert "replay.update" in activation.installed()
    activation.disable()
    # the test's own cleanup: take their layer off, then ours (outermost again) comes off
    setattr(impl, "update_graph_params", ours)
    activation.enable("on")
    activation.disable()
    assert impl.__dict__["update_graph_params"] is original


def test_an_inert_layer_changes_nothing(seams) -> None:
    """Beneath a third-party wrapper after disable, our layer passes straight through."""
    impl = seams.AscendAttentionBackendImpl
    original = impl.__dict__["update_graph_params"]
    stock = overlay_arm("paged_attention", "off", steps=8)
    activation.enable("on")
    ours = impl.__dict__["update_graph_params"]
    calls: list[int] = []

    def theirs(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        calls.append(1)
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(impl, "update_graph_params", theirs)
    activation.disable()
    try:
        arm = overlay_arm("paged_attention", "off", steps=8)
        assert_bitwise(arm, stock)
        assert arm.counters == {}
        assert calls, "the updates did not go through their layer (and our inert one beneath)"
    finally:
        setattr(impl, "update_graph_params", ours)
        activation.enable("on")
        activation.disable()
    assert impl.__dict__["update_graph_params"] is original
