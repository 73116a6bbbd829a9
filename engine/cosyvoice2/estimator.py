"""The flow-matching velocity estimator: a 1-D U-Net of causal convolutions and
chunk-causal transformer blocks (the reference's ``CausalConditionalDecoder``).

Every convolution is causal (left context only), every norm is per frame and the
attention sees up to the end of its own 50-frame chunk. So, for one Euler step,
a new chunk needs only (a) the last two input frames of every convolution and
(b) the keys/values of earlier frames of every attention block. :class:`StepState`
holds exactly that, one per Euler step; :class:`StepRows` hands each call the states
of the streams it computes (one, or a batch of streams at different positions, their
caches padded and masked). Module and key names follow the reference
(diffusers' ``BasicTransformerBlock``) so ``flow.pt`` loads strictly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import TimeCache, append_rows, split_tail
from .encoder import attention_mask
from .model_config import ConfigError, EstimatorConfig


class StepState:
    """Left context for one Euler step: conv tails and attention caches, keyed by slot."""

    def __init__(self, limit_frames: int | None = None) -> None:
        self.tails: dict[int, Tensor] = {}
        self.kv: dict[int, tuple[TimeCache, TimeCache]] = {}
        self.limit = limit_frames

    def cache(self, slot: int) -> tuple[TimeCache, TimeCache]:
        if slot not in self.kv:
            self.kv[slot] = (TimeCache(limit=self.limit), TimeCache(limit=self.limit))
        return self.kv[slot]

    def nbytes(self) -> int:
        return sum(k.nbytes() + v.nbytes() for k, v in self.kv.values())

    def mark(self) -> Callable[[], None]:
        """A function that puts this state back as it is now (a failed batched call's undo:
        caches only append and tails are replaced, never written in place)."""
        tails = dict(self.tails)
        lengths = {slot: (k.length, v.length) for slot, (k, v) in self.kv.items()}

        def restore() -> None:
            self.tails = tails
            for slot in list(self.kv):
                if slot not in lengths:
                    del self.kv[slot]
                    continue
                k, v = self.kv[slot]
                k.truncate(lengths[slot][0])
                v.truncate(lengths[slot][1])

        return restore


class StepRows:
    """The states one estimator call reads and extends: stream ``i`` owns rows
    ``[i*r, (i+1)*r)`` of the batch (r = 2, CFG's conditioned and unconditioned pair)
    and ``states[i]``; ``starts`` (one per row) is where each row's new frames start.
    One stream is the unbatched case: its caches are used as they are, nothing is
    padded. ``masks`` may be shared by the calls of one chunk: every attention block
    of every Euler step has the same queries and keys, so the same mask."""

    def __init__(
        self, states: Sequence[StepState], starts: Tensor, rows: int, masks: dict[tuple, Tensor | None] | None = None
    ) -> None:
        self.states, self.starts, self.rows = list(states), starts, rows
        self.masks = {} if masks is None else masks

    def conv_input(self, slot: int, x: Tensor, k: int) -> Tensor:
        """``x`` behind each stream's last ``k`` input frames (zeros at its start); keeps
        the new last ``k`` as each stream's tail."""
        rows = x.shape[0] if len(self.states) == 1 else self.rows
        tails = [st.tails.get(slot) for st in self.states]
        held = [t if t is not None else x.new_zeros(rows, x.shape[1], k) for t in tails]
        x = torch.cat([held[0] if len(held) == 1 else torch.cat(held), x], dim=2)
        for st, part in zip(self.states, split_tail(x[:, :, -k:], len(self.states))):
            st.tails[slot] = part
        return x

    def keys(self, slot: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, list[int] | None]:
        """Append the new keys/values to each stream's caches; all held, padded where the
        streams differ in length, and each stream's key count there (None: no padding)."""
        caches = [st.cache(slot) for st in self.states]
        keys, lengths = append_rows([c[0] for c in caches], k)
        values, _ = append_rows([c[1] for c in caches], v)
        return keys, values, lengths

    def mask(self, n_q: int, n_k: int, chunk: int | None, lengths: list[int] | None) -> Tensor | None:
        """The (R, 1, n_q, n_k) attention mask of these rows, or None: see ``attention_mask``."""
        key = (n_q, n_k, chunk, None if lengths is None else tuple(lengths))
        if key not in self.masks:
            per_row = None if lengths is None else torch.tensor(lengths, device=self.starts.device).repeat_interleave(self.rows)
            mask = attention_mask(self.starts, n_q, n_k, chunk, per_row)
            self.masks[key] = None if mask is None else mask.unsqueeze(1)
        return self.masks[key]


def cache_bytes_per_frame(cfg: EstimatorConfig, n_timesteps: int, itemsize: int) -> int:
    """The attention caches one stream keeps per mel frame: every Euler step has its own
    keys and values in every transformer block, for both halves of the CFG batch. At
    full size (10 steps x 56 blocks x (k, v) x 2 x 512 channels) this is 2.29 MB per
    frame in bf16: 115 MB per second of prompt and speech (50 frames a second)."""
    blocks = cfg.n_blocks * (2 + cfg.num_mid_blocks)  # down, mid..., up
    return n_timesteps * blocks * 2 * 2 * cfg.num_heads * cfg.attention_head_dim * itemsize


class CausalConv1d(nn.Conv1d):
    """A conv over the current and k-1 previous frames; the previous ones come from the state."""

    slot = -1

    def __init__(self, cin: int, cout: int, kernel: int) -> None:
        super().__init__(cin, cout, kernel)

    def forward(self, x: Tensor, st: StepRows) -> Tensor:  # type: ignore[override]
        return super().forward(st.conv_input(self.slot, x, self.kernel_size[0] - 1))


class CausalBlock1D(nn.Module):
    """conv -> LayerNorm over channels -> Mish. Indices match the reference Sequential."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), nn.Identity(), nn.LayerNorm(dim_out))

    def forward(self, x: Tensor, st: StepRows) -> Tensor:
        x = self.block[0](x, st)
        return F.mish(self.block[2](x.transpose(1, 2)).transpose(1, 2))


class CausalResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_emb_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: Tensor, temb: Tensor, st: StepRows) -> Tensor:
        h = self.block1(x, st) + self.mlp(temb).unsqueeze(-1)
        return self.block2(h, st) + self.res_conv(x)


class Attention(nn.Module):
    """diffusers ``Attention`` as the reference configures it: no q/k/v bias, biased output."""

    slot = -1

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: Tensor, st: StepRows, chunk: int | None) -> Tensor:
        b, n, _ = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

        q = heads(self.to_q(x))
        k, v, lengths = st.keys(self.slot, heads(self.to_k(x)), heads(self.to_v(x)))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=st.mask(n, k.shape[2], chunk, lengths))
        return self.to_out[0](out.transpose(1, 2).reshape(b, n, -1))


class GELUProj(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        # net.1 is the reference's (inactive) dropout; kept so indices match.
        self.net = nn.ModuleList([GELUProj(dim, dim * mult), nn.Identity(), nn.Linear(dim * mult, dim)])

    def forward(self, x: Tensor) -> Tensor:
        return self.net[2](self.net[0](x))


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, st: StepRows, chunk: int | None) -> Tensor:
        x = x + self.attn1(self.norm1(x), st, chunk)
        return x + self.ff(self.norm3(x))


class TimestepEmbedding(nn.Module):
    def __init__(self, cin: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(cin, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def sinusoidal_time(t: Tensor, dim: int, scale: float = 1000.0) -> Tensor:
    half = dim // 2
    freq = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    emb = scale * t.unsqueeze(1) * freq.unsqueeze(0)
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class CausalConditionalDecoder(nn.Module):
    def __init__(self, cfg: EstimatorConfig) -> None:
        super().__init__()
        if len(cfg.channels) != 1:
            # Several levels would down-/up-sample in time with non-causal convs.
            raise ConfigError("the flow estimator must have a single channel level")
        self.cfg = cfg
        ch = cfg.channels[0]
        temb = ch * 4

        def transformers() -> nn.ModuleList:
            return nn.ModuleList(
                BasicTransformerBlock(ch, cfg.num_heads, cfg.attention_head_dim) for _ in range(cfg.n_blocks)
            )

        self.time_mlp = TimestepEmbedding(cfg.in_channels, temb)
        self.down_blocks = nn.ModuleList(
            [nn.ModuleList([CausalResnetBlock1D(cfg.in_channels, ch, temb), transformers(), CausalConv1d(ch, ch, 3)])]
        )
        self.mid_blocks = nn.ModuleList(
            nn.ModuleList([CausalResnetBlock1D(ch, ch, temb), transformers()]) for _ in range(cfg.num_mid_blocks)
        )
        self.up_blocks = nn.ModuleList(
            [nn.ModuleList([CausalResnetBlock1D(2 * ch, ch, temb), transformers(), CausalConv1d(ch, ch, 3)])]
        )
        self.final_block = CausalBlock1D(ch, ch)
        self.final_proj = nn.Conv1d(ch, cfg.out_channels, 1)
        # Number the stateful modules so a StepState can key its caches by them.
        for i, m in enumerate(m for m in self.modules() if isinstance(m, (CausalConv1d, Attention))):
            m.slot = i

    def forward(
        self,
        x: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        st: StepRows,
        streaming: bool = True,
    ) -> Tensor:
        """Velocity for each stream's next n frames (from ``st.starts``). x, mu, cond:
        (B, 80, n); t: (B,); spks: (B, 80); rows as ``st`` assigns them to streams."""
        chunk = self.cfg.static_chunk_size if streaming else None
        temb = self.time_mlp(sinusoidal_time(t, self.cfg.in_channels).to(t.dtype))
        h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.shape[-1]), cond], dim=1)

        def attend(blocks: nn.ModuleList, h: Tensor) -> Tensor:
            h = h.transpose(1, 2)
            for block in blocks:
                h = block(h, st, chunk)
            return h.transpose(1, 2)

        # A ModuleList yields plain Modules: each level's parts are named by cast.
        skips = []
        for level in self.down_blocks:
            resnet, blocks, down = cast(tuple[nn.Module, nn.ModuleList, nn.Module], tuple(cast(nn.ModuleList, level)))
            h = attend(blocks, resnet(h, temb, st))
            skips.append(h)
            h = down(h, st)
        for level in self.mid_blocks:
            resnet, blocks = cast(tuple[nn.Module, nn.ModuleList], tuple(cast(nn.ModuleList, level)))
            h = attend(blocks, resnet(h, temb, st))
        for level in self.up_blocks:
            resnet, blocks, up = cast(tuple[nn.Module, nn.ModuleList, nn.Module], tuple(cast(nn.ModuleList, level)))
            h = torch.cat([h, skips.pop()], dim=1)
            h = up(attend(blocks, resnet(h, temb, st)), st)
        return self.final_proj(self.final_block(h, st))
