"""``ab --model ... --model-runner v2``: the A/B on vLLM's model runner v2, by opt-in repairs.

vllm-ascend 0.23.0.post1 does not run model runner v2 on vLLM 0.23.0: with
``VLLM_USE_V2_MODEL_RUNNER`` set it falls back to the v1 runner (and the overlay then refuses the
stale graphs that fallback captures, ``aspects/stale.py``). The simulator (torch-npu-sim) carries
an opt-in repair that runs the release's own v2 code (``v2-model-runner``: the worker's runner
choice, the release's ``patch_v2`` modules, vLLM 0.23.0's graph manager keywords). The option
sets the variable and names the repair in every arm, by environment only: the overlay never
imports the simulator. On an Ascend host no such repair exists, so the option is refused there.
"""

from __future__ import annotations

#: The choices, named as vLLM names the runners (``VLLM_USE_V2_MODEL_RUNNER``); vLLM's own
#: ``--runner`` is the runner *type* (generate, pooling, draft), hence ``--model-runner``.
CHOICES = ("v1", "v2")
#: The simulator's repairs variable and the repair's name (torch_npu_sim.engine.repairs).
REPAIRS_VAR = "TORCH_NPU_SIM_REPAIRS"
V2_REPAIRS = ("v2-model-runner",)
RELEASE = "vllm-ascend 0.23.0.post1"


def environment(runner: str) -> dict[str, str]:
    """What every arm's environment gets for ``runner`` (nothing for v1)."""
    if runner != "v2":
        return {}
    return {"VLLM_USE_V2_MODEL_RUNNER": "1", REPAIRS_VAR: ",".join(V2_REPAIRS)}


def report_line(runner: str) -> str | None:
    """The report's line for ``runner`` (None for v1, the release's own runner)."""
    if runner != "v2":
        return None
    return (
        f"model runner v2 (opt-in, unsupported by {RELEASE}, which falls back to v1 on "
        f"vLLM 0.23.0): run by the simulator's repairs {', '.join(V2_REPAIRS)} "
        "(VLLM_USE_V2_MODEL_RUNNER=1 in every arm)"
    )


REFUSED_ON_HARDWARE = (
    f"--model-runner v2 needs the simulator's opt-in repairs ({', '.join(V2_REPAIRS)}): "
    f"{RELEASE} does not run model runner v2 on vLLM 0.23.0 (it falls back to v1); on an Ascend "
    "host there is nothing to A/B"
)
