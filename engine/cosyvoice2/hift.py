"""HiFT vocoder: mel -> 24 kHz audio (neural source filter + iSTFT head).

    mel -> F0 predictor -> harmonic sine source (NSF) --STFT--> fused into
    mel -> conv_pre -> [up-sample x8, x5, x3 + ResBlocks] -> conv_post -> (mag, phase)
        -> iSTFT (n_fft 16, hop 4)

Weight norm is folded into plain weights at load time (``weights.py``); module
names otherwise follow the reference ``HiFTGenerator``. :class:`VocoderStream`
vocodes chunk by chunk: the vocoder is not causal, so each window starts 8 frames
back (the reference's ``mel_cache_len``), those 8 frames of audio are cross-faded
with the previous window's withheld tail, and the source keeps its phase and noise
across windows so that the two overlapping renderings agree.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model_config import HiFTConfig


def _padding(kernel: int, dilation: int = 1) -> int:
    return (kernel * dilation - dilation) // 2


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        a = self.alpha.view(1, -1, 1)
        return x + (1.0 / (a + 1e-9)) * torch.sin(x * a).pow(2)


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=_padding(kernel, d)) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, padding=_padding(kernel)) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + c2(a2(c1(a1(x))))
        return x


class F0Predictor(nn.Module):
    """Five conv+ELU layers and a linear head: |f0| in Hz per mel frame."""

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = cfg.f0_in_channels
        for _ in range(5):
            layers += [nn.Conv1d(cin, cfg.f0_cond_channels, 3, padding=1), nn.ELU()]
            cin = cfg.f0_cond_channels
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cfg.f0_cond_channels, cfg.f0_num_class)

    def forward(self, mel: Tensor) -> Tensor:
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


class SourceModule(nn.Module):
    """Harmonic-plus-noise source (the reference's SourceModuleHnNSF2 with SineGen2).

    Phase is integrated at frame rate and linearly interpolated to samples, which
    is what makes a window's source depend only on its own frames plus one
    (``phase_before``: the running phase sum, carried across windows)."""

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)

    def forward(self, f0: Tensor, noise: Tensor, phase_before: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """f0: (B, T) Hz; noise: (B, T*scale, H+1) standard normal.
        Returns the source (B, 1, T*scale) and the running phase sum per frame (B, T, H+1)."""
        c, scale = self.cfg, self.cfg.upsample_scale
        harmonics = torch.arange(1, c.nb_harmonics + 2, device=f0.device, dtype=f0.dtype)
        rad = (f0.unsqueeze(-1) * harmonics / c.sampling_rate) % 1  # cycles per sample
        cum = torch.cumsum(rad, dim=1)
        if phase_before is not None:
            cum = cum + phase_before.unsqueeze(1)
        phase = F.interpolate(cum.transpose(1, 2) * 2 * np.pi * scale, scale_factor=float(scale), mode="linear")
        sines = torch.sin(phase.transpose(1, 2)) * c.nsf_alpha
        uv = (f0 > c.nsf_voiced_threshold).float().repeat_interleave(scale, dim=1).unsqueeze(-1)
        noise_amp = uv * c.nsf_sigma + (1 - uv) * c.nsf_alpha / 3
        waves = sines * uv + noise_amp * noise
        return torch.tanh(self.l_linear(waves)).transpose(1, 2), cum


class HiFTGenerator(nn.Module):
    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        base, n_fft = cfg.base_channels, cfg.n_fft
        self.m_source = SourceModule(cfg)
        self.conv_pre = nn.Conv1d(cfg.in_channels, base, 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(base // 2**i, base // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes))
        )
        # The source enters at every resolution, down-sampled to match.
        down = np.cumprod([1, *cfg.upsample_rates[::-1][:-1]])[::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k, d) in enumerate(zip(down, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
            ch, u = base // 2 ** (i + 1), int(u)
            conv = nn.Conv1d(n_fft + 2, ch, 1) if u == 1 else nn.Conv1d(n_fft + 2, ch, u * 2, u, padding=u // 2)
            self.source_downs.append(conv)
            self.source_resblocks.append(ResBlock(ch, k, tuple(d)))
        self.resblocks = nn.ModuleList(
            ResBlock(base // 2 ** (i + 1), k, tuple(d))
            for i in range(len(self.ups))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
        )
        self.conv_post = nn.Conv1d(base // 2 ** len(self.ups), n_fft + 2, 7, padding=3)
        self.f0_predictor = F0Predictor(cfg)
        self.register_buffer("window", torch.hann_window(n_fft, periodic=True), persistent=False)

    def decode(self, mel: Tensor, source: Tensor) -> Tensor:
        """mel (B, 80, T), source (B, 1, T*scale) -> audio (B, T*scale)."""
        c = self.cfg
        spec = torch.stft(source.squeeze(1), c.n_fft, c.hop_len, c.n_fft, window=self.window, return_complex=True)
        s = torch.cat([spec.real, spec.imag], dim=1)
        x = self.conv_pre(mel)
        k = len(c.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, c.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s))
            x = sum(self.resblocks[i * k + j](x) for j in range(k)) / k
        x = self.conv_post(F.leaky_relu(x))
        half = c.n_fft // 2 + 1
        magnitude = torch.exp(x[:, :half]).clamp(max=1e2)
        phase = torch.sin(x[:, half:])  # the reference's (redundant) sin
        audio = torch.istft(torch.polar(magnitude, phase), c.n_fft, c.hop_len, c.n_fft, window=self.window)
        return audio.clamp(-c.audio_limit, c.audio_limit)

    @torch.inference_mode()
    def inference(self, mel: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """One shot: (audio, source). Noise is drawn in the reference's order."""
        f0 = self.f0_predictor(mel)
        scale, h = self.cfg.upsample_scale, self.cfg.nb_harmonics + 1
        # The reference draws initial phases first; they vanish in the frame-rate
        # integration, but drawing them keeps the noise identical for a given seed.
        torch.rand(mel.shape[0], h, generator=generator, device=mel.device)
        # The reference's randn_like fills a transposed (harmonic-major) tensor, which
        # torch does element by element: same layout, same values for the same seed.
        noise = torch.empty(mel.shape[0], h, f0.shape[1] * scale, device=mel.device).transpose(1, 2)
        noise.normal_(generator=generator)
        source, _ = self.m_source(f0, noise)
        return self.decode(mel, source), source


def fades(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Complementary raised-cosine fades (they sum to exactly 1)."""
    w = torch.sin(0.5 * math.pi * (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n) ** 2
    return w, 1.0 - w


class VocoderStream:
    """Vocodes one utterance's mel as it arrives (batch of 1, fp32)."""

    OVERLAP = 8  # mel frames re-rendered and cross-faded at each seam (reference: mel_cache_len)
    F0_CONTEXT = 6  # the F0 predictor's reach (5 convs of 3) + 1 frame for phase interpolation

    def __init__(self, hift: HiFTGenerator, generator: torch.Generator | None = None) -> None:
        self.hift, self.generator = hift, generator
        self.device = hift.conv_pre.weight.device
        self.scale = hift.cfg.upsample_scale
        self.harmonics = hift.cfg.nb_harmonics + 1
        self.mel = torch.zeros(1, hift.cfg.in_channels, 0, device=self.device)  # recent frames
        self.mel_start = 0  # absolute index of self.mel's first frame
        self.emitted = 0  # frames whose audio is out
        self.phase_before: Tensor | None = None  # running phase sum through frame emitted-2
        self.noise = torch.zeros(1, 0, self.harmonics, device=self.device)  # for frames [emitted, end)
        self.tail: Tensor | None = None  # withheld audio of frames [emitted, end)
        self.fade_in, self.fade_out = fades(self.OVERLAP * self.scale, self.device)

    @torch.inference_mode()
    def push(self, mel: Tensor, final: bool = False) -> Tensor:
        """Add mel frames (1, 80, n); return the audio (samples,) now final."""
        mel = mel.to(self.device, torch.float32)
        self.mel = torch.cat([self.mel, mel], dim=2)
        end = self.mel_start + self.mel.shape[2]
        a = self.emitted  # this window renders frames [a, end)
        if end == a:
            return torch.zeros(0, device=self.device)
        f0_from = max(0, a - self.F0_CONTEXT)
        f0 = self.hift.f0_predictor(self.mel[:, :, f0_from - self.mel_start :])
        # Phase: integrate from frame a-1 (one frame early, so interpolation at the
        # window's left edge sees a real neighbour), continuing the carried sum.
        ph_from = max(0, a - 1)
        fresh = torch.randn(1, mel.shape[2] * self.scale, self.harmonics, generator=self.generator, device=self.device)
        noise = torch.cat([self.noise, fresh], dim=1)  # the overlap reuses its noise
        pad = (a - ph_from) * self.scale
        noise = F.pad(noise, (0, 0, pad, 0))
        source, cum = self.hift.m_source(f0[:, ph_from - f0_from :], noise, self.phase_before)
        source = source[:, :, pad:]
        audio = self.hift.decode(self.mel[:, :, a - self.mel_start :], source)[0]
        if self.tail is not None:
            n = self.tail.shape[0]
            audio[:n] = audio[:n] * self.fade_in[:n] + self.tail * self.fade_out[:n]
        if final:
            self.emitted, self.tail = end, None
            return audio
        keep_from = max(a, end - self.OVERLAP)
        cut = (keep_from - a) * self.scale
        out, self.tail = audio[:cut], audio[cut:]
        # Carry state for the next window, which renders from keep_from.
        if keep_from - 2 >= ph_from:
            self.phase_before = cum[:, keep_from - 2 - ph_from] % 1
        self.noise = noise[:, pad + cut :]
        self.emitted = keep_from
        drop = max(0, (keep_from - self.F0_CONTEXT) - self.mel_start)
        self.mel, self.mel_start = self.mel[:, :, drop:], self.mel_start + drop
        return out
