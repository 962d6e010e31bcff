"""Tiny models built at test time: configs with seeded random weights, written with
``save_pretrained`` into a cache directory keyed by a hash of the recipe. Nothing is downloaded.

Each model is small enough to run through the real vLLM engine on two CPU cores in seconds, and
has the attention layout of the family it stands for (GQA heads, sliding-window layers, a 512-wide
global head, KV sharing, an EAGLE3 draft). Weights are drawn so that greedy decoding is not
degenerate: unit-scale embeddings, ``1/sqrt(fan_in)`` matrices, norm scales near 1, and an output
head scaled so that logits spread over several units (a stale attention result moves the argmax;
float rounding does not).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .checkpoints import HIDDEN, VOCAB, ModelSpec, save_tokenizer
from .deepseek_model import DEEPSEEK_V3
from .deepseek_v2_model import (
    DEEPSEEK_V2,
    DEEPSEEK_V2_LITE,
    DEEPSEEK_V2_LITE_YARN,
    GLM47_FLASH,
    GLM47_FLASH_MTP,
    KIMI_K2,
    MOONLIGHT,
)
from .qwen3_next_model import QWEN3_NEXT, QWEN3_NEXT_TWO_GROUPS, QWEN3_NEXT_WIDE
from .qwen35_model import QWEN35, QWEN35_MOE, QWEN35_TWO_GROUPS
from .step3p5_model import STEP3P5


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/torch-npu-sim/models`` (or ``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torch-npu-sim" / "models"


def materialize(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The directory of model ``name`` under ``root``, built on first use (atomically)."""
    return materialize_spec(MODELS[name], root)


def materialize_spec(spec: ModelSpec, root: str | os.PathLike[str] | None = None) -> Path:
    """The directory of the model ``spec`` describes under ``root``, built on first use."""
    name = spec.name
    base = Path(root) if root is not None else cache_root()
    target = base / f"{name}-{spec.key()}"
    if (target / "config.json").is_file():
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
    try:
        spec.build(spec, staging)
        try:
            staging.rename(target)
        except OSError:  # another process won the race: keep its copy
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# --------------------------------------------------------------------------------------------
# Weights


def seeded_weights(
    model: Any,
    seed: int,
    logit_scale: float = 4.0,
    embed_std: float = 1.0,
    branch_scale: float = 1.0,
) -> None:
    """Redraw every parameter of ``model`` (in place) from ``seed``, keeping its structure.

    Matrices ``N(0, 1/fan_in)``; embeddings ``N(0, embed_std^2)``; vectors initialised to ones
    (norm scales) become ``1 + N(0, 0.1^2)``, other vectors ``N(0, 0.02^2)``; the output head is
    scaled by ``logit_scale`` so logits are well separated.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if param.dim() >= 2:
                if "embed" in name:
                    value = noise * embed_std
                else:
                    value = noise / param.shape[-1] ** 0.5
                    if name.endswith("lm_head.weight"):
                        value = value * logit_scale
                    elif name.endswith(("o_proj.weight", "down_proj.weight")):
                        value = value * branch_scale
            elif bool((param == 1).all()):
                value = 1 + 0.1 * noise
            else:
                value = 0.02 * noise
            param.copy_(value.to(param.dtype))


def _save(model: Any, directory: Path) -> None:
    model.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(directory)


def _build_hf(spec: ModelSpec, directory: Path) -> None:
    """Any transformers architecture: config from ``spec.config`` (``config_class`` + kwargs)."""
    import torch
    import transformers

    kwargs = dict(spec.config)
    config_cls = getattr(transformers, kwargs.pop("config_class"))
    model_cls = getattr(transformers, kwargs.pop("model_class"))
    config = config_cls(**kwargs)
    torch.manual_seed(spec.seed)
    model = model_cls(config).to(torch.float32)
    seeded_weights(model, spec.seed, branch_scale=spec.branch_scale)
    _save(model, directory)


def _build_eagle3(spec: ModelSpec, directory: Path) -> None:
    """An EAGLE3 draft (vLLM's ``LlamaForCausalLMEagle3``) that guesses its target well.

    The draft checkpoint layout (``midlayer.*``, ``fc``, ``norm``, ``lm_head``) is written as
    safetensors; transformers has no class for it. Random weights would accept nothing, and an
    acceptance rate of zero cannot tell a right draft graph from a wrong one. So the draft is a
    bigram guesser built from the target: its attention looks at its own position only (queries
    are scaled copies of the keys, both read from the token embedding), its values pass that
    embedding through, ``fc`` and the MLP are silent, and the target's final norm and output head
    read the result. The target, whose layers add to the embedding, agrees often but not always;
    a draft attention that misses the newest key (a stale kv length) loses that agreement.
    """
    import torch
    from safetensors.torch import load_file, save_file

    cfg = spec.config
    target = load_file(materialize(cfg["target"], directory.parent) / "model.safetensors")
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, inter, vocab = cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    assert kv * hd == h, "the pass-through values need kv_heads * head_dim == hidden"
    generator = torch.Generator().manual_seed(spec.seed)
    keys = torch.randn(kv * hd, h, generator=generator) / h**0.5  # embeds -> keys
    zeros = torch.zeros(kv * hd, h)
    group = heads // kv
    queries = torch.cat([keys[(i // group) * hd : (i // group + 1) * hd] for i in range(heads)])
    out = torch.zeros(h, heads * hd)
    for i in range(heads):  # average the query heads of one kv head back onto its channels
        j = i // group
        out[j * hd : (j + 1) * hd, i * hd : (i + 1) * hd] = torch.eye(hd) / group
    tensors = {
        "midlayer.self_attn.q_proj.weight": torch.cat(
            [2.0 * queries, torch.zeros_like(queries)], 1
        ),
        "midlayer.self_attn.k_proj.weight": torch.cat([keys, zeros], 1),
        "midlayer.self_attn.v_proj.weight": torch.cat([torch.eye(h), torch.zeros(h, h)], 1),
        "midlayer.self_attn.o_proj.weight": out,
        "midlayer.mlp.gate_proj.weight": torch.zeros(inter, h),
        "midlayer.mlp.up_proj.weight": torch.zeros(inter, h),
        "midlayer.mlp.down_proj.weight": torch.zeros(h, inter),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "fc.weight": torch.zeros(h, aux * h),
        "norm.weight": target["model.norm.weight"],
        "lm_head.weight": target["lm_head.weight"],
    }
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        directory / "model.safetensors",
        metadata={"format": "pt"},
    )
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "draft_vocab_size": vocab,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
        **{k: v for k, v in cfg.items() if k != "target"},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))


def _build_gemma4(spec: ModelSpec, directory: Path) -> None:
    """Gemma4 as its real checkpoints are: ``Gemma4ForConditionalGeneration`` (a tiny vision
    tower the engine skips with ``language_model_only``), with the KV-shared layers' ``k_proj``,
    ``v_proj`` and ``k_norm`` written too (transformers leaves them out; vLLM requires them)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    kwargs = dict(spec.config)
    text = kwargs.pop("text_config")
    config = transformers.Gemma4Config(
        text_config=text, vision_config=kwargs.pop("vision_config"), audio_config=None, **kwargs
    )
    torch.manual_seed(spec.seed)
    model = transformers.Gemma4ForConditionalGeneration(config).to(torch.float32)
    seeded_weights(model, spec.seed, embed_std=spec.embed_std)
    _save(model, directory)
    weights_file = directory / "model.safetensors"
    tensors = load_file(weights_file)
    generator = torch.Generator().manual_seed(spec.seed + 1)
    h, kv = text["hidden_size"], text["num_key_value_heads"]
    first_shared = text["num_hidden_layers"] - text["num_kv_shared_layers"]
    for i in range(first_shared, text["num_hidden_layers"]):
        full = text["layer_types"][i] == "full_attention"
        hd = text["global_head_dim"] if full else text["head_dim"]
        prefix = f"model.language_model.layers.{i}.self_attn"
        for proj in ("k_proj", "v_proj"):
            name = f"{prefix}.{proj}.weight"
            if name not in tensors:
                tensors[name] = torch.randn(kv * hd, h, generator=generator) / h**0.5
        if f"{prefix}.k_norm.weight" not in tensors:
            tensors[f"{prefix}.k_norm.weight"] = torch.ones(hd)
    save_file(tensors, weights_file, metadata={"format": "pt"})


def _write_config_only(spec: ModelSpec, directory: Path) -> None:
    """A checkpoint whose engine stops at its config (no weights are ever read)."""
    (directory / "config.json").write_text(json.dumps(spec.config, indent=1))


# --------------------------------------------------------------------------------------------
# The models

_DENSE = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # Qwen3 (FIA, GQA 4:2, head 64, q/k norms), two layers.
        ModelSpec(
            "qwen3",
            _build_hf,
            {
                "config_class": "Qwen3Config",
                "model_class": "Qwen3ForCausalLM",
                "num_hidden_layers": 2,
                **_DENSE,
            },
            # Its EAGLE3 draft guesses the next token from the current one: the layers must not
            # drown the current token, or the draft is rarely right.
            branch_scale=0.5,
        ),
        # EAGLE3 draft for "qwen3": its auxiliary hidden states are the inputs of layers 0, 1.
        ModelSpec(
            "qwen3_eagle3",
            _build_eagle3,
            {
                **_DENSE,
                "target": "qwen3",
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1]},
            },
        ),
        # Gemma4: sliding (head 64) and global (head 512, partial rotary) layers, the last layer
        # reading an earlier layer's KV cache (KV sharing), per-layer input embeddings.
        ModelSpec(
            "gemma4",
            _build_gemma4,
            {
                "text_config": {
                    "vocab_size": VOCAB,
                    "hidden_size": HIDDEN,
                    "intermediate_size": 256,
                    "num_hidden_layers": 6,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 2,
                    "head_dim": 64,
                    "global_head_dim": 512,
                    "layer_types": [
                        "sliding_attention",
                        "sliding_attention",
                        "full_attention",
                        "sliding_attention",
                        "sliding_attention",
                        "full_attention",
                    ],
                    "sliding_window": 8,
                    # Layer 5 (global) reads layer 2's KV cache. With two shared layers (4 on 3
                    # as well), eager and VLLM_COMPILE already differ at prefill: see docs.
                    "num_kv_shared_layers": 1,
                    "hidden_size_per_layer_input": 16,
                    "vocab_size_per_layer_input": VOCAB,
                    "max_position_embeddings": 8192,
                    "pad_token_id": 0,
                    "eos_token_id": 1,
                    "bos_token_id": 2,
                },
                "vision_config": {
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "num_key_value_heads": 2,
                    "head_dim": 16,
                },
            },
            # Gemma multiplies embeddings by sqrt(hidden): unit-RMS residual stream, so the layers
            # (not the tied embedding's echo of the input token) decide the next token.
            embed_std=HIDDEN**-0.5,
        ),
        # Gemma4's MTP draft as its checkpoints declare it (``gemma4_assistant``): vLLM 0.23.0
        # rewrites that model type to ``gemma4_mtp``, but only after transformers parsed it.
        ModelSpec(
            "gemma4_assistant",
            _write_config_only,
            {
                "architectures": ["Gemma4AssistantForCausalLM"],
                "model_type": "gemma4_assistant",
                "backbone_hidden_size": HIDDEN,
                "text_config": {
                    "model_type": "gemma4_text",
                    "vocab_size": VOCAB,
                    "hidden_size": HIDDEN,
                    "intermediate_size": 256,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 2,
                    "head_dim": 64,
                    "global_head_dim": 512,
                    "layer_types": ["full_attention"],
                },
            },
        ),
        # Llama with sliding-window and full layers alternating (S, F, S, F), window 8 tokens.
        ModelSpec(
            "llama_sliding",
            _build_hf,
            {
                "config_class": "LlamaConfig",
                "model_class": "LlamaForCausalLM",
                "num_hidden_layers": 4,
                "layer_types": [
                    "sliding_attention",
                    "full_attention",
                    "sliding_attention",
                    "full_attention",
                ],
                "sliding_window": 8,
                **_DENSE,
            },
        ),
        # Step3.5 with its two MTP layers (its own module: a MoE target, a multi-group draft).
        STEP3P5,
        # DeepSeek-V3 (MLA, a dense and a MoE layer) with its MTP layer (its own module).
        DEEPSEEK_V3,
        # Qwen3.5 (Gated DeltaNet + gated full attention) with its MTP layer (its own module):
        # the real 3:1 pattern, and a layout whose attention layers span two KV-cache groups.
        QWEN35,
        QWEN35_TWO_GROUPS,
        QWEN35_MOE,
        # Qwen3-Next (GDN with fused qkvz / ba projections, MoE + shared expert) with its MTP
        # layer (its own module).
        QWEN3_NEXT,
        QWEN3_NEXT_TWO_GROUPS,
        QWEN3_NEXT_WIDE,
        # --- MLA variants (their own module): DeepSeek-V2-Lite (no query LoRA, softmax greedy
        # routing) and Moonlight (no query LoRA, sigmoid routing in one group, scaling 2.446).
        DEEPSEEK_V2_LITE,
        MOONLIGHT,
        KIMI_K2,
        GLM47_FLASH,
        DEEPSEEK_V2_LITE_YARN,
        DEEPSEEK_V2,
        GLM47_FLASH_MTP,
    )
}
