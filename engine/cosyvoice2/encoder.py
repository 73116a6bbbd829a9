"""The flow's token encoder: a chunk-causal conformer that up-samples 25 Hz tokens to 50 Hz.

    embed -> pre-lookahead conv -> N conformer layers (chunk mask, 25 tokens)
          -> x2 nearest up-sampling + causal conv -> embed -> 4 conformer layers
             (chunk mask, 50 frames) -> final LayerNorm

Everything is causal except the pre-lookahead layer, which reads 3 tokens ahead,
and attention within a chunk. So a *complete* chunk, once its 3 lookahead tokens
exist, never changes again: ``forward_chunk`` computes only the new chunk's
positions, reading the earlier ones from per-layer key/value caches and the
convolutions' left context from small tails. A single call over a whole sequence
with a fresh state is the reference's one-shot ``forward``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import TimeCache
from .model_config import EncoderConfig


def chunk_mask(q_start: int, n_q: int, n_k: int, chunk: int | None, device: torch.device) -> Tensor | None:
    """Boolean (n_q, n_k) mask: a position sees every key up to the end of its own chunk."""
    if not chunk:
        return None
    qi = torch.arange(q_start, q_start + n_q, device=device)
    limit = (torch.div(qi, chunk, rounding_mode="floor") + 1) * chunk
    return torch.arange(n_k, device=device).unsqueeze(0) < limit.unsqueeze(1)


def relative_positions(r: Tensor, d_model: int) -> Tensor:
    """ESPnet's sinusoidal encoding of signed relative offsets (query - key)."""
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=r.device) * -(math.log(10000.0) / d_model)
    )
    angle = r.float().unsqueeze(1) * div
    pe = torch.zeros(r.shape[0], d_model, device=r.device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe


class RelPositionAttention(nn.Module):
    """Transformer-XL attention: content term (q+u)k plus position term (q+v)p(i-j)."""

    def __init__(self, n_head: int, n_feat: int) -> None:
        super().__init__()
        self.h, self.d_k = n_head, n_feat // n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))

    def forward(self, x: Tensor, q_start: int, k_cache: TimeCache, v_cache: TimeCache, chunk: int | None) -> Tensor:
        b, n, _ = x.shape
        q = self.linear_q(x).view(b, n, self.h, self.d_k)
        k = k_cache.append(self.linear_k(x).view(b, n, self.h, self.d_k).transpose(1, 2))
        v = v_cache.append(self.linear_v(x).view(b, n, self.h, self.d_k).transpose(1, 2))
        e = k.shape[2]  # keys: every position so far, [0, q_start + n)
        # Offsets i - j run from e-1 (first key, last query) down to -(n-1).
        offsets = torch.arange(e - 1, -n, -1, device=x.device)
        p = self.linear_pos(relative_positions(offsets, self.h * self.d_k).to(x.dtype))
        p = p.view(1, -1, self.h, self.d_k).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd_all = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        qi = torch.arange(q_start, q_start + n, device=x.device).unsqueeze(1)
        kj = torch.arange(e, device=x.device).unsqueeze(0)
        index = (e - 1) - (qi - kj)  # column of offset (qi - kj) in bd_all
        bd = bd_all.gather(-1, index.expand(b, self.h, n, e))
        scores = (ac + bd) / math.sqrt(self.d_k)
        mask = chunk_mask(q_start, n, e, chunk, x.device)
        if mask is not None:
            scores = scores.masked_fill(~mask, -float("inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, -1)
        return self.linear_out(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.silu(self.w_1(x)))  # swish


class ConformerLayer(nn.Module):
    """Pre-norm attention + feed-forward (the yaml turns off macaron and convolution)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        d = cfg.output_size
        self.self_attn = RelPositionAttention(cfg.attention_heads, d)
        self.feed_forward = FeedForward(d, cfg.linear_units)
        self.norm_ff = nn.LayerNorm(d, eps=1e-12)
        self.norm_mha = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x: Tensor, q_start: int, kv: tuple[TimeCache, TimeCache], chunk: int | None) -> Tensor:
        x = x + self.self_attn(self.norm_mha(x), q_start, kv[0], kv[1], chunk)
        return x + self.feed_forward(self.norm_ff(x))


class LinearEmbed(nn.Module):
    """Linear + LayerNorm, scaled by sqrt(d) (the rel-pos encoding adds nothing to x)."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5))
        self.xscale = math.sqrt(odim)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(x) * self.xscale


class PreLookaheadLayer(nn.Module):
    """conv1 reads positions t..t+L (the lookahead), conv2 is causal over 3 positions."""

    def __init__(self, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=3)

    def forward(self, x: Tensor, ahead: Tensor, tail: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, n, C) new positions; ahead: (B, <=L, C) the tokens after them
        (zeros stand in at the end of speech); tail: (B, C, 2) conv2's left context."""
        h = torch.cat([x, ahead], dim=1).transpose(1, 2)
        h = F.pad(h, (0, self.lookahead - ahead.shape[1]))
        h = F.leaky_relu(self.conv1(h))
        h = torch.cat([tail, h], dim=2)
        out = self.conv2(h).transpose(1, 2)
        return out + x, h[:, :, -2:]


class Upsample1D(nn.Module):
    """Nearest x stride, then a causal conv of 2*stride+1 taps."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, stride * 2 + 1)

    def forward(self, x: Tensor, tail: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, C, n) -> (B, C, n*stride); tail: (B, C, 2*stride) up-sampled left context."""
        up = torch.cat([tail, x.repeat_interleave(self.stride, dim=2)], dim=2)
        return self.conv(up), up[:, :, -2 * self.stride :]


@dataclass
class EncoderState:
    """What earlier chunks left behind: attention caches and convolution tails."""

    done: int = 0  # token positions already encoded
    kv: list[tuple[TimeCache, TimeCache]] = field(default_factory=list)
    up_kv: list[tuple[TimeCache, TimeCache]] = field(default_factory=list)
    lookahead_tail: Tensor | None = None
    up_tail: Tensor | None = None

    def nbytes(self) -> int:
        return sum(k.nbytes() + v.nbytes() for k, v in self.kv + self.up_kv)


class UpsampleConformerEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.output_size
        self.embed = LinearEmbed(cfg.input_size, d)
        self.pre_lookahead_layer = PreLookaheadLayer(d, cfg.pre_lookahead_len)
        self.encoders = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.num_blocks))
        self.up_layer = Upsample1D(d, cfg.upsample_stride)
        self.up_embed = LinearEmbed(cfg.input_size, d)
        self.up_encoders = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.num_up_blocks))
        self.after_norm = nn.LayerNorm(d, eps=1e-5)

    def new_state(
        self, batch: int, device: torch.device, dtype: torch.dtype, reserve_tokens: int = 0, limit_tokens: int | None = None
    ) -> EncoderState:
        d, s = self.cfg.output_size, self.cfg.upsample_stride
        lim, up_lim = limit_tokens, None if limit_tokens is None else limit_tokens * s
        return EncoderState(
            kv=[(TimeCache(reserve=reserve_tokens, limit=lim), TimeCache(reserve=reserve_tokens, limit=lim)) for _ in self.encoders],
            up_kv=[
                (TimeCache(reserve=reserve_tokens * s, limit=up_lim), TimeCache(reserve=reserve_tokens * s, limit=up_lim))
                for _ in self.up_encoders
            ],
            lookahead_tail=torch.zeros(batch, d, 2, device=device, dtype=dtype),
            up_tail=torch.zeros(batch, d, 2 * s, device=device, dtype=dtype),
        )

    def cache_bytes_per_token(self, itemsize: int) -> int:
        """Attention keys and values per token: the token-rate layers' and the up-sampled ones'."""
        c = self.cfg
        return 2 * c.output_size * itemsize * (c.num_blocks + c.num_up_blocks * c.upsample_stride)

    def forward_chunk(self, xs: Tensor, ahead: Tensor, state: EncoderState, streaming: bool = True) -> Tensor:
        """Encode token positions [state.done, state.done + n) -> (B, n*stride, D) frames.

        ``xs``: (B, n, input_size) token embeddings; ``ahead``: the (up to 3) embedded
        tokens that follow, or fewer/none at the end of speech. ``streaming`` selects
        the chunk mask (the reference's ``streaming=True``) over full attention.
        """
        chunk = self.cfg.static_chunk_size if streaming else None
        start = state.done
        x = self.embed(xs)
        x, state.lookahead_tail = self.pre_lookahead_layer(x, self.embed(ahead), state.lookahead_tail)
        for layer, kv in zip(self.encoders, state.kv):
            x = layer(x, start, kv, chunk)
        up, state.up_tail = self.up_layer(x.transpose(1, 2), state.up_tail)
        x = self.up_embed(up.transpose(1, 2))
        s = self.cfg.upsample_stride
        for layer, kv in zip(self.up_encoders, state.up_kv):
            x = layer(x, start * s, kv, chunk * s if chunk else None)
        state.done = start + xs.shape[1]
        return self.after_norm(x)
