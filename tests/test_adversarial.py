"""The adversarial schedule executed by prophecy (``torch_npu_sim.adversarial``) on stock's decode
step (``tests/decode_step.py``): what a device running the update stream as early as allowed and
the compute stream as late gives, against what it gives with the barrier or the stream-order wait.

The oracle is the step's own arithmetic: step ``i`` updates its task to ``scale = i + 2``; a run
the next update overtakes reads that update's scale, the last run its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.decode_step import Step
from torch_npu_sim import adversarial

STEPS = 4


def _in_program_order(steps: int) -> list[float]:
    return [float(i + 2) for i in range(steps)]


def _overtaken(steps: int) -> list[float]:
    return [float(i + 3) if i + 1 < steps else float(i + 2) for i in range(steps)]


def _no_wait(step: Step) -> None:
    return None


def _two_passes(
    detector: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before_replay: Callable[[Step], None],
    pass2_steps: int = STEPS,
    pass2_offset: float = 0.0,
) -> tuple[list[float], list[float], dict[str, Any], dict[str, int]]:
    """Pass 1 (detector on), its prophecy written as the engine writes it (by rank), pass 2 on
    a reset runtime reading it."""
    first = Step(detector).run(STEPS, before_replay)
    record = detector.prophecy_record()
    path = tmp_path / "prophecy.json"
    path.write_text(json.dumps({adversarial.rank_key(): record}))
    monkeypatch.setenv(adversarial.ENV_VAR, str(path))
    detector.reset()
    step = Step(detector)
    if pass2_offset:
        update = step.update
        monkeypatch.setattr(step, "update", lambda scale: update(scale + pass2_offset))
    second = step.run(pass2_steps, before_replay)
    return first, second, record, detector.stats()


def test_without_the_barrier_each_run_reads_the_update_that_overtakes_it(
    detector: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, record, stats = _two_passes(detector, tmp_path, monkeypatch, _no_wait)
    assert first == _in_program_order(STEPS)  # the simulator's own order: the hazard is hidden
    assert record["runs"] == [[0, i, i + 1] for i in range(STEPS - 1)]
    assert second == _overtaken(STEPS)
    assert stats["prophecy_runs"] == stats["prophecy_runs_changed"] == STEPS - 1
    assert stats["prophecy_checked"] == STEPS - 1
    assert stats["prophecy_broken"] == stats["prophecy_unmet"] == 0


@pytest.mark.parametrize("order", ["barrier", "stream-order wait"])
def test_an_ordered_step_gives_the_same_outputs_under_the_adversarial_schedule(
    detector: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """Stock's barrier (a device synchronize before each replay), or the overlay's stream-order
    wait (``aspects/replay_order``): nothing overtaken, nothing substituted."""
    from ascend_graph_patch.aspects import replay_order

    def wait(step: Step) -> None:
        if order == "barrier":
            detector.current_stream().synchronize()
        else:
            replay_order._order_updates_after_compute([step.update_stream])

    first, second, record, stats = _two_passes(detector, tmp_path, monkeypatch, wait)
    assert first == second == _in_program_order(STEPS)
    assert record == {"runs": [], "updates": {}}
    assert stats["prophecy_runs"] == stats["prophecy_checked"] == 0


def test_a_program_that_does_not_repeat_itself_breaks_the_prophecy_loudly(
    detector: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pass 2 updates with other values than pass 1 (every overtaking update differs), or stops
    early (the last overtaking update never comes): counted, so the arm says inconclusive."""
    *_, stats = _two_passes(detector, tmp_path, monkeypatch, _no_wait, pass2_offset=10.0)
    assert stats["prophecy_checked"] == stats["prophecy_broken"] == STEPS - 1
    detector.reset()
    *_, stats = _two_passes(detector, tmp_path, monkeypatch, _no_wait, pass2_steps=STEPS - 1)
    assert stats["prophecy_unmet"] == 1 and stats["prophecy_broken"] == 0


def test_host_values_keep_what_a_device_task_keeps_and_substitute_back() -> None:
    """Scalars, lists and the op's named host tensors are values; device tensors are not."""
    import torch

    dev, lens = torch.ones(3), torch.tensor([4, 5], dtype=torch.int32)
    values = adversarial.host_values(
        (dev, 7, [1, 2]), {"q": dev, "context_lens": lens, "scale": 0.5}, ("context_lens",)
    )
    assert values == {
        "args": {"1": 7, "2": [1, 2]},
        "kwargs": {"context_lens": {"tensor": [4, 5], "dtype": "int32"}, "scale": 0.5},
    }
    later = json.loads(json.dumps(values).replace("[4, 5]", "[6, 7]"))
    args, kwargs, changed = adversarial.substitute(
        (dev, 7, [1, 2]), {"q": dev, "context_lens": lens, "scale": 0.5}, later
    )
    assert changed and args[0] is dev and kwargs["q"] is dev
    assert kwargs["context_lens"].tolist() == [6, 7] and kwargs["context_lens"].dtype == torch.int32
    assert adversarial.substitute(args, kwargs, values)[2]  # back to pass 1's: changed again


# --- the engine's adversarial arms (``<arm>@adversarial``): plumbing, without an engine -------


def _runner(rank: int | None, prophecy: dict | None, **sim: int) -> dict[str, Any]:
    return {"rank": rank, "prophecy": prophecy, "sim": sim}


def test_an_adversarial_arm_is_its_graph_arm_again_and_refuses_anything_else() -> None:
    from torch_npu_sim.engine import arms

    arm = arms.arm_named("nobarrier@adversarial")
    assert arm.graph and arm.env == arms.ALL_ARMS["nobarrier"].env
    assert arms.source_arm(arm.name) == "nobarrier" and arms.source_arm("nobarrier") is None
    for wrong in ("eager@adversarial", "nothing@adversarial", "nothing"):
        with pytest.raises(ValueError, match="adversarial|unknown arm"):
            arms.arm_named(wrong)


def test_pass_one_runs_first_and_its_prophecies_reach_pass_two(tmp_path: Path, mocker: Any) -> None:
    """Asked for ``stock@adversarial`` alone, the runner adds ``stock``, starts the adversarial
    arm only once stock's result is in, and gives it one prophecy file per case that raced (by
    the rank of each model-runner process); a case without a prophecy gets no file."""
    from torch_npu_sim.engine import arms
    from torch_npu_sim.engine.arm import prophecy_file

    prophecy = {"runs": [[0, 0, 1]], "updates": {"0:1": {"args": {}, "kwargs": {"n": 2}}}}
    pass_one = {
        "cases": {
            "a/raced": {"runners": [_runner(0, prophecy), _runner(1, prophecy)]},
            "b/clean": {"runners": [_runner(0, None)]},
        }
    }
    started: list[tuple[str, Path | None]] = []
    done: list[str] = []

    def launch(arm: Any, directory: Path, *rest: Any) -> tuple[Any, float, Path]:
        started.append((arm.name, rest[-1]))
        assert arms.source_arm(arm.name) in (None, *done)  # never before its pass 1
        proc = mocker.Mock()
        proc.poll.return_value = 0
        return proc, 0.0, directory / arm.name

    def load(arm_dir: Path, returncode: int | None, seconds: float) -> dict[str, Any]:
        done.append(arm_dir.name)
        return pass_one if arm_dir.name == "stock" else {"cases": {}}

    mocker.patch.object(arms, "_launch", side_effect=launch)
    mocker.patch.object(arms, "_load", side_effect=load)
    mocker.patch.object(arms.time, "sleep")
    mocker.patch.object(arms.supervisor, "stop")
    results = arms.run_arms(tmp_path, tmp_path, ["stock@adversarial"], cases=())
    assert [name for name, _ in started] == ["stock", "stock@adversarial"]
    assert started[0][1] is None
    folder = started[1][1]
    assert folder == tmp_path / "stock@adversarial" / "prophecy"
    assert json.loads((folder / prophecy_file("a/raced")).read_text()) == {
        "0": prophecy,
        "1": prophecy,
    }
    assert not (folder / prophecy_file("b/clean")).exists()
    assert set(results) == {"stock", "stock@adversarial"}


def test_the_race_table_says_what_the_prophecy_did_and_whether_it_held() -> None:
    from torch_npu_sim.engine.race_table import adversarial as column

    counts = {"prophecy_runs": 21, "prophecy_runs_changed": 20, "prophecy_broken": 0}
    ranks = [_runner(0, None, **counts, prophecy_unmet=0), _runner(1, None, **counts)]
    assert column({"runners": ranks}) == "42 (40 changed), held"
    broken = [_runner(0, None, **{**counts, "prophecy_broken": 2}, prophecy_unmet=1)]
    assert column({"runners": broken}) == "21 (20 changed), BROKEN (2 differ, 1 unmet)"
    assert column({"runners": [_runner(0, None, tasks_run=3)]}) == "-"  # not an adversarial arm
