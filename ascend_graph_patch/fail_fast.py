"""A failed update at tensor parallelism > 1 ends the job now, not at a collective's timeout.

vLLM 0.23's multiprocess executor reads the reply of one worker only (the first tensor-parallel
rank of the last pipeline stage). When the overlay raises an update error into another rank's
worker (the error stock would raise there too), vLLM logs it and that worker waits for the next
call, while its peers run on into a collective it never joins: nothing ends the job until the
collective's timeout (gloo's 30 minutes by default, HCCL's on hardware). Stock hangs the same way.

So, just before raising, :func:`raised` records the error (type, message, rank, graph, task: in
``status`` and the status file), and in such a worker ends the process after one line saying why
and the error's traceback. vLLM's worker monitor sees a worker die and fails the job: the engine
shuts its workers down and raises to the caller. Ending the process was chosen over aborting the
process groups by trying both on the engine (``docs/engine.md``): gloo's ``abort`` does not close
the connections, so the peers still wait, and on hardware vllm-ascend's HCCL communicators are not
torch process groups at all; a dead worker is seen whatever the backend.

The reply the executor reads needs nothing: its error already ends the job. Nor does a process
that is not a multiprocess executor's worker (the engine core's own model runner, TP = 1 with data
parallelism): its error reaches its engine core, which fails. ``ASCEND_GRAPH_PATCH_TP_FAULT=wait``
keeps stock's behaviour. Runs on the fault path only: the replay hot path never calls it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import traceback
from typing import Any

#: How vLLM 0.23's multiprocess executor names its worker processes (``make_worker_process``).
WORKER_PREFIX = "VllmWorker-"
#: The worker's exit status when it ends itself (``EX_SOFTWARE``).
EXIT_STATUS = 70

#: The last update error the overlay raised in this process (``status`` shows it), or None.
LAST: dict[str, Any] | None = None


def _position() -> tuple[int | None, int | None, bool | None]:
    """(rank, world size, whether the executor reads this worker's reply); None where unknown."""
    rank = size = None
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, size = dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    if not multiprocessing.current_process().name.startswith(WORKER_PREFIX):
        return rank, size, None
    try:
        from vllm.distributed import parallel_state as ps

        read = ps.get_tp_group().rank_in_group == 0 and ps.get_pp_group().is_last_rank
        pcp = getattr(ps, "get_pcp_group", None)
        if read and pcp is not None:
            read = pcp().rank_in_group == 0
    except Exception:  # cannot tell: keep stock's behaviour
        return rank, size, None
    return rank, size, read


def _graph_size(descriptor: Any) -> Any:
    size = getattr(descriptor, "num_tokens", None)
    return size if isinstance(size, int) else str(descriptor)


def raised(error: BaseException, role: str, descriptor: Any, task: str) -> None:
    """The overlay is about to raise ``error`` (an update of the ``role`` graph ``descriptor``
    failed at ``task``) into the engine: record it; in a worker whose reply the executor does not
    read, end the process (unless ``ASCEND_GRAPH_PATCH_TP_FAULT=wait``)."""
    from ascend_graph_patch import settings

    rank, size, read = _position()
    ends = read is False and settings.tp_fault() == settings.TP_FAIL
    record(error, role, descriptor, task, "ended this worker" if ends else None)
    if not ends:
        return
    assert LAST is not None
    where = f"rank {rank} of {size}" if size is not None else "this worker"
    message = (
        f"ascend-graph-patch: {where}: the {role} graph of size {LAST['graph_size']} failed its "
        f"update ({LAST['type']}: {LAST['message']}; {task}); the executor does not read this "
        "rank's reply, so its peers would wait in a collective until it times out: ending this "
        f"worker now so the job fails ({settings.ENV_TP_FAULT}=wait keeps stock's wait)"
    )
    try:
        traceback.print_exception(error, file=sys.stderr)
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(EXIT_STATUS)


def record(
    error: BaseException, role: str, descriptor: Any, task: str, action: str | None = None
) -> None:
    """Record ``error`` as the last one the overlay raised here (``status``'s ``fault``) and
    write the status file now, without ending anything: an error every rank raises alike (a
    stale graph at capture, ``aspects/stale.py``) reaches the engine through the reply it reads."""
    global LAST
    rank, size = _position()[:2]
    LAST = {
        "type": type(error).__name__,
        "message": str(error).splitlines()[0][:500] if str(error) else "",
        "rank": rank,
        "world_size": size,
        "role": role,
        "graph_size": _graph_size(descriptor),
        "task": task[:500],
        "action": action or "raised into the engine",
        "at": round(time.time(), 3),
    }
    _write_status()


def _write_status() -> None:
    """Write this process's status file now (if it keeps one): it may end in a moment."""
    writer = getattr(sys.modules.get("ascend_graph_patch.status_files"), "_WRITER", None)
    if writer is not None:
        writer.write()
