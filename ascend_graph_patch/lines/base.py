"""The shape of a supported line and of the structural checks the gate runs against it."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def _resolve(module: str, qualname: str) -> Any:
    mod = sys.modules.get(module)
    if mod is None:
        raise LookupError(f"module {module} not loaded")
    obj: Any = mod
    for part in qualname.split(".") if qualname else ():
        if not hasattr(obj, part):
            raise LookupError(f"{module}.{qualname} is missing")
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    return obj


@dataclass(frozen=True)
class Check:
    """One structural fact about a seam; `describe()` is what a refusal prints."""

    kind: str  # "signature" | "fields" | "has" | "absent" | "source"
    module: str
    qualname: str
    expect: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.kind} {self.module}:{self.qualname}"

    def run(self) -> str | None:
        """None if the fact holds, else why not."""
        try:
            if self.kind == "absent":
                mod = sys.modules.get(self.module)
                if mod is not None and hasattr(mod, self.qualname):
                    return f"{self.module}.{self.qualname} exists (a newer line)"
                return None
            obj = _resolve(self.module, self.qualname)
            if self.kind == "signature":
                got = tuple(inspect.signature(obj).parameters)
                if got != self.expect:
                    return f"signature of {self.qualname} is {got}, expected {self.expect}"
            elif self.kind == "fields":
                got = tuple(f.name for f in dataclasses.fields(obj))
                if got != self.expect:
                    return f"fields of {self.qualname} are {got}, expected {self.expect}"
            elif self.kind == "has":
                missing = [a for a in self.expect if not hasattr(obj, a)]
                if missing:
                    return f"{self.qualname} lacks {', '.join(missing)}"
            elif self.kind == "source":
                text = inspect.getsource(obj)
                missing = [s for s in self.expect if s not in text]
                if missing:
                    return f"{self.qualname} no longer mentions {', '.join(missing)}"
            else:
                return f"unknown check kind {self.kind}"
        except (LookupError, TypeError, ValueError, OSError) as exc:
            return str(exc)
        return None


TemplateBuilder = Callable[[dict[str, Any], Any], dict[str, Any]]  # (fields, attention module)


@dataclass(frozen=True)
class Line:
    """A vllm-ascend release line the overlay knows how to own graphs on."""

    name: str
    vllm_ascend_versions: frozenset[str]
    vllm_versions: frozenset[str]
    checks: Mapping[str, tuple[Check, ...]]  # aspect group -> structural checks
    tuple_arity: Mapping[str, int]  # task kind -> captured tuple length
    templates: Mapping[str, TemplateBuilder]  # task kind -> (captured fields, module) -> kwargs
    update_params: tuple[str, ...]  # parameters of the stock update_graph_params
    fields: Callable[[str, tuple], dict[str, Any]]  # task kind, captured tuple -> named fields
    dynamic_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
