"""The real torch-npu 2.10.0.post4, as data, and the checks that hold the simulator to it.

``tests/fixtures/torch_npu_2.10.0.post4.json`` (made by ``scripts/extract-torch-npu-schemas.py``
from the wheel, provenance inside) holds the registered op schemas and the signatures of the
graph / stream / event Python API. This module turns them into ``inspect.Signature``s, compares
the simulator's against them, finds vllm-ascend's ``torch_npu`` call sites and binds them, and
prints the conformance table (``python -m tests.torch_npu_conformance``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import json
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "torch_npu_2.10.0.post4.json"

#: vllm-ascend files of the conformance table: attention and device code, and what the graph
#: path runs (capture wrapper, v1/v2 runners' update and graph context, draft proposer). The
#: binding test reads every file of the release (``release_files``).
CALL_SITE_FILES = (
    "attention/attention_v1.py",
    "attention/mla_v1.py",
    "attention/utils.py",
    "device/device_op.py",
    "compilation/acl_graph.py",
    "worker/model_runner_v1.py",
    "worker/v2/utils.py",
    "worker/v2/aclgraph_utils.py",
    "spec_decode/llm_base_proposer.py",
    "sample/sampler.py",
)
#: Files where every call must resolve to a known real API (the others may call APIs outside the
#: fixture's scope, e.g. torch.npu memory functions).
STRICT_FILES = ("attention/attention_v1.py", "attention/utils.py", "device/device_op.py")

API_MODULES = ("torch_npu.npu.graphs", "torch_npu.npu.streams", "torch_npu.npu.utils")


@functools.cache
def fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


# --------------------------------------------------------------------------------------------
# signatures


def schema(key: str) -> torch.FunctionSchema:
    return torch._C.parse_schema(fixture()["schemas"][key])


def schema_key(name: str) -> str | None:
    """``npu::``/``atb::`` key of an op name such as ``"npu_fia.out"`` (None: not registered)."""
    for namespace in ("npu", "atb"):
        key = f"{namespace}::{name}"
        if key in fixture()["schemas"]:
            return key
    return None


def schema_signature(key: str) -> inspect.Signature:
    """The Python calling convention of a registered schema (keyword-only after ``*``)."""
    params = []
    for arg in schema(key).arguments:
        kind = (
            inspect.Parameter.KEYWORD_ONLY
            if arg.kwarg_only
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        default = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
        params.append(inspect.Parameter(arg.name, kind, default=default))
    return inspect.Signature(params)


def api_signature(qualname: str) -> inspect.Signature:
    """Signature of a real Python API function or method (as written in the wheel's source)."""
    text = fixture()["python_api"][qualname]
    namespace: dict[str, Any] = {}
    exec(
        compile(f"from __future__ import annotations\ndef f{text}: pass", qualname, "exec"),
        namespace,
    )
    return inspect.signature(namespace["f"])


def without_first(sig: inspect.Signature) -> inspect.Signature:
    """A method's signature as its callers see it (``self`` / ``cls`` dropped)."""
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def differences(real: inspect.Signature, sim: inspect.Signature) -> list[str]:
    """Names and order, positional vs keyword-only, required vs default, default values."""
    problems = []
    r_names, s_names = list(real.parameters), list(sim.parameters)
    if r_names != s_names:
        missing = [n for n in r_names if n not in s_names]
        extra = [n for n in s_names if n not in r_names]
        if missing or extra:
            problems.append(f"parameters: missing {missing}, extra {extra}")
        else:
            problems.append(f"order: real {r_names}, simulator {s_names}")
    for name, r in real.parameters.items():
        s = sim.parameters.get(name)
        if s is None:
            continue
        if r.kind != s.kind:
            problems.append(f"{name}: {r.kind.description} in real, {s.kind.description} here")
        if (r.default is r.empty) != (s.default is s.empty):
            what = "required" if r.default is r.empty else f"default {r.default!r}"
            problems.append(f"{name}: {what} in real, not here")
        elif r.default is not r.empty and not _same_default(r.default, s.default):
            problems.append(f"{name}: default {r.default!r} in real, {s.default!r} here")
    return problems


def _same_default(a: Any, b: Any) -> bool:
    """Equal defaults: ``1.`` and ``1`` agree, ``False`` and ``0`` or ``None`` and ``[]`` do not."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return False
    return a == b


def _annotation(fn: Callable[..., Any], value: Any) -> Any:
    if isinstance(value, str):
        module = inspect.getmodule(inspect.unwrap(fn))
        scope = dict(vars(typing))
        scope.update(vars(module) if module else {})
        return eval(value, scope)  # noqa: S307 - our own annotations
    return value


def return_arity(fn: Callable[..., Any]) -> int | None:
    """Values a simulator function returns, from its annotation (None: not annotated)."""
    ann = _annotation(fn, inspect.signature(fn).return_annotation)
    if ann is inspect.Signature.empty or ann is Any:
        return None
    if ann is None or ann is type(None):
        return 0
    if typing.get_origin(ann) is tuple:
        return len(typing.get_args(ann))
    return 1


def tensor_type_problems(key: str, fn: Callable[..., Any]) -> list[str]:
    """Parameters the schema types ``Tensor`` that the simulator annotates as something wider."""
    sig = inspect.signature(fn)
    problems = []
    for arg in schema(key).arguments:
        if str(arg.type) != "Tensor" or arg.name not in sig.parameters:
            continue
        ann = _annotation(fn, sig.parameters[arg.name].annotation)
        if ann not in (torch.Tensor, Any, inspect.Parameter.empty):
            problems.append(f"{arg.name}: Tensor in real, {ann} here")
    return problems


def op_problems(key: str, fn: Callable[..., Any]) -> list[str]:
    """Everything in which a simulator op differs from its registered schema."""
    problems = differences(schema_signature(key), inspect.signature(fn))
    problems += tensor_type_problems(key, fn)
    arity = return_arity(fn)
    if arity is not None and arity != len(schema(key).returns):
        problems.append(f"returns {len(schema(key).returns)} value(s) in real, {arity} here")
    return problems


# --------------------------------------------------------------------------------------------
# vllm-ascend call sites


@dataclass(frozen=True)
class CallSite:
    file: str
    line: int
    target: str  # dotted, from torch_npu: "torch_npu.npu_fia.out", "torch_npu.npu.graph"
    positional: int
    keywords: tuple[str, ...]
    unpacks: bool  # *args or **kwargs: only a partial bind is possible

    def bind(self, *sigs: inspect.Signature) -> None:
        """Raise TypeError if this call binds to none of ``sigs`` (an op's overloads)."""
        errors = []
        for sig in sigs:
            binder = sig.bind_partial if self.unpacks else sig.bind
            try:
                binder(*([None] * self.positional), **dict.fromkeys(self.keywords))
                return
            except TypeError as exc:
                errors.append(str(exc))
        raise TypeError(f"{self.where}: {self.target}: " + "; ".join(errors))

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def vllm_ascend_root() -> Path:
    spec = importlib.util.find_spec("vllm_ascend")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    name = ".".join(reversed(parts))
    if name.startswith("torch.npu."):
        return "torch_npu.npu." + name.removeprefix("torch.npu.")
    return name if name.startswith("torch_npu.") else None


def release_files() -> tuple[str, ...]:
    """Every Python file of the installed vllm-ascend, relative to its package."""
    root = vllm_ascend_root()
    return tuple(str(p.relative_to(root)) for p in sorted(root.rglob("*.py")))


def call_sites(files: tuple[str, ...] = CALL_SITE_FILES) -> Iterator[CallSite]:
    root = vllm_ascend_root()
    for rel in files:
        for node in ast.walk(ast.parse((root / rel).read_text())):
            if not isinstance(node, ast.Call):
                continue
            target = _dotted(node.func)
            if target is None:
                continue
            starred = any(isinstance(a, ast.Starred) for a in node.args)
            keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
            double = any(k.arg is None for k in node.keywords)
            positional = sum(not isinstance(a, ast.Starred) for a in node.args)
            yield CallSite(rel, node.lineno, target, positional, keywords, starred or double)


# --------------------------------------------------------------------------------------------
# real API of a call target, and the simulator's


def overloads(name: str) -> list[str]:
    """Schema keys a call of op ``name`` can select: the named overload, or for a bare name
    every overload (an ``OpOverloadPacket`` call picks the one the arguments fit)."""
    key = schema_key(name)
    if key is None or "." in name:
        return [key] if key is not None else []
    return [key] + sorted(k for k in fixture()["schemas"] if k.startswith(key + "."))


def real_api(target: str) -> tuple[str, list[inspect.Signature]] | None:
    """(what, signatures) of the real API a call target names; None when outside the fixture."""
    if target.startswith("torch_npu.npu."):
        name = target.removeprefix("torch_npu.npu.")
        for module in API_MODULES:
            for qualname in (f"{module}.{name}", f"{module}.{name}.__new__"):
                if qualname in fixture()["python_api"]:
                    sig = api_signature(qualname)
                    return qualname, [without_first(sig) if qualname.endswith("__new__") else sig]
            init = f"{module}.{name}.__init__"
            if init in fixture()["python_api"]:
                return init, [without_first(api_signature(init))]
        return None
    keys = overloads(target.removeprefix("torch_npu.").removeprefix("atb."))
    return (keys[0], [schema_signature(k) for k in keys]) if keys else None


def sim_object(target: str) -> Any:
    """What the simulated torch_npu has under a call target (ATB ops: the registered one)."""
    import torch_npu  # the simulator (installed by the root conftest)

    from torch_npu_sim import atb

    obj: Any = torch_npu
    for part in target.removeprefix("torch_npu.").split("."):
        swapped = (obj is torch_npu and part in atb.API_LIST) or (
            obj is torch_npu.atb and part in atb.ATB_API_LIST
        )
        obj = getattr(atb.ATB_OPS if swapped else obj, part)
    return obj


def sim_signature(obj: Any) -> inspect.Signature:
    """Signature of a simulator callable (a SimOp: of the reference op it launches)."""
    return inspect.signature(getattr(obj, "fn", obj))


def sim_signatures(obj: Any) -> list[inspect.Signature]:
    """The signature of each overload a simulator op runs (``atb._overloads``: base, ``.out``),
    or its one signature."""
    fn = getattr(obj, "fn", obj)
    return [inspect.signature(f) for f in getattr(fn, "overloads", (fn,))]


def is_stub(obj: Any) -> bool:
    """An op the simulator names but does not implement (it raises SimulatorError if called)."""
    return bool(getattr(getattr(obj, "fn", obj), "sim_unsupported", False))


# --------------------------------------------------------------------------------------------
# the table


def table() -> list[tuple[str, str, str, str, str]]:
    """(API, real, simulator, call sites, match) for every API a call site or the sim uses."""
    sites: dict[str, list[CallSite]] = {}
    for site in call_sites():
        sites.setdefault(site.target, []).append(site)
    rows = []
    for target in sorted(sites):
        real = real_api(target)
        try:
            obj = sim_object(target)
        except AttributeError:
            obj = None
        if real is None:
            continue
        what, sigs = real
        n = len(sites[target])
        binds = sum(_binds(s, sigs) for s in sites[target])
        if obj is None:
            sim, match = "absent", "no"
        elif is_stub(obj):
            sim, match = "named, not simulated (raises)", "n/a"
        else:
            # overload by overload where the simulator runs several (else the first only)
            pairs = zip(sigs, sim_signatures(obj), strict=False)
            problems = [p for real_sig, sim_sig in pairs for p in differences(real_sig, sim_sig)]
            sim = "same" if not problems else "; ".join(problems)
            match = "yes" if not problems and binds == n else "no"
        rows.append(
            (target.removeprefix("torch_npu."), _short(what, sigs[0]), sim, f"{binds}/{n}", match)
        )
    return rows


def _binds(site: CallSite, sigs: list[inspect.Signature]) -> bool:
    try:
        site.bind(*sigs)
    except TypeError:
        return False
    return True


def _short(what: str, sig: inspect.Signature) -> str:
    params = list(sig.parameters.values())
    kw = sum(p.kind == p.KEYWORD_ONLY for p in params)
    if "::" in what:
        returns = ", ".join(str(r.type) for r in schema(what).returns) or "()"
        return f"{what}: {len(params) - kw} pos + {kw} kw-only -> {returns}"
    return f"{what.rsplit('.', 1)[0] if what.endswith(('__init__', '__new__')) else what}{sig}"


def main() -> None:
    print("| API | real | simulator | call sites | match |")
    print("| --- | --- | --- | --- | --- |")
    for row in table():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    import torch_npu_sim

    torch_npu_sim.install()
    main()
