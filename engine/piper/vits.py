"""VITS inference (the model inside Piper voices), in plain torch.

Only the inference path is here: text encoder -> stochastic duration predictor (reverse)
-> length regulation -> prior sample -> normalising flow (reverse) -> HiFi-GAN decoder.
Piper runs the same network as one ONNX graph; splitting it into ``infer_latent`` and
``decode`` is what lets the decoder run on latent chunks and start streaming early.

Module and parameter names follow the Piper/VITS training code (``enc_p``, ``dp``,
``flow``, ``dec``) so that ONNX initializer names map onto them one to one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

LRELU_SLOPE = 0.1
MAX_PHONEME_SECONDS = 2.0
"""The longest one phoneme is spoken, at speed 1 (it scales with the length scale). The
duration predictor's own outputs stay far below (a long pause is about half a second);
the bound makes a text's speech at most this many seconds per phoneme, whatever it holds."""


@dataclass
class VitsConfig:
    # Text encoder (relative-position transformer).
    n_vocab: int = 256
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    window_size: int = 4
    inter_channels: int = 192
    # Stochastic duration predictor. dp_n_flows counts the training graph's ConvFlows;
    # the first one is never used at inference (see DurationPredictor.reverse).
    dp_filter_channels: int = 192
    dp_kernel_size: int = 3
    dp_n_layers: int = 3
    dp_n_flows: int = 4
    dp_num_bins: int = 10
    dp_tail_bound: float = 5.0
    # Residual-coupling flow.
    flow_n_flows: int = 4
    flow_n_layers: int = 4
    flow_kernel_size: int = 5
    flow_dilation_rate: int = 1
    # HiFi-GAN generator.
    resblock: str = "2"
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_initial_channel: int = 256
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    sample_rate: int = 22050
    # Speakers. A multi-speaker voice embeds its speaker id into gin_channels and
    # conditions the duration predictor, the flow's WaveNets and the decoder on it.
    n_speakers: int = 1
    gin_channels: int = 0

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)


# Layout: every activation is [B, C, 1, T] in channels-last memory, i.e. stored as
# [B, T, C], and 1-D convolutions run as 2-D ones. oneDNN's channels-last kernels skip
# the reorders it otherwise does around every conv (and its plain-layout dilated kernels
# are slow): this halves HiFi-GAN's CPU time. The [B, T, C] storage also makes the
# channel LayerNorms and attention heads plain views instead of strided copies.
# Parameters keep their Conv1d shapes, so ONNX weights still map by name and shape.


def to_cl(x: torch.Tensor) -> torch.Tensor:
    """[B, C, T] -> [B, C, 1, T] channels-last (a view if already stored as [B, T, C])."""
    return x.unsqueeze(2).contiguous(memory_format=torch.channels_last)


def time_major(x: torch.Tensor) -> torch.Tensor:
    """[B, C, 1, T] channels-last -> its [B, T, C] storage, as a view."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)


def channels_first(x: torch.Tensor) -> torch.Tensor:
    """[B, T, C] -> [B, C, 1, T] channels-last, as a view."""
    return x.transpose(1, 2).unsqueeze(2)


def _kernel_channels_last(weight: torch.Tensor) -> None:
    """Store a [O, I, K] kernel so that its [O, I, 1, K] view is channels-last, as the
    activations are: stored plainly, oneDNN copied every kernel wider than 1 into that
    order on every call (12% of a whole utterance's CPU time). ``load_state_dict`` and
    ``.to()`` keep these strides."""
    weight.data = weight.data.unsqueeze(2).contiguous(memory_format=torch.channels_last).squeeze(2)


def _numeric_padding(padding: str | tuple[int, ...]) -> int:
    """The padding of a 1-d layer as the number its [B, C, 1, T] forward passes on: a
    named padding ("same", "valid") has no such number."""
    if isinstance(padding, str):
        raise ValueError(f"padding {padding!r}: only numeric padding is supported")
    return padding[0]


class Conv(nn.Conv1d):
    """A Conv1d applied to [B, C, 1, T] channels-last activations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _kernel_channels_last(self.weight)
        self._padding = _numeric_padding(self.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(
            x, self.weight.unsqueeze(2), self.bias, (1, self.stride[0]),
            (0, self._padding), (1, self.dilation[0]), self.groups,
        )


class ConvTranspose(nn.ConvTranspose1d):
    """A ConvTranspose1d applied to [B, C, 1, T] channels-last activations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _kernel_channels_last(self.weight)
        self._padding = _numeric_padding(self.padding)

    # No output_size: the layout fixes the output length, so the override narrows the
    # signature on purpose.
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return F.conv_transpose2d(
            x, self.weight.unsqueeze(2), self.bias, (1, self.stride[0]),
            (0, self._padding), (0, self.output_padding[0]), self.groups,
            (1, self.dilation[0]),
        )


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """[B] lengths -> [B, 1, 1, max_length] float mask."""
    steps = torch.arange(max_length, device=lengths.device)
    return (steps[None, :] < lengths[:, None]).float()[:, None, None, :]


class LayerNorm(nn.Module):
    """LayerNorm over the channel axis."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(time_major(x), self.gamma.shape, self.gamma, self.beta, self.eps)
        return channels_first(y)


# --------------------------------------------------------------------------- encoder


def add_band(scores: torch.Tensor, band: torch.Tensor) -> None:
    """scores[..., i, i + k] += band[..., i, k + w] for |k| <= w, in place.

    Offset k is the k-th diagonal, so this is 2w+1 strided adds instead of
    materialising (and padding) a [T, T] relative-position matrix."""
    t, w = scores.shape[-1], (band.shape[-1] - 1) // 2
    for k in range(-min(w, t - 1), min(w, t - 1) + 1):
        scores.diagonal(k, -2, -1).add_(band[..., max(0, -k) : t - max(0, k), k + w])


def take_band(p: torch.Tensor, w: int) -> torch.Tensor:
    """The inverse gather: band[..., i, k + w] = p[..., i, i + k] (0 off the matrix)."""
    t = p.shape[-1]
    band = p.new_zeros(*p.shape[:-1], 2 * w + 1)
    for k in range(-min(w, t - 1), min(w, t - 1) + 1):
        band[..., max(0, -k) : t - max(0, k), k + w] = p.diagonal(k, -2, -1)
    return band


class RelativeSelfAttention(nn.Module):
    """Multi-head self-attention with windowed relative key/value embeddings
    (Shaw et al.), shared across heads: offsets beyond +-window contribute nothing."""

    def __init__(self, channels: int, n_heads: int, window_size: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = Conv(channels, channels, 1)
        self.conv_k = Conv(channels, channels, 1)
        self.conv_v = Conv(channels, channels, 1)
        self.conv_o = Conv(channels, channels, 1)
        self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))
        self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))

    def forward(self, x: torch.Tensor, masked_out: torch.Tensor | None) -> torch.Tensor:
        """``masked_out``: [B, 1, T, T], True where a score is excluded (padding), or
        None where nothing is."""
        b, c, _, t = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:  # -> [B, H, T, d]
            return time_major(y).view(b, t, self.n_heads, self.k_channels).transpose(1, 2)

        q = heads(self.conv_q(x)) / math.sqrt(self.k_channels)
        k, v = heads(self.conv_k(x)), heads(self.conv_v(x))
        scores = q @ k.transpose(-2, -1)
        add_band(scores, q @ self.emb_rel_k.transpose(-2, -1))
        if masked_out is not None:
            scores.masked_fill_(masked_out, -1e4)
        p = torch.softmax(scores, dim=-1)
        out = p @ v + take_band(p, self.window_size) @ self.emb_rel_v
        return self.conv_o(channels_first(out.transpose(1, 2).reshape(b, t, c)))


class FFN(nn.Module):
    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        # "same" padding; the training code pads (k-1)//2 left and k//2 right, which is
        # the conv's own symmetric padding for the odd kernels every voice uses.
        self.pad = ((kernel_size - 1) // 2, kernel_size // 2)
        conv_pad = self.pad[0] if self.pad[0] == self.pad[1] else 0
        self.conv_1 = Conv(channels, filter_channels, kernel_size, padding=conv_pad)
        self.conv_2 = Conv(filter_channels, channels, kernel_size, padding=conv_pad)

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad[0] == self.pad[1]:
            return x
        return F.pad(x, self.pad).contiguous(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv_1(self._padded(x * mask)))
        return self.conv_2(self._padded(x * mask)) * mask


class Encoder(nn.Module):
    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        h = cfg.hidden_channels
        n = cfg.n_layers
        self.attn_layers = nn.ModuleList(
            RelativeSelfAttention(h, cfg.n_heads, cfg.window_size) for _ in range(n)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(h) for _ in range(n))
        self.ffn_layers = nn.ModuleList(
            FFN(h, cfg.filter_channels, cfg.kernel_size) for _ in range(n)
        )
        self.norm_layers_2 = nn.ModuleList(LayerNorm(h) for _ in range(n))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Without padding the attention mask is all ones: skip the [T, T] masked_fill.
        # With it, the [T, T] comparison is made once for every layer (5% of the prior
        # of a 400-phoneme sentence on one thread).
        masked_out = None if bool(mask.all()) else (mask.transpose(2, 3) * mask) == 0  # [B,1,T,T]
        x = x * mask
        for attn, norm_1, ffn, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm_1(x + attn(x, masked_out))
            x = norm_2(x + ffn(x, mask))
        return x * mask


class TextEncoder(nn.Module):
    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.hidden_channels = cfg.hidden_channels
        self.inter_channels = cfg.inter_channels
        self.emb = nn.Embedding(cfg.n_vocab, cfg.hidden_channels)
        self.encoder = Encoder(cfg)
        self.proj = Conv(cfg.hidden_channels, 2 * cfg.inter_channels, 1)

    def forward(
        self, ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = channels_first(self.emb(ids) * math.sqrt(self.hidden_channels))
        x = self.encoder(x, mask)
        m, logs = (self.proj(x) * mask).split(self.inter_channels, dim=1)
        return x, m, logs


# ------------------------------------------------------------------ duration predictor


class DDSConv(nn.Module):
    """Dilated depth-separable conv stack (dilation kernel**i), GELU, residual."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            self.convs_sep.append(
                Conv(
                    channels,
                    channels,
                    kernel_size,
                    groups=channels,
                    dilation=dilation,
                    padding=(kernel_size * dilation - dilation) // 2,
                )
            )
            self.convs_1x1.append(Conv(channels, channels, 1))
        self.norms_1 = nn.ModuleList(LayerNorm(channels) for _ in range(n_layers))
        self.norms_2 = nn.ModuleList(LayerNorm(channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for sep, norm_1, c1x1, norm_2 in zip(
            self.convs_sep, self.norms_1, self.convs_1x1, self.norms_2
        ):
            y = F.gelu(norm_1(sep(x * mask)))
            x = x + F.gelu(norm_2(c1x1(y)))
        return x * mask


def _spline_knots(unnormalized: torch.Tensor, bound: float, minimum: float) -> torch.Tensor:
    """Softmax bin sizes (each at least `minimum` of the range) -> K+1 knots on
    [-bound, bound], with the end knots pinned exactly."""
    n = unnormalized.shape[-1]
    sizes = minimum + (1 - minimum * n) * torch.softmax(unnormalized, dim=-1)
    knots = F.pad(torch.cumsum(sizes, dim=-1), (1, 0)) * (2 * bound) - bound
    knots[..., 0] = -bound
    knots[..., -1] = bound
    return knots


def rq_spline_inverse(
    y: torch.Tensor,
    widths: torch.Tensor,
    heights: torch.Tensor,
    derivatives: torch.Tensor,
    tail_bound: float,
    min_bin: float = 1e-3,
    min_derivative: float = 1e-3,
) -> torch.Tensor:
    """Inverse of a monotone rational-quadratic spline on [-B, B], identity outside
    (Durkan et al. 2019, "linear tails"). Vectorised: no boolean indexing, so shapes
    stay static and there is no host sync."""
    # Boundary derivatives fixed so that softplus(c) + min_derivative == 1: the spline
    # joins the identity tails smoothly.
    tail = math.log(math.exp(1 - min_derivative) - 1)
    derivatives = min_derivative + F.softplus(F.pad(derivatives, (1, 1), value=tail))
    cumw = _spline_knots(widths, tail_bound, min_bin)
    cumh = _spline_knots(heights, tail_bound, min_bin)

    inside = (y >= -tail_bound) & (y <= tail_bound)
    yc = y.clamp(-tail_bound, tail_bound)
    # The last knot is nudged up so y == +B falls in the last bin, as in the original.
    search = torch.cat([cumh[..., :-1], cumh[..., -1:] + 1e-6], dim=-1)
    idx = (yc.unsqueeze(-1) >= search).sum(-1, keepdim=True) - 1
    idx = idx.clamp(0, widths.shape[-1] - 1)

    def at(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-1, idx).squeeze(-1)

    x_k, y_k = at(cumw), at(cumh)
    w_k = at(cumw[..., 1:] - cumw[..., :-1])
    h_k = at(cumh[..., 1:] - cumh[..., :-1])
    d_k, d_k1 = at(derivatives[..., :-1]), at(derivatives[..., 1:])
    delta = h_k / w_k

    # Solve the bin's rational quadratic for theta in [0, 1] (numerically stable root).
    dy = yc - y_k
    s = d_k + d_k1 - 2 * delta
    a = dy * s + h_k * (delta - d_k)
    b = h_k * d_k - dy * s
    c = -delta * dy
    disc = (b * b - 4 * a * c).clamp_min(0)
    theta = (2 * c) / (-b - torch.sqrt(disc))
    return torch.where(inside, theta * w_k + x_k, y)


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m, logs = self.m.view(1, -1, 1, 1), self.logs.view(1, -1, 1, 1)
        return (x - m) * torch.exp(-logs) * mask


class ConvFlow(nn.Module):
    """Neural-spline coupling on 2 channels: channel 0 conditions channel 1."""

    def __init__(self, filter_channels: int, kernel_size: int, n_layers: int,
                 num_bins: int, tail_bound: float) -> None:
        super().__init__()
        self.filter_channels = filter_channels
        self.num_bins = num_bins
        self.tail_bound = tail_bound
        self.pre = Conv(1, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        self.proj = Conv(filter_channels, 3 * num_bins - 1, 1)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x0, x1 = x.split(1, dim=1)  # [B, 1, 1, T] each
        h = self.convs(self.pre(x0) + g, mask)
        h = time_major(self.proj(h) * mask).unsqueeze(1)  # [B, 1, T, 3K-1]: bins last
        k = self.num_bins
        scale = math.sqrt(self.filter_channels)
        x1 = rq_spline_inverse(
            x1.squeeze(2), h[..., :k] / scale, h[..., k : 2 * k] / scale, h[..., 2 * k :],
            self.tail_bound,
        )
        return torch.cat([x0, x1.unsqueeze(2)], dim=1) * mask


class StochasticDurationPredictor(nn.Module):
    """Flow-based duration model; at inference noise is pushed through the flows in
    reverse, conditioned on the text encoding, giving log-durations."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        fc = cfg.dp_filter_channels
        self.pre = Conv(cfg.hidden_channels, fc, 1)
        self.convs = DDSConv(fc, cfg.dp_kernel_size, cfg.dp_n_layers)
        self.proj = Conv(fc, fc, 1)
        self.cond = Conv(cfg.gin_channels, fc, 1) if cfg.gin_channels else None
        # Training layout: [affine, (convflow, flip) x n]. The convflow at index 1 is
        # skipped in reverse (VITS drops it as useless), so the export has no weights
        # for it; a ModuleDict keeps the training indices without a dead module.
        self.flows = nn.ModuleDict({"0": ElementwiseAffine(2)})
        for i in range(1, cfg.dp_n_flows):
            self.flows[str(2 * i + 1)] = ConvFlow(
                fc, cfg.dp_kernel_size, cfg.dp_n_layers, cfg.dp_num_bins, cfg.dp_tail_bound
            )
        self.n_flows = cfg.dp_n_flows

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor,
                speaker: torch.Tensor | None = None) -> torch.Tensor:
        """x: encoder output [B, H, 1, T]; noise [B, 2, 1, T], already scaled by noise_w;
        speaker: [B, G, 1, 1] embeddings, or None -> log-durations [B, 1, 1, T]."""
        h = self.pre(x)
        if self.cond is not None and speaker is not None:
            h = h + self.cond(speaker)
        g = self.proj(self.convs(h, mask)) * mask
        z = noise
        for i in reversed(range(1, self.n_flows)):
            z = cast(ConvFlow, self.flows[str(2 * i + 1)]).reverse(z.flip(1), mask, g)
        z = cast(ElementwiseAffine, self.flows["0"]).reverse(z.flip(1), mask)
        return z[:, :1]


# ------------------------------------------------------------------------------- flow


class WN(nn.Module):
    """Non-causal WaveNet: gated dilated convs with residual and skip paths."""

    def __init__(self, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int,
                 gin_channels: int = 0) -> None:
        super().__init__()
        self.hidden = hidden
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        # Every layer's gate input gets its own slice of one projection of the speaker.
        self.cond_layer = Conv(gin_channels, 2 * hidden * n_layers, 1) if gin_channels else None
        for i in range(n_layers):
            d = dilation_rate**i
            pad = (kernel_size * d - d) // 2
            self.in_layers.append(Conv(hidden, 2 * hidden, kernel_size, dilation=d, padding=pad))
            # The last layer has no residual half: only its skip output is used.
            out = 2 * hidden if i < n_layers - 1 else hidden
            self.res_skip_layers.append(Conv(hidden, out, 1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, speaker: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden
        skip = torch.zeros_like(x)
        last = len(self.in_layers) - 1
        cond = self.cond_layer(speaker) if self.cond_layer is not None and speaker is not None else None
        for i, (in_layer, rs_layer) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            a = in_layer(x)
            if cond is not None:
                a = a + cond[:, 2 * h * i : 2 * h * (i + 1)]
            acts = torch.tanh(a[:, :h]) * torch.sigmoid(a[:, h:])
            rs = rs_layer(acts)
            if i < last:
                x = (x + rs[:, :h]) * mask
                skip = skip + rs[:, h:]
            else:
                skip = skip + rs
        return skip * mask


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the first half predicts a shift of the second."""

    def __init__(self, channels: int, hidden: int, kernel_size: int,
                 dilation_rate: int, n_layers: int, gin_channels: int = 0) -> None:
        super().__init__()
        # Not ``half``: that would hide nn.Module.half().
        self.half_channels = channels // 2
        self.pre = Conv(self.half_channels, hidden, 1)
        self.enc = WN(hidden, kernel_size, dilation_rate, n_layers, gin_channels)
        self.post = Conv(hidden, self.half_channels, 1)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, speaker: torch.Tensor | None = None) -> torch.Tensor:
        x0, x1 = x.split(self.half_channels, dim=1)
        h = self.enc(self.pre(x0) * mask, mask, speaker)
        m = self.post(h) * mask
        return torch.cat([x0, (x1 - m) * mask], dim=1)


class ResidualCouplingBlock(nn.Module):
    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        # Training layout: [coupling, flip] x n; flips have no weights, so only the
        # even indices exist here.
        self.flows = nn.ModuleDict(
            {
                str(2 * i): ResidualCouplingLayer(
                    cfg.inter_channels, cfg.hidden_channels, cfg.flow_kernel_size,
                    cfg.flow_dilation_rate, cfg.flow_n_layers, cfg.gin_channels,
                )
                for i in range(cfg.flow_n_flows)
            }
        )
        self.n_flows = cfg.flow_n_flows

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, speaker: torch.Tensor | None = None) -> torch.Tensor:
        for i in reversed(range(self.n_flows)):
            z = cast(ResidualCouplingLayer, self.flows[str(2 * i)]).reverse(z.flip(1), mask, speaker)
        return z


# ---------------------------------------------------------------------------- decoder


class ResBlock1(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            Conv(channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2)
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            Conv(channels, channels, kernel_size, padding=(kernel_size - 1) // 2)
            for _ in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            x = c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE)).add_(x)
        return x


class ResBlock2(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            Conv(channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2)
            for d in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c in self.convs:
            x = c(F.leaky_relu(x, LRELU_SLOPE)).add_(x)
        return x


class Generator(nn.Module):
    """HiFi-GAN: transposed-conv upsampling, each followed by the mean of parallel
    multi-receptive-field residual blocks."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        ch = cfg.upsample_initial_channel
        self.conv_pre = Conv(cfg.inter_channels, ch, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        block = ResBlock1 if cfg.resblock == "1" else ResBlock2
        for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
            c_in, c_out = ch // 2**i, ch // 2 ** (i + 1)
            self.ups.append(ConvTranspose(c_in, c_out, k, u, padding=(k - u) // 2))
            for rk, rd in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(block(c_out, rk, tuple(rd)))
        self.conv_post = Conv(c_out, 1, 7, padding=3, bias=False)
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        self.cond = Conv(cfg.gin_channels, ch, 1) if cfg.gin_channels else None

    def forward(self, z: torch.Tensor, speaker: torch.Tensor | None = None) -> torch.Tensor:
        """z [B, C, 1, F] channels-last, speaker [B, G, 1, 1] or None -> audio [B, 1, 1, F * hop]."""
        x = self.conv_pre(z)
        if self.cond is not None and speaker is not None:
            x = x + self.cond(speaker)  # one vector per stream, the same at every frame
        k = self.num_kernels
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * k : (i + 1) * k]
            acc = blocks[0](x)
            for block in blocks[1:]:
                acc += block(x)
            x = acc.div_(k)
        # The final activation uses torch's default slope (0.01), as trained. conv_post
        # may compute in a wider type than the rest (Vits.reduce_precision): its output is
        # the audio itself, which bf16's 8 significant bits would round to 1 part in 256.
        return torch.tanh(self.conv_post(F.leaky_relu(x).to(self.conv_post.weight.dtype)))


# ------------------------------------------------------------------------------ model


REDUCIBLE_PARTS = ("enc_p", "flow", "dec")
"""The parts that may compute in a reduced precision. The duration predictor is not one:
its spline flows and the ceil of its output decide the alignment, a whole frame per
rounding flip, and it is a small share of the work."""


class Vits(nn.Module):
    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.enc_p = TextEncoder(cfg)
        self.dp = StochasticDurationPredictor(cfg)
        self.flow = ResidualCouplingBlock(cfg)
        self.dec = Generator(cfg)
        self.emb_g = nn.Embedding(cfg.n_speakers, cfg.gin_channels) if cfg.n_speakers > 1 else None
        self.hop_length = cfg.hop_length
        self.sample_rate = cfg.sample_rate

    def reduce_precision(self, dtype: torch.dtype, parts: tuple[str, ...] = REDUCIBLE_PARTS) -> None:
        """Compute ``parts`` in ``dtype`` (torch.bfloat16, torch.float16). Every part still
        takes and gives float32 at its boundary, so the durations, the chunked decoder's
        latents and the audio stay float32; the decoder's last conv stays float32 too."""
        unknown = set(parts) - set(REDUCIBLE_PARTS)
        if unknown:
            raise ValueError(f"cannot reduce the precision of {sorted(unknown)}; parts: {REDUCIBLE_PARTS}")
        for name in parts:
            module: nn.Module = getattr(self, name)
            post = self.dec.conv_post.weight.detach().clone() if name == "dec" else None
            module.to(dtype)  # keeps each kernel's channels-last strides
            if post is not None:
                self.dec.conv_post.weight.data = post

    def dtype_of(self, part: str) -> torch.dtype:
        """The type ``part`` ("enc_p", "dp", "flow", "dec") computes in."""
        return next(getattr(self, part).parameters()).dtype

    def _ids(self, phoneme_ids: torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(phoneme_ids, dtype=torch.long, device=self.device)
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
            raise ValueError(f"expected phoneme ids shaped [T] or [1, T], got {tuple(ids.shape)}")
        return ids

    @property
    def device(self) -> torch.device:
        return self.enc_p.emb.weight.device

    @property
    def n_speakers(self) -> int:
        return self.cfg.n_speakers

    def speaker_embedding(self, speakers: list[int | None]) -> torch.Tensor | None:
        """Each stream's speaker (None: speaker 0) -> embeddings [B, G, 1, 1], float32;
        None for a one-speaker voice. An id out of range raises ValueError."""
        if self.emb_g is None:
            return None
        ids = [0 if s is None else s for s in speakers]
        if not all(0 <= s < self.n_speakers for s in ids):
            raise ValueError(f"speaker ids {ids} out of range: this voice has {self.n_speakers} speakers")
        g = self.emb_g(torch.tensor(ids, dtype=torch.long, device=self.device))
        return g[:, :, None, None].contiguous(memory_format=torch.channels_last)

    def _randn(self, shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=self.device)

    @torch.inference_mode()
    def infer_prior(
        self,
        phoneme_ids: torch.Tensor,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        generator: torch.Generator | None = None,
        bucket: int = 1,
        speaker: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything before the flow: z_p [1, C, F] and durations [T] (frames).

        The flow is the expensive, length-proportional part of ``infer_latent``;
        streaming callers run it chunk-wise on z_p instead (chunked.stream_chunks).

        ``bucket`` pads the ids to a multiple of it, masked out: oneDNN builds and caches
        kernels per input shape, so a server that sees every sentence length would pay
        that set-up on each new length and keep a cache entry for each."""
        ((z_p, durations),) = self.infer_priors([self._ids(phoneme_ids)[0]], noise_scale, [length_scale],
                                                noise_w, [generator], bucket, [speaker])
        return z_p, durations

    @torch.inference_mode()
    def infer_priors(
        self,
        phoneme_ids: list[torch.Tensor],
        noise_scale: float,
        length_scales: list[float],
        noise_w: float,
        generators: list[torch.Generator | None] | None = None,
        bucket: int = 1,
        speakers: list[int | None] | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``infer_prior`` for several sentences in one batch, padded to the longest and
        masked, each with its own length scale and speaker; the same results as one call
        each.

        Each sentence draws its noise in its own shape from its own generator (None: the
        global one), so that with seeded generators the batch equals the calls one by one."""
        gens = list(generators) if generators is not None else [None] * len(phoneme_ids)
        if not phoneme_ids or any(ids.dim() != 1 or ids.numel() == 0 for ids in phoneme_ids):
            raise ValueError("expected a non-empty list of non-empty 1-D phoneme id tensors")
        if not all(ls > 0 for ls in length_scales):
            raise ValueError(f"length scales must be > 0, got {length_scales}")
        lengths = [int(ids.numel()) for ids in phoneme_ids]
        padded = [-(-n // bucket) * bucket for n in lengths]  # each one's own bucket, for its noise
        b, t = len(lengths), max(padded)
        ids = torch.zeros((b, t), dtype=torch.long, device=self.device)
        for row, seq in enumerate(phoneme_ids):
            ids[row, : lengths[row]] = seq.to(self.device)
        x_mask = sequence_mask(torch.tensor(lengths, device=self.device), t)
        x, m_p, logs_p = (y.float() for y in self.enc_p(ids, x_mask.to(self.dtype_of("enc_p"))))

        noise = torch.zeros((b, 2, t), device=self.device)
        for row, n in enumerate(padded):
            noise[row, :, :n] = self._randn((1, 2, n), gens[row])[0]
        g = self.speaker_embedding(list(speakers) if speakers is not None else [None] * b)
        logw = self.dp.reverse(x, x_mask, to_cl(noise) * noise_w, g)
        scales = torch.tensor(length_scales, device=self.device)[:, None]
        durations = torch.ceil(torch.exp(logw).flatten(1) * x_mask.flatten(1) * scales).long()
        # However odd the input, speech stays proportional to its phonemes.
        longest = torch.ceil(MAX_PHONEME_SECONDS * self.sample_rate / self.hop_length * scales).long()
        durations = torch.minimum(durations, longest)

        # Length regulation: frame f belongs to the phoneme whose cumulative duration
        # first exceeds f. A gather instead of VITS's [F, T] path matrix and matmul.
        ends = torch.cumsum(durations, dim=1)  # [B, T]
        n_frames = max(int(ends[:, -1].max()), 1)
        frames = torch.arange(n_frames, device=self.device).expand(b, n_frames).contiguous()
        owner = torch.searchsorted(ends, frames, right=True).clamp_max(t - 1)
        index = owner.unsqueeze(-1).expand(-1, -1, m_p.shape[1])  # [B, F, C]
        m = channels_first(time_major(m_p).gather(1, index)).squeeze(2)
        logs = channels_first(time_major(logs_p).gather(1, index)).squeeze(2)
        out = []
        for row in range(b):
            frames_i = max(int(ends[row, -1]), 1)
            z_p = m[row : row + 1, :, :frames_i]
            if noise_scale:
                eps = self._randn((1, m.shape[1], frames_i), gens[row])
                z_p = z_p + eps * torch.exp(logs[row : row + 1, :, :frames_i]) * noise_scale
            out.append((z_p.contiguous(), durations[row, : lengths[row]]))
        return out

    @torch.inference_mode()
    def flow_reverse(self, z_p: torch.Tensor, mask: torch.Tensor | None = None,
                     speaker: torch.Tensor | None = None) -> torch.Tensor:
        """Prior sample -> decoder latent, [B, C, F] -> [B, C, F]; ``mask`` [B, 1, 1, F]
        marks real frames (padding is zero and has no effect on them); ``speaker``: each
        row's ``speaker_embedding``."""
        dtype = self.dtype_of("flow")
        if mask is None:
            mask = z_p.new_ones(z_p.shape[0], 1, 1, z_p.shape[2])
        g = speaker.to(dtype) if speaker is not None else None
        return self.flow.reverse(to_cl(z_p.to(dtype)), mask.to(dtype), g).squeeze(2).float()

    @torch.inference_mode()
    def infer_latent(
        self,
        phoneme_ids: torch.Tensor,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        generator: torch.Generator | None = None,
        speaker: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Phoneme ids [T] or [1, T] -> (z [1, C, F] ready for ``decode``, durations [T]
        int64 frames, summing to F; samples per phoneme = frames * hop_length)."""
        z_p, durations = self.infer_prior(
            phoneme_ids, noise_scale, length_scale, noise_w, generator, speaker=speaker
        )
        return self.flow_reverse(z_p, speaker=self.speaker_embedding([speaker])), durations

    @torch.inference_mode()
    def decode(self, z: torch.Tensor, speaker: torch.Tensor | None = None) -> torch.Tensor:
        """z [B, C, F] -> audio [B, F * hop_length] float32 in [-1, 1]; ``speaker``: each
        row's ``speaker_embedding``."""
        dtype = self.dtype_of("dec")
        g = speaker.to(dtype) if speaker is not None else None
        return self.dec(to_cl(z.to(dtype)), g).reshape(z.shape[0], -1).float()

    @torch.inference_mode()
    def forward(
        self,
        phoneme_ids: torch.Tensor,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        generator: torch.Generator | None = None,
        speaker: int | None = None,
    ) -> torch.Tensor:
        z, _ = self.infer_latent(phoneme_ids, noise_scale, length_scale, noise_w, generator, speaker)
        return self.decode(z, self.speaker_embedding([speaker]))[0]
