"""Feature extraction for the frontend: three spectrogram flavours, each as its model expects."""

from __future__ import annotations

import functools
import math

import torch
import torchaudio
from torch import Tensor

from .model_config import MelConfig


def _hz_to_mel(hz: Tensor) -> Tensor:
    # Slaney's scale: linear below 1 kHz, logarithmic above.
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    logstep = math.log(6.4) / 27.0
    return torch.where(hz >= min_log_hz, min_log_hz / f_sp + torch.log(hz.clamp(min=min_log_hz) / min_log_hz) / logstep, hz / f_sp)


def _mel_to_hz(mel: Tensor) -> Tensor:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    logstep = math.log(6.4) / 27.0
    return torch.where(mel >= min_log_hz / f_sp, min_log_hz * torch.exp(logstep * (mel - min_log_hz / f_sp)), f_sp * mel)


@functools.lru_cache(maxsize=8)
def _slaney_mel(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> Tensor:
    """librosa.filters.mel's default filterbank (Slaney scale, area-normalised) as
    (n_mels, n_freqs). Built in float64 as librosa builds it, then cast: both references
    (whisper's mel_filters.npz and matcha's librosa call) are that float64 result, and
    torchaudio's float32 construction differs by 1.6e-7, i.e. 1.5e-4 in the log-mel."""
    fft_freqs = torch.linspace(0.0, sr / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = torch.tensor([fmin, fmax], dtype=torch.float64)
    mel_lo, mel_hi = _hz_to_mel(edges).tolist()
    mel_f = _mel_to_hz(torch.linspace(mel_lo, mel_hi, n_mels + 2, dtype=torch.float64))
    fdiff = mel_f.diff()
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]
    return weights.float().contiguous()


def whisper_log_mel(audio_16k: Tensor, n_mels: int = 128) -> Tensor:
    """Whisper's log-mel (n_fft 400, hop 160, clamp to max-8 dB, scaled): (n_mels, frames).
    Input to ``speech_tokenizer_v2.onnx``."""
    window = torch.hann_window(400, device=audio_16k.device)
    stft = torch.stft(audio_16k, 400, 160, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    mel = _slaney_mel(16000, 400, n_mels, 0.0, 8000.0).to(audio_16k.device) @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def kaldi_fbank(audio_16k: Tensor) -> Tensor:
    """80-bin Kaldi fbank, mean-normalised over time: (frames, 80). Input to ``campplus.onnx``."""
    feat = torchaudio.compliance.kaldi.fbank(audio_16k.unsqueeze(0), num_mel_bins=80, dither=0, sample_frequency=16000)
    return feat - feat.mean(dim=0, keepdim=True)


def matcha_mel(audio: Tensor, cfg: MelConfig) -> Tensor:
    """The flow's mel (matcha-TTS / HiFi-GAN style: reflect pad, |STFT|, log): (frames, n_mels)."""
    pad = (cfg.n_fft - cfg.hop_size) // 2
    y = torch.nn.functional.pad(audio.view(1, 1, -1), (pad, pad), mode="reflect").view(1, -1)
    window = torch.hann_window(cfg.win_size, device=audio.device)
    spec = torch.stft(
        y, cfg.n_fft, hop_length=cfg.hop_size, win_length=cfg.win_size, window=window,
        center=cfg.center, pad_mode="reflect", normalized=False, onesided=True, return_complex=True,
    )  # fmt: skip
    mag = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-9)
    fmax = float(cfg.fmax) if cfg.fmax is not None else cfg.sampling_rate / 2
    mel = _slaney_mel(cfg.sampling_rate, cfg.n_fft, cfg.num_mels, float(cfg.fmin), fmax).to(audio.device) @ mag
    return torch.log(torch.clamp(mel, min=1e-5))[0].T
