#!/usr/bin/env python
"""Mutation testing of the release line: does a wrong relaunch argument get past the tests?

Every argument the line's templates and providers pass to a relaunch is mutated, one at a time,
in a temporary copy of the repository, and a chosen set of tests runs against the copy; a mutant
the tests fail on is *killed*, one they pass is a *survivor* (``docs/design.md``, "Mutation
testing", explains each survivor). The sites are found in the source, never by line number:

- templates: the functions the line's ``TaskLayout(...)`` calls name as ``template=``; each
  keyword they put in the relaunch (a dict entry, a ``kwargs.update`` keyword) is dropped,
  swapped with the nearest entry whose schema type (from the op's registered schema in
  ``tests/fixtures/torch_npu_2.10.0.post4.json``) is the same, or has its constant changed;
- layouts: each ``TaskLayout``'s ``binds`` (a pair dropped, two pairs' metadata attributes
  swapped), ``block_table``, ``draft_causal`` and ``workspace``;
- providers: the functions named as ``provider=`` / ``rebind_table=`` and the ``values`` of
  every ``*Provider`` class of the line and of ``core/providers.py``: a padding skipped
  (``x + [0] * n`` -> ``x``), a slice skipped, a request count taken as the token count
  (``a // b`` -> ``a``), a constant changed, a returned entry dropped or swapped, keys paired
  with other values (``zip(k, v)`` -> ``zip(k[::-1], v)``), a condition's branch forced;
- metadata: another draft step's metadata (``per_step[b.step]`` in ``core/graph.py``, and the
  step the line's ``draft_step`` returns), another layer's (a bucket's keys rotated), and the
  KV-sharing target ignored (the line's ``metadata_key``).

Usage (``make mutate``; parallelism 1, a timeout per mutant)::

    .venv/bin/python scripts/mutate.py [--quick] [--list] [--only SUBSTRING ...]
        [--timeout 240] [--out mutation-report] [--tests tests/test_x.py ...]

It writes ``<out>/mutants.json`` and ``<out>/mutants.md`` (killed / survived per mutant). The
working tree is never modified: the copy lives in a temporary directory, removed at the end,
on Ctrl-C too.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINES = "ascend_graph_patch/lines"
PROVIDERS = "ascend_graph_patch/core/providers.py"
GRAPH = "ascend_graph_patch/core/graph.py"
FIXTURE = "tests/fixtures/torch_npu_2.10.0.post4.json"

#: The tests every mutant runs first (unit tests of the core and the line: seconds), then the
#: harness tests of its kind: the overlay against stock bitwise and under verify on the real
#: vllm-ascend code (``-x``: a killed mutant stops at its first failing test).
COMMON_TESTS = ("tests/test_core.py",)
_SCENARIO = "tests/test_overlay_scenarios.py::test_{}[{}]"
_BITWISE, _VERIFY = "overlay_equals_stock_and_eager", "verify_reports_no_mismatch"
TESTS_BY_KIND = {
    "FIA": (
        _SCENARIO.format(_VERIFY, "dense_gqa"),
        _SCENARIO.format(_BITWISE, "dense_gqa"),
        "tests/test_mtp.py::test_verify_has_no_mismatch_where_stock_is_right[mtp_k1]",
        _SCENARIO.format(_BITWISE, "sliding_window"),
    ),
    "FIA_V2": (_SCENARIO.format(_VERIFY, "sinks"), _SCENARIO.format(_BITWISE, "sinks")),
    "PA": (
        _SCENARIO.format(_VERIFY, "paged_attention"),
        _SCENARIO.format(_BITWISE, "paged_attention"),
    ),
    "MLA": (
        _SCENARIO.format(_VERIFY, "mla"),
        _SCENARIO.format(_BITWISE, "mla"),
        "tests/test_mtp.py::test_overlay_equals_stock_equals_eager[mla_mtp_k2]",
        "tests/test_mla.py::test_plain_target_graph_matches_stock",
        "tests/test_mla.py::test_mtp_target_graph_matches_stock",
        "tests/test_mla.py::test_draft_graph_matches_stock_per_step",
        "tests/test_mla.py::test_quantised_layers_relaunch_with_their_dequant_scales",
        "tests/test_mtp.py::test_verify_has_no_mismatch_where_stock_is_right[mla_mtp_k2]",
    ),
    "step": (
        "tests/test_mtp.py::test_verify_has_no_mismatch_where_stock_is_right[mtp_k4]",
        "tests/test_mtp.py::test_overlay_equals_stock_equals_eager[mtp_k2]",
        "tests/test_mtp.py::test_verify_has_no_mismatch_where_stock_is_right[mla_mtp_k2]",
    ),
    "layer": (
        _SCENARIO.format(_VERIFY, "gemma4_mixed"),
        _SCENARIO.format(_BITWISE, "hybrid_linear_grouped"),
        "tests/test_mtp.py::test_verify_has_no_mismatch_where_stock_is_right[mtp_2layers_k3]",
    ),
}
QUICK_TESTS_BY_KIND = {kind: tests[:1] for kind, tests in TESTS_BY_KIND.items()}
#: Replay steps per harness arm (the suite runs 200): enough for the random batches to pad, vary
#: and grow the KV lengths across block boundaries; ``--steps`` changes it.
STEPS = 24
#: ``--quick`` keeps these operators (one or two per site).
QUICK_OPERATORS = frozenset(
    {"drop", "padding", "step", "floordiv", "bind-drop", "layer", "steady-none"}
)


@dataclass
class Mutant:
    id: str  # stable across edits: file, scope, site, operator
    file: str
    line: int
    scope: str
    site: str
    operator: str
    description: str
    kind: str  # what the mutated argument feeds: a layout kind, or "step" / "layer"
    start: int  # byte offsets in the original file
    end: int
    replacement: str
    status: str = "not run"
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# discovery


class Source:
    """One file's bytes, its AST, and node spans as byte offsets."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data = (REPO / path).read_bytes()
        self.tree = ast.parse(self.data)
        self._line_starts = [0]
        for i, byte in enumerate(self.data):
            if byte == 0x0A:
                self._line_starts.append(i + 1)

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self._line_starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = self._line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return start, end

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode()

    def entry_span(self, key: ast.AST, value: ast.AST) -> tuple[int, int]:
        """A dict entry or keyword with its trailing comma, for dropping it."""
        start, _ = self.span(key)
        _, end = self.span(value)
        rest = self.data[end:]
        stripped = rest.lstrip(b" \t\r\n")
        if stripped.startswith(b","):
            end += len(rest) - len(stripped) + 1
        return start, end


def schema_types(op: str) -> dict[str, str]:
    """Parameter name -> normalised type, from the op's registered schema (the fixture)."""
    schemas = json.loads((REPO / FIXTURE).read_text())["schemas"]
    schema = schemas.get(f"npu::{op}") or schemas.get(f"atb::{op}") or ""
    params = schema[schema.find("(") + 1 : schema.rfind(") ->")]
    out = {}
    for part in params.split(","):
        part = part.strip().lstrip("*").strip()
        match = re.match(r"([\w\[\]?()!]+)\s+(\w+)", part)
        if match:
            kind = re.sub(r"\(.*?\)|\?", "", match.group(1)).replace("SymInt", "int")
            out[match.group(2)] = kind
    return out


def schema_defaults(op: str) -> dict[str, str]:
    schemas = json.loads((REPO / FIXTURE).read_text())["schemas"]
    schema = schemas.get(f"npu::{op}") or schemas.get(f"atb::{op}") or ""
    return dict(re.findall(r"(\w+)=(\"[^\"]*\"|[\w.-]+)", schema))


def _functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _calls_named(tree: ast.AST, name: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
            yield node


class Finder:
    def __init__(self) -> None:
        self.mutants: list[Mutant] = []
        self.kind = "FIA"  # the layout kind the sites being visited feed

    def add(
        self,
        src: Source,
        node: ast.AST,
        scope: str,
        site: str,
        operator: str,
        description: str,
        replacement: str,
        span: tuple[int, int] | None = None,
    ) -> None:
        start, end = span or src.span(node)
        if src.data[start:end].decode() == replacement:
            return
        base = f"{Path(src.path).name}:{scope}:{site}:{operator}"
        ident, n = base, 2
        while any(m.id == ident for m in self.mutants):
            ident, n = f"{base}#{n}", n + 1
        self.mutants.append(
            Mutant(
                ident,
                src.path,
                node.lineno,
                scope,
                site,
                operator,
                description,  # type: ignore[attr-defined]
                operator if operator in ("step", "layer") else self.kind,
                start,
                end,
                replacement,
            )
        )

    # -- constants ------------------------------------------------------------------------------
    def constants(
        self,
        src: Source,
        node: ast.AST,
        scope: str,
        site: str,
        defaults: dict[str, str] | None = None,
    ) -> None:
        for sub in ast.walk(node):
            if not isinstance(sub, ast.Constant):
                continue
            value = sub.value
            if isinstance(value, bool):
                self.add(
                    src, sub, scope, site, "constant", f"{value} -> {not value}", str(not value)
                )
            elif isinstance(value, int):
                self.add(
                    src, sub, scope, site, "constant", f"{value} -> {value + 1}", str(value + 1)
                )
            elif isinstance(value, str) and defaults is not None and site in defaults:
                other = defaults[site]
                if other.strip('"') != value:
                    self.add(src, sub, scope, site, "constant", f"{value!r} -> {other}", other)

    # -- relaunch keyword entries (dict literal entries, ``update`` keywords) -------------------
    def entries(
        self,
        src: Source,
        scope: str,
        entries: list[tuple[ast.AST, str, ast.expr]],
        types: dict[str, str],
        defaults: dict[str, str],
    ) -> None:
        for i, (key_node, name, value) in enumerate(entries):
            self.add(
                src,
                value,
                scope,
                name,
                "drop",
                f"{name} not passed (the op's default)",
                "",
                src.entry_span(key_node, value),
            )
            kind = types.get(name)
            default = defaults.get(name, "None")
            if kind is not None:
                order = list(range(i + 1, len(entries))) + list(range(i - 1, -1, -1))
                for j in order:
                    other_name, other = entries[j][1], entries[j][2]
                    text = src.text(other)
                    if text == default:  # the op's default: the drop above already is this
                        continue
                    if types.get(other_name) == kind and text != src.text(value):
                        self.add(
                            src,
                            value,
                            scope,
                            name,
                            "swap",
                            f"{name} given {other_name}'s value ({src.text(other)})",
                            src.text(other),
                        )
                        break
            if isinstance(value, ast.List) and len(value.elts) > 1:
                items = ", ".join(src.text(e) for e in reversed(value.elts))
                self.add(src, value, scope, name, "swap", f"{name}'s items reversed", f"[{items}]")
            self.constants(src, value, scope, name, defaults)

    def template(self, src: Source, fn: ast.FunctionDef, op: str) -> None:
        types, defaults = schema_types(op), schema_defaults(op)
        for node in ast.walk(fn):
            if isinstance(node, ast.Dict):
                entries = [
                    (k, k.value, v)
                    for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                ]
                self.entries(src, fn.name, entries, types, defaults)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"
            ):
                entries = [(k, k.arg, k.value) for k in node.keywords if k.arg]
                self.entries(src, fn.name, entries, types, defaults)

    # -- providers and rules ---------------------------------------------------------------------
    def provider(self, src: Source, fn: ast.FunctionDef, scope: str, op: str | None) -> None:
        types = schema_types(op) if op else {}
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Add)
                and (
                    isinstance(node.right, ast.BinOp)
                    and isinstance(node.right.op, ast.Mult)
                    and isinstance(node.right.left, ast.List)
                )
            ):
                self.add(
                    src,
                    node,
                    scope,
                    src.text(node.left),
                    "padding",
                    f"padding skipped: {src.text(node)} -> {src.text(node.left)}",
                    src.text(node.left),
                )
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
                self.add(
                    src,
                    node,
                    scope,
                    src.text(node),
                    "floordiv",
                    f"{src.text(node)} -> {src.text(node.left)} (the token count, not the "
                    "request count)",
                    src.text(node.left),
                )
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Slice)
                and node.slice.lower is None
                and node.slice.upper is not None
            ):
                self.add(
                    src,
                    node,
                    scope,
                    src.text(node),
                    "slice",
                    f"slice skipped: {src.text(node)} -> {src.text(node.value)}",
                    src.text(node.value),
                )
            elif isinstance(node, ast.IfExp):
                for branch, which in ((node.body, "then"), (node.orelse, "else")):
                    self.add(
                        src,
                        node,
                        scope,
                        src.text(node.test),
                        f"branch-{which}",
                        f"{src.text(node)} -> {src.text(branch)}",
                        src.text(branch),
                    )
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "zip"
                and len(node.args) >= 2
            ):
                first = node.args[0]
                self.add(
                    src,
                    first,
                    scope,
                    src.text(first),
                    "pairing",
                    f"{src.text(first)} paired with other values (reversed)",
                    f"{src.text(first)}[::-1]",
                )
            elif isinstance(node, ast.Return) and isinstance(node.value, (ast.BoolOp, ast.Compare)):
                for forced in ("True", "False"):
                    self.add(
                        src,
                        node.value,
                        scope,
                        "return",
                        f"rule-{forced.lower()}",
                        f"{src.text(node.value)} -> {forced}",
                        forced,
                    )
            elif isinstance(node, ast.Dict):
                entries = [
                    (k, k.value, v)
                    for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                ]
                self.entries(src, scope, entries, types, {}) if entries else None
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, int)
                and not isinstance(node.value, bool)
            ):
                self.add(
                    src,
                    node,
                    scope,
                    f"const{node.value}",
                    "constant",
                    f"{node.value} -> {node.value + 1}",
                    str(node.value + 1),
                )

    def steady(self, src: Source, cls: ast.ClassDef) -> None:
        """A provider's steady value (``self.steady = (keyword, getter)``: the graph's workspace,
        written into every task's template) forced to None."""
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Attribute) and t.attr == "steady" for t in node.targets)
                and isinstance(node.value, ast.Tuple)
                and len(node.value.elts) == 2
            ):
                key, getter = node.value.elts
                self.add(
                    src,
                    getter,
                    f"{cls.name}.steady",
                    src.text(key).strip("\"'"),
                    "steady-none",
                    f"the steady {src.text(key)} forced to None for every task",
                    "lambda: None",
                )

    # -- layouts ----------------------------------------------------------------------------------
    def layout(self, src: Source, call: ast.Call, kind: str) -> None:
        kw = _keywords(call)
        scope = f"layout[{kind}]"
        binds = kw.get("binds")
        if isinstance(binds, ast.Tuple):
            pairs = [p for p in binds.elts if isinstance(p, ast.Tuple) and len(p.elts) == 2]
            for p in pairs:
                name = ast.literal_eval(p.elts[0])
                self.add(
                    src,
                    p,
                    scope,
                    f"binds.{name}",
                    "bind-drop",
                    f"{name} no longer rebound per step",
                    "",
                    src.entry_span(p, p),
                )
            for a, b in zip(pairs, pairs[1:], strict=False):
                na, nb = ast.literal_eval(a.elts[0]), ast.literal_eval(b.elts[0])
                self.add(
                    src,
                    a.elts[1],
                    scope,
                    f"binds.{na}",
                    "bind-swap",
                    f"{na} rebound from {nb}'s metadata attribute",
                    src.text(b.elts[1]),
                )
        for name, replacement in (
            ("block_table", "None"),
            ("draft_causal", "None"),
            ("workspace", '"graph"'),
        ):
            value = kw.get(name)
            if value is not None and src.text(value) != replacement:
                self.add(
                    src,
                    value,
                    scope,
                    name,
                    "layout",
                    f"{name}={src.text(value)} -> {replacement}",
                    replacement,
                )

    # -- metadata sources -------------------------------------------------------------------------
    def metadata_graph(self, src: Source) -> None:
        """Where the graph fetches each task's metadata (its ``values_*`` and ``_prepare``)."""
        for fn in _functions(src.tree).values():
            if not (fn.name.startswith("values") or fn.name == "_prepare"):
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Subscript)
                    and isinstance(node.slice, ast.Attribute)
                    and node.slice.attr == "step"
                ):
                    seq, index = src.text(node.value), src.text(node.slice)
                    self.add(
                        src,
                        node.slice,
                        fn.name,
                        f"{seq}[{index}]",
                        "step",
                        f"another draft step's metadata: {seq}[({index} + 1) % len({seq})]",
                        f"({index} + 1) % len({seq})",
                    )
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "itemgetter"
                    and node.args
                    and isinstance(node.args[0], ast.Starred)
                ):
                    keys = src.text(node.args[0].value)
                    self.add(
                        src,
                        node.args[0],
                        fn.name,
                        f"itemgetter(*{keys})",
                        "layer",
                        "another layer's metadata: the bucket's keys rotated by one",
                        f"*({keys}[1:] + {keys}[:1])",
                    )

    def metadata_line(self, src: Source, fn: ast.FunctionDef, role: str) -> None:
        for node in ast.walk(fn):
            if role == "metadata_key" and isinstance(node, ast.BoolOp):
                last = node.values[-1]
                self.add(
                    src,
                    node,
                    fn.name,
                    "return",
                    "layer",
                    f"the KV-sharing target ignored: {src.text(node)} -> {src.text(last)}",
                    src.text(last),
                )
            if (
                role == "draft_step"
                and isinstance(node, ast.Return)
                and isinstance(node.value, ast.Name)
            ):
                self.add(
                    src,
                    node.value,
                    fn.name,
                    "return",
                    "step",
                    f"another draft step: {node.value.id} -> {node.value.id} + 1",
                    f"{node.value.id} + 1",
                )


def discover() -> list[Mutant]:
    finder = Finder()
    workspace_kinds: dict[str, str] = {}  # a layout's workspace source -> the first kind using it
    for path in sorted((REPO / LINES).glob("*.py")):
        rel = str(path.relative_to(REPO))
        src = Source(rel)
        functions = _functions(src.tree)
        classes = {n.name: n for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef)}
        for call in _calls_named(src.tree, "TaskLayout"):
            kw = _keywords(call)
            kind = src.text(kw["kind"]) if "kind" in kw else "?"
            finder.kind = kind
            op = ast.literal_eval(kw["op"]) if isinstance(kw.get("op"), ast.Constant) else None
            if isinstance(kw.get("workspace"), ast.Constant):
                workspace_kinds.setdefault(kw["workspace"].value, kind)
            elif "provider" not in kw:
                workspace_kinds.setdefault("graph", kind)
            template = kw.get("template")
            if isinstance(template, ast.Name) and template.id in functions and op:
                finder.template(src, functions[template.id], op)
            for role in ("provider", "rebind_table"):
                ref = kw.get(role)
                if isinstance(ref, ast.Name) and ref.id in functions:
                    finder.provider(src, functions[ref.id], ref.id, op)
            finder.layout(src, call, kind)
        for name, cls in classes.items():
            if name.endswith("Provider"):
                op, finder.kind = _provider_op(src, name)
                for fn in cls.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == "values":
                        finder.provider(src, fn, f"{name}.values", op)
                finder.steady(src, cls)
        for call in _calls_named(src.tree, "Line"):
            for role, ref in _keywords(call).items():
                named = isinstance(ref, ast.Name) and ref.id in functions
                if role in ("metadata_key", "draft_step") and named:
                    finder.metadata_line(src, functions[ref.id], role)
    src = Source(PROVIDERS)
    for cls in ast.walk(src.tree):
        if isinstance(cls, ast.ClassDef) and cls.name.endswith("Provider"):
            # the core's providers by the workspace they serve: per_lengths (PA) or the graph's
            source = "per_lengths" if "Lengths" in cls.name else "graph"
            finder.kind = workspace_kinds.get(source, "FIA")
            finder.steady(src, cls)
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "values":
                    finder.provider(src, fn, f"{cls.name}.values", None)
    finder.metadata_graph(Source(GRAPH))
    # a mutant whose replacement does not parse is no mutant
    out = []
    for m in finder.mutants:
        data = (REPO / m.file).read_bytes()
        try:
            ast.parse(data[: m.start] + m.replacement.encode() + data[m.end :])
        except SyntaxError:
            continue
        out.append(m)
    return out


def _provider_op(src: Source, provider_class: str) -> tuple[str | None, str]:
    """The op and kind of the layout whose provider factory builds ``provider_class``."""
    functions = _functions(src.tree)
    for call in _calls_named(src.tree, "TaskLayout"):
        kw = _keywords(call)
        ref = kw.get("provider")
        if isinstance(ref, ast.Name) and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == provider_class
            for n in ast.walk(functions.get(ref.id, ast.Module(body=[], type_ignores=[])))
        ):
            return ast.literal_eval(kw["op"]), src.text(kw["kind"])
    return None, "FIA"


# --------------------------------------------------------------------------------------------
# running: a warm server forks one child per mutant


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        rel = name.decode()
        src = REPO / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _env(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), str(copy / "simulator")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("ASCEND_GRAPH_PATCH", None)  # the tests choose each arm's mode themselves
    env["AGP_TEST_STEPS"] = os.environ.get("AGP_TEST_STEPS", str(STEPS))
    return env


def serve() -> int:
    """The warm server (``--serve``, started by the driver in the copy): imports what every test
    process imports (the root conftest: the simulator as ``torch_npu``; vLLM; vllm-ascend's graph
    modules; the harness), but not the overlay, then forks a child per request that runs pytest
    with the copy's current (mutated) overlay. One JSON request / reply per line."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol; logs go to stderr
    os.dup2(2, 1)
    sys.path[:0] = [os.getcwd()]
    import conftest  # noqa: F401  (the test environment, the simulator installed)
    from torch_npu_sim import workload  # noqa: F401
    from torch_npu_sim.harness import process, scenarios  # noqa: F401

    process.ensure()
    import pytest  # noqa: F401

    running: list[int] = []

    def stop(signum: int, frame: object) -> None:  # the driver ends: so does the mutant's test
        for pid in running:
            os.killpg(pid, signal.SIGKILL)
        os._exit(1)

    signal.signal(signal.SIGTERM, stop)
    stale = sorted(m for m in sys.modules if m.startswith("ascend_graph_patch."))
    print(json.dumps({"ready": True, "overlay_modules_loaded": stale}), file=replies)
    for line in sys.stdin:
        request = json.loads(line)
        log = Path(request["log"])
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: its own process group, so a timeout kills what it started
            os.setpgid(0, 0)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = 3
            try:
                import pytest as child_pytest

                code = int(child_pytest.main(request["args"]))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        running[:] = [pid]
        deadline = t0 + request["timeout"]
        code = None
        while code is None:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                code = "timeout"
            else:
                time.sleep(0.2)
        running.clear()
        print(json.dumps({"code": code, "seconds": time.monotonic() - t0}), file=replies)
    return 0


class Server:
    """The driver's handle on the warm server; restarted if it dies."""

    def __init__(self, copy: Path) -> None:
        self.copy = copy
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve"],
            cwd=self.copy,
            env=_env(self.copy),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.copy / ".server.log").open("a"),
            text=True,
            start_new_session=True,
        )
        ready = json.loads(self.proc.stdout.readline() or "{}")  # type: ignore[union-attr]
        if not ready.get("ready"):
            tail = (self.copy / ".server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the mutation server did not start:\n{tail}")
        watched = {_module_name(path) for path in (LINES + "/", PROVIDERS, GRAPH)}
        stale = [
            m for m in ready["overlay_modules_loaded"] if any(m.startswith(w) for w in watched)
        ]
        if stale:
            raise RuntimeError(f"the server imported mutated modules before forking: {stale}")

    def run(self, tests: tuple[str, ...], timeout: float) -> tuple[str, float, list[str]]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        log = self.copy / ".mutant.log"
        args = ["-x", "-q", "-p", "no:cacheprovider", "--tb=line", "-o", "addopts=", *tests]
        request = {"args": args, "timeout": timeout, "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        reply = json.loads(self.proc.stdout.readline() or '{"code": "server died", "seconds": 0}')  # type: ignore[union-attr]
        text = log.read_text(errors="replace") if log.exists() else ""
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
        code = reply["code"]
        if code == 0:
            return "survived", reply["seconds"], []
        if code == "timeout":
            return "timeout", reply["seconds"], []
        if code == 1 or failed:
            return "killed", reply["seconds"], failed
        return f"error ({code})", reply["seconds"], [text[-300:]]

    def collect(self, tests: tuple[str, ...]) -> set[str]:
        """The test ids pytest collects from the files of ``tests`` in this tree."""
        files = tuple(dict.fromkeys(t.split("::")[0] for t in tests))
        self.run(("--collect-only", *files), 900)
        text = (self.copy / ".mutant.log").read_text(errors="replace")
        return {line.strip() for line in text.splitlines() if "::" in line}

    def stop(self) -> None:
        """End the server, and with it a mutant's test still running (interrupted runs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/").replace("/", ".")


def _which_package_is_imported(copy: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", "import ascend_graph_patch as m; print(m.__file__)"],
        cwd=copy,
        env=_env(copy),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def tests_for(mutant: Mutant, quick: bool, known: set[str] | None = None) -> tuple[str, ...]:
    """The kind's first harness test (the likeliest to fail), the core's unit tests, the rest;
    test ids the tree does not have (``known``: what pytest collects here) are left out."""
    by_kind = QUICK_TESTS_BY_KIND if quick else TESTS_BY_KIND
    harness = by_kind.get(mutant.kind, by_kind["FIA"])
    tests = (*harness[:1], *COMMON_TESTS, *harness[1:])
    if known is None:
        return tests
    return tuple(t for t in tests if _exists(t, known))


def _exists(test: str, known: set[str]) -> bool:
    return any(k == test or k.startswith((test + "::", test + "[")) for k in known)


def write_report(mutants: list[Mutant], out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(m) for m in mutants]
    for r in rows:
        for key in ("start", "end"):
            r.pop(key)
    (out / "mutants.json").write_text(json.dumps({"meta": meta, "mutants": rows}, indent=1) + "\n")
    counts: dict[str, int] = {}
    for m in mutants:
        counts[m.status] = counts.get(m.status, 0) + 1
    lines = [
        "# Mutation testing of the line",
        "",
        f"{len(mutants)} mutants: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
        f"{meta['seconds'] / 60:.1f} min; quick: {meta['quick']}; timeout {meta['timeout']} s",
        "",
        "| mutant | line | kind | what | result | first failing test |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in mutants:
        first = m.failed[0] if m.failed else ""
        lines.append(
            f"| `{m.id}` | {m.file}:{m.line} | {m.kind} | {m.description} | {m.status} | {first} |"
        )
    (out / "mutants.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"only the {', '.join(sorted(QUICK_OPERATORS))} mutants, and one "
        "harness test per kind",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", nargs="*", default=(), help="mutant ids containing one of these")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    parser.add_argument("--out", default="mutation-report")
    parser.add_argument("--steps", type=int, default=STEPS, help="replay steps per harness arm")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ["AGP_TEST_STEPS"] = str(args.steps)
    if args.serve:
        return serve()

    mutants = discover()
    if args.quick:
        mutants = [m for m in mutants if m.operator in QUICK_OPERATORS]
    if args.only:
        mutants = [m for m in mutants if any(s in m.id for s in args.only)]
    if args.list:
        for m in mutants:
            print(f"{m.id:70} {m.kind:6} {m.file}:{m.line}  {m.description}")
        print(f"{len(mutants)} mutants")
        return 0
    t0 = time.monotonic()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a SIGTERM ends the run like Ctrl-C: report, remove the copy

    signal.signal(signal.SIGTERM, interrupted)
    with tempfile.TemporaryDirectory(prefix="agp-mutate-") as tmp:
        copy = Path(tmp)
        _copy_tree(copy)
        imported = _which_package_is_imported(copy)
        if not imported.startswith(str(copy)):
            print(f"the tests would import {imported}, not the copy: refusing", file=sys.stderr)
            return 2
        server = Server(copy)
        originals: dict[str, bytes] = {}
        try:
            every = tuple(dict.fromkeys(t for m in mutants for t in tests_for(m, args.quick)))
            known = server.collect(every)
            missing = [t for t in every if not _exists(t, known)]
            if missing:
                print("not in this tree, left out:", *missing, sep="\n  ", flush=True)
            every = tuple(t for t in every if t not in missing)
            status, seconds, failed = server.run(every, args.timeout * 4)
            print(f"unmutated: {status} in {seconds:.0f} s", flush=True)
            if status != "survived":
                print("the tests fail without a mutant: fix that first", *failed, sep="\n")
                return 2
            for i, m in enumerate(mutants, 1):
                data = originals.setdefault(m.file, (REPO / m.file).read_bytes())
                (copy / m.file).write_bytes(
                    data[: m.start] + m.replacement.encode() + data[m.end :]
                )
                try:
                    tests = tests_for(m, args.quick, known)
                    m.status, m.seconds, m.failed = server.run(tests, args.timeout)
                finally:
                    (copy / m.file).write_bytes(data)
                print(f"[{i}/{len(mutants)}] {m.status:9} {m.seconds:5.0f} s  {m.id}", flush=True)
        except KeyboardInterrupt:
            print("interrupted: reporting what ran", file=sys.stderr)
        finally:
            server.stop()
    meta = {
        "seconds": time.monotonic() - t0,
        "quick": args.quick,
        "timeout": args.timeout,
        "steps": args.steps,
        "common_tests": list(COMMON_TESTS),
        "tests_by_kind": QUICK_TESTS_BY_KIND if args.quick else TESTS_BY_KIND,
    }
    write_report(mutants, REPO / args.out, meta)
    survived = sum(m.status == "survived" for m in mutants)
    print(f"{len(mutants)} mutants, {survived} survived; report in {args.out}/mutants.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
