"""The shape of a supported release line, and the structural checks the gate runs against it.

A line is everything the overlay knows about one vllm-ascend release, as data: where each seam is
(module, qualified name, expected parameters), how each attention kind is captured (the tuple the
stock code appends to ``GraphParams.attn_params``, the argument that names its bucket) and
relaunched (the op, the static keyword arguments, the metadata attributes rebound every step),
which runtime calls verify intercepts, and the fingerprints that tell this release from its
neighbours. The aspects and the gate read only this; they name seams by key.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def resolve(module: str, qualname: str) -> Any:
    """The object at ``module.qualname`` in an already-imported module (LookupError if absent).

    Class attributes are read statically, so a staticmethod resolves to its function and a wrapt
    wrapper installed on a class is seen as the wrapper, not a bound method.
    """
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
class Seam:
    """Where an aspect attaches, and the parameters the target must have (None: not checked)."""

    module: str
    qualname: str
    params: tuple[str, ...] | None = None

    @property
    def target(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass(frozen=True)
class Check:
    """One structural fact about the release; ``describe()`` is what a refusal prints."""

    kind: str  # "resolves" | "signature" | "fields" | "has" | "absent" | "source"
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
            obj = resolve(self.module, self.qualname)
            if self.kind == "resolves":
                return None
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


#: (the captured tuple as a named tuple of the layout's fields, the attention module) -> the
#: relaunch keyword arguments as captured.
TemplateBuilder = Callable[[Any, Any], dict[str, Any]]
#: (the captured fields, graph role) -> whether the block table is rebound every step.
BlockTableRule = Callable[[Any, str], bool]


@dataclass(frozen=True)
class CaptureContext:
    """What a layout's own provider factory may read of the capture that made its task."""

    role: str  # target / draft / draft_prefill
    num_tokens: int  # the graph's size: the GraphParams key the task was appended under
    impl: Any  # the attention impl whose call captured the task
    workspace: Callable[[], Any]  # the graph's captured workspace, read per step


#: (layout, captured fields, relaunch template, capture context) -> the task's provider (an
#: object with ``kind``, ``group``, ``value_keys`` and ``values(metadata)``: ``core.graph``'s
#: ``Provider``), for a kind whose per-step values are more than attributes read as they are.
ProviderFactory = Callable[["TaskLayout", Any, dict[str, Any], CaptureContext], Any]


@dataclass(frozen=True)
class TaskLayout:
    """How one attention kind is captured and relaunched on a line."""

    kind: str
    #: Seam key of the backend method that opens this kind's task group at capture.
    capture_seam: str
    #: Names of the tuple the stock capture appends to ``GraphParams.attn_params``, in order.
    fields: tuple[str, ...]
    #: Attribute path on ``torch_npu`` of the op the update relaunches.
    op: str
    #: Static relaunch keyword arguments, from the captured fields.
    template: TemplateBuilder
    #: (position, name) of the capture method's argument that gives the GraphParams key ...
    key_arg: tuple[int, str]
    #: ... and how: the argument's value -> num_tokens.
    key_of: Callable[[Any], int]
    #: (relaunch keyword, metadata attribute) pairs rebound from the step's metadata.
    binds: tuple[tuple[str, str], ...]
    #: (relaunch keyword, metadata attribute) of the block table, rebound when ``rebind_table``.
    block_table: tuple[str, str] | None = None
    rebind_table: BlockTableRule | None = None
    #: Metadata attribute telling whether a draft step is causal (sparse mode 0 when not).
    draft_causal: str | None = None
    #: Where the relaunch's workspace comes from: the graph's captured one ("graph"), or
    #: recomputed from the fresh lengths by ``workspace_getter`` (a ``torch_npu`` path).
    workspace: str = "graph"
    workspace_getter: str | None = None
    #: The relaunch keywords whose values stock computes per step (lengths, a draft's block
    #: table): verify compares them by value; every other argument must be the very object (or
    #: an equal value of one type) stock passes.
    dynamic_args: tuple[str, ...] = ()
    #: The op's leading parameters, in order, as its schema names them (torch-npu 2.10.0.post4):
    #: how verify names the arguments stock passes by position.
    positional: tuple[str, ...] = ()
    #: Relaunch keywords of scratch memory stock allocates per step (PA's recomputed workspace):
    #: verify compares them by shape, dtype and device (their contents are not data).
    scratch: tuple[str, ...] = ()
    #: The kind's own provider, when its values are more than ``binds`` read as they are (MLA:
    #: nested decode fields, padded lengths, a draft's block table slice); None: the generic ones.
    provider: ProviderFactory | None = None


@dataclass(frozen=True)
class Interceptor:
    """A runtime call verify intercepts during its dry run of the stock update."""

    name: str
    module: str
    target: str
    wrapper: str  # attribute of ascend_graph_patch.aspects.verify


#: (metadata key, the per-step list the proposer passes, the step's metadata the capture saw)
#: -> the draft step a draft task reads; ``CaptureRefused`` for a shape the line does not know.
DraftStepRule = Callable[[str, Any, Any], int]
#: (attention impl, its layer's name) -> the key of its metadata in ``attn_metadata``.
MetadataKeyRule = Callable[[Any, str], str]
#: (runner "v1" | "v2") -> why this release's attention may run outside its graph path during a
#: FULL capture and what to do, where the line knows a cause that holds now; else None.
StaleCauseRule = Callable[[str], "str | None"]


def no_stale_cause(runner: str) -> str | None:
    """A line that knows no cause of a stale capture."""
    return None


#: What the overlay does with a graph holding an attention impl (``ImplFate.fate``):
OWNED = "owned"  # its task groups are captured through the line's seams: owned, updated
STOCK = "left to stock"  # its own capture / update path the overlay does not model: refused
NOTHING = "captures nothing"  # it opens no task group, stock updates nothing: refused, named


@dataclass(frozen=True)
class ImplFate:
    """One attention impl class of the release and what becomes of a graph holding it.

    Every impl class the release defines has one (``tests/test_lines.py`` enumerates them from
    the installed modules); a graph holding an attention impl of a class without one is refused
    too (:meth:`Line.refusal`), so a class the line does not know is never owned.
    """

    module: str
    qualname: str
    fate: str  # OWNED / STOCK / NOTHING
    reason: str  # why: the seams it is owned through, or what ``status`` shows for a refusal


@dataclass(frozen=True)
class Line:
    """A vllm-ascend release line the overlay knows how to own graphs on."""

    name: str
    vllm_ascend_versions: frozenset[str]
    vllm_versions: frozenset[str]
    #: Seam key -> where it is. Aspects name seams by these keys.
    seams: Mapping[str, Seam]
    #: Aspect group -> structural facts beyond "every seam resolves with its parameters".
    fingerprints: Mapping[str, tuple[Check, ...]]
    #: Attention kind -> how it is captured and relaunched.
    layouts: Mapping[str, TaskLayout]
    #: Parameters of the stock ``update_graph_params`` (how the update seam is called).
    update_params: tuple[str, ...]
    #: (module, function) of each stock per-role GraphParams accessor: target, draft, prefill.
    graph_params: tuple[tuple[str, str], ...]
    #: Which draft step a draft task reads (the proposers' ``draft_attn_metadatas`` shapes).
    draft_step: DraftStepRule
    #: Which ``attn_metadata`` key a layer's task reads (KV sharing, as stock reads it).
    metadata_key: MetadataKeyRule
    verify_interceptors: tuple[Interceptor, ...] = field(default_factory=tuple)
    #: Seam keys of aspects this release has no seam for (an earlier or later release lacks a
    #: path): those aspects are not installed, and their group's gate does not ask for them.
    absent: Mapping[str, str] = field(default_factory=dict)
    #: The fate of every attention impl class of the release (owned, left to stock, captures
    #: nothing), by module and qualified name: :meth:`refusal` reads it.
    impls: tuple[ImplFate, ...] = ()
    #: (module, qualified name) of the base every attention impl derives from: a layer's
    #: ``impl`` whose class does not is no attention impl (a MoE kernel's), not the line's concern.
    impl_base: tuple[str, str] = ("vllm.v1.attention.backend", "AttentionImplBase")
    #: ``module:attr`` of every update entry point the runners call (timed by ``ab``).
    update_entry_points: tuple[str, ...] = ()
    #: Calls ``ab`` counts per process beside the updates, by name -> ``module:attr``: the dummy
    #: batches a data-parallel rank runs while another rank has work, the drafter's dummy runs.
    counted_entry_points: Mapping[str, str] = field(default_factory=dict)
    #: The seam modules ``status --check`` imports to run the gate here, in an order that
    #: imports (some modules only import after others).
    check_imports: tuple[str, ...] = ()
    #: The known cause of a stale capture, named in the error (``aspects/stale.py``).
    stale_cause: StaleCauseRule = no_stale_cause

    def fate(self, cls: type) -> ImplFate | None:
        """The fate of ``cls`` itself (None: the line does not know it; a subclass of a class
        it owns may capture otherwise, as the release's FA3 and 310P impls do)."""
        for fate in self.impls:
            if fate.qualname == cls.__qualname__ and fate.module == cls.__module__:
                return fate
        return None

    def refusal(self, impl: Any) -> str | None:
        """Why a graph holding ``impl`` is left to stock; None when it is owned.

        Derived, not listed: an impl is owned only if its class is one the line owns through
        its seams; one left to stock or capturing nothing is refused with the line's reason, and
        any other attention impl (a subclass included) is refused as unknown to the line.
        """
        cls = type(impl)
        fate = self.fate(cls)
        if fate is None:
            if not any((k.__module__, k.__qualname__) == self.impl_base for k in cls.__mro__):
                return None  # no attention impl
            return (
                f"attention impl {cls.__module__}.{cls.__qualname__} is unknown to line "
                f"{self.name} (no fate for it or any of its bases): left to stock"
            )
        return None if fate.fate == OWNED else fate.reason

    def has(self, seam: str) -> bool:
        """Whether this release has seam ``seam`` (KeyError if the line does not know the key)."""
        if seam in self.seams:
            return True
        if seam in self.absent:
            return False
        raise KeyError(f"line {self.name} neither has nor declares absent seam {seam!r}")
