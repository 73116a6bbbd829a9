"""Frontend features against the reference's own frontend methods, on random audio.

``CosyVoiceFrontEnd._extract_speech_token`` / ``_extract_spk_embedding`` /
``_extract_speech_feat`` run as the reference runs them, with recording stand-ins for
the two ONNX sessions, so what is compared is exactly the tensor the reference would
feed its speech tokenizer, CAMPPlus, and the flow. Each has a negative control: a
plausible mistake on the same input lands far outside the tolerance.
"""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest
import torch
import torchaudio

from voxwire.engine.cosyvoice2.features import kaldi_fbank, matcha_mel, whisper_log_mel
from voxwire.engine.cosyvoice2.model_config import MelConfig

from . import oracle_frontend

# Measured max abs differences on these inputs (fp32): whisper log-mel 1.2e-7, fbank 0 (the same torchaudio call),
# matcha mel 9.5e-7; our Slaney filterbank is built in float64 as librosa builds it
# (torchaudio's float32 one gave 1.5e-4). The negative controls land at >= 1e-2.
TOL_WHISPER = 1e-5
TOL_FBANK = 1e-6
TOL_MATCHA = 1e-4


def _audio(seed: int, seconds: float, rate: int) -> torch.Tensor:
    """Noise plus a gliding tone and a silent stretch: broadband, tonal and near-zero frames."""
    g = torch.Generator().manual_seed(seed)
    n = int(seconds * rate)
    t = torch.arange(n) / rate
    x = 0.05 * torch.randn(n, generator=g) + 0.4 * torch.sin(2 * torch.pi * (150 + 400 * t) * t)
    x[n // 3 : n // 3 + rate // 5] *= 1e-4
    return x.clamp(-1, 1).float()


@pytest.fixture(scope="module")
def frontend(reference) -> types.SimpleNamespace:
    """A reference frontend object with recording sessions and the yaml's feat_extractor."""
    cls = oracle_frontend.frontend_class()
    fe = cls.__new__(cls)
    fe.device = torch.device("cpu")
    fe.speech_tokenizer_session = oracle_frontend.FakeSession(2)
    fe.campplus_session = oracle_frontend.FakeSession(1)
    cfg = MelConfig()
    fe.feat_extractor = functools.partial(
        oracle_frontend.matcha_audio().mel_spectrogram,
        n_fft=cfg.n_fft, num_mels=cfg.num_mels, sampling_rate=cfg.sampling_rate, hop_size=cfg.hop_size,
        win_size=cfg.win_size, fmin=cfg.fmin, fmax=cfg.fmax, center=cfg.center,
    )  # fmt: skip
    return types.SimpleNamespace(cls=cls, obj=fe)


def _err(a, b) -> float:
    return float((torch.as_tensor(a).double() - torch.as_tensor(b).double()).abs().max())


@pytest.mark.parametrize("seed,seconds", [(0, 1.0), (1, 3.7), (2, 9.3)])
def test_whisper_log_mel_matches_reference(frontend, seed: int, seconds: float) -> None:
    wav = _audio(seed, seconds, 16000)
    frontend.cls._extract_speech_token(frontend.obj, wav.unsqueeze(0))
    ref = torch.from_numpy(frontend.obj.speech_tokenizer_session.first)  # (1, 128, frames)
    ours = whisper_log_mel(wav).unsqueeze(0)
    assert ours.shape == ref.shape
    assert _err(ours, ref) < TOL_WHISPER, f"max {_err(ours, ref):.2e}"
    # The frame count it passes alongside is the one our frontend passes.
    assert int(frontend.obj.speech_tokenizer_session.fed["input1"][0]) == ours.shape[2]
    # Negative control: an HTK mel scale (torchaudio's default) instead of Slaney.
    fb = torchaudio.functional.melscale_fbanks(201, 0.0, 8000.0, 128, 16000, norm="slaney", mel_scale="htk").T
    power = torch.stft(wav, 400, 160, window=torch.hann_window(400), return_complex=True)[..., :-1].abs() ** 2
    wrong = (fb @ power).clamp(min=1e-10).log10()
    wrong = (torch.maximum(wrong, wrong.max() - 8.0) + 4.0) / 4.0
    assert _err(wrong.unsqueeze(0), ref) > 100 * TOL_WHISPER


@pytest.mark.parametrize("seed,seconds", [(3, 1.0), (4, 6.1)])
def test_kaldi_fbank_matches_reference(frontend, seed: int, seconds: float) -> None:
    wav = _audio(seed, seconds, 16000)
    frontend.cls._extract_spk_embedding(frontend.obj, wav.unsqueeze(0))
    ref = torch.from_numpy(frontend.obj.campplus_session.first)  # (1, frames, 80)
    ours = kaldi_fbank(wav).unsqueeze(0)
    assert ours.shape == ref.shape
    assert _err(ours, ref) < TOL_FBANK, f"max {_err(ours, ref):.2e}"
    # Negative control: without the mean normalisation over time.
    raw = torchaudio.compliance.kaldi.fbank(wav.unsqueeze(0), num_mel_bins=80, dither=0, sample_frequency=16000)
    assert _err(raw.unsqueeze(0), ref) > 1e4 * TOL_FBANK


@pytest.mark.parametrize("seed,seconds", [(5, 1.0), (6, 4.3)])
def test_matcha_mel_matches_reference(frontend, seed: int, seconds: float) -> None:
    wav = _audio(seed, seconds, 24000)
    ref, _ = frontend.cls._extract_speech_feat(frontend.obj, wav.unsqueeze(0))  # (1, frames, 80)
    ours = matcha_mel(wav, MelConfig()).unsqueeze(0)
    assert ours.shape == ref.shape
    assert _err(ours, ref) < TOL_MATCHA, f"max {_err(ours, ref):.2e}"
    # Negative control: the filterbank up to Nyquist instead of the yaml's fmax 8 kHz.
    wrong = matcha_mel(wav, MelConfig(fmax=None)).unsqueeze(0)
    assert _err(wrong, ref) > 10 * TOL_MATCHA


def test_features_are_float32_whatever_the_input(frontend) -> None:
    """bf16 against fp32 on the CPU. The frontend computes every feature in float32 (the
    prompt is extracted once per voice and stored in float32; only the flow casts it).
    Audio that passed through bf16 first (8 mantissa bits, ~-48 dB quantisation noise)
    shifts the features by the amounts asserted here (measured: matcha mel 0.043 nats,
    whisper log-mel 0.22 and fbank 0.29, both in their near-silent bins), far more
    than fp32 rounding, which is exact run to run."""
    wav = _audio(7, 3.0, 24000)
    wav_bf16 = wav.to(torch.bfloat16).float()
    ref = matcha_mel(wav, MelConfig())
    low = matcha_mel(wav_bf16, MelConfig())
    assert ref.dtype == low.dtype == torch.float32
    # Where there is energy (mel > -5, i.e. above the silent stretch), bf16 audio changes
    # the log-mel by well under 0.1 nats; fp32 versus itself is exact.
    loud = ref > -5
    assert loud.float().mean() > 0.5
    assert _err(ref[loud], low[loud]) < 0.1
    assert _err(ref, matcha_mel(wav.clone(), MelConfig())) == 0.0
    wav16 = _audio(7, 3.0, 16000)
    assert _err(whisper_log_mel(wav16), whisper_log_mel(wav16.to(torch.bfloat16).float())) < 0.5
    assert _err(kaldi_fbank(wav16), kaldi_fbank(wav16.to(torch.bfloat16).float())) < 0.5
    # The reference's prompt mel cast to bf16, as a bf16 flow reads it: relative error
    # within bf16's rounding (2^-8 relative; measured 0.0039).
    cast = ref.to(torch.bfloat16).float()
    assert float(((cast - ref).abs() / ref.abs().clamp(min=1e-3)).max()) <= 2**-8
    assert not np.isnan(ref.numpy()).any()
