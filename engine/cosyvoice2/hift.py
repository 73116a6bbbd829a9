"""HiFT vocoder: mel -> 24 kHz audio (neural source filter + iSTFT head).

    mel -> F0 predictor -> harmonic sine source (NSF) --STFT--> fused into
    mel -> conv_pre -> [up-sample x8, x5, x3 + ResBlocks] -> conv_post -> (mag, phase)
        -> iSTFT (n_fft 16, hop 4)

Weight norm is folded into plain weights at load time (``weights.py``); module
names otherwise follow the reference ``HiFTGenerator``. By default the engine vocodes
chunk by chunk with the pinned reference's seams (:class:`OfficialVocoderStream`). The
project's own, an option measured closer to one-shot vocoding, is :class:`VocoderStream`:
the vocoder is not causal, so each window starts 8 frames back (the reference's
``mel_cache_len``), those 8 frames of audio are cross-faded with the previous window's
withheld tail, and the source keeps its phase and noise across windows so that the two
overlapping renderings agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

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
    window: torch.Tensor  # a buffer (register_buffer), which nn.Module's typing cannot see

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
        window = self.prepare(mel, final)
        if window is None:
            return torch.zeros(0, device=self.device)
        return self.finish(window, render(self.hift, [window])[0])

    def prepare(self, mel: Tensor, final: bool = False) -> Window | None:
        """Take in mel frames (1, 80, n) and draw this window's noise: the inputs of the
        window to render now, or None when there is nothing to render. ``render`` then
        vocodes many streams' windows in one batch, and ``finish`` takes the audio."""
        mel = mel.to(self.device, torch.float32)
        self.mel = torch.cat([self.mel, mel], dim=2)
        end = self.mel_start + self.mel.shape[2]
        a = self.emitted  # this window renders frames [a, end)
        if end == a:
            return None
        f0_from = max(0, a - self.F0_CONTEXT)
        # Phase: integrate from frame a-1 (one frame early, so interpolation at the
        # window's left edge sees a real neighbour), continuing the carried sum.
        ph_from = max(0, a - 1)
        fresh = torch.randn(1, mel.shape[2] * self.scale, self.harmonics, generator=self.generator, device=self.device)
        noise = torch.cat([self.noise, fresh], dim=1)  # the overlap reuses its noise
        pad = (a - ph_from) * self.scale
        noise = F.pad(noise, (0, 0, pad, 0))
        return Window(
            f0_mel=self.mel[:, :, f0_from - self.mel_start :],
            f0_skip=ph_from - f0_from,
            noise=noise,
            phase_before=self.phase_before,
            pad=pad,
            mel=self.mel[:, :, a - self.mel_start :],
            start=a,
            ph_from=ph_from,
            end=end,
            final=final,
        )

    def finish(self, w: Window, audio: Tensor) -> Tensor:
        """Cross-fade the rendered window (samples,) with the last one's tail; carry the
        state the next window needs; return the audio now final."""
        a, end = w.start, w.end
        if self.tail is not None:
            n = self.tail.shape[0]
            audio[:n] = audio[:n] * self.fade_in[:n] + self.tail * self.fade_out[:n]
        if w.final:
            self.emitted, self.tail = end, None
            return audio
        keep_from = max(a, end - self.OVERLAP)
        cut = (keep_from - a) * self.scale
        out, self.tail = audio[:cut], audio[cut:]
        # Carry state for the next window, which renders from keep_from.
        if keep_from - 2 >= w.ph_from:
            if w.cum is None:
                raise ValueError("finish takes a rendered window: this one has no phase sum")
            self.phase_before = w.cum[:, keep_from - 2 - w.ph_from] % 1
        self.noise = w.noise[:, w.pad + cut :]
        self.emitted = keep_from
        drop = max(0, (keep_from - self.F0_CONTEXT) - self.mel_start)
        self.mel, self.mel_start = self.mel[:, :, drop:], self.mel_start + drop
        return out

    @classmethod
    def state_bound(cls, hift: HiFTGenerator, chunk_frames: int) -> int:
        """The most ``state_bytes`` can be when no window exceeds ``chunk_frames`` new frames:
        mel, per-sample noise and audio of the carried frames, fp32."""
        scale, harmonics = hift.cfg.upsample_scale, hift.cfg.nb_harmonics + 1
        frames = cls.OVERLAP + cls.F0_CONTEXT + chunk_frames
        return frames * 4 * (hift.cfg.in_channels + scale * (harmonics + 1))

    def state_bytes(self) -> int:
        """What the stream holds between windows (a few frames of mel, noise and audio)."""
        held = [self.mel, self.noise] + ([] if self.tail is None else [self.tail])
        return sum(t.numel() * t.element_size() for t in held)


@dataclass
class Window:
    """One stream's vocoder window: its inputs (``prepare``) and its phase sum (``render``)."""

    f0_mel: Tensor  # (1, 80, n_f0): the window plus the F0 predictor's left context
    f0_skip: int  # F0 frames before the phase integration starts
    noise: Tensor  # (1, samples, harmonics)
    phase_before: Tensor | None
    pad: int  # noise samples before the window proper
    mel: Tensor  # (1, 80, n): the frames rendered
    start: int
    ph_from: int
    end: int
    final: bool
    cum: Tensor | None = None

    def shape_key(self) -> tuple[int, ...]:
        return (self.f0_mel.shape[2], self.f0_skip, self.noise.shape[1], self.pad, self.mel.shape[2])


class OfficialVocoderStream:
    """Vocodes one utterance's mel with the pinned CosyVoice2Model's seams (ace7c47,
    ``token2wav``): each window is the last window's final 8 mel frames plus the new
    ones; F0 is predicted on the window only; the window's source is drawn afresh and
    its first 8 frames' worth is overwritten by the last window's source there; the
    first 8 frames of audio are cross-faded with the last window's withheld tail by a
    Hamming window (``fade_in_out``). Noise is drawn in the reference's order, from this
    stream's generator (the reference uses torch's global one)."""

    MEL_CACHE = 8  # the reference's mel_cache_len

    def __init__(self, hift: HiFTGenerator, generator: torch.Generator | None = None) -> None:
        self.hift, self.generator = hift, generator
        self.device = hift.conv_pre.weight.device
        self.scale = hift.cfg.upsample_scale
        self.harmonics = hift.cfg.nb_harmonics + 1
        self.cache_len = self.MEL_CACHE * self.scale  # source_cache_len
        # np.hamming in float64, as the reference multiplies by the numpy window.
        w = torch.from_numpy(np.hamming(2 * self.cache_len))
        self.fade_in, self.fade_out = w[: self.cache_len], w[self.cache_len :]
        self.cache: tuple[Tensor, Tensor, Tensor] | None = None  # mel, source, speech

    @torch.inference_mode()
    def push(self, mel: Tensor, final: bool = False) -> Tensor:
        window = self.prepare(mel, final)
        if window is None:
            return torch.zeros(0, device=self.device)
        return self.finish(window, render(self.hift, [window])[0])

    def prepare(self, mel: Tensor, final: bool = False) -> SeamWindow | None:
        mel = mel.to(self.device, torch.float32)
        cache_source = None
        if self.cache is not None:
            mel = torch.cat([self.cache[0], mel], dim=2)
            cache_source = self.cache[1]
        if mel.shape[2] == 0:
            return None
        n = mel.shape[2] * self.scale
        g, dev = self.generator, self.device
        # SineGen2's initial phases (they vanish in the frame-rate integration), its
        # harmonic-major randn_like, then SourceModuleHnNSF2's unused noise branch.
        torch.rand(1, self.harmonics, generator=g, device=dev)
        noise = torch.empty(1, self.harmonics, n, device=dev).transpose(1, 2)
        noise.normal_(generator=g)
        torch.randn(1, n, 1, generator=g, device=dev)
        return SeamWindow(mel, noise, cache_source, final)

    def finish(self, w: SeamWindow, audio: Tensor) -> Tensor:
        k = self.cache_len
        if self.cache is not None:
            tail = self.cache[2]
            faded = audio[:k].double() * self.fade_in.to(audio.device) + tail.double() * self.fade_out.to(audio.device)
            audio = torch.cat([faded.to(audio.dtype), audio[k:]])
        if w.final:
            self.cache = None
            return audio
        assert w.source is not None
        self.cache = (w.mel[:, :, -self.MEL_CACHE :], w.source[:, :, -k:], audio[-k:])
        return audio[:-k]

    @classmethod
    def state_bound(cls, hift: HiFTGenerator, chunk_frames: int) -> int:
        """What the stream carries between windows, fp32: 8 frames of mel, source, audio.
        (``chunk_frames`` is for the signature shared with :class:`VocoderStream`.)"""
        return cls.MEL_CACHE * 4 * (hift.cfg.in_channels + 2 * hift.cfg.upsample_scale)

    def state_bytes(self) -> int:
        return 0 if self.cache is None else sum(t.numel() * t.element_size() for t in self.cache)


@dataclass
class SeamWindow:
    """One :class:`OfficialVocoderStream` window: its inputs and, once rendered, its source."""

    mel: Tensor  # (1, 80, n): the last window's 8 frames, then the new ones
    noise: Tensor  # (1, n * scale, harmonics), harmonic-major
    cache_source: Tensor | None  # (1, 1, 8 * scale): overwrites the start of the source
    final: bool
    source: Tensor | None = None

    def shape_key(self) -> tuple[int, ...]:
        return (-1, self.mel.shape[2], 0 if self.cache_source is None else self.cache_source.shape[2])


def make_vocoder(hift: HiFTGenerator, generator: torch.Generator | None, seams: str) -> VocoderStream | OfficialVocoderStream:
    """``seams``: "official" (the pinned reference's) or "project" (phase-continuous source,
    F0 context, raised-cosine fades: see :class:`VocoderStream`)."""
    if seams == "official":
        return OfficialVocoderStream(hift, generator)
    if seams == "project":
        return VocoderStream(hift, generator)
    raise ValueError(f"unknown vocoder seams {seams!r}: official or project")


@torch.inference_mode()
def _render_official(hift: HiFTGenerator, windows: list[SeamWindow]) -> list[Tensor]:
    mel = torch.cat([w.mel for w in windows])
    f0 = hift.f0_predictor(mel)
    source, _ = hift.m_source(f0, torch.cat([w.noise for w in windows]))
    for i, w in enumerate(windows):
        if w.cache_source is not None:  # the reference: "use cache_source to avoid glitch"
            source[i : i + 1, :, : w.cache_source.shape[2]] = w.cache_source
    audio = hift.decode(mel, source)
    for i, w in enumerate(windows):
        w.source = source[i : i + 1]
    return list(audio)


def finish_window(vocoder: VocoderStream | OfficialVocoderStream, w: Window | SeamWindow, audio: Tensor) -> Tensor:
    """``vocoder.finish(w, audio)`` where the caller holds either kind of vocoder and window."""
    if isinstance(vocoder, OfficialVocoderStream) and isinstance(w, SeamWindow):
        return vocoder.finish(w, audio)
    if isinstance(vocoder, VocoderStream) and isinstance(w, Window):
        return vocoder.finish(w, audio)
    raise TypeError(f"{type(vocoder).__name__} cannot finish a {type(w).__name__}")


_W = TypeVar("_W", Window, SeamWindow)


def _all_of(windows: Sequence[Window | SeamWindow], kind: type[_W]) -> list[_W]:
    """The windows as the one kind they are: one batch never mixes the two vocoders'."""
    out = [w for w in windows if isinstance(w, kind)]
    if len(out) != len(windows):
        raise TypeError(f"a batch of {kind.__name__}s holds windows of another kind")
    return out


@torch.inference_mode()
def render(hift: HiFTGenerator, windows: Sequence[Window | SeamWindow]) -> list[Tensor]:
    """Vocode windows of equal shapes (``shape_key``) as one batch; sets each
    window's ``cum`` (or ``source``). Returns each window's audio (samples,). The vocoder is not causal,
    so windows of unequal lengths are not padded into one batch: that would change
    their edges. The caller groups them."""
    if isinstance(windows[0], SeamWindow):
        return _render_official(hift, _all_of(windows, SeamWindow))
    return _render_project(hift, _all_of(windows, Window))


def _render_project(hift: HiFTGenerator, windows: list[Window]) -> list[Tensor]:
    f0 = hift.f0_predictor(torch.cat([w.f0_mel for w in windows]))
    phase_before = None
    if any(w.phase_before is not None for w in windows):
        # A window without a carried phase starts from zero: adding 0 changes nothing.
        zero = f0.new_zeros(1, windows[0].noise.shape[2])
        phase_before = torch.cat([zero if w.phase_before is None else w.phase_before for w in windows])
    pad, skip = windows[0].pad, windows[0].f0_skip
    source, cum = hift.m_source(f0[:, skip:], torch.cat([w.noise for w in windows]), phase_before)
    audio = hift.decode(torch.cat([w.mel for w in windows]), source[:, :, pad:])
    for i, w in enumerate(windows):
        w.cum = cum[i : i + 1]
    return list(audio)
