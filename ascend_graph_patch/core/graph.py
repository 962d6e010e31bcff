"""An owned graph and the update tasks it holds (the UpdatableGraph idea, RFC 13058).

A task is keyed by (kind, metadata key, draft step), never by position. Replay is two phases:
`resolve` computes every launch argument from a metadata source without touching the runtime, so a
failure there changes nothing and the caller can still run the stock update; `apply` then, per task
and exactly once, opens the task-group update, relaunches the op with the fresh arguments, closes
the update and records the task's event (a graph left waiting on an event is a hang on hardware).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ascend_graph_patch.core.kinds import DRAFT, DRAFT_PREFILL, TARGET

__all__ = [
    "DRAFT",
    "DRAFT_PREFILL",
    "TARGET",
    "CaptureRefused",
    "DraftSource",
    "OwnedGraph",
    "ResolutionError",
    "ResolvedTask",
    "TargetSource",
    "UpdateTask",
]


class CaptureRefused(Exception):
    """At capture: a task group cannot be owned, so its whole graph is left to stock."""


class ResolutionError(Exception):
    """At replay: fresh parameters for a task could not be computed; the step goes to stock."""


class Provider(Protocol):
    """Writes the launch arguments that change per step, read from one metadata object."""

    kind: str

    def bind(self, metadata: Any, launch: dict[str, Any], cache: dict) -> None: ...


class MetadataSource(Protocol):
    def lookup(self, metadata_key: str, step: int) -> Any: ...


class TargetSource:
    """Target graphs read `forward_context.attn_metadata` (layer name -> metadata)."""

    __slots__ = ("attn_metadata",)

    def __init__(self, attn_metadata: Mapping[str, Any]) -> None:
        self.attn_metadata = attn_metadata

    def lookup(self, metadata_key: str, step: int) -> Any:
        try:
            return self.attn_metadata[metadata_key]
        except (KeyError, TypeError) as exc:
            raise ResolutionError(f"no metadata for key {metadata_key!r}") from exc


class DraftSource:
    """Draft graphs read the per-step list the proposer passes (`draft_attn_metadatas`)."""

    __slots__ = ("per_step",)

    def __init__(self, per_step: Sequence[Mapping[str, Any]] | None) -> None:
        self.per_step = per_step

    def lookup(self, metadata_key: str, step: int) -> Any:
        if self.per_step is None or step >= len(self.per_step):
            n = 0 if self.per_step is None else len(self.per_step)
            raise ResolutionError(f"draft step {step} missing ({n} step(s) of metadata given)")
        try:
            return self.per_step[step][metadata_key]
        except (KeyError, TypeError) as exc:
            raise ResolutionError(f"no metadata for key {metadata_key!r} at step {step}") from exc


@dataclass(eq=False, slots=True)
class UpdateTask:
    """One captured attention task group, owned by the graph that captured it.

    `template` holds the static launch arguments (the captured, weak-referenced tensors and
    scalars, as the stock registry holds them); the provider supplies what changes per step.
    `launch` is the dict each resolution binds the fresh values into (the template itself: only
    the changing keys are ever overwritten, so nothing is copied at capture or rebuilt per step),
    and the last step's host lists stay referenced until the next update has replaced them (the
    device consumes them asynchronously on hardware).
    """

    kind: str
    metadata_key: str
    step: int
    layer_name: str | None
    handle: Any
    event: Any
    op: Callable[..., Any]
    template: dict[str, Any]
    provider: Provider
    launch: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.launch = self.template

    @property
    def key(self) -> tuple[str, str, int]:
        """Identity within a graph. KV-sharing layers share a metadata key, not a layer name."""
        return (self.kind, self.layer_name or self.metadata_key, self.step)


ResolvedTask = tuple[UpdateTask, dict[str, Any]]


@dataclass(eq=False)
class OwnedGraph:
    """A captured graph whose tasks the overlay updates itself."""

    role: str
    descriptor: Any
    tasks: list[UpdateTask] = field(default_factory=list)
    # Precomputed per graph (launch dicts are per task and persistent): what resolve walks and
    # what it returns, so a replay step allocates nothing but the providers' fresh values.
    _bindings: list[tuple] | None = field(default=None, repr=False)
    _resolved: list[ResolvedTask] = field(default_factory=list, repr=False)
    _keys: set[tuple[str, str, int]] = field(default_factory=set, repr=False)

    def add(self, task: UpdateTask) -> None:
        key = task.key
        if key in self._keys:
            raise CaptureRefused(f"duplicate task key {key}")
        self._keys.add(key)
        self.tasks.append(task)
        self._bindings = None

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tasks:
            out[t.kind] = out.get(t.kind, 0) + 1
        return out

    def _prepare(self) -> list[tuple]:
        self._bindings = [
            (t.metadata_key, t.step, t.provider.bind, t.launch, t) for t in self.tasks
        ]
        self._resolved = [(t, t.launch) for t in self.tasks]
        return self._bindings

    def resolve(self, source: MetadataSource) -> list[ResolvedTask]:
        """Bind every task's fresh launch arguments, before any runtime call.

        Nothing the runtime or the stock path can see changes: a failure here leaves the step
        free to go to the stock update.
        """
        bindings = self._bindings if self._bindings is not None else self._prepare()
        cache: dict = {}
        lookup = source.lookup
        for metadata_key, step, bind, launch, task in bindings:
            metadata = lookup(metadata_key, step)
            try:
                bind(metadata, launch, cache)
            except ResolutionError:
                raise
            except Exception as exc:  # a provider bug must not leave events unrecorded
                raise ResolutionError(f"{task.kind} provider failed for {task.key}: {exc!r}") from (
                    exc
                )
        return list(self._resolved)

    def apply(self, resolved: list[ResolvedTask], update_stream: Any, runtime: Any) -> None:
        """Update each task once and record its event, on `update_stream`.

        If a launch fails part-way, the remaining events are still recorded so the replay cannot
        hang, and the error is re-raised for the caller to count.
        """
        begin = runtime.graph_task_update_begin
        end = runtime.graph_task_update_end
        done = 0
        try:
            with runtime.stream(update_stream):
                for task, kwargs in resolved:
                    begin(update_stream, task.handle)
                    try:
                        task.op(**kwargs)
                    finally:
                        end(update_stream)
                    task.event.record(update_stream)
                    done += 1
        except BaseException:
            for rest, _ in resolved[done:]:
                try:
                    rest.event.record(update_stream)
                except Exception:
                    pass
            raise
