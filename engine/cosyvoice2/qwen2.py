"""The Qwen2 decoder-only transformer, with a preallocated KV cache (gpt-fast style).

Module names follow Hugging Face's ``Qwen2ForCausalLM`` so that the released
``llm.pt`` loads with strict key matching. The cache is not a buffer of the model:
many utterances share one model, so each owns a :class:`KVCache`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model_config import QwenConfig


class KVCache:
    """Keys and values of one utterance (batch of 1), preallocated to ``max_len``."""

    def __init__(
        self, cfg: QwenConfig, max_len: int, device: torch.device | str, dtype: torch.dtype
    ) -> None:
        shape = (cfg.num_hidden_layers, 1, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0  # positions written so far

    def write(self, layer: int, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        end = pos + k.shape[2]
        if end > self.max_len:
            raise IndexError(f"KV cache of {self.max_len} positions is full")
        self.k[layer, :, :, pos:end] = k
        self.v[layer, :, :, pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 as Hugging Face does; cast back before the gain.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(cfg: QwenConfig, length: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """cos/sin for positions [0, length), half-rotation layout (HF ``rotate_half``)."""
    inv_freq = 1.0 / (
        cfg.rope_theta
        ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device=device).float() / cfg.head_dim)
    )
    t = torch.arange(length, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Qwen2Attention(nn.Module):
    def __init__(self, cfg: QwenConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=True)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=True)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, layer: int, pos: int
    ) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = cache.write(layer, pos, k, v)
        # Grouped-query attention: each KV head serves n_heads / n_kv query heads.
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        mask = None
        if t > 1:  # prefill: causal, shifted by what the cache already holds
            qi = torch.arange(pos, pos + t, device=x.device).unsqueeze(1)
            kj = torch.arange(pos + t, device=x.device).unsqueeze(0)
            mask = kj <= qi
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Qwen2MLP(nn.Module):
    def __init__(self, cfg: QwenConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, cfg: QwenConfig) -> None:
        super().__init__()
        self.self_attn = Qwen2Attention(cfg)
        self.mlp = Qwen2MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, layer: int, pos: int
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, cfg: QwenConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen2ForCausalLM(nn.Module):
    """Backbone + (tied) text head. Only the backbone runs: speech tokens have their own head."""

    def __init__(self, cfg: QwenConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Qwen2Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            # Tied: the checkpoint carries both keys, one tensor; costs no memory here.
            self.lm_head.weight = self.model.embed_tokens.weight
        self._rope: tuple[Tensor, Tensor] | None = None

    def rope(self, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if self._rope is None or self._rope[0].shape[0] < length or self._rope[0].device != device:
            # Grow in steps so a long utterance does not rebuild the table every token.
            self._rope = rope_tables(self.cfg, max(2 * length, 2048), device)
        return self._rope

    def forward(self, embeds: Tensor, cache: KVCache) -> Tensor:
        """Run ``embeds`` (B=1, T, D) at the cache's next positions; return the final hidden states."""
        pos, t = cache.length, embeds.shape[1]
        cos, sin = self.rope(pos + t, embeds.device)
        cos, sin = cos[pos : pos + t].to(embeds.dtype), sin[pos : pos + t].to(embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, cache, i, pos)
        cache.length = pos + t
        return self.model.norm(x)
