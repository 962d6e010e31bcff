"""The toy decoder the harness engines run: seeded weights around the REAL attention layers.

Each attention layer's ``forward`` is vllm-ascend's ``AscendAttentionBackendImpl.forward`` on a
real paged KV cache, and each MLA layer's decode is ``AscendMLAImpl._forward_decode`` on a paged
latent cache; everything else (embedding, projections, norms) is a few matmuls. Metadata
and KV caches are looked up per layer name exactly as vLLM's ``unified_attention_with_output``
does, so capture and replay see what the runner's model sees.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from torch_npu_sim.harness.spec import LayerSpec, Scenario

D_MODEL = 128
VOCAB = 97
#: MLA layers: the key's rope part and each head's value width (the latent is ``head_size``).
MLA_ROPE = 16
MLA_V = 32


class LayerShim:
    """What vLLM's ``Attention`` module is to the impl and the runner (no vLLM module): the
    ``layer`` argument the impl reads (its name, unit KV scales) and, registered by name in the
    config's ``static_forward_context`` (``register``), the holder of its impl."""

    def __init__(self, name: str) -> None:
        self.layer_name = name
        self._k_scale_float = 1.0
        self._v_scale_float = 1.0
        self.impl: Any = None


class ToyLayer:
    """Weights of one layer, its real attention impl and its KV cache (shared under KV sharing)."""

    def __init__(self, spec: LayerSpec, gen: torch.Generator) -> None:
        self.spec = spec
        self.shim = LayerShim(spec.name)
        self.impl: Any = None
        self.kv_cache: torch.Tensor | None = None

        def w(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, generator=gen) / rows**0.5

        if spec.kind == "linear":
            self.w1 = w(D_MODEL, 2 * D_MODEL)
            self.w2 = w(2 * D_MODEL, D_MODEL)
        elif spec.kind == "mla":
            # the query already absorbed into the latent (as AscendMLAImpl's decode sees it), its
            # rope part, the latent and key rope written to the cache, the value up-projection
            n, latent = spec.num_heads, spec.head_size
            self.wq = w(D_MODEL, n * latent)
            self.wq_pe = w(D_MODEL, n * MLA_ROPE)
            self.wkv = w(D_MODEL, latent + MLA_ROPE)
            self.w_uv = torch.randn(n, latent, MLA_V, generator=gen) / latent**0.5
            self.wo = w(n * MLA_V, D_MODEL)
            self.sinks = None
        else:
            q_dim = spec.num_heads * spec.head_size
            kv_dim = spec.num_kv_heads * spec.head_size
            self.wq = w(D_MODEL, q_dim)
            self.wk = w(D_MODEL, kv_dim)
            self.wv = w(D_MODEL, kv_dim)
            self.wo = w(q_dim, D_MODEL)
            self.sinks = torch.randn(spec.num_heads, generator=gen) if spec.sinks else None

    @property
    def owns_kv(self) -> bool:
        """Whether the layer writes its own KV cache (KV-sharing layers skip the write, as vLLM)."""
        return self.kv_cache is not None and self.spec.kv_sharing_target is None

    def attend(self, h: torch.Tensor, metadata: Any) -> torch.Tensor:
        """Project, run the real impl on this layer's metadata and cache, project back."""
        spec = self.spec
        t = h.shape[0]
        if spec.kind == "mla":
            return self._attend_mla(h, metadata)
        q = (h @ self.wq).view(t, spec.num_heads, spec.head_size)
        k = v = None
        if spec.kv_sharing_target is None:
            k = (h @ self.wk).view(t, spec.num_kv_heads, spec.head_size)
            v = (h @ self.wv).view(t, spec.num_kv_heads, spec.head_size)
        out = torch.empty(t, spec.num_heads, spec.head_size, dtype=h.dtype)
        attn_md = metadata[spec.name] if metadata is not None else None
        self.impl.forward(self.shim, q, k, v, self.kv_cache, attn_md, out)
        return out.view(t, -1) @ self.wo

    def _attend_mla(self, h: torch.Tensor, metadata: Any) -> torch.Tensor:
        """MLA decode as ``AscendMLAImpl.forward`` runs it past its projections: this step's
        latent and key rope written by ``npu_kv_rmsnorm_rope_cache`` (``exec_kv_decode``), then
        the real ``_forward_decode`` (FIA v2 with the rope split; captured as a task group)."""
        import torch_npu

        spec = self.spec
        t, n, latent = h.shape[0], spec.num_heads, spec.head_size
        md = metadata[spec.name]
        nope_cache, pe_cache = self.kv_cache
        kv = (h @ self.wkv).view(t, 1, 1, latent + MLA_ROPE)
        cos = torch.ones(t, 1, 1, MLA_ROPE, dtype=h.dtype)  # a toy: no rotation
        torch_npu.npu_kv_rmsnorm_rope_cache(
            kv,
            self.gamma,
            cos,
            torch.zeros_like(cos),
            md.slot_mapping[:t],
            pe_cache,
            nope_cache,
            epsilon=1e-6,
            cache_mode="PA",
        )
        q_nope = (h @ self.wq).view(t, n, latent)
        q_pe = (h @ self.wq_pe).view(t, n, MLA_ROPE)
        out = self.impl._forward_decode(q_nope, q_pe, nope_cache, pe_cache, nope_cache.shape[1], md)
        return out @ self.wo


def build_layers(
    scenario: Scenario, gen: torch.Generator, num_blocks: int, block_size: int
) -> list[ToyLayer]:
    """Every layer's weights, then its real impl and KV cache (random history, never prefilled)."""
    from vllm.v1.attention.backend import AttentionType
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackendImpl

    layers = [ToyLayer(spec, gen) for spec in scenario.layers]
    by_name = {layer.spec.name: layer for layer in layers}
    for layer in layers:
        spec = layer.spec
        if spec.kind == "linear":
            continue
        if spec.kind == "mla":
            _build_mla(layer, gen, num_blocks, block_size)
            continue
        layer.impl = layer.shim.impl = AscendAttentionBackendImpl(
            num_heads=spec.num_heads,
            head_size=spec.head_size,
            scale=spec.head_size**-0.5,
            num_kv_heads=spec.num_kv_heads,
            alibi_slopes=None,
            sliding_window=spec.sliding_window,
            kv_cache_dtype="auto",
            logits_soft_cap=None,
            attn_type=AttentionType.DECODER,
            kv_sharing_target_layer_name=spec.kv_sharing_target,
            sinks=layer.sinks,
        )
        if spec.kv_sharing_target is not None:
            continue
        layer.kv_cache = torch.randn(
            2, num_blocks, block_size, spec.num_kv_heads, spec.head_size, generator=gen
        )
    for layer in layers:
        target = layer.spec.kv_sharing_target
        if target is not None:
            layer.kv_cache = by_name[target].kv_cache
    return layers


def _build_mla(layer: ToyLayer, gen: torch.Generator, num_blocks: int, block_size: int) -> None:
    """A real ``AscendMLAImpl`` (its projections are the toy's, applied outside it), its value
    up-projection as ``process_weights_after_loading`` leaves it, and the paged latent / key
    rope caches (``(blocks, block_size, 1, D)``, random history)."""
    from vllm.v1.attention.backend import AttentionType
    from vllm_ascend.attention.mla_v1 import AscendMLAImpl

    spec = layer.spec
    if spec.num_kv_heads != 1:
        raise ValueError(f"{spec.name}: an MLA layer has one KV head (the latent)")
    nope = spec.head_size // 2  # what the scale is taken over: the query head width
    impl = AscendMLAImpl(
        num_heads=spec.num_heads,
        head_size=spec.head_size + MLA_ROPE,
        scale=(nope + MLA_ROPE) ** -0.5,
        num_kv_heads=1,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type=AttentionType.DECODER,
        kv_sharing_target_layer_name=None,
        q_lora_rank=None,
        kv_lora_rank=spec.head_size,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=MLA_ROPE,
        qk_head_dim=nope + MLA_ROPE,
        v_head_dim=MLA_V,
        rotary_emb=None,
        q_proj=None,
        kv_b_proj=None,
        o_proj=None,
        layer_name=spec.name,
    )
    impl.W_UV = layer.w_uv
    layer.impl = layer.shim.impl = impl
    layer.gamma = torch.ones(spec.head_size)
    layer.kv_cache = (
        torch.randn(num_blocks, block_size, 1, spec.head_size, generator=gen),
        torch.randn(num_blocks, block_size, 1, MLA_ROPE, generator=gen),
    )


def register(layers: list[ToyLayer], vllm_config: Any) -> None:
    """Register each attention layer by name, as vLLM's ``Attention.__init__`` does: the forward
    context lists them (``no_compile_layers``), which is how the runner finds a layer's impl."""
    static = vllm_config.compilation_config.static_forward_context
    for layer in layers:
        if layer.impl is not None:
            if layer.spec.name in static:
                raise ValueError(
                    f"duplicate layer name in static_forward_context: {layer.spec.name}"
                )
            static[layer.spec.name] = layer.shim


def random_ids(rng: random.Random, n: int) -> torch.Tensor:
    """``n`` token ids drawn from ``rng`` (the batches' inputs)."""
    return torch.tensor([rng.randrange(VOCAB) for _ in range(n)], dtype=torch.int64)


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class ToyDecoder:
    """The target model: embeds, runs every layer, reads per-layer metadata from the context."""

    def __init__(self, layers: list[ToyLayer], gen: torch.Generator) -> None:
        self.layers = layers
        self.embed = torch.randn(VOCAB, D_MODEL, generator=gen)
        self.freqs = torch.linspace(0.01, 1.0, D_MODEL)

    def embed_tokens(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.embedding(input_ids, self.embed)
        return x + 0.1 * torch.sin(positions.unsqueeze(-1).to(x.dtype) * self.freqs)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        x = self.embed_tokens(input_ids, positions)
        for layer in self.layers:
            h = rms(x)
            if layer.spec.kind == "linear":
                x = x + torch.tanh(h @ layer.w1) @ layer.w2
            else:
                x = x + layer.attend(h, metadata)
        return rms(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied-embedding logits (what greedy tokens are the argmax of)."""
        return hidden @ self.embed.T
