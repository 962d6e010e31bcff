"""The whole-model oracle of the engine cases: transformers' own greedy generation of a case's
requests, which shares no code with vLLM, vllm-ascend or the simulator's references (read by
``tests/test_engine.py`` for Qwen3.5 and ``scripts/eager-oracle.py`` for the optional cases)."""

from __future__ import annotations

import random
from typing import Any

from .cases import Case


def greedy_tokens(model_class: Any, directory: Any, case: Case) -> list[list[int]]:
    """Each request of ``case``'s first batch, generated greedily by ``model_class`` (a
    transformers class) loaded in float32 from ``directory``: exactly ``max_tokens`` tokens,
    no end-of-sequence stop."""
    import torch

    from .workload import VllmWorkload

    model = model_class.from_pretrained(directory, dtype=torch.float32).eval()
    batch = VllmWorkload(case, graph=False).next_batch(random.Random(case.seed))
    tokens = []
    for request in batch:
        prompt = torch.tensor([request.prompt])
        n = request.max_tokens
        out = model.generate(
            prompt,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        tokens.append(out[0, prompt.shape[1] :].tolist())
    return tokens
