"""Stream-ordered replay (opt-in, ``ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream``): the host barrier
before a FULL replay, replaced by an ordering on the device.

Stock 0.23.0.post1 synchronises the device before every FULL target replay
(``ACLGraphWrapper.__call__``): the update of step i, queued on the update stream after replay i,
must not rewrite a task that replay i-1 has not run yet, nor record an event whose previous record
replay i-1 has not consumed. So the host waits for the whole device, every step, and cannot prepare
step i+1 while step i runs (what async scheduling is for).

For a graph the overlay owns, whose update stream it has seen (at that graph's previous update),
this module queues the replay without the barrier, after ``update_stream.wait_stream(compute)``
for every update stream of the process (the runner's and a drafter's): every update issued from
now on runs after everything queued on the compute stream before this replay (every earlier replay
of every graph, drafts included), and never waits on this replay itself, whose gates wait on those
updates (no deadlock). This is upstream's order for model runner v2 (wait_stream before the
replay; PRs 12944, 13600) and the relanded UpdatableGraph's (16798).

Everything else keeps stock's behaviour, counted by reason in ``status``:

- the first replay of each graph (its update stream is not known yet), graphs the overlay does
  not own or refused, graphs without tasks (nothing to order: stock's barrier stays);
- wrappers stock does not synchronise (ENPU updates before it replays; merged EAGLE drafts):
  unchanged.

The barrier is dropped through the release's own switch: the wrapper skips it when built for ENPU
(``enable_enpu``), read only there on the replay path; the call runs with it set and restores it.
Model runner v2 (``run_fullgraph``) has no barrier in this release: there the waits are added, so
its updates are ordered after earlier replays where stock's are not.
"""

from __future__ import annotations

from typing import Any

from ascend_graph_patch import state
from ascend_graph_patch.core.kinds import TARGET
from ascend_graph_patch.core.registry import REGISTRY

#: The counters (``status``; the A/B's stream arm and the engine's race table read them).
STREAM = "replay_order.stream"
STREAM_V2 = "replay_order.stream.v2"
#: Every stream-ordered replay: v1 wrappers (barrier dropped) and v2 managers (waits added).
ORDERED = (STREAM, STREAM_V2)
BARRIER = "replay_order.barrier"
#: replays stock runs without a barrier (ENPU, merged EAGLE / MTP drafts): left as they are
NO_BARRIER = "replay_order.no_barrier"
_SAID = (
    "stream-ordered replay is on (ASCEND_GRAPH_PATCH_REPLAY_SYNC=stream, opt-in): owned FULL "
    "graphs replay without stock's device synchronize, their updates ordered after earlier "
    "replays by the update stream waiting on the compute stream"
)


def note_update_stream(streams: list[Any], stream: Any) -> None:
    """Remember an update stream in ``streams`` (``Active.update_streams``; every update call
    passes the runner's or a drafter's)."""
    if stream is None:
        return
    for known in streams:
        if known is stream:
            return
    streams.append(stream)


def _order_updates_after_compute(streams: list[Any]) -> None:
    state.warn_once("replay-order", _SAID)
    import torch  # loaded wherever a replay runs; not at import: the A/B reads the names above

    compute = torch.npu.current_stream()
    for stream in streams:
        if stream is not compute:
            stream.wait_stream(compute)


def _keeps_barrier(instance: Any, role: str, descriptor: Any) -> str | None:
    """Why this FULL replay keeps stock's barrier, or None when it can be stream-ordered."""
    owned = REGISTRY.lookup(role, descriptor, instance)
    if owned is None:
        return "unowned"
    if not owned.tasks:
        return "no_tasks"
    if owned.update_stream is None:
        return "first_replay"
    return None


def prepare_v1(instance: Any, role: str, descriptor: Any, streams: list[Any]) -> bool:
    """Before ``ACLGraphWrapper.__call__`` replays the FULL graph ``(role, descriptor)``: whether
    it can replay without the barrier, having made the update streams wait if so."""
    if getattr(instance, "enable_enpu", False) or (role != TARGET and instance.use_eagle):
        state.count(NO_BARRIER)  # stock has no barrier here: nothing to replace
        return False
    reason = _keeps_barrier(instance, role, descriptor)
    if reason is not None:
        state.count(f"{BARRIER}.{reason}")
        return False
    _order_updates_after_compute(streams)
    state.count(STREAM)
    return True


def without_barrier(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Call the wrapper with its barrier skipped by the release's own switch (``enable_enpu``,
    read only at the barrier on the replay path), restored whatever the replay does."""
    instance.enable_enpu = True
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.enable_enpu = False


def v2_replay(streams: list[Any]) -> None:
    """Before a v2 ``run_fullgraph`` (which replays, then updates, with no barrier in this
    release): order the updates it issues after everything queued before its replay."""
    if streams:
        _order_updates_after_compute(streams)
        state.count(STREAM_V2)
