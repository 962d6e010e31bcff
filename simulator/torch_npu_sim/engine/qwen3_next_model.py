"""Tiny Qwen3-Next (``Qwen3NextForCausalLM``): Gated DeltaNet linear-attention layers between
gated full-attention layers, a sparse MoE block with a gated shared expert in every layer, and an
MTP layer, written as the real checkpoints are.

What differs from Qwen3.5 (``qwen35_model``) on the engine: the GDN input projections are the
fused, per-key-head interleaved ``in_proj_qkvz`` / ``in_proj_ba`` (vllm-ascend splits them with its
``fused_qkvzba_split_reshape_cat`` Triton kernel), the full-attention layers rotate a quarter of
each head with plain (not multimodal) RoPE, the model is text only (``Qwen3NextForCausalLM``, no
vision tower), the routed experts are stored one tensor per expert (``mlp.experts.E.gate_proj``
..., the only names vLLM's Qwen3-Next loader maps; transformers 5.5.4 holds them fused in memory
and writes them so, reversing its ``qwen2_moe`` conversion on save), and the MTP layer is
declared by ``num_nextn_predict_layers`` (vllm-ascend's ``patch_speculative_config`` rewrites
the draft's model type to ``qwen3_next_mtp``, served by vLLM's ``Qwen3NextMTP``; its loader reads
``mtp.*`` and the target's ``model.embed_tokens`` and ``lm_head``). Norms are Gemma-style
(``1 + weight``) except the GDN output's gated norm.

transformers 5.5.4 builds the target; the MTP tensors, which transformers does not model, are
added to the safetensors. Sizes obey the release's one start-up constraint for hybrids, as
Qwen3.5's do: the GDN state page (4 value heads x key dim 64 x value dim 64 x 4 bytes) must be a
whole number of attention pages (``patch/platform/patch_mamba_config.py:94-97``).

The MTP layer is the same guesser as Qwen3.5's (see ``qwen35_model``): ``fc`` keeps a small share
of the normed token embedding, the attention looks at its own position, its values pass the
embedding through, its MoE block is silent, and the target's final norm and output head read the
result. A draft attention that misses the newest key loses that agreement.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoints import HIDDEN, ModelSpec, save_tokenizer
from .qwen35_model import guessing_layer, text_config

LINEAR, FULL = "linear_attention", "full_attention"
#: Routed experts (softmax top 2 of 4, renormalised) and a gated shared expert, every layer.
EXPERTS, TOP_K, EXPERT_INTER, SHARED_INTER = 4, 2, 64, 64


def config(layer_types: list[str], mtp: bool, **changes: Any) -> dict[str, Any]:
    """``Qwen3NextConfig`` keyword arguments for a tiny model with ``layer_types`` (and
    ``changes``): Qwen3.5's tiny text config (the same GDN and attention sizes) with a MoE block in
    every layer and Qwen3-Next's rotary."""
    return {
        **text_config(layer_types),
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": EXPERT_INTER,
        "shared_expert_intermediate_size": SHARED_INTER,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        # Qwen3-Next's rotary: a quarter of each head rotated (NeoX halves), one position stream.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        "mtp": mtp,
        **changes,
    }


def build(spec: ModelSpec, directory: Path) -> None:
    """Write config, tokenizer and seeded weights (plus the guessing MTP layer, if asked)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from .models import seeded_weights

    kwargs = dict(spec.config)
    mtp = kwargs.pop("mtp")
    hf_config = transformers.Qwen3NextConfig(**kwargs)
    torch.manual_seed(spec.seed)
    model = transformers.Qwen3NextForCausalLM(hf_config).to(torch.float32)
    seeded_weights(model, spec.seed, branch_scale=spec.branch_scale)
    with torch.no_grad():  # the GDN and fused-expert branches too (seeded_weights: *.weight)
        for name, param in model.named_parameters():
            if name.endswith(("linear_attn.out_proj.weight", "mlp.experts.down_proj")):
                param.mul_(spec.branch_scale)
    model.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(directory)
    if not mtp:
        return
    weights = directory / "model.safetensors"
    tensors = load_file(weights)
    generator = torch.Generator().manual_seed(spec.seed + 1)
    tensors.update(_guessing_mtp(tensors, generator))
    save_file(tensors, weights, metadata={"format": "pt"})
    config_file = directory / "config.json"
    data = json.loads(config_file.read_text())
    data["num_nextn_predict_layers"] = 1
    config_file.write_text(json.dumps(data, indent=1))


def _guessing_mtp(target: dict[str, Any], generator: Any) -> dict[str, Any]:
    """The MTP tensors (see the module docstring): Qwen3.5's guessing layer, a silent MoE block
    with one tensor per expert (as vLLM's loader maps them), the target's final norm."""
    import torch

    h, p = HIDDEN, "mtp.layers.0."
    mlp = {  # a silent MoE block: no expert and no shared expert adds anything
        p + "mlp.gate.weight": torch.zeros(EXPERTS, h),
        p + "mlp.shared_expert.gate_proj.weight": torch.zeros(SHARED_INTER, h),
        p + "mlp.shared_expert.up_proj.weight": torch.zeros(SHARED_INTER, h),
        p + "mlp.shared_expert.down_proj.weight": torch.zeros(h, SHARED_INTER),
        p + "mlp.shared_expert_gate.weight": torch.zeros(1, h),
    }
    for e in range(EXPERTS):
        mlp[f"{p}mlp.experts.{e}.gate_proj.weight"] = torch.zeros(EXPERT_INTER, h)
        mlp[f"{p}mlp.experts.{e}.up_proj.weight"] = torch.zeros(EXPERT_INTER, h)
        mlp[f"{p}mlp.experts.{e}.down_proj.weight"] = torch.zeros(h, EXPERT_INTER)
    return {
        **mlp,
        **guessing_layer(generator),
        "mtp.norm.weight": target["model.norm.weight"].clone(),
    }


#: Qwen3-Next with the released 3:1 pattern (three GDN layers, then gated full attention), MoE in
#: every layer, and its MTP layer (served as the draft only when a case asks for it).
QWEN3_NEXT = ModelSpec(
    "qwen3_next", build, config([LINEAR, LINEAR, LINEAR, FULL], mtp=True), branch_scale=0.5
)
#: Layers L, F, L, F + MTP: the attention layers (two + MTP) beside two GDN layers span two
#: KV-cache groups (as ``qwen35_model.QWEN35_TWO_GROUPS``).
QWEN3_NEXT_TWO_GROUPS = ModelSpec(
    "qwen3_next_two_groups",
    build,
    config([LINEAR, FULL, LINEAR, FULL], mtp=True),
    branch_scale=0.5,
)
#: Other GDN shapes: one key head shared by three value heads (a ratio that is no power of two),
#: head dims 128 (the released models' GDN dims; state page 3 x 128 x 128 x 4 bytes), and layer 1
#: with a dense MLP (``mlp_only_layers``) among the MoE layers.
QWEN3_NEXT_WIDE = ModelSpec(
    "qwen3_next_wide",
    build,
    config(
        [LINEAR, LINEAR, LINEAR, FULL],
        mtp=True,
        linear_num_key_heads=1,
        linear_num_value_heads=3,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        mlp_only_layers=[1],
    ),
    branch_scale=0.5,
)
