"""A tiny DeepSeek-V3 (``DeepseekV3ForCausalLM``) with its MTP layer, written as the real
checkpoints are laid out, so vLLM 0.23.0's own loaders read it.

What makes it DeepSeek-V3 to vllm-ascend 0.23.0.post1: MLA attention (``AscendMLAImpl``: q-LoRA
and kv-LoRA ranks, the query and key split into a rope-less part and a rope part, the KV cache
holding the normed latent and the rotated key rope), a dense first layer
(``first_k_dense_replace``) and MoE layers with a shared expert and grouped top-k routing (sigmoid
scores, a correction bias, ``n_group`` / ``topk_group``, ``routed_scaling_factor``). The MTP layer
sits at ``model.layers.<num_hidden_layers>`` with ``enorm``, ``hnorm``, ``eh_proj``,
``shared_head.{norm,head}`` and its own copy of the embedding, as DeepSeek's checkpoints ship it.

Random MTP weights would accept no draft token, and then a wrong draft graph could not show in
the acceptance rate. So the MTP layer is a guesser built from the target, like the EAGLE3 and
Step3.5 drafts, here through MLA: ``eh_proj`` keeps a small share of the normed token embedding,
the latent ``c`` of a position is an orthogonal map ``A`` of that embedding, each head's query in
latent space is a scaled copy of its own position's latent (so it attends to its own position),
the value path maps the latent back through ``A^T`` (the embedding passes through), the MoE is
silent and the target's final norm and head read the result. A draft attention that misses the
newest key (a stale kv length or block table) attends elsewhere and loses that agreement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checkpoints import HIDDEN, VOCAB, ModelSpec, save_checkpoint

HEADS = 4
#: The latent (kv-LoRA) and the query LoRA are as wide as the hidden state: the MTP guesser maps
#: the embedding onto the latent and back without loss.
KV_LORA = Q_LORA = HIDDEN
NOPE, ROPE, V_HEAD = 32, 16, 32
EXPERTS, MOE_INTER, INTER = 8, 64, 256

#: The config as DeepSeek-V3's ``config.json`` states it (vLLM reads ``DeepseekV3Config``).
CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "moe_intermediate_size": MOE_INTER,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "q_lora_rank": Q_LORA,
    "kv_lora_rank": KV_LORA,
    "qk_nope_head_dim": NOPE,
    "qk_rope_head_dim": ROPE,
    "v_head_dim": V_HEAD,
    "n_routed_experts": EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    # Two groups of four experts, one group chosen per token: grouped routing decides.
    "n_group": 2,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "moe_layer_freq": 1,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}


def build(spec: ModelSpec, directory: Path) -> None:
    """Write config, tokenizer and seeded weights for ``spec`` (config: :data:`CONFIG`)."""
    import torch

    cfg = spec.config
    h, n_layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    generator = torch.Generator().manual_seed(spec.seed)

    def matrix(rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) * (scale / cols**0.5)

    def norm(size: int) -> torch.Tensor:  # RMSNorm scales by its weight: near 1
        return 1.0 + 0.1 * torch.randn(size, generator=generator)

    branch = spec.branch_scale
    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(cfg["vocab_size"], h, generator=generator),
    }
    for i in range(n_layers):
        p = f"model.layers.{i}."
        tensors.update(_attention(p + "self_attn.", matrix, norm, h, branch))
        tensors[p + "input_layernorm.weight"] = norm(h)
        tensors[p + "post_attention_layernorm.weight"] = norm(h)
        if i < cfg["first_k_dense_replace"]:
            tensors.update(_mlp(p + "mlp.", matrix, h, cfg["intermediate_size"], branch))
            continue
        tensors[p + "mlp.gate.weight"] = matrix(cfg["n_routed_experts"], h)
        tensors[p + "mlp.gate.e_score_correction_bias"] = 0.1 * torch.randn(
            cfg["n_routed_experts"], generator=generator
        )
        for e in range(cfg["n_routed_experts"]):
            tensors.update(_mlp(f"{p}mlp.experts.{e}.", matrix, h, MOE_INTER, branch))
        shared = MOE_INTER * cfg["n_shared_experts"]
        tensors.update(_mlp(p + "mlp.shared_experts.", matrix, h, shared, branch))
    tensors["model.norm.weight"] = norm(h)
    tensors["lm_head.weight"] = matrix(cfg["vocab_size"], h, 4.0)
    for i in range(n_layers, n_layers + cfg["num_nextn_predict_layers"]):
        tensors.update(_guessing_mtp_layer(f"model.layers.{i}.", tensors, generator, cfg))
    save_checkpoint(directory, tensors, cfg)


def _attention(a: str, matrix: Any, norm: Any, h: int, branch: float) -> dict:
    return {
        a + "q_a_proj.weight": matrix(Q_LORA, h),
        a + "q_a_layernorm.weight": norm(Q_LORA),
        a + "q_b_proj.weight": matrix(HEADS * (NOPE + ROPE), Q_LORA),
        a + "kv_a_proj_with_mqa.weight": matrix(KV_LORA + ROPE, h),
        a + "kv_a_layernorm.weight": norm(KV_LORA),
        a + "kv_b_proj.weight": matrix(HEADS * (NOPE + V_HEAD), KV_LORA),
        a + "o_proj.weight": matrix(h, HEADS * V_HEAD, branch),
    }


def _mlp(prefix: str, matrix: Any, h: int, inter: int, branch: float) -> dict:
    return {
        prefix + "gate_proj.weight": matrix(inter, h),
        prefix + "up_proj.weight": matrix(inter, h),
        prefix + "down_proj.weight": matrix(h, inter, branch),
    }


def _guessing_mtp_layer(prefix: str, target: dict, generator: Any, cfg: dict) -> dict:
    """The MTP layer that guesses the token after its input token (see the module docstring)."""
    import torch

    h = cfg["hidden_size"]
    assert KV_LORA == Q_LORA == h and h == HEADS * NOPE and h == HEADS * V_HEAD, (
        "the guesser maps the embedding onto the latent and back: the widths must match"
    )
    orthogonal, _ = torch.linalg.qr(torch.randn(h, h, generator=generator))
    eye = torch.eye(h)
    query_scale = 4.0  # each head's own-position score, against a random one's: ~18 to ~3
    q_b = torch.zeros(HEADS * (NOPE + ROPE), Q_LORA)
    kv_b = torch.zeros(HEADS * (NOPE + V_HEAD), KV_LORA)
    for head in range(HEADS):
        select = eye[head * NOPE : (head + 1) * NOPE]  # this head's share of the latent
        q_b[head * (NOPE + ROPE) : head * (NOPE + ROPE) + NOPE] = query_scale * select
        kv_b[head * (NOPE + V_HEAD) : head * (NOPE + V_HEAD) + NOPE] = select  # keys
        values = eye[head * V_HEAD : (head + 1) * V_HEAD] @ orthogonal.T  # latent -> embedding
        kv_b[head * (NOPE + V_HEAD) + NOPE : (head + 1) * (NOPE + V_HEAD)] = values
    a = prefix + "self_attn."
    tensors = {
        prefix + "embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
        prefix + "enorm.weight": torch.ones(h),
        prefix + "hnorm.weight": torch.zeros(h),
        # A small share of the normed embedding (none of the hidden state): the attention's
        # pass-through, not the residual, decides the guess.
        prefix + "eh_proj.weight": torch.cat([0.1 * eye, torch.zeros(h, h)], 1),
        prefix + "shared_head.norm.weight": target["model.norm.weight"].clone(),
        prefix + "shared_head.head.weight": target["lm_head.weight"].clone(),
        a + "q_a_proj.weight": orthogonal.clone(),
        a + "q_a_layernorm.weight": torch.ones(Q_LORA),
        a + "q_b_proj.weight": q_b,
        # The latent is the embedding turned by ``orthogonal``; the key rope part is zero.
        a + "kv_a_proj_with_mqa.weight": torch.cat([orthogonal, torch.zeros(ROPE, h)]),
        a + "kv_a_layernorm.weight": torch.ones(KV_LORA),
        a + "kv_b_proj.weight": kv_b,
        a + "o_proj.weight": eye.clone(),
        prefix + "input_layernorm.weight": torch.ones(h),
        prefix + "post_attention_layernorm.weight": torch.ones(h),
        # A silent MoE block: routed and shared experts add nothing.
        prefix + "mlp.gate.weight": torch.zeros(cfg["n_routed_experts"], h),
        prefix + "mlp.gate.e_score_correction_bias": torch.zeros(cfg["n_routed_experts"]),
    }
    silent = {"gate_proj": (MOE_INTER, h), "up_proj": (MOE_INTER, h), "down_proj": (h, MOE_INTER)}
    experts = [f"experts.{e}" for e in range(cfg["n_routed_experts"])] + ["shared_experts"]
    for expert in experts:
        for name, shape in silent.items():
            tensors[f"{prefix}mlp.{expert}.{name}.weight"] = torch.zeros(shape)
    return tensors


DEEPSEEK_V3 = ModelSpec("deepseek_v3", build, CONFIG, branch_scale=0.5)
