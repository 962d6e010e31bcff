"""A tiny Step3.5 (``Step3p5ForCausalLM``) with its MTP layers, from vLLM's own ``Step3p5Config``.

Step3.5 is the one draft on vllm-ascend 0.23.0.post1 whose layers span several KV-cache groups
(``AscendStep3p5MTPProposer``): each MTP layer is a full decoder layer with its own attention, and
the hybrid KV-cache manager puts each sliding MTP layer in a group of its own. The target has a
full-attention layer with a dense MLP and a sliding layer with a MoE block (routed experts with a
sigmoid router and its bias, a shared expert), as the real model alternates them.

The checkpoint is written as the real one is laid out (``model.layers.N.moe.gate_proj.weight``
packed ``[experts, out, in]``, ``share_expert``, MTP layers at ``num_hidden_layers + i`` with
``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.{norm,output}``), so vLLM's own loaders read it.

Random MTP layers would accept no draft token, and then a wrong draft graph could not show in the
acceptance rate. So each MTP layer is a guesser built from the target, like the EAGLE3 draft:
``eh_proj`` keeps a small share of the normed token embedding, the layer's attention looks at its
own position (queries are scaled copies of the keys, both read from that embedding), its values
pass the embedding through, its MLP is silent, and the target's final norm and output head read
the result. A draft attention that misses the newest key (a stale kv length, or another group's
block table) attends elsewhere and loses that agreement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checkpoints import HIDDEN, VOCAB, ModelSpec, save_checkpoint

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
EXPERTS, MOE_INTER, INTER = 4, 64, 256

#: vLLM's ``Step3p5Config`` keyword arguments. ``layer_types`` covers the MTP layers as the real
#: checkpoints do (the config keeps ``num_hidden_layers`` of them; vllm-ascend's proposer extends
#: the draft's with sliding layers again).
CONFIG: dict[str, Any] = {
    "architectures": ["Step3p5ForCausalLM"],
    "model_type": "step3p5",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_attention_heads": HEADS,
    "num_attention_groups": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_hidden_layers": 2,
    "layer_types": ["full_attention", "sliding_attention"] + ["sliding_attention"] * 2,
    "sliding_window": 8,
    "max_seq_len": 8192,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "moe_layers_enum": "1",
    "moe_num_experts": EXPERTS,
    "moe_top_k": 2,
    "moe_intermediate_size": MOE_INTER,
    "share_expert_dim": MOE_INTER,
    "moe_router_activation": "sigmoid",
    "moe_router_scaling_factor": 1.0,
    "norm_expert_weight": True,
    "use_moe_router_bias": True,
    "need_fp32_gate": True,
    "num_nextn_predict_layers": 2,
    "tie_word_embeddings": False,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}


def build(spec: ModelSpec, directory: Path) -> None:
    """Write config, tokenizer and seeded weights for ``spec`` (config: :data:`CONFIG`)."""
    import torch

    cfg = spec.config
    h, n_layers, n_mtp = (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["num_nextn_predict_layers"],
    )
    generator = torch.Generator().manual_seed(spec.seed)

    def matrix(rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) * (scale / cols**0.5)

    def gemma_norm(size: int) -> torch.Tensor:  # GemmaRMSNorm scales by 1 + weight
        return 0.1 * torch.randn(size, generator=generator)

    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(cfg["vocab_size"], h, generator=generator),
    }
    branch = spec.branch_scale
    for i in range(n_layers):
        p = f"model.layers.{i}."
        tensors.update(_attention(p, matrix, gemma_norm, h, branch))
        if str(i) in cfg["moe_layers_enum"].split(","):
            e, inter = cfg["moe_num_experts"], cfg["moe_intermediate_size"]
            tensors[p + "moe.gate.weight"] = matrix(e, h)
            tensors[p + "moe.router_bias"] = 0.1 * torch.randn(e, generator=generator)
            tensors[p + "moe.gate_proj.weight"] = torch.stack([matrix(inter, h) for _ in range(e)])
            tensors[p + "moe.up_proj.weight"] = torch.stack([matrix(inter, h) for _ in range(e)])
            tensors[p + "moe.down_proj.weight"] = torch.stack(
                [matrix(h, inter, branch) for _ in range(e)]
            )
            tensors.update(_mlp(p + "share_expert.", matrix, h, cfg["share_expert_dim"], branch))
        else:
            tensors.update(_mlp(p + "mlp.", matrix, h, cfg["intermediate_size"], branch))
    tensors["model.norm.weight"] = gemma_norm(h)
    tensors["lm_head.weight"] = matrix(cfg["vocab_size"], h, 4.0)
    for i in range(n_layers, n_layers + n_mtp):
        tensors.update(_guessing_mtp_layer(f"model.layers.{i}.", tensors, generator, h))
    save_checkpoint(directory, tensors, cfg)


def _attention(prefix: str, matrix: Any, gemma_norm: Any, h: int, branch: float) -> dict:
    a = prefix + "self_attn."
    return {
        a + "q_proj.weight": matrix(HEADS * HEAD_DIM, h),
        a + "k_proj.weight": matrix(KV_HEADS * HEAD_DIM, h),
        a + "v_proj.weight": matrix(KV_HEADS * HEAD_DIM, h),
        a + "o_proj.weight": matrix(h, HEADS * HEAD_DIM, branch),
        a + "q_norm.weight": gemma_norm(HEAD_DIM),
        a + "k_norm.weight": gemma_norm(HEAD_DIM),
        prefix + "input_layernorm.weight": gemma_norm(h),
        prefix + "post_attention_layernorm.weight": gemma_norm(h),
    }


def _mlp(prefix: str, matrix: Any, h: int, inter: int, branch: float) -> dict:
    return {
        prefix + "gate_proj.weight": matrix(inter, h),
        prefix + "up_proj.weight": matrix(inter, h),
        prefix + "down_proj.weight": matrix(h, inter, branch),
    }


def _guessing_mtp_layer(prefix: str, target: dict, generator: Any, h: int) -> dict:
    """One MTP layer that guesses the token after its input token (see the module docstring)."""
    import torch

    assert h == KV_HEADS * HEAD_DIM, "the pass-through values need kv_heads * head_dim == hidden"
    keys = torch.randn(KV_HEADS * HEAD_DIM, h, generator=generator) / h**0.5
    group = HEADS // KV_HEADS
    queries = torch.cat(
        [keys[(i // group) * HEAD_DIM : (i // group + 1) * HEAD_DIM] for i in range(HEADS)]
    )
    out = torch.zeros(h, HEADS * HEAD_DIM)
    for i in range(HEADS):  # average the query heads of one kv head back onto its channels
        j = i // group
        out[j * HEAD_DIM : (j + 1) * HEAD_DIM, i * HEAD_DIM : (i + 1) * HEAD_DIM] = (
            torch.eye(HEAD_DIM) / group
        )
    a = prefix + "self_attn."
    return {
        prefix + "enorm.weight": torch.zeros(h),
        prefix + "hnorm.weight": torch.zeros(h),
        # A small share of the normed embedding (none of the hidden state): the attention's
        # pass-through, not the residual, decides the guess.
        prefix + "eh_proj.weight": torch.cat([0.1 * torch.eye(h), torch.zeros(h, h)], 1),
        prefix + "shared_head.norm.weight": target["model.norm.weight"].clone(),
        prefix + "shared_head.output.weight": target["lm_head.weight"].clone(),
        a + "q_proj.weight": queries,
        a + "k_proj.weight": keys,
        a + "v_proj.weight": torch.eye(h),
        a + "o_proj.weight": out,
        # q_norm's scale 1 + 1: each position's own key scores 2 * head_dim / sqrt(head_dim).
        a + "q_norm.weight": torch.ones(HEAD_DIM),
        a + "k_norm.weight": torch.zeros(HEAD_DIM),
        prefix + "input_layernorm.weight": torch.zeros(h),
        prefix + "post_attention_layernorm.weight": torch.zeros(h),
        prefix + "mlp.gate_proj.weight": torch.zeros(INTER, h),
        prefix + "mlp.up_proj.weight": torch.zeros(INTER, h),
        prefix + "mlp.down_proj.weight": torch.zeros(h, INTER),
    }


STEP3P5 = ModelSpec("step3p5", build, CONFIG, branch_scale=0.5)
