"""Tiny Qwen3.5 (``Qwen3_5ForConditionalGeneration``): Gated DeltaNet linear-attention layers
between gated full-attention layers, with an MTP layer, written as the real checkpoints are.

transformers 5.5.4 builds the model (a tiny vision tower the engine skips with
``language_model_only``); the MTP tensors (``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``,
``mtp.layers.0.*`` shaped as a full-attention layer, ``mtp.norm``), which transformers does not
model, are added to the safetensors, and ``text_config.mtp_num_hidden_layers`` declares them, so
vLLM's ``Qwen3_5MTP`` loads them as the draft (``speculative_config`` method ``mtp``).

Sizes obey the release's one start-up constraint for hybrids: the GDN state page must align with
the attention page (``patch/platform/patch_mamba_config.py:94-97``): 4 value heads x key dim 64 x
value dim 64 x 4 bytes (64 KiB) is 128 attention tokens' pages of 512 bytes; dims of 32 fail.

Random MTP weights would accept no draft token, and then a wrong draft graph could not show in
the acceptance rate. So the MTP layer is a guesser built from the target (as Step3.5's): ``fc``
keeps a small share of the normed token embedding (none of the hidden state), the attention
looks at its own position (queries are scaled copies of the keys, both read from that
embedding), its values pass the embedding through, its MLP is silent, and the target's final norm
and output head read the result. A draft attention that misses the newest key (a stale kv length,
another group's block table) attends elsewhere and loses that agreement.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoints import HIDDEN, VOCAB, ModelSpec, save_tokenizer

HEADS, KV_HEADS, HEAD_DIM, INTER = 4, 2, 64, 256
LINEAR, FULL = "linear_attention", "full_attention"


def text_config(layer_types: list[str]) -> dict[str, Any]:
    """``Qwen3_5TextConfig`` keyword arguments for a tiny model with ``layer_types``."""
    return {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": len(layer_types),
        "layer_types": layer_types,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        # Qwen3.5's rotary: a quarter of each head rotated, interleaved multimodal sections.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
        # Ids the prompts never hold (the engine tests draw prompt tokens from 3 up).
        "eos_token_id": 1,
        "bos_token_id": 2,
    }


#: The vision tower's config (skipped by the engine with ``language_model_only``).
VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": HIDDEN,
    "num_position_embeddings": 64,
}

#: Image / video / vision markers: ids 0-2 and the last, which prompts never hold (0-2), so
#: vLLM's and transformers' M-RoPE see text positions only.
SPECIAL = {
    "image_token_id": 0,
    "video_token_id": 1,
    "vision_start_token_id": 2,
    "vision_end_token_id": VOCAB - 1,
}


#: Qwen3.5-MoE's MLP: routed experts (softmax top 2 of 4) and a gated shared expert.
MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}


def config(layer_types: list[str], mtp: bool, moe: bool = False) -> dict[str, Any]:
    text = text_config(layer_types)
    if moe:
        del text["intermediate_size"]
        text.update(MOE)
    return {"text": text, "vision": VISION, "mtp": mtp, "moe": moe}


def build(spec: ModelSpec, directory: Path) -> None:
    """Write config, tokenizer and seeded weights (plus the guessing MTP layer, if asked)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from .models import seeded_weights

    cfg = spec.config
    family = "Qwen3_5Moe" if cfg.get("moe") else "Qwen3_5"
    hf_config = getattr(transformers, f"{family}Config")(
        text_config=dict(cfg["text"]), vision_config=dict(cfg["vision"]), **SPECIAL
    )
    torch.manual_seed(spec.seed)
    model_cls = getattr(transformers, f"{family}ForConditionalGeneration")
    model = model_cls(hf_config).to(torch.float32)
    seeded_weights(model, spec.seed, branch_scale=spec.branch_scale)
    with torch.no_grad():  # the GDN and fused-expert branches too (seeded_weights: *.weight)
        for name, param in model.named_parameters():
            if name.endswith(("linear_attn.out_proj.weight", "mlp.experts.down_proj")):
                param.mul_(spec.branch_scale)
    model.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(directory)
    if not cfg["mtp"]:
        return
    weights = directory / "model.safetensors"
    tensors = load_file(weights)
    generator = torch.Generator().manual_seed(spec.seed + 1)
    tensors.update(_guessing_mtp(tensors, generator, bool(cfg.get("moe"))))
    save_file(tensors, weights, metadata={"format": "pt"})
    config_file = directory / "config.json"
    data = json.loads(config_file.read_text())
    data["text_config"]["mtp_num_hidden_layers"] = 1
    config_file.write_text(json.dumps(data, indent=1))


def guessing_layer(generator: Any) -> dict[str, Any]:
    """The guessing MTP layer (see the module docstring) without its MLP and final norm: ``fc``,
    the pre-``fc`` norms, a gated attention that looks at its own position and passes the
    embedding through, and the layer's norms. Qwen3.5's and Qwen3-Next's norms scale by
    ``1 + weight``, so zeros leave a norm's input normalised only."""
    import torch

    h = HIDDEN
    assert h == KV_HEADS * HEAD_DIM, "the pass-through values need kv_heads * head_dim == hidden"
    keys = torch.randn(KV_HEADS * HEAD_DIM, h, generator=generator) / h**0.5
    group = HEADS // KV_HEADS
    q_proj = torch.zeros(HEADS * 2 * HEAD_DIM, h)  # per head: its query rows, then its gate rows
    out = torch.zeros(h, HEADS * HEAD_DIM)
    for i in range(HEADS):
        j = i // group
        q_proj[i * 2 * HEAD_DIM : i * 2 * HEAD_DIM + HEAD_DIM] = keys[
            j * HEAD_DIM : (j + 1) * HEAD_DIM
        ]
        out[j * HEAD_DIM : (j + 1) * HEAD_DIM, i * HEAD_DIM : (i + 1) * HEAD_DIM] = (
            torch.eye(HEAD_DIM) / group
        )
    zeros = torch.zeros(h)
    p, a = "mtp.layers.0.", "mtp.layers.0.self_attn."
    return {
        "mtp.fc.weight": torch.cat([0.1 * torch.eye(h), torch.zeros(h, h)], 1),
        "mtp.pre_fc_norm_embedding.weight": zeros.clone(),
        "mtp.pre_fc_norm_hidden.weight": zeros.clone(),
        a + "q_proj.weight": q_proj,  # gate rows 0: the output gate halves every head
        a + "k_proj.weight": keys,
        a + "v_proj.weight": torch.eye(h),
        a + "o_proj.weight": out,
        # q_norm's scale 1 + 1: each position's own key scores 2 * head_dim / sqrt(head_dim).
        a + "q_norm.weight": torch.ones(HEAD_DIM),
        a + "k_norm.weight": torch.zeros(HEAD_DIM),
        p + "input_layernorm.weight": zeros.clone(),
        p + "post_attention_layernorm.weight": zeros.clone(),
    }


def _guessing_mtp(target: dict[str, Any], generator: Any, moe: bool) -> dict[str, Any]:
    """The MTP tensors: the guessing layer, a silent MLP, the target's final norm."""
    import torch

    h, p = HIDDEN, "mtp.layers.0."
    if moe:  # a silent MoE block: no expert and no shared expert adds anything
        e, inter = MOE["num_experts"], MOE["moe_intermediate_size"]
        shared = MOE["shared_expert_intermediate_size"]
        mlp = {
            p + "mlp.gate.weight": torch.zeros(e, h),
            p + "mlp.experts.gate_up_proj": torch.zeros(e, 2 * inter, h),
            p + "mlp.experts.down_proj": torch.zeros(e, h, inter),
            p + "mlp.shared_expert.gate_proj.weight": torch.zeros(shared, h),
            p + "mlp.shared_expert.up_proj.weight": torch.zeros(shared, h),
            p + "mlp.shared_expert.down_proj.weight": torch.zeros(h, shared),
            p + "mlp.shared_expert_gate.weight": torch.zeros(1, h),
        }
    else:
        mlp = {
            p + "mlp.gate_proj.weight": torch.zeros(INTER, h),
            p + "mlp.up_proj.weight": torch.zeros(INTER, h),
            p + "mlp.down_proj.weight": torch.zeros(h, INTER),
        }
    return {
        **mlp,
        **guessing_layer(generator),
        "mtp.norm.weight": target["model.language_model.norm.weight"].clone(),
    }


#: Dense Qwen3.5 with the real 3:1 pattern (three GDN layers, then gated full attention), and
#: its MTP layer.
QWEN35 = ModelSpec(
    "qwen3_5", build, config([LINEAR, LINEAR, LINEAR, FULL], mtp=True), branch_scale=0.5
)
#: Attention layers that span two KV-cache groups (L, F, L, F + MTP): vLLM groups layers of a
#: type stride-wise in groups of the smallest type's size, so 3 attention layers (two + MTP)
#: beside 2 GDN layers form two attention groups (layers 1 + MTP; layer 3).
QWEN35_TWO_GROUPS = ModelSpec(
    "qwen3_5_two_groups", build, config([LINEAR, FULL, LINEAR, FULL], mtp=True), branch_scale=0.5
)
#: Qwen3.5-MoE (routed and shared experts in every layer), 3:1, with its MTP layer.
QWEN35_MOE = ModelSpec(
    "qwen3_5_moe",
    build,
    config([LINEAR, LINEAR, LINEAR, FULL], mtp=True, moe=True),
    branch_scale=0.5,
)
