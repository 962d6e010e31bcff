#!/usr/bin/env python
"""Extract the conformance fixture from a real torch-npu wheel, without installing it.

The wheel cannot be imported without CANN, but what the simulator must match is readable:

- the registered op schemas are plain strings in ``lib/libtorch_npu.so`` (namespace ``npu``) and
  ``lib/libop_plugin_atb.so`` (namespace ``atb``); a string counts when ``torch._C.parse_schema``
  accepts it (the op yaml shipped in the wheel is not what is registered);
- the graph, stream and event Python API is in ``npu/graphs.py``, ``npu/streams.py`` and
  ``npu/utils.py`` (signatures read with ``ast``, nothing executed);
- the ATB swap lists are in ``op_plugin/atb/_atb_ops.py``;
- the capture-rule error messages are strings in ``libtorch_npu.so``;
- what ``import torch_npu`` adds to ``torch`` is in ``_init/``: the functions it puts under
  ``torch.distributed`` (``patches/distributed_patches.py``, their signatures read from the
  modules they come from), the process-group backends it registers (``registry/distributed.py``)
  and the device backend and generated methods (``registry/backend.py``).

The fixture keeps the schemas of every op the simulator defines and every ``torch_npu`` op the
installed vllm-ascend names (so it needs the simulator and vllm-ascend importable: run it with the
project's venv). Usage (about 5 s; the wheel is about 40 MB)::

    pip download --no-deps --only-binary=:all: torch-npu==2.10.0.post4 \
        --platform manylinux_2_28_x86_64 --python-version 3.11 -d /tmp/wheel
    PYTHONPATH=.:simulator .venv/bin/python scripts/extract-torch-npu-schemas.py \
        --wheel /tmp/wheel/torch_npu-2.10.0.post4-cp311-cp311-manylinux_2_28_x86_64.whl
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "torch_npu_2.10.0.post4.json"
LIBRARIES = {"torch_npu/lib/libtorch_npu.so": "npu", "torch_npu/lib/libop_plugin_atb.so": "atb"}
PYTHON_API = ("torch_npu/npu/graphs.py", "torch_npu/npu/streams.py", "torch_npu/npu/utils.py")
MESSAGES = {
    "capture_on_default_stream": "must be captured on a non-default stream",
    "capture_end_on_other_stream": "Capture must end on the same stream",
}
_PRINTABLE = re.compile(rb"[\x20-\x7e]{8,}")
_SCHEMA_LIKE = re.compile(r"^[A-Za-z_]\w*(\.\w+)?\(.*\) ?-> ?.+$")


def registered_schemas(data: bytes, namespace: str) -> dict[str, str]:
    """``namespace::name[.overload]`` -> schema, for every string torch parses as a schema."""
    import torch

    found: dict[str, str] = {}
    for match in _PRINTABLE.finditer(data):
        text = match.group().decode()
        if not _SCHEMA_LIKE.match(text):
            continue
        try:
            schema = torch._C.parse_schema(text)
        except RuntimeError:
            continue
        key = f"{namespace}::{schema.name}" + (
            f".{schema.overload_name}" if schema.overload_name else ""
        )
        if key in found and found[key] != text:
            raise SystemExit(f"two different schemas for {key}")
        found[key] = text
    return found


def _signature(args: ast.arguments) -> str:
    return "(" + ast.unparse(args) + ")"


def python_api(source: str, module: str) -> dict[str, str]:
    """Qualified name -> signature of the public functions and methods of one module."""
    tree = ast.parse(source)
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out[f"{module}.{node.name}"] = _signature(node.args)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                if item.name.startswith("_") and item.name not in ("__init__", "__new__"):
                    continue
                out[f"{module}.{node.name}.{item.name}"] = _signature(item.args)
    return out


def _literal_list(source: str, name: str) -> list[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise SystemExit(f"{name} not found")


def wanted_ops() -> set[str]:
    """Op names (base, no overload) the simulator defines or vllm-ascend names on torch_npu."""
    sys.path[:0] = [str(REPO), str(REPO / "simulator")]
    from torch_npu_sim import _install_impl

    names = set(_install_impl._UNSIMULATED) | set(_install_impl._UNSIMULATED_HOST)
    names |= {name.partition(".")[0] for name in _install_impl._reference_ops()[0]}
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vllm_ascend is not importable: run with the project's venv")
    root = Path(next(iter(spec.submodule_search_locations)))
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _dotted(node.value) in (
                "torch_npu",
                "torch_npu.atb",
            ):
                names.add(node.attr)
    return names


def _function_signature(archive: zipfile.ZipFile, dotted: str) -> str:
    """Signature of ``torch_npu.<dotted>`` (a module-level function), read from the wheel's
    source: the module's own ``def``, or the one it imports with ``from .x import name``."""
    module, _, name = dotted.rpartition(".")
    base = "torch_npu/" + module.replace(".", "/")
    for member in (base + ".py", base + "/__init__.py"):
        try:
            tree = ast.parse(archive.read(member).decode())
        except KeyError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return _signature(node.args)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return _function_signature(archive, f"{module}.{node.module}.{alias.name}")
    raise SystemExit(f"torch_npu.{dotted}: no function found in the wheel")


def _calls(source: str, attr: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
    ]


def torch_additions(archive: zipfile.ZipFile) -> dict[str, Any]:
    """What ``import torch_npu`` adds to ``torch``: public ``torch.distributed`` functions (target
    -> the signature of the torch_npu function put there), backends, device registration."""
    init = "torch_npu/_init/"
    patches = archive.read(init + "patches/distributed_patches.py").decode()
    functions = {}
    for target, source in _literal_list(patches, "_PUBLIC_API_ALIASES"):
        if target.split(".")[-1].startswith("_") or "._" in target:
            functions["torch." + target] = None  # a private hook (an autograd backward): named
            continue
        functions["torch." + target] = _function_signature(archive, source)
    registry = archive.read(init + "registry/distributed.py").decode()
    backends = [
        call.args[0].value
        for call in _calls(registry, "register_backend")
        if call.args and isinstance(call.args[0], ast.Constant)
    ]
    device = archive.read(init + "registry/backend.py").decode()
    (rename,) = _calls(device, "rename_privateuse1_backend")
    (generate,) = _calls(device, "generate_methods_for_privateuse1_backend")
    return {
        "functions": dict(sorted(functions.items())),
        "backends": backends,
        "privateuse1_backend": ast.literal_eval(rename.args[0]),
        "generated_methods": {
            kw.arg: ast.literal_eval(kw.value)
            for kw in generate.keywords
            if kw.arg and kw.arg.startswith("for_")
        },
    }


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parent = _dotted(node.value)
        return None if parent is None else f"{parent}.{node.attr}"
    return None


def extract(wheel: Path) -> dict[str, Any]:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel) as archive:
        strings: dict[str, str] = {}
        texts: dict[str, str] = {}
        for member, namespace in LIBRARIES.items():
            data = archive.read(member)
            strings.update(registered_schemas(data, namespace))
            for key, needle in MESSAGES.items():
                for match in _PRINTABLE.finditer(data):
                    if needle.encode() in match.group():
                        texts.setdefault(key, match.group().decode())
        api: dict[str, str] = {}
        for member in PYTHON_API:
            module = member.removesuffix(".py").replace("/", ".")
            api.update(python_api(archive.read(member).decode(), module))
        atb_source = archive.read("torch_npu/op_plugin/atb/_atb_ops.py").decode()
        npu_init = archive.read("torch_npu/npu/__init__.py").decode()
        version = archive.read("torch_npu/version.py").decode()
        additions = torch_additions(archive)
    atb_lists = {
        "API_LIST": _literal_list(atb_source, "API_LIST"),
        "ATB_API_LIST": _literal_list(atb_source, "ATB_API_LIST"),
    }
    wanted = wanted_ops() | set(atb_lists["API_LIST"]) | set(atb_lists["ATB_API_LIST"])
    schemas = {k: v for k, v in sorted(strings.items()) if k.split("::")[1].split(".")[0] in wanted}
    present = {k.split("::")[1].split(".")[0] for k in schemas}
    missing = sorted(set(MESSAGES) - set(texts))
    if missing:
        raise SystemExit(f"messages not found: {missing}")
    return {
        "provenance": {
            "wheel": wheel.name,
            "sha256": digest,
            "version": _literal_assign(version, "__version__"),
            "git_version": _literal_assign(version, "git_version"),
            "download": (
                "pip download --no-deps --only-binary=:all: torch-npu==2.10.0.post4 "
                "--platform manylinux_2_28_x86_64 --python-version 3.11 -d <dir>"
            ),
            "regenerate": (
                "PYTHONPATH=.:simulator .venv/bin/python scripts/extract-torch-npu-schemas.py "
                "--wheel <dir>/" + wheel.name
            ),
            "scope": (
                "schemas: every op the simulator defines, the installed vllm-ascend names on "
                "torch_npu or torch_npu.atb, or the ATB swap lists name; python_api: public "
                "functions and methods of npu/graphs.py, npu/streams.py, npu/utils.py; "
                "torch_additions: what import torch_npu adds to torch (_init/)"
            ),
        },
        "schemas": schemas,
        "not_registered": sorted(wanted - present),
        "python_api": dict(sorted(api.items())),
        "npu_all": sorted(_literal_list(npu_init, "__all__")),
        "atb": atb_lists,
        "messages": dict(sorted(texts.items())),
        "torch_additions": additions,
    }


def _literal_assign(source: str, name: str) -> str:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise SystemExit(f"{name} not found")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the torch-npu .whl file")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    fixture = extract(args.wheel)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1, sort_keys=False) + "\n")
    print(
        f"{args.out}: {len(fixture['schemas'])} schemas, {len(fixture['python_api'])} API "
        f"signatures, {len(fixture['not_registered'])} names without a registered schema"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
