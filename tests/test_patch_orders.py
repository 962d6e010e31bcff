"""Import / patch / unpatch orders, ddtrace-style: each order in its own fresh interpreter.

The `.pth` loader is installed in the venv, so the environment decides what a fresh process does.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from ascend_graph_patch import activation
from ascend_graph_patch.aspects import ASPECTS

PROBE = r"""
import json, sys
import torch_npu_sim as sim
IMPORT_FIRST = sys.argv[1] == "import-first"
ENABLE = sys.argv[2]
import vllm_ascend.ops  # noqa: F401
if IMPORT_FIRST:
    import vllm_ascend.attention.attention_v1  # noqa: F401
    import vllm_ascend.compilation.acl_graph  # noqa: F401
if ENABLE != "-":
    from ascend_graph_patch import activation
    activation.enable(ENABLE)
    activation.enable(ENABLE)  # twice: idempotent
from ascend_graph_patch import _bootstrap
_bootstrap.bootstrap()  # the vLLM plugin entry point after the .pth: idempotent
import vllm_ascend.attention.attention_v1 as attn
import vllm_ascend.compilation.acl_graph as acl
impl = attn.AscendAttentionBackendImpl.__dict__["update_graph_params"]
call = acl.ACLGraphWrapper.__dict__["__call__"]
def wrapped(obj):
    # a wrapt FunctionWrapper, or ours for a staticmethod's function (without importing wrapt)
    return any(t.__name__ == "FunctionWrapper" for t in type(obj).__mro__)
def wrappers(obj):
    # FunctionWrappers in the chain (a staticmethod's function is wrapped inside it)
    count = 0
    while obj is not None:
        count += wrapped(obj)
        obj = obj.__func__ if isinstance(obj, staticmethod) else getattr(obj, "__wrapped__", None)
    return count
print(json.dumps({
    "update_wrapped": wrappers(impl) >= 1,
    "double_wrapped": wrappers(impl) > 1,
    "call_wrapped": wrapped(call),
    "activation_loaded": "ascend_graph_patch.activation" in sys.modules,
    "wrapt_loaded": "wrapt" in sys.modules,
    "installed": (sys.modules["ascend_graph_patch.activation"].installed()
                  if "ascend_graph_patch.activation" in sys.modules else []),
}))
"""


def probe(env_mode: str, order: str, enable: str = "-") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_GRAPH_PATCH")}
    env.update(ASCEND_GRAPH_PATCH=env_mode, TORCH_NPU_SIM="1", VLLM_PLUGINS="ascend")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, order, enable],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["import-first", "enable-first"])
def test_enabled_by_environment_installs_once_whatever_the_order(order: str) -> None:
    out = probe("on", order)
    assert out["update_wrapped"] and out["call_wrapped"] and not out["double_wrapped"]
    v1 = sorted(a.name for a in ASPECTS if a.group == "v1")  # what loading vllm_ascend installs
    assert sorted(out["installed"]) == v1 and len(v1) == 7


def test_enabled_in_process_after_import_installs_immediately() -> None:
    out = probe("off", "import-first", enable="on")
    assert out["update_wrapped"] and not out["double_wrapped"]


def test_toggle_off_wraps_nothing_and_loads_nothing() -> None:
    out = probe("off", "import-first")
    assert out == {
        "update_wrapped": False,
        "double_wrapped": False,
        "call_wrapped": False,
        "activation_loaded": False,
        "wrapt_loaded": False,
        "installed": [],
    }


def test_unpatch_restores_the_original_attributes() -> None:
    importlib.import_module("vllm_ascend.ops")
    attn = importlib.import_module("vllm_ascend.attention.attention_v1")
    acl = importlib.import_module("vllm_ascend.compilation.acl_graph")
    impl = attn.AscendAttentionBackendImpl
    before = (
        impl.__dict__["update_graph_params"],
        impl.__dict__["forward"],
        acl.ACLGraphWrapper.__dict__["__call__"],
    )
    activation.enable("verify")
    try:
        assert impl.__dict__["update_graph_params"] is not before[0]
        assert "verify.fia" in activation.installed()
    finally:
        activation.disable()
    after = (
        impl.__dict__["update_graph_params"],
        impl.__dict__["forward"],
        acl.ACLGraphWrapper.__dict__["__call__"],
    )
    assert all(a is b for a, b in zip(before, after, strict=True))
    assert activation.installed() == []


class _Recording:
    """A callable that records every attribute looked up on it and missing."""

    def __init__(self) -> None:
        self.missing: list[str] = []

    def __call__(self, *args: object) -> tuple:
        return args

    def __getattr__(self, name: str) -> object:
        self.missing.append(name)
        raise AttributeError(name)


@pytest.mark.parametrize("static", [True, False])
def test_a_staticmethod_s_wrapper_is_called_without_looking_for_an_instance(static: bool) -> None:
    """The update seam is a staticmethod: its wrapper calls ours straight away, with no instance.
    A plain FunctionWrapper (the negative control) first looks for a ``__self__`` at every call:
    an AttributeError raised and cleared per replay step."""
    import wrapt

    from ascend_graph_patch.installer import _static_wrapper

    seen = []

    def aspect(wrapped, instance, args, kwargs):  # noqa: ANN001, ANN202
        seen.append(instance)
        return wrapped(*args, **kwargs)

    function = _Recording()
    wrapper = (
        _static_wrapper(function, aspect) if static else wrapt.FunctionWrapper(function, aspect)
    )
    holder = type("Impl", (), {"update": staticmethod(wrapper)})
    function.missing.clear()  # what building the wrapper and the class looked up
    assert holder.update(1, 2) == (1, 2) and holder().update(3) == (3,)
    assert seen == [None, None]
    assert function.missing == ([] if static else ["__self__", "__self__"])
