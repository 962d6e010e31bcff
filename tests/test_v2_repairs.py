"""The ``v2-model-runner`` repair (``torch_npu_sim.engine.repairs``): each part acts only when a
case names the repair, and then does exactly its one thing. The engine case
``qwen3/compile/decode-only/v2`` shows the whole repair at work (``tests/test_engine.py``); the
stale-graph case (the variable without the repair) shows the release's own fallback."""

from __future__ import annotations

import functools
import types

import pytest

from torch_npu_sim.engine import cases, repairs


@pytest.fixture
def named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(repairs.ENV_VAR, repairs.V2_MODEL_RUNNER)


def test_the_cases_name_the_repair_by_its_own_name() -> None:
    assert cases.V2_REPAIR == repairs.V2_MODEL_RUNNER
    assert repairs.V2_MODEL_RUNNER in cases.V2_QWEN3.repairs
    assert cases.V2_QWEN3.environment["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert cases.V2_QWEN3.reference == "qwen3+v2"  # its own eager reference


def test_the_release_graph_manager_takes_no_lora_keywords_without_the_repair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM 0.23.0's manager refuses the newer keywords the release passes: the failure the
    repair removes stays asserted when the repair is not named."""
    from vllm.v1.worker.gpu import cudagraph_utils

    monkeypatch.delenv(repairs.ENV_VAR, raising=False)
    with pytest.raises(TypeError, match="lora_capture_cases"):
        cudagraph_utils.ModelCudaGraphManager.__init__(
            object.__new__(cudagraph_utils.ModelCudaGraphManager),
            None,
            None,
            None,
            1,
            lora_capture_cases=None,
        )


def _recorder(calls: list) -> functools.partial:
    def call(receiver: object, *args: object, **kwargs: object) -> str:
        calls.append((args, kwargs))
        return "result"

    return functools.partial(call, object())


@pytest.mark.usefixtures("named")
def test_the_newer_keywords_are_dropped_when_none() -> None:
    calls: list = []
    result = repairs._drop_newer_keywords(
        _recorder(calls), (1, 2), {"lora_capture_cases": None, "lora_capture_hook": None, "x": 3}
    )
    assert result == "result" and calls == [((1, 2), {"x": 3})]


@pytest.mark.usefixtures("named")
def test_a_lora_capture_is_refused_not_dropped() -> None:
    """A real LoRA capture would be lost by dropping it: refused loudly instead."""
    with pytest.raises(NotImplementedError, match="LoRA capture"):
        repairs._drop_newer_keywords(_recorder([]), (), {"lora_capture_cases": [1, 2]})


def test_without_the_repair_the_keywords_reach_the_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(repairs.ENV_VAR, "step3p5-pad-call")  # another repair only
    calls: list = []
    repairs._drop_newer_keywords(_recorder(calls), (), {"lora_capture_cases": None})
    assert calls == [((), {"lora_capture_cases": None})]


@pytest.mark.parametrize(("name", "configured", "want"), [(True, True, True), (True, False, False),
                                                          (False, True, False)])  # fmt: skip
def test_the_worker_runs_v2_only_when_named_and_configured(
    monkeypatch: pytest.MonkeyPatch, name: bool, configured: bool, want: bool
) -> None:
    """After ``NPUWorker.__init__`` (which clears the flag on vLLM 0.23.0), the flag is what the
    configuration says, only with the repair named."""
    if name:
        monkeypatch.setenv(repairs.ENV_VAR, repairs.V2_MODEL_RUNNER)
    else:
        monkeypatch.delenv(repairs.ENV_VAR, raising=False)
    worker = types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(use_v2_model_runner=configured)
    )

    def init(self: types.SimpleNamespace) -> None:
        self.use_v2_model_runner = False  # the release's fallback

    repairs._v2_as_configured(functools.partial(init, worker), (), {})
    assert worker.use_v2_model_runner is want


@pytest.mark.parametrize("name", [True, False])
def test_the_release_v2_patches_are_imported_only_when_named(
    monkeypatch: pytest.MonkeyPatch, mocker: pytest.MockerFixture, name: bool
) -> None:
    if name:
        monkeypatch.setenv(repairs.ENV_VAR, repairs.V2_MODEL_RUNNER)
    else:
        monkeypatch.delenv(repairs.ENV_VAR, raising=False)
    imported = mocker.patch.object(repairs.importlib, "import_module")
    repairs._import_v2_patches(types.ModuleType("vllm_ascend.patch.worker"))
    names = [c.args[0] for c in imported.call_args_list]
    assert names == (list(repairs.V2_PATCHES) if name else [])
    assert len(repairs.V2_PATCHES) == 5
