"""An owned graph and the update tasks it holds (the UpdatableGraph idea, RFC 13058).

A task is keyed by (kind, metadata key, draft step), never by position. Replay is two phases:
``resolve`` computes every launch argument from a metadata source without touching the runtime;
``apply`` then, per task and exactly once, opens the task-group update, relaunches the op with the
fresh arguments, closes the update and records the task's event (a graph left waiting on an event
is a hang on hardware).

A task relaunches with one keyword dict, its ``template``: the captured arguments, with the
values its provider computes per step written over the keys they rebind just before the call
(``template |= values; op(**template)``: the bare call plus a few key writes, where a merge into a
fresh dict would copy every argument). The layers of a KV-cache group share one values dict: the
step computes it once. A steady value (the graph's captured workspace, read from the graph as
stock reads it, not from the metadata) is read once per step and written into the templates
only when it changes: a key write per task saved on every step.

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
    "ResolutionError",
    "Resolution",
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
    value_keys: tuple[str, ...]  # the relaunch keywords rebound per step (``values`` + steady)
    #: (relaunch keyword, getter) of a value read from the graph, not the metadata (the
    #: graph's captured workspace), or None: the graph reads it once per step per bucket and
    #: writes it into the templates only when it changes (``values`` leaves it out)
    steady: tuple[str, Callable[[], Any]] | None

    def values(self, metadata: Any) -> dict[str, Any]: ...


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


@dataclass(eq=False, slots=True)
class UpdateTask:
    """One captured attention task group, owned by the graph that captured it.

    ``template`` holds the relaunch's keyword arguments as captured (the weak-referenced tensors
    and scalars, as the stock registry holds them) and is the dict the relaunch passes: every
    update writes the provider's fresh values over the keys it rebinds (``provider.value_keys``;
    its steady value, when it changes), so it holds the last step's values until the next one
    replaces them (the device reads host lists asynchronously on hardware). Whatever else reads
    it reads the other keys (``static``) or overrides these.
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

    @property
    def static(self) -> dict[str, Any]:
        """The arguments no update rewrites (the template without the provider's keys)."""
        rebound = self.provider.value_keys
        return {k: v for k, v in self.template.items() if k not in rebound}

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
    """One step's resolved update of a graph: per task, the values its relaunch writes over its
    template (the layers of a KV-cache group share one dict).

    Indexed or iterated, it gives ``(task, full relaunch kwargs)``, built on demand (verify,
    tests, the benchmark's floor); ``OwnedGraph.apply`` passes the two parts straight to the call.
    """

    __slots__ = ("tasks", "values")

    def __init__(self, tasks: list[UpdateTask], values: list[dict[str, Any]]) -> None:
        self.tasks = tasks
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        task = self.tasks[index]
        return task, {**task.template, **self.values[index]}  # what its relaunch passes


#: A bucket whose steady value was never written (None is a value: a graph without a workspace).
_UNSET = object()


@dataclass(eq=False, slots=True)
class _Bucket:
    """Tasks sharing a provider configuration (and, for drafts, a step): those whose metadata
    object is the same share one computation of their values."""

    step: int
    indices: list[int]
    span: slice | None  # the same indices as a slice, when they are contiguous
    keys: tuple[str, ...]  # the tasks' metadata keys
    fetch: Callable[[Any], Any]  # their metadata objects in one C call (one object if one key)
    provider: Provider  # the first task's (the group's configuration)
    label: str  # the first task's
    single: bool  # one task: ``fetch`` returns its metadata object, not a tuple
    steady: tuple[str, Callable[[], Any]] | None  # the provider's steady value, if any
    calls: list[tuple] | None = None  # its tasks' calls, when every bucket's tasks are contiguous
    #: the steady value every template of the bucket holds (``_UNSET``: not written yet)
    written: Any = _UNSET


@dataclass(eq=False)
class OwnedGraph:
    """A captured graph whose tasks the overlay updates itself."""

    role: str
    descriptor: Any
    #: Whether the runner replays this graph before updating it (the default order; ENPU / 310P
    #: update first). When an update fails, a launched replay still waits on the events.
    replay_first: bool = True
    tasks: list[UpdateTask] = field(default_factory=list)
    #: The stream its last update ran on; stream-ordered replay orders it after the compute
    #: stream before the next replay (``aspects/replay_order.py``). None until the first update.
    update_stream: Any = None
    # Precomputed per graph: the buckets resolve walks and the calls apply walks, so a replay
    # step allocates the providers' fresh values and one list.
    _buckets: list[_Bucket] | None = field(default=None, repr=False)
    _calls: list[tuple] = field(default_factory=list, repr=False)
    #: (values list, its runs) of the last step resolved whose buckets each share one values dict
    #: and lie one after another in task order (a dense target: one run; an MTP draft: one per
    #: step). A run is (the bucket's calls, its dict): ``apply_values`` given that very list
    #: relaunches run by run with each run's dict, no per-task pairing.
    _runs: tuple[list[dict[str, Any]], list[tuple[list[tuple], dict[str, Any]]]] | None = field(
        default=None, repr=False
    )
    _keys: set[tuple[str, str, int]] = field(default_factory=set, repr=False)

    def add(self, task: UpdateTask) -> None:
        key = task.key
        if key in self._keys:
            raise CaptureRefused(f"duplicate task key {key}")
        self._keys.add(key)
        self.tasks.append(task)
        self._calls.append((task.op, task.handle, task.event, task.template))
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
            start, stop = indices[0], indices[-1] + 1
            bucket = _Bucket(
                step,
                indices,
                slice(start, stop) if indices == list(range(start, stop)) else None,
                keys,
                itemgetter(*keys),
                first.provider,
                first.label,
                len(keys) == 1,
                getattr(first.provider, "steady", None),
            )
            self._buckets.append(bucket)
        if all(b.span is not None for b in self._buckets):  # then they tile the tasks in order
            for b in self._buckets:
                b.calls = self._calls[b.span]
        return self._buckets

    def resolve(self, source: TargetSource | DraftSource) -> Resolution:
        """Every task's fresh launch arguments, before any update-scope runtime call."""
        if isinstance(source, DraftSource):
            return Resolution(self.tasks, self.values_draft(source.per_step))
        return Resolution(self.tasks, self.values_target(source.attn_metadata))

    def values_target(self, attn_metadata: Any) -> list[dict[str, Any]]:
        """From ``forward_context.attn_metadata`` (layer name -> metadata).

        A bucket's metadata objects are fetched in one call; when they are one object (the
        layers of a KV-cache group), its values are computed once and shared by every task.
        Nothing the runtime or the stock path can see changes; the module docstring says what
        each failure means.
        """
        buckets = self._buckets or self._prepare()
        if len(buckets) == 1:  # every task alike (a dense model): the common step, kept short
            bucket = buckets[0]
            if bucket.steady is not None:
                self._steady(bucket)
            try:
                fetched = bucket.fetch(attn_metadata)
            except (KeyError, TypeError, IndexError) as exc:
                raise self._missing(TargetSource(attn_metadata), bucket, exc) from exc
            shared = _shared_values(bucket, fetched, None)
            if shared is not None:
                values = [shared] * len(self.tasks)
                self._runs = (values, [(self._calls, shared)])
                return values
            each: list = [None] * len(self.tasks)
            self._write_each(bucket, fetched, {}, each)
            return each
        cache: dict = {}  # several buckets may read one metadata object
        values: list = [None] * len(self.tasks)
        runs: list | None = [] if buckets[0].calls is not None else None
        for bucket in buckets:
            if bucket.steady is not None:
                self._steady(bucket)
            try:
                fetched = bucket.fetch(attn_metadata)
            except (KeyError, TypeError, IndexError) as exc:
                raise self._missing(TargetSource(attn_metadata), bucket, exc) from exc
            runs = self._write(bucket, fetched, cache, values, runs)
        if runs is not None:
            self._runs = (values, runs)
        return values

    def values_draft(self, per_step: Any) -> list[dict[str, Any]]:
        """From the proposer's per-step metadata (``draft_attn_metadatas``)."""
        buckets = self._buckets or self._prepare()
        cache = {} if len(buckets) > 1 else None
        values: list = [None] * len(self.tasks)
        runs: list | None = [] if buckets[0].calls is not None else None
        for bucket in buckets:
            if bucket.steady is not None:
                self._steady(bucket)
            try:
                fetched = bucket.fetch(per_step[bucket.step])
            except (KeyError, TypeError, IndexError) as exc:
                raise self._missing(DraftSource(per_step), bucket, exc) from exc
            runs = self._write(bucket, fetched, cache, values, runs)
        if runs is not None:
            self._runs = (values, runs)
        return values

    def _steady(self, bucket: _Bucket) -> None:
        """Read the bucket's steady value (once per step, as stock reads it per task) and, when
        it is not the one its templates hold, write it into every one of them. A value that
        never changes costs one read per bucket, not a key write per task."""
        key, read = bucket.steady  # type: ignore[misc]
        try:
            value = read()
        except Exception as exc:  # a bug of ours: stock, reading the same graph, is fine
            raise ResolutionError(f"{bucket.label}: reading {key} failed: {exc!r}") from exc
        if value is not bucket.written:
            tasks = self.tasks
            for i in bucket.indices:
                tasks[i].template[key] = value
            bucket.written = value

    def _write(
        self, bucket: _Bucket, fetched: Any, cache: dict | None, out: list, runs: list | None
    ) -> list | None:
        """Each task's values of ``bucket`` into ``out`` (by task index); returns ``runs`` with
        the bucket's run added when its tasks share one dict, else None (no runs this step)."""
        shared = _shared_values(bucket, fetched, cache)
        if shared is None:
            self._write_each(bucket, fetched, {} if cache is None else cache, out)
            return None
        if bucket.span is not None:
            out[bucket.span] = [shared] * len(bucket.indices)
        else:
            for i in bucket.indices:
                out[i] = shared
        if runs is not None:
            runs.append((bucket.calls, shared))
        return runs

    def _write_each(self, bucket: _Bucket, fetched: Any, cache: dict, out: list) -> None:
        """Tasks reading several metadata objects: values per object (``cache`` shares them)."""
        for i, metadata in zip(bucket.indices, fetched, strict=True):
            task = self.tasks[i]
            out[i] = _values(task.provider, task.label, metadata, cache)

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

    def apply(
        self, resolved: Resolution | list[ResolvedTask], update_stream: Any, runtime: Any
    ) -> None:
        """Update each task once and record its event, on ``update_stream``.

        If a call fails part way, the update scope is closed, the events a launched replay still
        waits on are recorded (so it cannot hang), and the runtime's error propagates, with a
        note saying which task failed.
        """
        if isinstance(resolved, Resolution) and resolved.tasks is self.tasks:
            self.apply_values(resolved.values, update_stream, runtime)
            return
        # (task, full kwargs) pairs: each relaunch's kwargs whole, written into a fresh dict
        tasks = [task for task, _ in resolved]
        calls = [(t.op, t.handle, t.event, {}) for t in tasks]
        self.apply_values([kw for _, kw in resolved], update_stream, runtime, tasks, calls)

    def apply_values(
        self,
        values: list[dict[str, Any]],
        update_stream: Any,
        runtime: Any,
        tasks: list[UpdateTask] | None = None,
        calls: list[tuple] | None = None,
    ) -> None:
        """``apply`` of what ``values_target`` / ``values_draft`` resolved: the replay hot path.

        ``values[i]`` is what task ``i``'s relaunch writes over its template (``tasks`` and their
        ``calls``, ``(op, handle, event, template)``: this graph's, unless given).
        """
        runs = None
        if calls is None:
            tasks, calls = self.tasks, self._calls
            resolved = self._runs
            if resolved is not None and resolved[0] is values:
                runs = resolved[1]  # each run's tasks take one dict: no per-task pairing
        assert tasks is not None
        begin = runtime.graph_task_update_begin
        end = runtime.graph_task_update_end
        total = len(tasks)
        # Nothing is counted per task: after a failure, what the current run's iterator has left
        # says where (``offset``: the tasks of the runs before it; the paired loop is one run).
        offset = 0
        remaining: Any = iter(()) if runs is not None else zip(calls, values)  # noqa: B905
        length = 0 if runs is not None else total
        finished = record_failed = False
        try:
            with runtime.stream(update_stream):
                if runs is not None:
                    for run, shared in runs:
                        offset += length
                        length = len(run)
                        remaining = iter(run)
                        for op, handle, event, launch in remaining:
                            launch |= shared
                            begin(update_stream, handle)
                            try:
                                op(**launch)
                            except BaseException:
                                _quietly(end, update_stream)  # close the scope; keep its error
                                raise
                            end(update_stream)
                            try:
                                event.record(update_stream)
                            except BaseException:
                                record_failed = True
                                raise
                else:
                    for (op, handle, event, launch), fresh in remaining:
                        launch |= fresh
                        begin(update_stream, handle)
                        try:
                            op(**launch)
                        except BaseException:
                            _quietly(end, update_stream)
                            raise
                        end(update_stream)
                        try:
                            event.record(update_stream)
                        except BaseException:
                            record_failed = True
                            raise
                finished = True
        except BaseException as exc:
            started = offset + length - sum(1 for _ in remaining)
            done = started if finished else max(started - 1, 0)
            # A record that failed is not retried (it may have half happened), and the replay
            # will wait at that event whatever else is recorded: recording the events after it
            # would only leave them set with nothing to consume them (stock does not either).
            pending = [] if record_failed else tasks[done:]
            released = self.release(update_stream, pending)
            failed = tasks[done].label if done < total else "the update"
            exc.add_note(
                f"ascend-graph-patch: the update of {failed} ({done + 1} of {total}) "
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


def _shared_values(bucket: _Bucket, fetched: Any, cache: dict | None) -> dict[str, Any] | None:
    """The values every task of ``bucket`` relaunches with, when its tasks read one metadata
    object (a KV-cache group, or a bucket of one task); None when they read several."""
    if bucket.single:  # ``fetched`` is the one task's metadata object
        return _values(bucket.provider, bucket.label, fetched, cache)
    first = fetched[0]
    for metadata in fetched:  # a bytecode loop: half the instructions of all(map(is_, ...))
        if metadata is not first:
            return None
    return _values(bucket.provider, bucket.label, first, cache)


def _values(provider: Provider, label: str, metadata: Any, cache: dict | None) -> dict[str, Any]:
    """Fresh values for ``metadata``: computed once per (provider group, metadata object) in
    ``cache`` (None: a graph of one bucket, where nothing else could share them)."""
    if cache is not None:
        key = (provider.group, id(metadata))
        shared = cache.get(key)
        if shared is not None:
            return shared
    try:
        shared = provider.values(metadata)
    except StepFault as fault:
        fault.args = (f"{label}: {fault.args[0]}",)
        raise
    except Exception as exc:  # a bug of ours: stock, reading the same metadata, is fine
        raise ResolutionError(f"{label}: provider failed: {exc!r}") from exc
    if cache is not None:
        cache[key] = shared
    return shared


def _quietly(call: Callable[..., Any], *args: Any) -> bool:
    """Call, swallowing an error (already failing: the first error is the one to raise)."""
    try:
        call(*args)
        return True
    except Exception:
        return False
