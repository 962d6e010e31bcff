"""The named workloads of the harness engines: target, draft and v2 tables, and one catalogue.

Every workload is reachable by name through ``CATALOGUE`` (name -> scenario, whose ``stock`` says
how stock behaves on it) and ``build(name)`` (the engine that runs it): the tests, the A/B worker
and the soak pick any of them the same way. Plain data until ``build``: listing costs no vLLM.

Target scenarios (v1 ``NPUModelRunner`` decode). Each picks one branch of vllm-ascend
0.23.0.post1's graph capture / update code (FIA, FIA with a sliding window, FIA v2 with learnable
sinks, paged attention, the Gemma4 layer-aware replay, a hybrid model whose metadata dict carries
non-attention keys). The observed behaviour of the STOCK update path is recorded on each scenario
(``stock``) with its evidence; the tests (``tests/test_real_code.py``, ``test_mtp.py``,
``test_v2.py``) assert exactly that behaviour, so the notes cannot silently go stale.

Observed on the simulator (fp32, replay vs the same real code run eagerly, 100-200 random steps):

=====================  ======================================================================
dense_gqa              ok, max |replay - eager| 4.8e-07
dense_full             ok, 7.2e-07 (FULL mode: one dummy request carries the padding)
dense_enpu             ok, 7.2e-07 (update before replay)
sliding_window         ok, 7.2e-07 (captured block table kept for the window layer)
sinks                  ok, 4.8e-07 (FIA v2 branch, ``_EXTRA_CTX.sinks``)
paged_attention        ok, 3.6e-07 (PA at sizes 4/16, FIA at 8)
gemma4_fia             ok, 8.6e-07 (layer-aware replay by tuple[21] layer name, KV sharing)
gemma4_mixed           CRASH in the stock update: ``ValueError: not enough values to unpack
                       (expected 22, got 9)`` (attention_v1.py:715, first replayed step)
hybrid_linear_grouped  ok, 1.2e-06 (same model, group-major keys: attention first)
hybrid_linear          CRASH in the stock update: ``AttributeError: 'LinearAttnMetadata' object
                       has no attribute 'seq_lens_list'`` (attention_v1.py:751, first step)
mla                    ok, 1.1e-06 (AscendMLAImpl._forward_decode over a latent cache, and
                       AscendMLAImpl.update_graph_params: the MLA backend's own update)
=====================  ======================================================================

Without the update (events recorded, arguments left as last launched) every correct scenario
differs from eager by 0.2-3.3 (``paged_attention`` included: the simulator freezes PA's host
``context_lens`` at launch, as hardware does, although the runner passes a view of its persistent
``optimistic_seq_lens_cpu`` buffer).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from torch_npu_sim.harness.spec import (
    DraftScenario,
    LayerSpec,
    Scenario,
    V2Scenario,
    draft_layer,
)

if TYPE_CHECKING:
    from torch_npu_sim.workload import Workload


def _attn(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def _mla(name: str) -> LayerSpec:
    """An MLA layer: four query heads over one 64-wide latent (the KV cache's one head)."""
    return LayerSpec(name, num_heads=4, num_kv_heads=1, head_size=64, kind="mla")


def _linear(i: int) -> str:
    # Qwen3-Next style GDN layer prefix; it sits in attn_metadata but captures no attention task.
    return f"model.layers.{i}.linear_attn"


_HYBRID_LAYERS = (
    LayerSpec(_linear(0), kind="linear"),
    LayerSpec(_attn(1)),
    LayerSpec(_linear(2), kind="linear"),
    LayerSpec(_attn(3)),
    LayerSpec(_linear(4), kind="linear"),
    LayerSpec(_attn(5)),
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="dense_gqa",
            layers=tuple(LayerSpec(_attn(i)) for i in range(4)),
            stock="ok",
        ),
        Scenario(
            # FULL (not FULL_DECODE_ONLY): the runner pads with ONE dummy request holding all
            # padding tokens (kv length 0): the FIA batch size changes between capture and replay.
            name="dense_full",
            layers=tuple(LayerSpec(_attn(i)) for i in range(3)),
            compilation_mode="FULL",
            stock="ok",
        ),
        Scenario(
            # ENPU / 310P ordering: synchronize, update (records every event), then replay.
            name="dense_enpu",
            layers=tuple(LayerSpec(_attn(i)) for i in range(3)),
            update_order="update_then_replay",
            stock="ok",
        ),
        Scenario(
            name="sliding_window",
            layers=(
                LayerSpec(_attn(0)),
                LayerSpec(_attn(1), sliding_window=64),
                LayerSpec(_attn(2)),
            ),
            max_kv_len=384,
            stock="ok",
        ),
        Scenario(
            name="sinks",
            layers=tuple(LayerSpec(_attn(i), sinks=True) for i in range(3)),
            stock="ok",
        ),
        Scenario(
            # PA for the graph sizes in pa_shape_list (4, 16), FIA for size 8: the update picks
            # its branch per replayed size. The eager reference (unpadded) mostly runs FIA.
            name="paged_attention",
            layers=tuple(LayerSpec(_attn(i), num_heads=8, num_kv_heads=8) for i in range(3)),
            pa_shape_list=(4, 16),
            compilation_mode="FULL_DECODE_ONLY",
            stock="ok",
        ),
        Scenario(
            # Gemma4-like: head-512 global layers take the PA path (using_paged_attention returns
            # True for head_size 512 whatever the mode), sliding layers take FIA, so one capture
            # size holds a MIXED list of 9-field PA tuples and 22-field FIA tuples; the stock
            # update picks its branch without head_size (FIA branch) and unpacks every tuple as
            # FIA. Layer 5 shares layer 0's KV cache (Gemma-style KV sharing).
            name="gemma4_mixed",
            layers=(
                LayerSpec(_attn(0), num_heads=4, num_kv_heads=1, head_size=512),
                LayerSpec(_attn(1), num_heads=4, num_kv_heads=2, head_size=64, sliding_window=32),
                LayerSpec(_attn(2), num_heads=4, num_kv_heads=2, head_size=64, sliding_window=32),
                LayerSpec(_attn(3), num_heads=4, num_kv_heads=1, head_size=512),
                LayerSpec(_attn(4), num_heads=4, num_kv_heads=2, head_size=64, sliding_window=32),
                LayerSpec(
                    _attn(5),
                    num_heads=4,
                    num_kv_heads=1,
                    head_size=512,
                    kv_sharing_target=_attn(0),
                ),
            ),
            model_type="gemma4",
            max_kv_len=256,
            stock="crash: ValueError: not enough values to unpack (expected 22, got 9)",
        ),
        Scenario(
            # Positive control for the layer-aware replay: the same Gemma4-like layout with every
            # layer on FIA (global heads 128, not 512). The stock update resolves each task by the
            # layer name in tuple[21] (layer 5: its KV-sharing target's key) and gets it right.
            name="gemma4_fia",
            layers=(
                LayerSpec(_attn(0), num_heads=4, num_kv_heads=2, head_size=128),
                LayerSpec(_attn(1), num_heads=4, num_kv_heads=2, head_size=64, sliding_window=32),
                LayerSpec(_attn(2), num_heads=4, num_kv_heads=2, head_size=64, sliding_window=32),
                LayerSpec(_attn(3), num_heads=4, num_kv_heads=2, head_size=128),
                LayerSpec(_attn(4), num_heads=4, num_kv_heads=2, head_size=64, sliding_window=32),
                LayerSpec(
                    _attn(5),
                    num_heads=4,
                    num_kv_heads=2,
                    head_size=128,
                    kv_sharing_target=_attn(0),
                ),
            ),
            model_type="gemma4",
            max_kv_len=256,
            stock="ok",
        ),
        Scenario(
            # Hybrid (Qwen3-Next-like): linear-attention layers interleaved with attention
            # layers; their metadata keys are in attn_metadata in layer order. The stock FIA
            # update takes the first len(captured) keys, sorts them, and so pairs attention tasks
            # with linear-attention metadata.
            name="hybrid_linear",
            layers=_HYBRID_LAYERS,
            metadata_order="layers",
            stock="crash: AttributeError: 'LinearAttnMetadata' object has no attribute "
            "'seq_lens_list'",
        ),
        Scenario(
            # MLA (DeepSeek-like): AscendMLAImpl's decode (FIA v2 with the rope split over the
            # latent cache), its task groups captured inline, its own update_graph_params.
            name="mla",
            layers=tuple(_mla(_attn(i)) for i in range(4)),
            stock="ok",
        ),
        Scenario(
            # Positive control: the same hybrid model with the v1 runner's group-major key order
            # (attention group first, linear-attention keys after, as Qwen3-Next arranges them):
            # the first len(captured) keys are exactly the attention layers, so stock is right.
            name="hybrid_linear_grouped",
            layers=_HYBRID_LAYERS,
            metadata_order="groups",
            stock="ok",
        ),
    )
}


# --------------------------------------------------------------------------------------------
# v1 merged draft graphs (MTP / Eagle proposer)


def _draft_scenarios() -> dict[str, DraftScenario]:
    one = (LayerSpec(draft_layer(0)),)
    two = (LayerSpec(draft_layer(0)), LayerSpec(draft_layer(1)))
    out: dict[str, DraftScenario] = {}
    for k in (1, 2, 3, 4):
        out[f"mtp_k{k}"] = DraftScenario(f"mtp_k{k}", one, num_speculative_tokens=k)
    out["mtp_2layers_k3"] = DraftScenario("mtp_2layers_k3", two, num_speculative_tokens=3)
    out["eagle_2layers_k2"] = DraftScenario(
        "eagle_2layers_k2", two, num_speculative_tokens=2, method="eagle"
    )
    out["mtp_non_causal"] = DraftScenario(
        "mtp_non_causal",
        two,
        num_speculative_tokens=3,
        causal_steps=(True, False, False),
        # the graph keeps the causal mask under sparse_mode 0; eager passes none (docs/v2.md)
        stock="wrong: non-causal steps differ from eager (captured mask kept, stock quirk)",
    )
    out["mtp_enpu_k3"] = DraftScenario(
        "mtp_enpu_k3", two, num_speculative_tokens=3, update_order="update_then_replay"
    )
    # DeepSeek's MTP: one MLA draft layer, its task per draft step (the MLA draft update's rule)
    out["mla_mtp_k2"] = DraftScenario(
        "mla_mtp_k2", (_mla(draft_layer(0)),), num_speculative_tokens=2
    )
    return out


DRAFT_SCENARIOS: dict[str, DraftScenario] = _draft_scenarios()


# --------------------------------------------------------------------------------------------
# model runner v2: the target manager over the v1 scenarios, and the draft prefill manager

#: v1 scenarios that do not apply to the v2 target manager (documented skips, docs/v2.md).
NOT_ON_V2 = {
    "dense_full": "v1 FULL-mode padding (one dummy request holds every pad token) is a "
    "v1 NPUModelRunner path; the v2 target manager captures FULL_DECODE_ONLY uniform-decode "
    "descriptors, so its padding is the dense_gqa case",
    "dense_enpu": "ENPU update-then-replay is a v1 runner order; the 0.23.0.post1 v2 "
    "ModelAclGraphManager.run_fullgraph always replays, then updates",
}

# How stock 0.23.0.post1 behaves on the v2 target path (through the harness adapter) where it
# differs from v1: on `sinks`, v2's run_fullgraph uses vLLM's set_forward_context, nothing sets
# `_EXTRA_CTX.sinks` (additional_kwargs has no "sinks"), so stock takes the FIA branch and unpacks
# the 15-field FIA-v2 tuple as a 22-field FIA one (attention_v1.py:715, first replayed step).
_V2_STOCK = {"sinks": "crash: ValueError: not enough values to unpack (expected 22, got 15)"}

#: The model of the v2 draft prefill (and draft decode) managers.
V2_DRAFT_MODEL = Scenario(
    "v2_draft",
    layers=(LayerSpec(draft_layer(0)), LayerSpec(draft_layer(1))),
    capture_sizes=(4, 8),
    max_kv_len=384,
)


def v2_name(target: str) -> str:
    """Catalogue name of the v2 target workload over v1 scenario ``target``."""
    return f"v2_{target}"


V2_SCENARIOS: dict[str, V2Scenario] = {
    v2.name: v2
    for v2 in (
        *(
            V2Scenario(v2_name(name), sc, stock=_V2_STOCK.get(name, sc.stock))
            for name, sc in SCENARIOS.items()
            if name not in NOT_ON_V2
        ),
        V2Scenario("v2_draft_prefill", V2_DRAFT_MODEL, role="draft_prefill", qlen=2),
    )
}


# --------------------------------------------------------------------------------------------
# the catalogue

AnyScenario = Scenario | DraftScenario | V2Scenario

#: Every named workload: target, draft and v2.
CATALOGUE: dict[str, AnyScenario] = {**SCENARIOS, **DRAFT_SCENARIOS, **V2_SCENARIOS}
assert len(CATALOGUE) == len(SCENARIOS) + len(DRAFT_SCENARIOS) + len(V2_SCENARIOS)


def stock_table() -> dict[str, str]:
    """Name -> how stock is known to behave, for every workload (``ab --list``)."""
    return {name: sc.stock for name, sc in CATALOGUE.items()}


def with_overrides(scenario: AnyScenario, **overrides: Any) -> AnyScenario:
    """``scenario`` with fields replaced; a v2 scenario passes its base's fields to the base."""
    if isinstance(scenario, V2Scenario):
        own = {f.name for f in dataclasses.fields(V2Scenario)}
        base = {k: v for k, v in overrides.items() if k not in own}
        mine = {k: v for k, v in overrides.items() if k in own}
        if base:
            mine["base"] = dataclasses.replace(scenario.base, **base)
        return dataclasses.replace(scenario, **mine)
    return dataclasses.replace(scenario, **overrides)


def build(which: str | AnyScenario, **overrides: Any) -> Workload:
    """The engine of a workload, by catalogue name or scenario, with scenario fields replaced."""
    scenario = CATALOGUE[which] if isinstance(which, str) else which
    if overrides:
        scenario = with_overrides(scenario, **overrides)
    if isinstance(scenario, DraftScenario):
        from torch_npu_sim.harness.draft import DraftEngine

        return DraftEngine(scenario)
    if isinstance(scenario, V2Scenario):
        from torch_npu_sim.harness.v2 import V2Engine

        return V2Engine(scenario)
    from torch_npu_sim.harness.target import TargetEngine

    return TargetEngine(scenario)
