"""The flow's token encoder: a chunk-causal conformer that up-samples 25 Hz tokens to 50 Hz.

    embed -> pre-lookahead conv -> N conformer layers (chunk mask, 25 tokens)
          -> x2 nearest up-sampling + causal conv -> embed -> 4 conformer layers
             (chunk mask, 50 frames) -> final LayerNorm

Everything is causal except the pre-lookahead layer, which reads 3 tokens ahead,
and attention within a chunk. So a *complete* chunk, once its 3 lookahead tokens
exist, never changes again: ``forward_chunk`` computes only the new chunk's
positions, reading the earlier ones from per-layer key/value caches and the
convolutions' left context from small tails. A single call over a whole sequence
with a fresh state is the reference's one-shot ``forward``. ``forward_chunks`` does
the same for several streams in one batch, each at its own position: their caches,
of different lengths, are zero-padded and the padding masked out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import TimeCache, append_rows, split_tail
from .model_config import EncoderConfig


def attention_mask(starts: Tensor, n_q: int, n_k: int, chunk: int | None, lengths: Tensor | None) -> Tensor | None:
    """Boolean (R, n_q, n_k) mask, or None where every key is visible.

    Row ``r``'s queries sit at positions ``starts[r] + i``; each sees every key up to the
    end of its own chunk (``chunk``; None is full attention) and, in a padded batch, only
    the first ``lengths[r]`` keys (the rest are padding).
    """
    if not chunk and lengths is None:
        return None
    keys = torch.arange(n_k, device=starts.device)
    mask = torch.ones(starts.shape[0], n_q, n_k, dtype=torch.bool, device=starts.device)
    if chunk:
        qi = starts.unsqueeze(1) + torch.arange(n_q, device=starts.device)
        limit = (torch.div(qi, chunk, rounding_mode="floor") + 1) * chunk
        mask &= keys < limit.unsqueeze(2)
    if lengths is not None:
        mask &= keys < lengths.view(-1, 1, 1)
    return mask


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

    def forward(
        self, x: Tensor, starts: Tensor, k_caches: Sequence[TimeCache], v_caches: Sequence[TimeCache], chunk: int | None
    ) -> Tensor:
        """x: (B, n, D), row b a stream whose new positions start at ``starts[b]``, with
        its own caches ``k_caches[b]``/``v_caches[b]`` (padded and masked when they differ)."""
        b, n, _ = x.shape
        q = self.linear_q(x).view(b, n, self.h, self.d_k)
        k, held = append_rows(k_caches, self.linear_k(x).view(b, n, self.h, self.d_k).transpose(1, 2))
        v, _ = append_rows(v_caches, self.linear_v(x).view(b, n, self.h, self.d_k).transpose(1, 2))
        e = k.shape[2]  # keys: every position so far of the longest row
        # Offsets i - j run from e-1 (first key, last query of the longest row) down to -(n-1).
        offsets = torch.arange(e - 1, -n, -1, device=x.device)
        p = self.linear_pos(relative_positions(offsets, self.h * self.d_k).to(x.dtype))
        p = p.view(1, -1, self.h, self.d_k).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd_all = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        qi = starts.view(-1, 1, 1) + torch.arange(n, device=x.device).view(1, -1, 1)
        kj = torch.arange(e, device=x.device).view(1, 1, -1)
        # Column of offset (qi - kj) in bd_all; a shorter row's padded keys fall off the
        # end, so clamp them in range: the mask drops them anyway.
        index = ((e - 1) - (qi - kj)).clamp(0, e + n - 2)
        bd = bd_all.gather(-1, index.unsqueeze(1).expand(b, self.h, n, e))
        scores = (ac + bd) / math.sqrt(self.d_k)
        lengths = None if held is None else torch.tensor(held, device=x.device)
        mask = attention_mask(starts, n, e, chunk, lengths)
        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(1), -float("inf"))
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

    def forward(self, x: Tensor, starts: Tensor, kv: Sequence[tuple[TimeCache, TimeCache]], chunk: int | None) -> Tensor:
        x = x + self.self_attn(self.norm_mha(x), starts, [k for k, _ in kv], [v for _, v in kv], chunk)
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

    def mark(self) -> Callable[[], None]:
        """A function that puts this state back as it is now (a failed batched call's undo:
        caches only append and tails are replaced, never written in place)."""
        done, tails = self.done, (self.lookahead_tail, self.up_tail)
        lengths = [(k.length, v.length) for k, v in self.kv + self.up_kv]

        def restore() -> None:
            self.done, (self.lookahead_tail, self.up_tail) = done, tails
            for (k, v), (nk, nv) in zip(self.kv + self.up_kv, lengths):
                k.truncate(nk)
                v.truncate(nv)

        return restore


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
        return self.forward_chunks(xs, ahead, [state], streaming)

    def forward_chunks(self, xs: Tensor, ahead: Tensor, states: Sequence[EncoderState], streaming: bool = True) -> Tensor:
        """``forward_chunk`` for several streams at once: row b of ``xs``/``ahead`` is
        ``states[b]``'s next n positions, wherever that stream is. Caches of different
        lengths are padded and masked (see ``append_rows``); each state gets its own part."""
        if len(states) > 1 and xs.shape[0] != len(states):
            raise ValueError(f"{xs.shape[0]} rows for {len(states)} encoder states")
        chunk = self.cfg.static_chunk_size if streaming else None
        starts = torch.tensor([st.done for st in states], device=xs.device)
        x = self.embed(xs)
        tail = torch.cat([st.lookahead_tail for st in states])  # type: ignore[misc]
        x, tail = self.pre_lookahead_layer(x, self.embed(ahead), tail)
        _give_rows(states, "lookahead_tail", tail)
        for i, layer in enumerate(self.encoders):
            x = layer(x, starts, [st.kv[i] for st in states], chunk)
        up, tail = self.up_layer(x.transpose(1, 2), torch.cat([st.up_tail for st in states]))  # type: ignore[misc]
        _give_rows(states, "up_tail", tail)
        x = self.up_embed(up.transpose(1, 2))
        s = self.cfg.upsample_stride
        for i, layer in enumerate(self.up_encoders):
            x = layer(x, starts * s, [st.up_kv[i] for st in states], chunk * s if chunk else None)
        for st in states:
            st.done += xs.shape[1]
        return self.after_norm(x)


def _give_rows(states: Sequence[EncoderState], name: str, tail: Tensor) -> None:
    """Hand each state its row of a batched conv tail."""
    for st, row in zip(states, split_tail(tail, len(states))):
        setattr(st, name, row)
