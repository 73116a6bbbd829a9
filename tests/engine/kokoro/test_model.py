"""The torch port (engine/kokoro/model.py) against the official ``kokoro`` package's KModel,
both loaded from the same checkpoint (random weights, conftest.py).

Stage by stage, because the model's output is chaotic in its F0: the harmonic source's
spectrum is fed to the generator as magnitude and *angle*, and the angle of its DC and
Nyquist bins (real numbers) is +pi or -pi on the sign of a float rounding error. So an F0
that differs from the oracle's in the last bit (two correct ALBERTs do) moves some phases
by 2 pi, and the audio by ~25 dB. Each stage is therefore checked on the oracle's own inputs.
"""

from __future__ import annotations

import pytest
import torch

from voxwire.engine.kokoro.model import Generator, KokoroConfig
from voxwire.engine.kokoro.weights import load_checkpoint

IDS = torch.tensor([[0, 50, 83, 54, 57, 16, 65, 102, 123, 54, 46, 4, 16, 62, 47, 61, 62, 5, 0]])


def snr_db(reference: torch.Tensor, x: torch.Tensor) -> float:
    reference, x = reference.double().flatten(), x.double().flatten()
    return 10 * float(torch.log10((reference**2).sum() / ((reference - x) ** 2).sum().clamp(min=1e-30)))


@pytest.fixture(scope="module")
def models(oracle_checkpoint):
    oracle, path = oracle_checkpoint
    return oracle, load_checkpoint(path)


@pytest.fixture(scope="module")
def style():
    return torch.randn(1, 256, generator=torch.Generator().manual_seed(3)) * 0.3


def _oracle_prosody(oracle, style):
    """The oracle's durations, F0, energy and aligned text, as its forward computes them."""
    with torch.no_grad():
        n = IDS.shape[1]
        mask = torch.zeros(1, n, dtype=torch.bool)
        lengths = torch.tensor([n])
        s = style[:, 128:]
        bert = oracle.bert(IDS, attention_mask=torch.ones_like(IDS))
        d = oracle.predictor.text_encoder(oracle.bert_encoder(bert).transpose(-1, -2), s, lengths, mask)
        x, _ = oracle.predictor.lstm(d)
        durations = torch.round(torch.sigmoid(oracle.predictor.duration_proj(x)).sum(-1)).clamp(min=1).long()[0]
        en = d.transpose(-1, -2).repeat_interleave(durations, dim=2)
        f0, energy = oracle.predictor.F0Ntrain(en, s)
        asr = oracle.text_encoder(IDS, lengths, mask).repeat_interleave(durations, dim=2)
    return durations, f0, energy, asr


def test_durations_and_prosody_match_the_oracle(models, style):
    oracle, port = models
    durations, f0, energy, asr = _oracle_prosody(oracle, style)
    p = port.prosody(IDS, style)
    assert p.durations.tolist() == durations.tolist()
    assert len(set(durations.tolist())) > 1  # the check would not see a shifted duration otherwise
    assert snr_db(f0, p.f0) > 90
    assert snr_db(energy, p.energy) > 90
    assert snr_db(asr, p.asr) > 90
    # The oracle's own whole forward gives the same durations.
    _, oracle_durations = oracle.forward_with_tokens(IDS, style, 1.0)
    assert oracle_durations.tolist() == durations.tolist()


def _decode(model_decoder, asr, f0, energy, s, seed, port: bool):
    torch.manual_seed(seed)
    with torch.no_grad():
        if not port:
            return model_decoder(asr, f0, energy, s).squeeze()
        g = model_decoder.generator
        return g(model_decoder.features(asr, f0, energy, s), s, g.source(f0))[0]


def test_whole_segment_audio_matches_the_oracle(models, style):
    """The decoder and generator, whole segment, same inputs and noise seed: >= 60 dB."""
    oracle, port = models
    _, f0, energy, asr = _oracle_prosody(oracle, style)
    s = style[:, :128]
    expected = _decode(oracle.decoder, asr, f0, energy, s, seed=5, port=False)
    audio = _decode(port.decoder, asr, f0, energy, s, seed=5, port=True)
    assert audio.shape == expected.shape == (f0.shape[1] * 300,)
    assert float(expected.abs().max()) > 0.01
    assert snr_db(expected, audio) >= 60

    # Negative controls: another noise seed, or one weight off, and the bound fails.
    assert snr_db(expected, _decode(port.decoder, asr, f0, energy, s, seed=6, port=True)) < 40
    with torch.no_grad():
        w = port.decoder.generator.conv_post.weight  # a scale before a norm would be normalised away
        saved = w.clone()
        w.mul_(1.01)
        try:
            assert snr_db(expected, _decode(port.decoder, asr, f0, energy, s, seed=5, port=True)) < 60
        finally:
            w.copy_(saved)


def test_a_window_of_the_source_is_the_whole_source_there():
    """``source_window`` (the engine's) against ``source`` (the oracle's), noise off: the
    same spectrum frame for frame, at the segment's ends and inside it."""
    torch.manual_seed(0)
    g = Generator(KokoroConfig().istft, 128).eval()
    f0 = 120 + 30 * torch.sin(torch.arange(200) / 10.0)[None]
    f0[:, 50:70] = 0  # unvoiced frames
    phase = g.frame_phase(f0)

    def spectrum(h: torch.Tensor) -> torch.Tensor:  # complex: an angle of pi and of -pi agree
        return torch.polar(h[:, :11], h[:, 11:])

    with torch.no_grad():
        whole = spectrum(g.source(f0, noise=False))
        for lo, hi in ((0, 200), (0, 32), (40, 104), (150, 200)):
            window = spectrum(g.source_window(f0, phase, lo, hi, noise=False))
            expected = whole[:, :, lo * 60 : hi * 60 + 1]
            assert window.shape == expected.shape
            assert float(((window - expected).abs() ** 2).sum() / (expected.abs() ** 2).sum()) < 1e-7
        shifted = spectrum(g.source_window(f0, phase, 41, 105, noise=False))
        assert float(((shifted - whole[:, :, 40 * 60 : 104 * 60 + 1]).abs() ** 2).sum()
                     / (whole.abs() ** 2).sum()) > 1e-3


def test_checkpoint_errors_are_coded(tmp_path, oracle_checkpoint):
    from voxwire.engine.base import EngineError

    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(EngineError) as e:
        load_checkpoint(bad)
    assert e.value.code == "model_invalid"
    _, path = oracle_checkpoint
    parts = torch.load(path, weights_only=True)
    del parts["decoder"]
    partial = tmp_path / "partial.pth"
    torch.save(parts, partial)
    with pytest.raises(EngineError) as e:
        load_checkpoint(partial)
    assert e.value.code == "model_invalid" and "decoder" in e.value.message
