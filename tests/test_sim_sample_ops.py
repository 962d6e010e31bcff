"""The sampler's reference op (``torch_npu_sim.sample_ops``) against oracles, and vllm-ascend's
NPU sampler path on the simulator.

Oracles: the operator's documented formula written out per row in float64 Python (sort, the k-th
largest value, softmax of what top-k kept, running sum from the smallest, put back), and vLLM's
own ``apply_top_k_top_p`` (the torch implementation vLLM samples with on other devices), which
the documented semantics match. The sampler itself (``AscendTopKTopPSampler``,
``random_sample``) is vllm-ascend's code, run here unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests import torch_npu_conformance as conf
from torch_npu_sim import sample_ops
from torch_npu_sim.runtime import SimulatorError


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def _oracle_row(row: list[float], p: float | None, k: int | None) -> list[float]:
    """The documented formula for one row, in float64 Python (no torch)."""
    order = sorted(range(len(row)), key=lambda i: row[i])  # ascending, stable
    values = [row[i] for i in order]
    if k is not None:
        kth = values[len(values) - k]
        values = [v if v >= kth else -math.inf for v in values]
    if p is not None:
        top = max(values)
        weights = [math.exp(v - top) if v != -math.inf else 0.0 for v in values]
        total = sum(weights)
        running = 0.0
        for j, w in enumerate(weights):
            running += w / total
            if running <= 1 - p and j < len(values) - 1:
                values[j] = -math.inf
    out = [0.0] * len(row)
    for j, i in enumerate(order):
        out[i] = values[j]
    return out


def _oracle(logits: torch.Tensor, p: torch.Tensor | None, k: torch.Tensor | None) -> torch.Tensor:
    rows = [
        _oracle_row(
            logits[b].double().tolist(),
            None if p is None else float(p[b]),
            None if k is None else int(k[b]),
        )
        for b in range(logits.shape[0])
    ]
    return torch.tensor(rows, dtype=torch.float64)


def _kept(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x)


@pytest.mark.parametrize("which", ["k", "p", "both"])
def test_top_k_top_p_equals_the_documented_formula(gen: torch.Generator, which: str) -> None:
    logits = torch.randn(6, 40, generator=gen) * 3
    k = torch.tensor([1, 2, 5, 17, 39, 40], dtype=torch.int32) if which != "p" else None
    p = torch.tensor([0.05, 0.3, 0.5, 0.8, 0.95, 1.0]) if which != "k" else None
    out = sample_ops.npu_top_k_top_p(logits, p=p, k=k)
    want = _oracle(logits, p, k)
    assert torch.equal(_kept(out), _kept(want))
    assert torch.equal(out[_kept(out)], logits[_kept(out)])  # kept values are unchanged
    assert bool(_kept(out).any(dim=-1).all())  # at least one token per row


def test_top_k_keeps_ties_with_the_kth_value() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0]])
    out = sample_ops.npu_top_k_top_p(logits, k=torch.tensor([3], dtype=torch.int32))
    assert _kept(out).tolist() == [[False, True, True, True, True]]  # 3, 3 and both 2s


def test_top_p_renormalises_what_top_k_kept() -> None:
    """p = 0.6 after top-2 of probabilities (0.5, 0.3, 0.2): top-2 renormalised is (0.625,
    0.375); the running sum from the smallest is 0.375 <= 0.4, so only the largest stays.
    Without the renormalisation 0.3 + 0.2 = 0.5 > 0.4 would keep two."""
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    out = sample_ops.npu_top_k_top_p(
        logits, p=torch.tensor([0.6]), k=torch.tensor([2], dtype=torch.int32)
    )
    assert _kept(out).tolist() == [[True, False, False]]


def test_matches_vllms_own_top_k_top_p(gen: torch.Generator) -> None:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    logits = torch.randn(8, 1024, generator=gen) * 4
    k = torch.randint(1, 1025, (8,), generator=gen, dtype=torch.int32)
    p = torch.rand(8, generator=gen) * 0.9 + 0.05
    for kk, pp in ((k, p), (k, None), (None, p)):
        ours = sample_ops.npu_top_k_top_p(logits, p=pp, k=kk)
        theirs = apply_top_k_top_p(logits.clone(), kk, pp)
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_keeps_its_dtype(gen: torch.Generator, dtype: torch.dtype) -> None:
    logits = (torch.randn(3, 16, generator=gen) * 2).to(dtype)
    out = sample_ops.npu_top_k_top_p(logits, p=torch.tensor([0.5, 0.9, 0.99], dtype=dtype))
    assert out.dtype == dtype
    want = _oracle(logits.float(), torch.tensor([0.5, 0.9, 0.99], dtype=dtype).float(), None)
    assert torch.equal(_kept(out), _kept(want))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({}, "cannot both be None"),
        ({"k": torch.tensor([2, 2], dtype=torch.int64)}, "int32"),
        ({"k": torch.tensor([0, 2], dtype=torch.int32)}, r"k must lie in \[1, 8\]"),
        ({"k": torch.tensor([9, 2], dtype=torch.int32)}, r"k must lie in \[1, 8\]"),
        ({"p": torch.tensor([0.5, 0.5], dtype=torch.float64)}, "logits' dtype"),
        ({"p": torch.tensor([0.5])}, "1-D of 2 rows"),
    ],
)
def test_documented_constraints_are_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(SimulatorError, match=message):
        sample_ops.npu_top_k_top_p(torch.zeros(2, 8), **kwargs)


def test_op_is_torch_npus_and_matches_its_registered_schema() -> None:
    import torch_npu

    assert torch_npu.npu_top_k_top_p.__wrapped__ is sample_ops.npu_top_k_top_p
    key = conf.schema_key("npu_top_k_top_p")
    assert key == "npu::npu_top_k_top_p"
    assert conf.op_problems(key, sample_ops.npu_top_k_top_p) == []


def test_vllm_ascend_sampler_filters_with_the_op_and_seeds_per_request(gen, mocker) -> None:
    """vllm-ascend's sampler on the simulated A2 device: top-k/top-p through
    ``torch_npu.npu_top_k_top_p``, then ``random_sample``'s exponential race (on its own stream)
    with each request's own generator: the same seeds give the same tokens, the oracle's."""
    from types import SimpleNamespace

    from vllm_ascend.sample import sampler

    config = SimpleNamespace(enable_reduce_sample=False, enable_async_exponential=False)
    mocker.patch.object(sampler, "get_ascend_config", return_value=config)  # no engine here

    assert sampler.apply_top_k_top_p is sampler._apply_top_k_top_p_torch_npu
    logits = torch.randn(3, 64, generator=gen) * 3
    k = torch.tensor([8, 64, 3], dtype=torch.int32)
    p = torch.tensor([0.9, 0.7, 1.0])
    filtered = sampler.apply_top_k_top_p(logits.clone(), k, p)
    kept = _kept(_oracle(logits, p, k))  # the documented formula, not the op the sampler calls
    assert torch.equal(_kept(filtered), kept) and torch.equal(filtered[kept], logits[kept])

    def draw(seed: int) -> torch.Tensor:
        probs = filtered.softmax(dim=-1, dtype=torch.float32)
        generators = {i: torch.Generator().manual_seed(seed + i) for i in range(3)}
        return sampler.random_sample(probs, generators)

    first, again = draw(7), draw(7)
    assert torch.equal(first, again)
    assert bool(_kept(filtered)[torch.arange(3), first].all())  # only kept tokens are drawn
    # The oracle of the race: argmax(probs / q), q ~ Exp(1) from each request's generator.
    probs = filtered.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    for i in range(3):
        q[i].exponential_(generator=torch.Generator().manual_seed(7 + i))
    assert torch.equal(first, probs.div(q).argmax(dim=-1))
