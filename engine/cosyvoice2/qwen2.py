"""The Qwen2 decoder-only transformer, with a preallocated KV cache (gpt-fast style).

Module names follow Hugging Face's ``Qwen2ForCausalLM`` so that the released
``llm.pt`` loads with strict key matching. The cache is not a buffer of the model:
many utterances share one model, so each owns a :class:`KVCache`, or a slot of a
:class:`SlotPool` when the engine decodes many utterances in one batched step.
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

    def positions(self, t: int, device: torch.device) -> Tensor:
        """(1, t) positions of the next ``t`` inputs (for RoPE)."""
        return torch.arange(self.length, self.length + t, device=device).unsqueeze(0)

    def end(self, t: int) -> int:
        return self.length + t

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Store ``k``/``v`` (1, kv, t, hd) at the next positions; return all keys, values
        and the attention mask of the new queries (None: attend to everything)."""
        pos, t = self.length, k.shape[2]
        end = pos + t
        if end > self.max_len:
            raise IndexError(f"KV cache of {self.max_len} positions is full")
        self.k[layer, :, :, pos:end] = k
        self.v[layer, :, :, pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end], causal_mask(pos, t, k.device)

    def advance(self, t: int) -> None:
        self.length += t


class SlotPool:
    """Keys and values of many sequences in one preallocated pool,
    ``[layers, slots, kv_heads, max_len, head_dim]``: each sequence owns one slot and
    its own length, so one decode step can advance all of them together.

    The pool grows (more slots, longer slots) by reallocation, only between steps and
    only to what an admitted sequence needs; a released slot is reused by the next one.
    """

    def __init__(self, cfg: QwenConfig, device: torch.device | str, dtype: torch.dtype) -> None:
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.k = self.v = self._empty(0, 0)
        self.used: set[int] = set()

    def _empty(self, slots: int, max_len: int) -> Tensor:
        c = self.cfg
        shape = (c.num_hidden_layers, slots, c.num_key_value_heads, max_len, c.head_dim)
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def acquire(self, length: int) -> int:
        """A free slot that holds ``length`` positions (growing the pool if need be)."""
        slot = next((i for i in range(self.slots) if i not in self.used), self.slots)
        slots, max_len = max(self.slots, slot + 1), max(self.max_len, length)
        if (slots, max_len) != (self.slots, self.max_len):
            # Round up, so that newcomers one by one do not reallocate each time.
            if slots > self.slots:
                slots = max(slots, 2 * self.slots)
            max_len = -(-max_len // 256) * 256
            k, v = self._empty(slots, max_len), self._empty(slots, max_len)
            k[:, : self.slots, :, : self.max_len] = self.k
            v[:, : self.slots, :, : self.max_len] = self.v
            self.k, self.v = k, v
        self.used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        self.used.discard(slot)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def batch(self, slots: list[int], lengths: list[int]) -> SlotBatch:
        return SlotBatch(self, slots, lengths)


def kv_bytes_per_token(cfg: QwenConfig, dtype: torch.dtype) -> int:
    """One sequence's KV cache per position: layers x KV heads x head_dim x (k, v)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * itemsize


class SlotBatch:
    """Some slots of a :class:`SlotPool` seen as one batch for one forward call: each
    sequence writes at its own length, and attends to its own keys only. Lengths are
    not advanced here: the caller commits them once the whole step has succeeded, so a
    failed step leaves every sequence as it was (the positions it wrote are unused)."""

    def __init__(self, pool: SlotPool, slots: list[int], lengths: list[int]) -> None:
        self.pool, self.slots, self.lengths = pool, slots, lengths
        dev = pool.device
        self.slot_t = torch.tensor(slots, device=dev)
        self.pos_t = torch.tensor(lengths, device=dev)
        first = slots[0]
        self.contiguous = slots == list(range(first, first + len(slots)))

    def positions(self, t: int, device: torch.device) -> Tensor:
        return self.pos_t.unsqueeze(1) + torch.arange(t, device=device).unsqueeze(0)

    def end(self, t: int) -> int:
        return max(self.lengths) + t

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        t, n = k.shape[2], self.end(k.shape[2])
        if n > self.pool.max_len:
            raise IndexError(f"KV slot of {self.pool.max_len} positions is full")
        kl, vl = self.pool.k[layer], self.pool.v[layer]
        if t == 1:
            kl[self.slot_t, :, self.pos_t] = k[:, :, 0]
            vl[self.slot_t, :, self.pos_t] = v[:, :, 0]
        else:
            for b, (slot, pos) in enumerate(zip(self.slots, self.lengths)):
                kl[slot, :, pos : pos + t] = k[b]
                vl[slot, :, pos : pos + t] = v[b]
        if self.contiguous:  # a view: no copy
            s = self.slots[0]
            keys, values = kl[s : s + len(self.slots), :, :n], vl[s : s + len(self.slots), :, :n]
        else:
            keys, values = kl[:, :, :n].index_select(0, self.slot_t), vl[:, :, :n].index_select(0, self.slot_t)
        if len(self.slots) == 1:
            return keys, values, causal_mask(self.lengths[0], t, k.device)
        if t == 1 and min(self.lengths) == max(self.lengths):
            return keys, values, None
        # Query q of sequence b (at position pos_b + q) sees keys j <= pos_b + q: its own
        # length masks out the rest of the padded batch.
        q = self.positions(t, k.device)  # (B, t)
        j = torch.arange(n, device=k.device)
        return keys, values, (j.view(1, 1, n) <= q.unsqueeze(2)).unsqueeze(1)

    def advance(self, t: int) -> None:
        """Lengths are committed by the caller (see the class note)."""


def causal_mask(pos: int, t: int, device: torch.device) -> Tensor | None:
    """Prefill of ``t`` queries at ``pos``: causal, shifted by what the cache already holds."""
    if t == 1:
        return None
    qi = torch.arange(pos, pos + t, device=device).unsqueeze(1)
    kj = torch.arange(pos + t, device=device).unsqueeze(0)
    return kj <= qi


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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | SlotBatch, layer: int) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v, mask = cache.update(layer, k, v)
        # Grouped-query attention: each KV head serves n_heads / n_kv query heads.
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | SlotBatch, layer: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer)
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

    def forward(self, embeds: Tensor, cache: KVCache | SlotBatch) -> Tensor:
        """Run ``embeds`` (B, T, D) at each sequence's next positions in ``cache`` (a
        :class:`KVCache`, or a batch of slots of a :class:`SlotPool`); return the final
        hidden states. Each sequence gets RoPE at its own positions."""
        t = embeds.shape[1]
        cos, sin = self.rope(cache.end(t), embeds.device)
        at = cache.positions(t, embeds.device)  # (B, T)
        cos, sin = cos[at].unsqueeze(1).to(embeds.dtype), sin[at].unsqueeze(1).to(embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, cache, i)
        cache.advance(t)
        return self.model.norm(x)
