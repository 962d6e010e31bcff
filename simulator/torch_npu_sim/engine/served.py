"""The simulator's models and settings for ``ascend-graph-patch ab --serve`` (no ``--model``).

A served A/B compares what the client received: text. The tiny models' byte-level tokenizer
cannot show most of what they generate (1024 logits, 257 tokens) and byte tokens do not
round-trip through UTF-8, so two arms could send the same text for different tokens. The served
model is the engine tests' dense Qwen3 (same config, same weights) with a word-level tokenizer
over its whole vocabulary and no special tokens: token ``i`` is the word ``w<i>``, text and tokens
map one to one, and the first token that differs is named exactly. The engine settings are the
engine cases' (``cases.engine_kwargs``) as ``vllm serve`` arguments; the load is shaped so that
most engine steps are pure decode and replay the FULL graphs: equal prompt and output lengths,
every request sent at once, as many at a time as the engine batches.

``ab --serve --sim-model NAME`` picks another of the engine tests' models, served the same way
(:data:`SERVED`): ``deepseek-v3`` (MLA, a dense and a MoE layer: what vLLM runs as one
data-parallel engine with dummy batches, where a dense model's DP ranks are independent engines),
``deepseek-v3+mtp`` (the same with its MTP layer as the draft, k = 1), ``qwen3.5-moe+mtp``
(the hybrid MoE with its MTP layer, k = 1), ``qwen3-next`` and ``qwen3-next+mtp`` (Qwen3-Next,
without and with its MTP layer, k = 1).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .cases import ASCEND_COMPILATION
from .models import MODELS, ModelSpec, materialize, materialize_spec

#: The engine tests' Qwen3, served.
TARGET = "qwen3"
NAME = "qwen3_served"
MAX_NUM_SEQS = 4
#: The default of ``--sim-model``.
DEFAULT = "qwen3"


def _save_word_tokenizer(directory: Path, vocab_size: int) -> None:
    """Token ``i`` is the word ``w<i>`` (whitespace separated); nothing is special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"\u2581w{i}": i for i in range(vocab_size)}  # Metaspace marks a word's start
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="\u2581w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)


def _build(spec: ModelSpec, directory: Path) -> None:
    """The target's config and weights (hard-linked where possible), a word-level tokenizer."""
    target = materialize(spec.config["target"], directory.parent)
    for name in ("config.json", "model.safetensors"):
        try:
            os.link(target / name, directory / name)
        except OSError:
            shutil.copy2(target / name, directory / name)
    config = json.loads((target / "config.json").read_text())
    # a multimodal checkpoint (Qwen3.5) keeps the vocabulary in its text config
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    _save_word_tokenizer(directory, int(vocab_size))


def _spec(target: str) -> ModelSpec:
    """The served copy of engine model ``target``, keyed by the target's recipe too: a changed
    model rebuilds its served copy."""
    name = NAME if target == TARGET else f"{target}_served"
    recipe = {"target": target, "target_key": MODELS[target].key(), "tokenizer": "words v2"}
    return ModelSpec(name, _build, recipe)


SPEC = _spec(TARGET)
#: ``--sim-model`` names: (engine model, speculative method and tokens, capture sizes).
SERVED: dict[str, tuple[str, dict[str, Any] | None, list[int]]] = {
    "qwen3": (TARGET, None, [1, 2, MAX_NUM_SEQS]),
    "deepseek-v3": ("deepseek_v3", None, [1, 2, MAX_NUM_SEQS]),
    # The MTP layer is in the target's checkpoint (``num_nextn_predict_layers``), as released.
    "deepseek-v3+mtp": ("deepseek_v3", {"method": "mtp", "num_speculative_tokens": 1}, [2, 4, 8]),
    # Qwen3.5-MoE (GDN + gated attention, 3:1, routed and shared experts) with its MTP layer: the
    # hybrid MoE users run at DP (the GDN state of an idle rank's dummy batches).
    "qwen3.5-moe+mtp": (
        "qwen3_5_moe",
        {"method": "mtp", "num_speculative_tokens": 1},
        [2, 4, 8],
    ),
    # Qwen3-Next (GDN with fused qkvz / ba projections, MoE + shared expert, 3:1), alone and with
    # its MTP layer (``qwen3_next_model``).
    "qwen3-next": ("qwen3_next", None, [1, 2, MAX_NUM_SEQS]),
    "qwen3-next+mtp": ("qwen3_next", {"method": "mtp", "num_speculative_tokens": 1}, [2, 4, 8]),
}
#: Engine arguments a served model needs beyond the common ones: Qwen3.5's text path only (its
#: tiny vision tower is skipped). vLLM's own token budget, not the engine cases' 20: with 20, at
#: DP=2 with both ranks busy, every graph arm's outputs differed from eager's, some from the first
#: token, which the eager prefill produces (docs/engine.md, the Qwen3.5-MoE DP rows: most likely
#: the release's fold of k + 1-token prompt chunks, whose outcome depends on how requests fall into
#: steps; not proven). With vLLM's budget no prompt is chunked and every arm equals eager.
EXTRA_ARGS: dict[str, list[str]] = {
    "qwen3.5-moe+mtp": ["--language-model-only"],
}


def engine_args(name: str = DEFAULT, model_dir: str | None = None) -> list[str]:
    """``vllm serve`` arguments of the engine cases' graph arm (``cases.engine_kwargs``) for the
    served model ``name`` (``model_dir``: its directory, the draft's with a speculative one)."""
    _, speculative, sizes = SERVED[name]
    compilation = {
        "mode": 3,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": sizes,
    }
    extra: list[str] = []
    if speculative is not None:
        extra = ["--speculative-config", json.dumps({**speculative, "model": model_dir})]
    return [
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--no-enable-prefix-caching",
        "--no-async-scheduling",  # one thread drives the simulated device
        "--kv-cache-memory-bytes",
        str(64 << 20),
        "--compilation-config",
        json.dumps(compilation),
        "--additional-config",
        json.dumps({"ascend_compilation_config": ASCEND_COMPILATION}),
        *extra,
        *EXTRA_ARGS.get(name, []),
    ]


def defaults(name: str = DEFAULT, root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What ``ab --serve`` runs on the simulator for ``--sim-model NAME`` (plain data)."""
    if name not in SERVED:
        raise KeyError(f"unknown --sim-model {name!r}; known: {', '.join(SERVED)}")
    model = str(materialize_spec(_spec(SERVED[name][0]), root))
    return {
        "model": model,
        "engine_args": engine_args(name, model),
        "load": {
            "num_prompts": 2 * MAX_NUM_SEQS,
            "input_len": 12,
            "output_len": 16,
            "max_concurrency": MAX_NUM_SEQS,
        },
    }
