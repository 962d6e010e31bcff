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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
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
    "Resolution",
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
    writes: tuple[str, ...]  # the relaunch keywords its values set

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
    and scalars, as the stock registry holds them); the provider supplies what changes per step,
    and ``static`` is the template without those keys. A relaunch is ``op(**static, **values)``
    with the step's values, so nothing is copied into a per-task dict at resolve time.
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
    static: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        writes = set(self.provider.writes)
        self.static = {k: v for k, v in self.template.items() if k not in writes}

    @property
    def key(self) -> tuple[str, str, int]:
        """Identity within a graph. KV-sharing layers share a metadata key, not a layer name."""
        return (self.kind, self.layer_name or self.metadata_key, self.step)

    @property
    def label(self) -> str:
        name = self.layer_name or self.metadata_key
        return f"{self.kind} {name}" + (f" step {self.step}" if self.step else "")


ResolvedTask = tuple[UpdateTask, dict[str, Any]]


class Resolution(Sequence[ResolvedTask]):
    """One step's resolved update: per task, its static arguments and this step's values.

    ``values[i]`` is shared by the tasks that read one metadata object (a KV group's layers).
    Iterating gives ``(task, keyword arguments)`` pairs, merged on demand (verify, tests).
    """

    __slots__ = ("graph", "values")

    def __init__(self, graph: OwnedGraph, values: list[dict[str, Any]]) -> None:
        self.graph = graph
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        task = self.graph.tasks[index]
        return task, {**task.static, **self.values[index]}


@dataclass(eq=False, slots=True)
class _Bucket:
    """Tasks sharing a provider configuration (and, for drafts, a step): those whose metadata
    object is the same share one computation of their values."""

    group: int
    step: int
    indices: list[int]
    fetch: Callable[[Any], tuple]  # the bucket's metadata objects, in one C call
    span: tuple[int, int] | None  # (start, stop) when the indices are contiguous


def _fetcher(keys: tuple[str, ...]) -> Callable[[Any], tuple]:
    if len(keys) == 1:
        single = itemgetter(keys[0])
        return lambda table: (single(table),)
    return itemgetter(*keys)


@dataclass(eq=False)
class OwnedGraph:
    """A captured graph whose tasks the overlay updates itself."""

    role: str
    descriptor: Any
    #: Whether the runner replays this graph before updating it (the default order; ENPU / 310P
    #: update first). When an update fails, a launched replay still waits on the events.
    replay_first: bool = True
    tasks: list[UpdateTask] = field(default_factory=list)
    # Precomputed per graph: the buckets resolve walks, the launches apply walks, and the list
    # of this step's values per task (persistent: the last step's host lists stay referenced until
    # the next update has replaced them; the device consumes them asynchronously on hardware).
    _buckets: list[_Bucket] | None = field(default=None, repr=False)
    _launches: list[tuple] = field(default_factory=list, repr=False)
    _values: list[dict[str, Any]] = field(default_factory=list, repr=False)
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
        buckets = []
        for (group, step), indices in by.items():
            keys = tuple(self.tasks[i].metadata_key for i in indices)
            contiguous = indices == list(range(indices[0], indices[-1] + 1))
            span = (indices[0], indices[-1] + 1) if contiguous else None
            buckets.append(_Bucket(group, step, indices, _fetcher(keys), span))
        self._buckets = buckets
        self._launches = [(t.op, t.handle, t.event, t.static) for t in self.tasks]
        self._values = [{} for _ in self.tasks]
        return buckets

    def resolve(self, source: TargetSource | DraftSource) -> Resolution:
        """Compute every task's fresh launch arguments, before any update-scope runtime call."""
        if isinstance(source, DraftSource):
            return self.resolve_draft(source.per_step)
        return self.resolve_target(source.attn_metadata)

    def resolve_target(self, attn_metadata: Any) -> Resolution:
        """From ``forward_context.attn_metadata`` (layer name -> metadata).

        A bucket's metadata objects are fetched in one call; when they are one object (the
        layers of a KV-cache group), its values are computed once for all of them. Nothing the
        runtime or the stock path can see changes; the module docstring says what failures mean.
        """
        buckets = self._buckets if self._buckets is not None else self._prepare()
        return self._resolve(buckets, lambda bucket: attn_metadata, TargetSource(attn_metadata))

    def resolve_draft(self, per_step: Any) -> Resolution:
        """From the proposer's per-step metadata (``draft_attn_metadatas``)."""
        buckets = self._buckets if self._buckets is not None else self._prepare()
        return self._resolve(buckets, lambda bucket: per_step[bucket.step], DraftSource(per_step))

    def _resolve(
        self, buckets: list[_Bucket], table: Callable[[_Bucket], Any], source: Any
    ) -> Resolution:
        values = self._values
        cache: dict = {}
        for bucket in buckets:
            try:
                metadatas = bucket.fetch(table(bucket))
            except (KeyError, TypeError, IndexError) as exc:
                raise self._missing(source, bucket, exc) from exc
            first = metadatas[0]
            if len(metadatas) == 1 or len(set(map(id, metadatas))) == 1:
                shared = self._compute(bucket.indices[0], bucket.group, first, cache)
                if bucket.span is not None:
                    start, stop = bucket.span
                    values[start:stop] = [shared] * (stop - start)
                else:
                    for i in bucket.indices:
                        values[i] = shared
            else:
                for i, metadata in zip(bucket.indices, metadatas, strict=True):
                    values[i] = self._compute(i, bucket.group, metadata, cache)
        return Resolution(self, values)

    def _compute(self, index: int, group: int, metadata: Any, cache: dict) -> dict[str, Any]:
        """Task ``index``'s fresh values: computed once per (provider group, metadata object)."""
        shared = cache.get((group, id(metadata)))
        if shared is None:
            task = self.tasks[index]
            try:
                shared = cache[(group, id(metadata))] = task.provider.values(metadata, cache)
            except StepFault as fault:
                fault.args = (f"{task.label}: {fault.args[0]}",)
                raise
            except Exception as exc:  # a bug of ours: stock, reading the same metadata, is fine
                raise ResolutionError(f"{task.label}: provider failed: {exc!r}") from exc
        return shared

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

    def apply(self, resolved: Sequence[ResolvedTask], update_stream: Any, runtime: Any) -> None:
        """Update each task once and record its event, on ``update_stream``.

        If a call fails part way, the update scope is closed, the events a launched replay still
        waits on are recorded (so it cannot hang), and the runtime's error propagates, with a
        note saying which task failed.
        """
        begin = runtime.graph_task_update_begin
        end = runtime.graph_task_update_end
        if isinstance(resolved, Resolution) and resolved.graph is self:
            launches: Any = zip(self._launches, resolved.values, strict=True)
        else:  # pairs built elsewhere (tests, tools): their keyword arguments as given
            launches = (((t.op, t.handle, t.event, kw), {}) for t, kw in resolved)
        tasks = self.tasks if isinstance(resolved, Resolution) else [t for t, _ in resolved]
        done = 0
        record_failed = False
        try:
            with runtime.stream(update_stream):
                for (op, handle, event, static), values in launches:
                    begin(update_stream, handle)
                    try:
                        op(**static, **values)
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
            pending = [] if record_failed else tasks[done:]
            released = self.release(update_stream, pending)
            failed = tasks[done].label if done < len(tasks) else "the update"
            exc.add_note(
                f"ascend-graph-patch: the update of {failed} ({done + 1} of {len(tasks)}) "
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


def _quietly(call: Callable[..., Any], *args: Any) -> bool:
    """Call, swallowing an error (already failing: the first error is the one to raise)."""
    try:
        call(*args)
        return True
    except Exception:
        return False
