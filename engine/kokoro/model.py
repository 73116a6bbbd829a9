"""Kokoro-82M in plain torch: StyleTTS2's text and prosody parts and an iSTFTNet decoder.

The inference path: phoneme ids -> ALBERT (PL-BERT) -> duration encoder -> durations;
-> prosody (F0 and energy curves); text encoder -> aligned features -> decoder blocks
(frame rate) -> iSTFTNet generator (24 kHz). ``Kokoro.prosody`` and
``Decoder.features`` run on a whole segment and are cheap; the generator holds nearly all
of the work and runs on windows of the segment (``Generator.window``), which is what lets
a segment stream before its audio is computed.

Module and parameter names follow the official ``kokoro`` package's state dict (``bert``,
``bert_encoder``, ``predictor``, ``text_encoder``, ``decoder``), with weight norm folded
into plain weights (engine/kokoro/weights.py), so both the official checkpoint and the
int8 graph's dequantized weights load as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 24000


@dataclass(frozen=True)
class AlbertConfig:
    vocab_size: int = 178
    embedding_size: int = 128
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 2048
    max_position_embeddings: int = 512
    num_hidden_layers: int = 12
    layer_norm_eps: float = 1e-12


@dataclass(frozen=True)
class IstftConfig:
    upsample_rates: tuple[int, ...] = (10, 6)
    upsample_kernel_sizes: tuple[int, ...] = (20, 12)
    upsample_initial_channel: int = 512
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    n_fft: int = 20
    hop: int = 5


@dataclass(frozen=True)
class KokoroConfig:
    """Kokoro-82M v1.0's shapes (its config.json)."""

    n_token: int = 178
    hidden_dim: int = 512
    style_dim: int = 128
    n_layer: int = 3
    max_dur: int = 50
    n_mels: int = 80
    text_encoder_kernel_size: int = 5
    albert: AlbertConfig = field(default_factory=AlbertConfig)
    istft: IstftConfig = field(default_factory=IstftConfig)

    @property
    def frame_samples(self) -> int:
        """Samples per duration frame: the decoder's upsampling by 2, the generator's, the
        iSTFT hop (2 x 10 x 6 x 5 = 600, 25 ms)."""
        return 2 * math.prod(self.istft.upsample_rates) * self.istft.hop

    @classmethod
    def from_json(cls, config: dict) -> KokoroConfig:
        """From the official config.json's fields."""
        ist, bert = config["istftnet"], config["plbert"]
        return cls(
            n_token=config["n_token"], hidden_dim=config["hidden_dim"], style_dim=config["style_dim"],
            n_layer=config["n_layer"], max_dur=config["max_dur"], n_mels=config["n_mels"],
            text_encoder_kernel_size=config["text_encoder_kernel_size"],
            albert=AlbertConfig(
                vocab_size=config["n_token"], hidden_size=bert["hidden_size"],
                num_attention_heads=bert["num_attention_heads"], intermediate_size=bert["intermediate_size"],
                max_position_embeddings=bert["max_position_embeddings"], num_hidden_layers=bert["num_hidden_layers"],
            ),
            istft=IstftConfig(
                upsample_rates=tuple(ist["upsample_rates"]), upsample_kernel_sizes=tuple(ist["upsample_kernel_sizes"]),
                upsample_initial_channel=ist["upsample_initial_channel"],
                resblock_kernel_sizes=tuple(ist["resblock_kernel_sizes"]),
                resblock_dilation_sizes=tuple(tuple(d) for d in ist["resblock_dilation_sizes"]),
                n_fft=ist["gen_istft_n_fft"], hop=ist["gen_istft_hop_size"],
            ),
        )


# --- ALBERT (PL-BERT): one transformer layer whose weights all 12 passes share ---------------


class _AlbertEmbeddings(nn.Module):
    def __init__(self, cfg: AlbertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.embedding_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.embedding_size)
        self.token_type_embeddings = nn.Embedding(2, cfg.embedding_size)
        self.LayerNorm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class _AlbertAttention(nn.Module):
    def __init__(self, cfg: AlbertConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        context = F.scaled_dot_product_attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)))
        return self.LayerNorm(x + self.dense(context.transpose(1, 2).reshape(b, t, c)))


class _AlbertLayer(nn.Module):
    def __init__(self, cfg: AlbertConfig) -> None:
        super().__init__()
        self.attention = _AlbertAttention(cfg)
        self.ffn = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_output = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.full_layer_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return self.full_layer_layer_norm(x + self.ffn_output(F.gelu(self.ffn(x), approximate="tanh")))


class _AlbertGroup(nn.Module):
    def __init__(self, cfg: AlbertConfig) -> None:
        super().__init__()
        self.albert_layers = nn.ModuleList([_AlbertLayer(cfg)])

    @property
    def layer(self) -> _AlbertLayer:
        return cast(_AlbertLayer, self.albert_layers[0])


class _AlbertEncoder(nn.Module):
    def __init__(self, cfg: AlbertConfig) -> None:
        super().__init__()
        self.passes = cfg.num_hidden_layers
        self.embedding_hidden_mapping_in = nn.Linear(cfg.embedding_size, cfg.hidden_size)
        self.albert_layer_groups = nn.ModuleList([_AlbertGroup(cfg)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embedding_hidden_mapping_in(x)
        layer = cast(_AlbertGroup, self.albert_layer_groups[0]).layer
        for _ in range(self.passes):
            x = layer(x)
        return x


class Albert(nn.Module):
    """One segment at a time, so no attention mask: a segment is never padded."""

    def __init__(self, cfg: AlbertConfig) -> None:
        super().__init__()
        self.embeddings = _AlbertEmbeddings(cfg)
        self.encoder = _AlbertEncoder(cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embeddings(ids))


# --- Style-conditioned normalisation and residual blocks ---------------------------------------


class ChannelNorm(nn.Module):
    """Layer norm over channels of a (B, C, T) tensor (StyleTTS2's ``LayerNorm``)."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.transpose(1, -1), self.gamma.shape, self.gamma, self.beta, self.eps).transpose(1, -1)


class AdaLayerNorm(nn.Module):
    """Layer norm over channels of (B, T, C), scaled and shifted by the style."""

    def __init__(self, style_dim: int, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.channels, self.eps = channels, eps
        self.fc = nn.Linear(style_dim, channels * 2)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(s).unsqueeze(1).chunk(2, dim=-1)
        return (1 + gamma) * F.layer_norm(x, (self.channels,), eps=self.eps) + beta


class AdaIN1d(nn.Module):
    """Instance norm over time, scaled and shifted by the style. Its statistics are the
    whole input's: a window of a segment is normalised by the window's own (see
    ``Generator.window``)."""

    def __init__(self, style_dim: int, channels: int) -> None:
        super().__init__()
        self.norm = nn.InstanceNorm1d(channels, affine=True)
        self.fc = nn.Linear(style_dim, channels * 2)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(s).unsqueeze(-1).chunk(2, dim=1)
        return (1 + gamma) * self.norm(x) + beta


class AdainResBlk1d(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, style_dim: int, upsample: bool = False) -> None:
        super().__init__()
        self.upsample = upsample
        self.conv1 = nn.Conv1d(dim_in, dim_out, 3, 1, 1)
        self.conv2 = nn.Conv1d(dim_out, dim_out, 3, 1, 1)
        self.norm1 = AdaIN1d(style_dim, dim_in)
        self.norm2 = AdaIN1d(style_dim, dim_out)
        self.conv1x1 = nn.Conv1d(dim_in, dim_out, 1, 1, 0, bias=False) if dim_in != dim_out else None
        self.pool = (nn.ConvTranspose1d(dim_in, dim_in, 3, 2, groups=dim_in, padding=1, output_padding=1)
                     if upsample else None)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        y = F.leaky_relu(self.norm1(x, s), 0.2)
        if self.pool is not None:
            y = self.pool(y)
        y = self.conv2(F.leaky_relu(self.norm2(self.conv1(y), s), 0.2))
        shortcut = F.interpolate(x, scale_factor=2.0, mode="nearest") if self.upsample else x
        if self.conv1x1 is not None:
            shortcut = self.conv1x1(shortcut)
        return (y + shortcut) * (1 / math.sqrt(2))


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return x + (1 / alpha) * torch.sin(alpha * x) ** 2


class AdaINResBlock1(nn.Module):
    """The generator's residual block: style-normalised, snake-activated dilated convs."""

    def __init__(self, channels: int, kernel_size: int, dilation: tuple[int, ...], style_dim: int) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList([
            nn.Conv1d(channels, channels, kernel_size, 1, dilation=d, padding=(kernel_size - 1) * d // 2)
            for d in dilation
        ])
        self.convs2 = nn.ModuleList([
            nn.Conv1d(channels, channels, kernel_size, 1, padding=(kernel_size - 1) // 2) for _ in dilation
        ])
        self.adain1 = nn.ModuleList([AdaIN1d(style_dim, channels) for _ in dilation])
        self.adain2 = nn.ModuleList([AdaIN1d(style_dim, channels) for _ in dilation])
        self.alpha1 = nn.ParameterList([nn.Parameter(torch.ones(1, channels, 1)) for _ in dilation])
        self.alpha2 = nn.ParameterList([nn.Parameter(torch.ones(1, channels, 1)) for _ in dilation])

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        for c1, c2, n1, n2, a1, a2 in zip(self.convs1, self.convs2, self.adain1, self.adain2, self.alpha1, self.alpha2):
            y = c1(_snake(n1(x, s), a1))
            x = x + c2(_snake(n2(y, s), a2))
        return x


# --- Text and prosody ---------------------------------------------------------------------------


class TextEncoder(nn.Module):
    def __init__(self, channels: int, kernel_size: int, depth: int, n_symbols: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_symbols, channels)
        self.cnn = nn.ModuleList([
            nn.Sequential(nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2),
                          ChannelNorm(channels), nn.LeakyReLU(0.2), nn.Dropout(0.2))
            for _ in range(depth)
        ])
        self.lstm = nn.LSTM(channels, channels // 2, 1, batch_first=True, bidirectional=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids).transpose(1, 2)
        for block in self.cnn:
            x = block(x)
        return self.lstm(x.transpose(1, 2))[0].transpose(1, 2)


class DurationEncoder(nn.Module):
    """LSTMs alternating with style-conditioned layer norms, the style concatenated to
    every layer's input."""

    def __init__(self, style_dim: int, d_model: int, n_layers: int) -> None:
        super().__init__()
        self.lstms = nn.ModuleList()
        for _ in range(n_layers):
            self.lstms.append(nn.LSTM(d_model + style_dim, d_model // 2, 1, batch_first=True, bidirectional=True))
            self.lstms.append(AdaLayerNorm(style_dim, d_model))

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """(B, d_model, T) text features -> (B, T, d_model + style_dim)."""
        style = s.unsqueeze(1).expand(-1, x.shape[2], -1)
        x = torch.cat([x.transpose(1, 2), style], dim=-1)
        for block in self.lstms:
            if isinstance(block, AdaLayerNorm):
                x = torch.cat([block(x, s), style], dim=-1)
            else:
                x = block(x)[0]
        return x


class _Linear(nn.Module):
    """A Linear under the name StyleTTS2's ``LinearNorm`` gives it."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.linear_layer = nn.Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_layer(x)


class ProsodyPredictor(nn.Module):
    def __init__(self, style_dim: int, d_hid: int, n_layers: int, max_dur: int) -> None:
        super().__init__()
        self.text_encoder = DurationEncoder(style_dim, d_hid, n_layers)
        self.lstm = nn.LSTM(d_hid + style_dim, d_hid // 2, 1, batch_first=True, bidirectional=True)
        self.duration_proj = _Linear(d_hid, max_dur)
        self.shared = nn.LSTM(d_hid + style_dim, d_hid // 2, 1, batch_first=True, bidirectional=True)
        half = d_hid // 2
        self.F0 = nn.ModuleList([AdainResBlk1d(d_hid, d_hid, style_dim), AdainResBlk1d(d_hid, half, style_dim, True),
                                 AdainResBlk1d(half, half, style_dim)])
        self.N = nn.ModuleList([AdainResBlk1d(d_hid, d_hid, style_dim), AdainResBlk1d(d_hid, half, style_dim, True),
                                AdainResBlk1d(half, half, style_dim)])
        self.F0_proj = nn.Conv1d(half, 1, 1)
        self.N_proj = nn.Conv1d(half, 1, 1)

    def curves(self, en: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """F0 and energy at twice the frame rate, from (B, C, frames) aligned features."""
        x = self.shared(en.transpose(1, 2))[0].transpose(1, 2)
        f0, n = x, x
        for block in self.F0:
            f0 = block(f0, s)
        for block in self.N:
            n = block(n, s)
        return self.F0_proj(f0).squeeze(1), self.N_proj(n).squeeze(1)


# --- The decoder: frame-rate blocks, then the iSTFTNet generator ---------------------------------


class _SourceLinear(nn.Module):
    """The harmonic source's merge of its sines (named as ``m_source``'s ``l_linear``)."""

    def __init__(self, harmonics: int) -> None:
        super().__init__()
        self.l_linear = nn.Linear(harmonics, 1)


class Generator(nn.Module):
    window: torch.Tensor
    HARMONICS = 9  # the fundamental and 8 overtones
    SINE_AMP, NOISE_STD, VOICED_THRESHOLD = 0.1, 0.003, 10.0

    def __init__(self, cfg: IstftConfig, style_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.upsample = math.prod(cfg.upsample_rates) * cfg.hop  # samples per input frame
        self.m_source = _SourceLinear(self.HARMONICS)
        self.ups = nn.ModuleList()
        self.noise_convs = nn.ModuleList()
        self.noise_res = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = cfg.upsample_initial_channel
        for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
            ch = cfg.upsample_initial_channel // 2 ** (i + 1)
            self.ups.append(nn.ConvTranspose1d(2 * ch, ch, k, u, padding=(k - u) // 2))
            for k_r, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(AdaINResBlock1(ch, k_r, d, style_dim))
            if i + 1 < len(cfg.upsample_rates):
                stride = math.prod(cfg.upsample_rates[i + 1:])
                self.noise_convs.append(nn.Conv1d(cfg.n_fft + 2, ch, stride * 2, stride, padding=(stride + 1) // 2))
                self.noise_res.append(AdaINResBlock1(ch, 7, (1, 3, 5), style_dim))
            else:
                self.noise_convs.append(nn.Conv1d(cfg.n_fft + 2, ch, 1))
                self.noise_res.append(AdaINResBlock1(ch, 11, (1, 3, 5), style_dim))
        self.conv_post = nn.Conv1d(ch, cfg.n_fft + 2, 7, 1, padding=3)
        self.register_buffer("window", torch.hann_window(cfg.n_fft), persistent=False)

    def source(self, f0: torch.Tensor, generator: torch.Generator | None = None, noise: bool = True) -> torch.Tensor:
        """The harmonic source's spectrum (B, n_fft + 2, frames x upsample / hop + 1) for a
        whole segment's F0 curve (B, frames), as Kokoro's SineGen makes it, its random
        draws (harmonics' start phases, then noise) in the same order and shapes: the
        oracle's audio, given the same seed (``noise=False``: no noise, the sines alone).
        The engine uses ``source_window``."""
        b, n = f0.shape
        f0 = f0.repeat_interleave(self.upsample, dim=1).unsqueeze(-1)  # (B, samples, 1)
        fn = f0 * torch.arange(1, self.HARMONICS + 1, device=f0.device, dtype=f0.dtype)
        rad = (fn / SAMPLE_RATE) % 1
        start = torch.rand(b, self.HARMONICS, device=f0.device, generator=generator)
        start[:, 0] = 0
        rad[:, 0, :] = rad[:, 0, :] + start
        # The phase is integrated at frame rate and interpolated back, as Kokoro does.
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / self.upsample, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * torch.pi
        phase = F.interpolate(phase.transpose(1, 2) * self.upsample, scale_factor=self.upsample, mode="linear")
        uv = (f0 > self.VOICED_THRESHOLD).to(f0.dtype)
        # Drawn into a (B, samples, harmonics) view of (B, harmonics, samples) storage, as
        # Kokoro's randn_like draws for its sines (a transposed view): torch fills a
        # non-contiguous tensor in another order than a contiguous one.
        draws = torch.empty(phase.shape, device=f0.device, dtype=f0.dtype).transpose(1, 2)
        draws = draws.normal_(generator=generator) if noise else draws.zero_()
        sines = self._excitation(phase.transpose(1, 2), uv, draws)
        spec = torch.stft(sines, self.cfg.n_fft, self.cfg.hop, self.cfg.n_fft, window=self.window, return_complex=True)
        return torch.cat([spec.abs(), spec.angle()], dim=1)

    def frame_phase(self, f0: torch.Tensor) -> torch.Tensor:
        """Each harmonic's phase at each frame of a whole segment, (B, frames, harmonics):
        what ``source`` integrates (the start phase it draws is lost to its interpolation,
        which never reads the first sample), so that ``source_window`` can start anywhere."""
        fn = f0.unsqueeze(-1) * torch.arange(1, self.HARMONICS + 1, device=f0.device, dtype=f0.dtype)
        return torch.cumsum((fn / SAMPLE_RATE) % 1, dim=1) * 2 * torch.pi

    def source_window(self, f0: torch.Tensor, phase: torch.Tensor, lo: int, hi: int,
                      generator: torch.Generator | None = None, noise: bool = True) -> torch.Tensor:
        """``source``'s spectrum for frames [lo, hi) of a segment, (B, n_fft + 2,
        (hi - lo) x upsample / hop + 1), from the segment's F0 and ``frame_phase``: the same
        sines sample for sample, its own noise draws (``noise=False``: none)."""
        n, pad, up = f0.shape[1], self.cfg.n_fft // 2, self.upsample
        first, last = max(0, lo * up - pad), min(n * up, hi * up + pad)  # the STFT's margin, within the segment
        i = torch.arange(first, last, device=f0.device)
        # Kokoro's linear interpolation (align_corners=False) of the frame phase, times up.
        x = ((i + 0.5) / up - 0.5).clamp(min=0)
        i0 = x.floor().long().clamp(max=n - 1)
        i1 = (i0 + 1).clamp(max=n - 1)
        w = (x - i0).unsqueeze(-1).to(phase.dtype)
        sample_phase = (phase[:, i0] * up) * (1 - w) + (phase[:, i1] * up) * w
        f0_samples = f0[:, i // up].unsqueeze(-1)
        uv = (f0_samples > self.VOICED_THRESHOLD).to(f0.dtype)
        draws = (torch.randn(sample_phase.shape, device=f0.device, generator=generator, dtype=f0.dtype) if noise
                 else torch.zeros_like(sample_phase))
        sines = self._excitation(sample_phase, uv, draws)
        # At the segment's ends, the reflection torch.stft pads with; inside, real samples.
        sines = F.pad(sines.unsqueeze(1), (first - (lo * up - pad), (hi * up + pad) - last), mode="reflect").squeeze(1)
        spec = torch.stft(sines, self.cfg.n_fft, self.cfg.hop, self.cfg.n_fft, window=self.window, center=False,
                          return_complex=True)
        return torch.cat([spec.abs(), spec.angle()], dim=1)

    def _excitation(self, phase: torch.Tensor, uv: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The merged excitation (B, samples): voiced sines plus noise, unvoiced noise."""
        noise_amp = uv * self.NOISE_STD + (1 - uv) * self.SINE_AMP / 3
        sines = torch.sin(phase) * self.SINE_AMP * uv + noise_amp * noise
        # float32 under autocast too: in bf16 this merge alone took the decoder's audio
        # from 32 dB of float32's to 26 (engine/kokoro/engine.py's precision note).
        with torch.autocast(phase.device.type, enabled=False):
            return torch.tanh(self.m_source.l_linear(sines.float())).squeeze(-1)

    def forward(self, x: torch.Tensor, s: torch.Tensor, har: torch.Tensor) -> torch.Tensor:
        """Audio (B, frames x upsample) for decoder features x (B, C, frames) and the
        matching span of ``source``'s spectrum (B, n_fft + 2, frames x upsample / hop + 1).
        A window of a segment gives that window's samples: every layer is aligned so that
        frame f's samples are f x upsample onwards; only its edges (zero-padded where the
        segment has neighbours) and its norms' statistics differ from the whole's."""
        kernels = len(self.cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = F.leaky_relu(x, 0.1)
            source = self.noise_res[i](self.noise_convs[i](har), s)
            x = up(x)
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + source
            x = sum(self.resblocks[i * kernels + j](x, s) for j in range(kernels)) / kernels
        # The head computes in float32 whatever the body did (bf16 under autocast): torch
        # has no bf16 complex product for the spectrum below, and what this convolution
        # gives is every bin's log magnitude and phase, which exp magnifies.
        with torch.autocast(x.device.type, enabled=False):
            x = self.conv_post(F.leaky_relu(x.float(), 0.01))
        half = self.cfg.n_fft // 2 + 1
        spec = torch.exp(x[:, :half]) * torch.exp(1j * torch.sin(x[:, half:]))
        return torch.istft(spec, self.cfg.n_fft, self.cfg.hop, self.cfg.n_fft, window=self.window)


class Decoder(nn.Module):
    def __init__(self, dim_in: int, style_dim: int, cfg: IstftConfig) -> None:
        super().__init__()
        self.encode = AdainResBlk1d(dim_in + 2, 1024, style_dim)
        self.decode = nn.ModuleList([AdainResBlk1d(1024 + 2 + 64, 1024, style_dim) for _ in range(3)]
                                    + [AdainResBlk1d(1024 + 2 + 64, 512, style_dim, upsample=True)])
        self.F0_conv = nn.Conv1d(1, 1, 3, 2, padding=1)
        self.N_conv = nn.Conv1d(1, 1, 3, 2, padding=1)
        self.asr_res = nn.Sequential(nn.Conv1d(512, 64, 1))
        self.generator = Generator(cfg, style_dim)

    def features(self, asr: torch.Tensor, f0: torch.Tensor, n: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The generator's input (B, 512, 2 x frames) for a whole segment: aligned text
        features (B, 512, frames) and the F0 and energy curves (B, 2 x frames)."""
        f0, n = self.F0_conv(f0.unsqueeze(1)), self.N_conv(n.unsqueeze(1))
        x = self.encode(torch.cat([asr, f0, n], dim=1), s)
        residual = self.asr_res(asr)
        for block in self.decode:  # each sees the inputs again (the upsampling one is last)
            x = block(torch.cat([x, residual, f0, n], dim=1), s)
        return x


@dataclass
class Prosody:
    """A segment's timing and the decoder's inputs, computed once for the whole segment."""

    durations: torch.Tensor
    """Frames per token (pads included), long."""
    asr: torch.Tensor
    """Aligned text features, (1, 512, frames)."""
    f0: torch.Tensor
    """(1, 2 x frames): the generator's frame rate."""
    energy: torch.Tensor
    """(1, 2 x frames)."""


class Kokoro(nn.Module):
    def __init__(self, cfg: KokoroConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bert = Albert(cfg.albert)
        self.bert_encoder = nn.Linear(cfg.albert.hidden_size, cfg.hidden_dim)
        self.predictor = ProsodyPredictor(cfg.style_dim, cfg.hidden_dim, cfg.n_layer, cfg.max_dur)
        self.text_encoder = TextEncoder(cfg.hidden_dim, cfg.text_encoder_kernel_size, cfg.n_layer, cfg.n_token)
        self.decoder = Decoder(cfg.hidden_dim, cfg.style_dim, cfg.istft)

    @torch.inference_mode()
    def prosody(self, ids: torch.Tensor, style: torch.Tensor, speed: float = 1.0) -> Prosody:
        """Durations, F0, energy and aligned text for one segment: ids (1, N) with the two
        pads, style (1, 256): the decoder's half, then the prosody's."""
        s = style[:, self.cfg.style_dim:]
        d = self.predictor.text_encoder(self.bert_encoder(self.bert(ids)).transpose(1, 2), s)
        logits = self.predictor.duration_proj(self.predictor.lstm(d)[0])
        durations = (torch.sigmoid(logits).sum(-1) / speed).round().clamp(min=1).long()[0]
        f0, energy = self.predictor.curves(d.transpose(1, 2).repeat_interleave(durations, dim=2), s)
        return Prosody(durations, self.text_encoder(ids).repeat_interleave(durations, dim=2), f0, energy)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, style: torch.Tensor, speed: float = 1.0,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole segment at once, as the official model computes it: (audio (samples,),
        durations)."""
        p = self.prosody(ids, style, speed)
        s = style[:, :self.cfg.style_dim]
        gen = self.decoder.generator
        audio = gen(self.decoder.features(p.asr, p.f0, p.energy, s), s, gen.source(p.f0, generator))
        return audio[0], p.durations
