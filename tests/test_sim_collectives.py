"""Every collective vllm-ascend captures replays as one device task, with the replay's data.

Two gloo ranks, each in a fresh interpreter, capture a small layer around one collective in a
simulated ``NPUGraph`` (the MoE layer at DP=2 all-gathers its hidden states and reduce-scatters
its output, EP exchanges tokens all-to-all, TP all-reduces), then replay it three times on new
inputs and compare each replay with the same code run eagerly. Before the simulator captured a
collective as one task, the reduce-scatter replayed the capture-time result (gloo copies it into
the output inside ``Work.wait``, which was recorded as a task of its own), ``all_to_all_single``
was not captured at all (its op returns only a ``Work``), and a functional collective's result was
copied before it was waited on: those cases failed here.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_gather_then_reduce_scatter_subgroup",
    "functional_all_gather_reduce_scatter",
)
REPLAYS = 3


def _layer(kind: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, group: Any) -> None:
    """One layer around a collective, as the engine's code calls it (``torch.distributed``)."""
    import torch.distributed as dist

    if kind == "all_reduce":
        y = x @ w
        dist.all_reduce(y, group=group)
        out.copy_(y * 1.0)  # read right behind the collective, as the next layer does
    elif kind == "all_gather":
        gathered = torch.empty(2 * x.shape[0], x.shape[1])
        dist.all_gather_into_tensor(gathered, x @ w, group=group)
        out.copy_(gathered[: out.shape[0]] + gathered[out.shape[0] :])
    elif kind == "reduce_scatter":
        part = torch.empty(x.shape[0] // 2, x.shape[1])
        dist.reduce_scatter_tensor(part, x @ w, group=group)
        out.copy_(part.repeat(2, 1) * 2.0)
    elif kind == "all_to_all":
        exchanged = torch.empty_like(x)
        dist.all_to_all_single(exchanged, x @ w, group=group)
        out.copy_(exchanged + 1.0)
    elif kind == "all_gather_then_reduce_scatter_subgroup":  # the MoE layer's DP path
        gathered = torch.empty(2 * x.shape[0], x.shape[1])
        dist.all_gather_into_tensor(gathered, x, group=group)
        part = torch.empty_like(x)
        dist.reduce_scatter_tensor(part, gathered @ w, group=group)
        out.copy_(part)
    elif kind == "functional_all_gather_reduce_scatter":  # what a compiled graph may trace
        import torch.distributed._functional_collectives as fc

        gathered = fc.all_gather_tensor(x @ w, 0, group)
        out.copy_(fc.reduce_scatter_tensor(gathered * 1.0, "sum", 0, group))
    else:
        raise ValueError(kind)


def _rank_main(rank: int, directory: Path) -> None:
    """Capture and replay every collective; write, per collective, whether each replay equals
    eager (or the error)."""
    import torch.distributed as dist

    import torch_npu_sim
    from torch_npu_sim import runtime as npu

    torch_npu_sim.install()
    results: dict[str, Any] = {}
    store = dist.FileStore(str(directory / "store"), 2)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30)
    )
    subgroup = dist.new_group([0, 1])
    generator = torch.Generator().manual_seed(rank)
    for kind in COLLECTIVES:
        try:
            group = subgroup if "subgroup" in kind else dist.group.WORLD
            x = torch.randn(4, 3, generator=generator)
            w = torch.randn(3, 3, generator=generator)
            out = torch.zeros(4, 3)
            graph = npu.NPUGraph()
            with npu.graph(graph, stream=npu.Stream()):
                _layer(kind, x, w, out, group)
            equal = []
            for _ in range(REPLAYS):
                x.copy_(torch.randn(4, 3, generator=generator))  # the step's new input
                graph.replay()
                npu.synchronize()
                replayed = out.clone()
                eager = torch.full_like(out, float("nan"))
                _layer(kind, x, w, eager, group)
                equal.append(bool(torch.allclose(replayed, eager, atol=1e-5)))
            results[kind] = {"equal": equal, "tasks": [t.name for t in graph._tasks]}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results[kind] = {"error": f"{type(exc).__name__}: {exc}"}
    dist.destroy_process_group()
    (directory / f"rank{rank}.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """Both ranks, each in a fresh interpreter, stopped by pid whatever happens."""
    directory = tmp_path_factory.mktemp("collectives")
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "import test_sim_collectives as t; t._rank_main(int(sys.argv[1]), t.Path(sys.argv[2]))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(rank), str(directory)]) for rank in (0, 1)
    ]
    try:
        for proc in procs:
            proc.wait(timeout=180)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {r: json.loads((directory / f"rank{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.parametrize("kind", COLLECTIVES)
def test_a_captured_collective_replays_with_the_replays_data(
    replays: dict[int, dict[str, Any]], kind: str
) -> None:
    for rank in (0, 1):
        got = replays[rank][kind]
        assert "error" not in got, got
        assert got["equal"] == [True] * REPLAYS, (rank, got)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_to_all"])
def test_a_collective_is_one_task_and_its_wait_records_nothing(
    replays: dict[int, dict[str, Any]], kind: str
) -> None:
    """The collective is a task of its own; nothing its backend does inside ``Work.wait``
    (gloo's split and copy) becomes one."""
    tasks = replays[0][kind]["tasks"]
    collectives = [t for t in tasks if t.startswith("c10d.")]
    assert len(collectives) == 1, tasks
    assert not [t for t in tasks if t.startswith("aten.split")], tasks
    copies = [t for t in tasks if t.startswith("aten.copy_")]
    assert len(copies) == 1, tasks  # the layer's own out.copy_ only
