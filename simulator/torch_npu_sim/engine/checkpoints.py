"""What every tiny model of the engine tests shares: its recipe (:class:`ModelSpec`), the common
sizes, and the offline tokenizer written beside its weights.

``models`` lists the models and builds them; each family with a checkpoint layout of its own has a
module of its own (``step3p5_model``, ``deepseek_model``) that writes it. Both sides import this
module, so the catalogue can import the families without a circle.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Bump when the way weights are drawn changes: cached models are rebuilt.
RECIPE_VERSION = 1
VOCAB = 1024
HIDDEN = 128


@dataclass(frozen=True)
class ModelSpec:
    """A tiny model: how to build it, from what config."""

    name: str
    #: Writes the model (config, weights) into an empty directory.
    build: Callable[[ModelSpec, Path], None]
    config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    #: Standard deviation of the token embeddings (Gemma scales them up by sqrt(hidden) itself).
    embed_std: float = 1.0
    #: Scale of what each attention / MLP block adds to the residual stream (``o_proj``,
    #: ``down_proj``): below 1, the current token weighs more in the next token's choice.
    branch_scale: float = 1.0

    def key(self) -> str:
        recipe = json.dumps(
            {
                "v": RECIPE_VERSION,
                "name": self.name,
                "config": self.config,
                "seed": self.seed,
                "embed_std": self.embed_std,
                "branch_scale": self.branch_scale,
            },
            sort_keys=True,
        )
        return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def save_tokenizer(directory: Path) -> None:
    """A byte-level tokenizer (256 byte tokens, no merges): text prompts work offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    vocab["<eos>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")
    fast.save_pretrained(directory)


def save_checkpoint(directory: Path, tensors: dict[str, Any], config: dict[str, Any]) -> None:
    """A checkpoint written by hand (the families transformers does not build here): the tensors
    in float32 as ``model.safetensors``, ``config.json`` and the byte-level tokenizer."""
    from safetensors.torch import save_file

    save_file(
        {k: v.float().contiguous() for k, v in tensors.items()},
        directory / "model.safetensors",
        metadata={"format": "pt"},
    )
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    save_tokenizer(directory)


__all__ = [
    "HIDDEN",
    "RECIPE_VERSION",
    "VOCAB",
    "ModelSpec",
    "save_checkpoint",
    "save_tokenizer",
]
