"""Tiny MLA models of the variants users serve beside DeepSeek-V3, written as their real
checkpoints are laid out (one tensor per expert), so vLLM 0.23.0's loaders read them, and
transformers 5.5.4's own classes of the same names too (the eager engine's independent oracle:
``tests/test_engine_mla_variants.py``).

- DeepSeek-V2-Lite (``DeepseekV2ForCausalLM``): no query LoRA (``q_lora_rank: null``: the query
  through a plain ``q_proj``, vLLM's and vllm-ascend's other MLA branch), softmax scores, greedy
  top-k over all experts (``topk_method: greedy``, one group), weights not renormalised, two
  shared experts. Twice: without rope scaling, and with the YaRN its real config ships
  (transformers' ``DeepseekV2Attention`` leaves YaRN's ``mscale`` out of its softmax scale, where
  vLLM and DeepSeek's own code put it in: the oracle corrects that one factor).
- DeepSeek-V2 (``DeepseekV2ForCausalLM``): query LoRA, softmax group-limited greedy routing.
- Moonlight (``DeepseekV3ForCausalLM`` as Moonlight-16B-A3B ships it): no query LoRA either,
  sigmoid scores with a correction bias (``noaux_tc``) in one group (``n_group: 1``,
  ``topk_group: 1``), many experts for the size, ``routed_scaling_factor`` 2.446.
- Kimi-K2 (``DeepseekV3ForCausalLM``): query LoRA, one-group sigmoid routing, YaRN.
- GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``): query LoRA, a rope-less key part narrower than the
  value head, GLM's always-biased one-group router.

All: a dense first layer (``first_k_dense_replace: 1``) and a MoE layer, no MTP layer (only
GLM-4.7-Flash's checkpoint ships one; it is not built here). DeepSeek-V3's tiny model
(``deepseek_model``) is not touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checkpoints import HIDDEN, VOCAB, ModelSpec, save_checkpoint

HEADS = 4
NOPE, ROPE, V_HEAD = 32, 16, 32

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    # No query LoRA: the query is one plain projection of the hidden state.
    "q_lora_rank": None,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": NOPE,
    "qk_rope_head_dim": ROPE,
    "v_head_dim": V_HEAD,
    "n_shared_experts": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}

#: DeepSeek-V2-Lite's ``config.json`` in small (its routing settings as shipped).
V2_LITE_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    **_COMMON,
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
}

#: DeepSeek-V2-Lite with the YaRN rope its real ``config.json`` ships (factor 40, ``mscale`` =
#: ``mscale_all_dim`` = 0.707: cos / sin unscaled, the softmax scale times
#: ``(0.0707 ln 40 + 1)^2``, about 1.59), otherwise :data:`V2_LITE_CONFIG`.
V2_LITE_YARN_CONFIG: dict[str, Any] = {
    **V2_LITE_CONFIG,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
    },
}

#: DeepSeek-V2 (the full model, not Lite) in small: query LoRA, softmax scores, and
#: **group-limited** greedy routing (``topk_method: group_limited_greedy``: groups ranked by their
#: best expert's score, the best ``topk_group`` kept; no correction bias), 4 groups of 8 experts,
#: 1 group and top 4 per token (the real one: 8 groups of 20, 3 groups, top 6), scaling 1.
V2_CONFIG: dict[str, Any] = {
    **V2_LITE_CONFIG,
    "q_lora_rank": 96,
    "n_routed_experts": 32,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 1,
    "topk_method": "group_limited_greedy",
}

#: Moonlight-16B-A3B's ``config.json`` in small (a ``DeepseekV3ForCausalLM``; Kimi-K2 routes the
#: same way: sigmoid, correction bias, one group, a scaling factor far from 1).
MOONLIGHT_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    **_COMMON,
    "n_routed_experts": 16,
    "num_experts_per_tok": 6,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.446,
    "num_nextn_predict_layers": 0,
}

#: Kimi-K2's ``config.json`` in small (a ``DeepseekV3ForCausalLM`` with query LoRA): sigmoid
#: routing in one group over many experts (top 8), one shared expert, scaling 2.827, and its
#: YaRN rope (factor 32, ``mscale`` = ``mscale_all_dim`` = 1: cos / sin unscaled, the softmax
#: scale multiplied by ``(0.1 ln 32 + 1)^2``), rope theta 50000.
KIMI_K2_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    **_COMMON,
    "q_lora_rank": 96,
    "n_shared_experts": 1,
    "n_routed_experts": 32,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "num_nextn_predict_layers": 0,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 32.0,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
    "max_position_embeddings": 131072,
}

#: GLM-4.7-Flash's ``config.json`` in small (``Glm4MoeLiteForCausalLM``: vLLM 0.23.0 serves it
#: with DeepSeek-V2's MLA attention and GLM-4-MoE's router): query LoRA, a rope-less key part
#: wider than the value head is not (``qk_nope_head_dim`` 48 against ``v_head_dim`` 64, as 192
#: against 256 in the real one), sigmoid routing with a correction bias in one group (no
#: ``topk_method`` key: GLM's router always takes the bias), scaling 1.8, rope theta 1e6.
GLM47_FLASH_CONFIG: dict[str, Any] = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "model_type": "glm4_moe_lite",
    **_COMMON,
    "q_lora_rank": 96,
    "qk_nope_head_dim": 48,
    "v_head_dim": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.8,
    "num_nextn_predict_layers": 0,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
}


#: GLM-4.7-Flash with its MTP layer (``num_nextn_predict_layers: 1``, vLLM's
#: ``Glm4MoeLiteMTP`` through vllm-ascend's MTP proposer): latent and query LoRA as wide as the
#: hidden state, so the MTP layer can be a guesser (:func:`_guessing_mtp_layer`); otherwise
#: :data:`GLM47_FLASH_CONFIG` (its narrower-key, wider-value heads kept).
GLM47_FLASH_MTP_CONFIG: dict[str, Any] = {
    **GLM47_FLASH_CONFIG,
    "q_lora_rank": HIDDEN,
    "kv_lora_rank": HIDDEN,
    "num_nextn_predict_layers": 1,
}


def _biased_router(cfg: dict[str, Any]) -> bool:
    """Whether the router has an ``e_score_correction_bias``: DeepSeek's ``noaux_tc``, and GLM's
    always."""
    return cfg.get("topk_method") == "noaux_tc" or cfg["model_type"] == "glm4_moe_lite"


def build(spec: ModelSpec, directory: Path) -> None:
    """Write config, tokenizer and seeded weights for ``spec`` (any of this module's configs)."""
    import torch

    cfg = spec.config
    h = cfg["hidden_size"]
    generator = torch.Generator().manual_seed(spec.seed)

    def matrix(rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) * (scale / cols**0.5)

    def norm(size: int) -> torch.Tensor:  # RMSNorm scales by its weight: near 1
        return 1.0 + 0.1 * torch.randn(size, generator=generator)

    branch = spec.branch_scale
    heads, kv_lora = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, v_head = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora = cfg["q_lora_rank"]
    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(cfg["vocab_size"], h, generator=generator),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if q_lora is None:
            tensors[a + "q_proj.weight"] = matrix(heads * (nope + rope), h)
        else:
            tensors[a + "q_a_proj.weight"] = matrix(q_lora, h)
            tensors[a + "q_a_layernorm.weight"] = norm(q_lora)
            tensors[a + "q_b_proj.weight"] = matrix(heads * (nope + rope), q_lora)
        tensors[a + "kv_a_proj_with_mqa.weight"] = matrix(kv_lora + rope, h)
        tensors[a + "kv_a_layernorm.weight"] = norm(kv_lora)
        tensors[a + "kv_b_proj.weight"] = matrix(heads * (nope + v_head), kv_lora)
        tensors[a + "o_proj.weight"] = matrix(h, heads * v_head, branch)
        tensors[p + "input_layernorm.weight"] = norm(h)
        tensors[p + "post_attention_layernorm.weight"] = norm(h)
        if i < cfg["first_k_dense_replace"]:
            tensors.update(_mlp(p + "mlp.", matrix, h, cfg["intermediate_size"], branch))
            continue
        experts, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        # Router logits spread over a few units: the top-k choice is clear, not a float tie.
        tensors[p + "mlp.gate.weight"] = matrix(experts, h, 2.0)
        if _biased_router(cfg):
            tensors[p + "mlp.gate.e_score_correction_bias"] = 0.1 * torch.randn(
                experts, generator=generator
            )
        for e in range(experts):
            tensors.update(_mlp(f"{p}mlp.experts.{e}.", matrix, h, inter, branch))
        shared = inter * cfg["n_shared_experts"]
        tensors.update(_mlp(p + "mlp.shared_experts.", matrix, h, shared, branch))
    tensors["model.norm.weight"] = norm(h)
    tensors["lm_head.weight"] = matrix(cfg["vocab_size"], h, 4.0)
    n_layers = cfg["num_hidden_layers"]
    for i in range(n_layers, n_layers + cfg.get("num_nextn_predict_layers", 0)):
        tensors.update(_guessing_mtp_layer(f"model.layers.{i}.", tensors, generator, cfg))
    save_checkpoint(directory, tensors, cfg)


def _guessing_mtp_layer(prefix: str, target: dict, generator: Any, cfg: dict) -> dict:
    """An MTP layer that guesses the token after its input token, as DeepSeek-V3's tiny one
    does (``deepseek_model``), for heads whose rope-less key part and value head differ in width:
    the latent of a position is an orthogonal map ``A`` of the normed token embedding; head ``i``
    owns latent channels ``[w i, w (i + 1))`` (``w`` = hidden / heads); its query (scaled) and
    key read them in the first ``w`` rope-less channels, its value maps them back through ``A^T``
    in its first ``w`` channels, and ``o_proj`` puts them back in place: attending to its own
    position, the layer passes the embedding through. The MoE is silent, the target's final norm
    and head read the result."""
    import torch

    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v_head = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    w = h // heads
    assert cfg["kv_lora_rank"] == cfg["q_lora_rank"] == h and w <= min(nope, v_head), (
        "the guesser maps the embedding onto the latent and back: the widths must allow it"
    )
    orthogonal, _ = torch.linalg.qr(torch.randn(h, h, generator=generator))
    eye = torch.eye(h)
    query_scale = 5.0
    q_b = torch.zeros(heads * (nope + rope), h)
    kv_b = torch.zeros(heads * (nope + v_head), h)
    o_proj = torch.zeros(h, heads * v_head)
    for head in range(heads):
        select = eye[head * w : (head + 1) * w]
        q_b[head * (nope + rope) : head * (nope + rope) + w] = query_scale * select
        base = head * (nope + v_head)
        kv_b[base : base + w] = select  # keys
        kv_b[base + nope : base + nope + w] = select @ orthogonal.T  # values: latent -> embedding
        o_proj[head * w : (head + 1) * w, head * v_head : head * v_head + w] = torch.eye(w)
    a = prefix + "self_attn."
    experts, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    tensors = {
        prefix + "embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
        prefix + "enorm.weight": torch.ones(h),
        prefix + "hnorm.weight": torch.zeros(h),
        prefix + "eh_proj.weight": torch.cat([0.1 * eye, torch.zeros(h, h)], 1),
        prefix + "shared_head.norm.weight": target["model.norm.weight"].clone(),
        prefix + "shared_head.head.weight": target["lm_head.weight"].clone(),
        a + "q_a_proj.weight": orthogonal.clone(),
        a + "q_a_layernorm.weight": torch.ones(h),
        a + "q_b_proj.weight": q_b,
        a + "kv_a_proj_with_mqa.weight": torch.cat([orthogonal, torch.zeros(rope, h)]),
        a + "kv_a_layernorm.weight": torch.ones(h),
        a + "kv_b_proj.weight": kv_b,
        a + "o_proj.weight": o_proj,
        prefix + "input_layernorm.weight": torch.ones(h),
        prefix + "post_attention_layernorm.weight": torch.ones(h),
        prefix + "mlp.gate.weight": torch.zeros(experts, h),
        prefix + "mlp.gate.e_score_correction_bias": torch.zeros(experts),
    }
    shared = inter * cfg["n_shared_experts"]
    for expert, size in [
        *((f"experts.{e}", inter) for e in range(experts)),
        ("shared_experts", shared),
    ]:
        for name, shape in (
            ("gate_proj", (size, h)),
            ("up_proj", (size, h)),
            ("down_proj", (h, size)),
        ):
            tensors[f"{prefix}mlp.{expert}.{name}.weight"] = torch.zeros(shape)
    return tensors


def _mlp(prefix: str, matrix: Any, h: int, inter: int, branch: float) -> dict:
    return {
        prefix + "gate_proj.weight": matrix(inter, h),
        prefix + "up_proj.weight": matrix(inter, h),
        prefix + "down_proj.weight": matrix(h, inter, branch),
    }


DEEPSEEK_V2_LITE = ModelSpec("deepseek_v2_lite", build, V2_LITE_CONFIG, branch_scale=0.5)
MOONLIGHT = ModelSpec("moonlight", build, MOONLIGHT_CONFIG, branch_scale=0.5)
KIMI_K2 = ModelSpec("kimi_k2", build, KIMI_K2_CONFIG, branch_scale=0.5)
GLM47_FLASH = ModelSpec("glm47_flash", build, GLM47_FLASH_CONFIG, branch_scale=0.5)
DEEPSEEK_V2 = ModelSpec("deepseek_v2", build, V2_CONFIG, branch_scale=0.5)
GLM47_FLASH_MTP = ModelSpec("glm47_flash_mtp", build, GLM47_FLASH_MTP_CONFIG, branch_scale=0.5)
DEEPSEEK_V2_LITE_YARN = ModelSpec(
    "deepseek_v2_lite_yarn", build, V2_LITE_YARN_CONFIG, branch_scale=0.5
)
