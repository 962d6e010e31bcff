"""An owned graph and the update tasks it holds (the UpdatableGraph idea, RFC 13058).

A task is keyed by (kind, metadata key, draft step), never by position. Replay is two phases:
``resolve`` computes every launch argument from a metadata source without touching the runtime;
``apply`` then, per task and exactly once, opens the task-group update, relaunches the op with the
fresh arguments, closes the update and records the task's event (a graph left waiting on an event
is a hang on hardware).

What a failure means decides what the step does (the caller acts on it; see ``aspects/replay``):

- :class:`ResolutionError`: the overlay itself could not resolve a task (a bug of ours); nothing
  reached the runtime, and the stock update, which reads the same intact metadata, takes the step;
- :class:`MetadataFault`: the step's metadata cannot be read as stock reads it (a key, a draft step
  or an attribute is missing, an entry is None or of another type); stock would raise reading it,
  so the step raises the same error;
- :class:`RuntimeFault`: a runtime host call made while resolving raised (the PA workspace getter,
  which stock calls too): the step raises it;
- an exception out of ``apply`` (a relaunch, an update-scope call or an event record failed part
  way): it propagates, as it would out of stock's loop.

Before raising, :meth:`OwnedGraph.release` records the events a launched replay still waits on,
so a failed step can never leave the graph hanging.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_, itemgetter
from typing import Any, Protocol

from ascend_graph_patch.core.kinds import DRAFT, DRAFT_PREFILL, TARGET

__all__ = [
    "DRAFT",
    "DRAFT_PREFILL",
    "TARGET",
    "CaptureRefused",
    "DraftSource",
    "MetadataFault",
    "OwnedGraph",
    "ResolutionError",
    "ResolvedTask",
    "RuntimeFault",
    "TargetSource",
    "UpdateTask",
]


class CaptureRefused(Exception):
    """At capture: a task group cannot be owned, so its whole graph is left to stock."""


class ResolutionError(Exception):
    """At replay: the overlay could not compute a task's parameters; stock takes the step."""


class StepFault(ResolutionError):
    """At replay: the step itself is broken; it raises ``error``, the exception stock would meet."""

    def __init__(self, message: str, error: BaseException) -> None:
        super().__init__(message)
        self.error = error


class MetadataFault(StepFault):
    """The step's metadata cannot be read the way stock reads it."""


class RuntimeFault(StepFault):
    """A runtime host call made while resolving (one stock makes too) raised."""


class Provider(Protocol):
    """Computes, from one metadata object, the launch arguments that change per step."""

    kind: str
    group: int  # providers configured alike share a group: their values are computed once

    def values(self, metadata: Any, cache: dict) -> dict[str, Any]: ...


class TargetSource:
    """Target graphs read ``forward_context.attn_metadata`` (layer name -> metadata)."""

    __slots__ = ("attn_metadata",)

    def __init__(self, attn_metadata: Mapping[str, Any]) -> None:
        self.attn_metadata = attn_metadata

    def missing(self, metadata_key: str, step: int) -> str:
        return f"no metadata for {metadata_key!r}"


class DraftSource:
    """Draft graphs read the per-step list the proposer passes (``draft_attn_metadatas``)."""

    __slots__ = ("per_step",)

    def __init__(self, per_step: Sequence[Mapping[str, Any]] | None) -> None:
        self.per_step = per_step

    def missing(self, metadata_key: str, step: int) -> str:
        given = len(self.per_step) if isinstance(self.per_step, Sequence) else 0
        return f"no metadata for {metadata_key!r} at draft step {step} ({given} step(s) given)"


_NONE = object()


@dataclass(eq=False, slots=True)
class UpdateTask:
    """One captured attention task group, owned by the graph that captured it.

    ``template`` holds the relaunch's keyword arguments as captured (the weak-referenced tensors
    and scalars, as the stock registry holds them); the provider supplies what changes per step.
    ``launch`` is the dict each resolution writes the fresh values into (the template itself:
    only the changing keys are ever overwritten, so nothing is copied at capture or rebuilt per
    step), and the last step's host lists stay referenced until the next update has replaced
    them (the device consumes them asynchronously on hardware).
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

    @property
    def label(self) -> str:
        name = self.layer_name or self.metadata_key
        return f"{self.kind} {name}" + (f" step {self.step}" if self.step else "")


ResolvedTask = tuple[UpdateTask, dict[str, Any]]


@dataclass(eq=False, slots=True)
class _Bucket:
    """Tasks sharing a provider configuration (and, for drafts, a step): those whose metadata
    object is the same share one computation of their values."""

    step: int
    indices: list[int]
    launches: list[dict[str, Any]]
    keys: tuple[str, ...]  # the tasks' metadata keys
    fetch: Callable[[Any], Any]  # their metadata objects in one C call (one object if one key)
    provider: Provider  # the first task's (the group's configuration)
    label: str  # the first task's


def _update_all(launches: list[dict[str, Any]], values: dict[str, Any]) -> None:
    """``launch.update(values)`` for every launch, the loop run in C."""
    deque(map(dict.update, launches, repeat(values)), maxlen=0)


@dataclass(eq=False)
class OwnedGraph:
    """A captured graph whose tasks the overlay updates itself."""

    role: str
    descriptor: Any
    #: Whether the runner replays this graph before updating it (the default order; ENPU / 310P
    #: update first). When an update fails, a launched replay still waits on the events.
    replay_first: bool = True
    tasks: list[UpdateTask] = field(default_factory=list)
    # Precomputed per graph: the buckets resolve walks and the launches apply walks, so a replay
    # step allocates nothing but the providers' fresh values.
    _buckets: list[_Bucket] | None = field(default=None, repr=False)
    _resolved: list[ResolvedTask] = field(default_factory=list, repr=False)
    _launches: list[tuple] = field(default_factory=list, repr=False)
    _keys: set[tuple[str, str, int]] = field(default_factory=set, repr=False)

    def add(self, task: UpdateTask) -> None:
        key = task.key
        if key in self._keys:
            raise CaptureRefused(f"duplicate task key {key}")
        self._keys.add(key)
        self.tasks.append(task)
        self._buckets = None

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tasks:
            out[t.kind] = out.get(t.kind, 0) + 1
        return out

    def _prepare(self) -> list[_Bucket]:
        by: dict[tuple[int, int], list[int]] = {}
        for i, t in enumerate(self.tasks):
            by.setdefault((t.provider.group, t.step), []).append(i)
        self._buckets = []
        for (_group, step), indices in by.items():
            first = self.tasks[indices[0]]
            keys = tuple(self.tasks[i].metadata_key for i in indices)
            bucket = _Bucket(
                step,
                indices,
                [self.tasks[i].launch for i in indices],
                keys,
                itemgetter(*keys),
                first.provider,
                first.label,
            )
            self._buckets.append(bucket)
        self._resolved = [(t, t.launch) for t in self.tasks]
        self._launches = [(t.op, t.handle, t.event, t.launch) for t in self.tasks]
        return self._buckets

    def resolve(self, source: TargetSource | DraftSource) -> list[ResolvedTask]:
        """Write every task's fresh launch arguments, before any update-scope runtime call."""
        if isinstance(source, DraftSource):
            return self.resolve_draft(source.per_step)
        return self.resolve_target(source.attn_metadata)

    def resolve_target(self, attn_metadata: Any) -> list[ResolvedTask]:
        """From ``forward_context.attn_metadata`` (layer name -> metadata).

        A bucket's metadata objects are fetched in one call; when they are one object (the
        layers of a KV-cache group), its values are computed once and written into every task's
        launch dict in one C loop. Nothing the runtime or the stock path can see changes; the
        module docstring says what each failure means.
        """
        buckets = self._buckets if self._buckets is not None else self._prepare()
        cache: dict = {}
        for bucket in buckets:
            try:
                fetched = bucket.fetch(attn_metadata)
            except (KeyError, TypeError, IndexError) as exc:
                raise self._missing(TargetSource(attn_metadata), bucket, exc) from exc
            self._write(bucket, fetched, cache)
        return self._resolved

    def resolve_draft(self, per_step: Any) -> list[ResolvedTask]:
        """From the proposer's per-step metadata (``draft_attn_metadatas``)."""
        buckets = self._buckets if self._buckets is not None else self._prepare()
        cache: dict = {}
        for bucket in buckets:
            try:
                fetched = bucket.fetch(per_step[bucket.step])
            except (KeyError, TypeError, IndexError) as exc:
                raise self._missing(DraftSource(per_step), bucket, exc) from exc
            self._write(bucket, fetched, cache)
        return self._resolved

    def _write(self, bucket: _Bucket, fetched: Any, cache: dict) -> None:
        if len(bucket.keys) == 1:  # ``fetched`` is the one task's metadata object
            bucket.launches[0].update(_values(bucket.provider, bucket.label, fetched, cache))
            return
        first = fetched[0]
        if all(map(is_, fetched, repeat(first))):  # one KV-cache group: one metadata object
            _update_all(bucket.launches, _values(bucket.provider, bucket.label, first, cache))
            return
        for i, launch, metadata in zip(bucket.indices, bucket.launches, fetched, strict=True):
            task = self.tasks[i]
            launch.update(_values(task.provider, task.label, metadata, cache))

    def _missing(self, source: Any, bucket: _Bucket, exc: BaseException) -> MetadataFault:
        """The first task of ``bucket`` whose metadata cannot be fetched, named."""
        task = self.tasks[bucket.indices[0]]
        for i in bucket.indices:
            candidate = self.tasks[i]
            try:
                if isinstance(source, DraftSource):
                    source.per_step[bucket.step][candidate.metadata_key]  # type: ignore[index]
                else:
                    source.attn_metadata[candidate.metadata_key]
            except (KeyError, TypeError, IndexError) as error:
                task, exc = candidate, error
                break
        return MetadataFault(f"{task.label}: {source.missing(task.metadata_key, task.step)}", exc)

    def apply(self, resolved: list[ResolvedTask], update_stream: Any, runtime: Any) -> None:
        """Update each task once and record its event, on ``update_stream``.

        If a call fails part way, the update scope is closed, the events a launched replay still
        waits on are recorded (so it cannot hang), and the runtime's error propagates, with a
        note saying which task failed.
        """
        begin = runtime.graph_task_update_begin
        end = runtime.graph_task_update_end
        launches = (
            self._launches
            if resolved is self._resolved
            else [(t.op, t.handle, t.event, kwargs) for t, kwargs in resolved]
        )
        done = 0
        record_failed = False
        try:
            with runtime.stream(update_stream):
                for op, handle, event, kwargs in launches:
                    begin(update_stream, handle)
                    try:
                        op(**kwargs)
                    except BaseException:
                        _quietly(end, update_stream)  # close the scope; keep the op's error
                        raise
                    end(update_stream)
                    try:
                        event.record(update_stream)
                    except BaseException:
                        record_failed = True
                        raise
                    done += 1
        except BaseException as exc:
            # A record that failed is not retried (it may have half happened), and the replay
            # will wait at that event whatever else is recorded: recording the events after it
            # would only leave them set with nothing to consume them (stock does not either).
            pending = [] if record_failed else [task for task, _ in resolved[done:]]
            released = self.release(update_stream, pending)
            failed = resolved[done][0].label if done < len(resolved) else "the update"
            exc.add_note(
                f"ascend-graph-patch: the update of {failed} ({done + 1} of {len(resolved)}) "
                f"failed; {released} pending event(s) recorded so the replay cannot hang"
            )
            raise

    def release(self, update_stream: Any, tasks: list[UpdateTask] | None = None) -> int:
        """Record the events of ``tasks`` (default: all) if a launched replay waits on them.

        Returns how many were recorded (0 when the runner updates before it replays: then no
        replay is waiting, and a record now would be a second one at the next step).
        """
        if not self.replay_first:
            return 0
        released = 0
        for task in self.tasks if tasks is None else tasks:
            if _quietly(task.event.record, update_stream):
                released += 1
        return released


def _values(provider: Provider, label: str, metadata: Any, cache: dict) -> dict[str, Any]:
    """Fresh values for ``metadata``: computed once per (provider group, metadata object)."""
    key = (provider.group, id(metadata))
    shared = cache.get(key)
    if shared is None:
        try:
            shared = cache[key] = provider.values(metadata, cache)
        except StepFault as fault:
            fault.args = (f"{label}: {fault.args[0]}",)
            raise
        except Exception as exc:  # a bug of ours: stock, reading the same metadata, is fine
            raise ResolutionError(f"{label}: provider failed: {exc!r}") from exc
    return shared


def _quietly(call: Callable[..., Any], *args: Any) -> bool:
    """Call, swallowing an error (already failing: the first error is the one to raise)."""
    try:
        call(*args)
        return True
    except Exception:
        return False
