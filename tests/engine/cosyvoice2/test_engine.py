"""The engine's contract: voices, caching, persistence, errors, streaming, cancellation."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest

from voxwire.engine.base import EngineError, SynthesisParams
from voxwire.engine.cosyvoice2 import missing_files
from voxwire.engine.cosyvoice2.engine import CosyVoice2Engine

SR = 16000


def _reference_audio(seconds: float = 3.0, f0: float = 180.0) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2
    return (0.3 * env * np.sin(2 * np.pi * f0 * t + 2 * np.sin(2 * np.pi * 5 * t))).astype(np.float32)


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> CosyVoice2Engine:
    return CosyVoice2Engine(tiny_dir, voices_dir=tmp_path_factory.mktemp("voices"), seed=123)


@pytest.fixture(scope="module")
def voice(engine: CosyVoice2Engine):
    registered = engine.register_voice(_reference_audio(), SR, "A short reference recording.", "ref")
    assert registered.created
    return registered.voice


def test_missing_model_is_reported_clearly(tmp_path: Path, tiny_dir: Path) -> None:
    assert missing_files(tiny_dir) == []
    (tmp_path / "cosyvoice2.yaml").write_text("x: 1\n")
    missing = missing_files(tmp_path)
    assert "llm.pt" in missing and "campplus.onnx" in missing and "CosyVoice-BlankEN/config.json" in missing
    with pytest.raises(EngineError) as err:
        CosyVoice2Engine(tmp_path)
    assert err.value.code == "model_missing"
    for name in missing:
        assert name in err.value.message
    assert "pretrained_models/CosyVoice2-0.5B" in err.value.message


def test_register_caches_by_content_and_persists(engine, voice, tiny_dir: Path) -> None:
    runs = engine.stats.frontend_runs
    again = engine.register_voice(_reference_audio(), SR, "A short reference recording.", "ref")
    assert again.voice.id == voice.id and not again.created and engine.stats.frontend_runs == runs  # no recomputation
    with pytest.raises(EngineError) as renamed:  # a new name for known audio is refused, not ignored
        engine.register_voice(_reference_audio(), SR, "A short reference recording.", "other name")
    assert renamed.value.code == "voice_exists" and "'ref'" in renamed.value.message
    different = engine.register_voice(_reference_audio(), SR, "Another transcript.", "ref2").voice
    assert different.id != voice.id and engine.stats.frontend_runs == runs + 1
    assert engine.has_voice(voice.id) and voice.sample_rate == 24000
    # A restart sees the stored voices and synthesises with them without the frontend.
    restarted = CosyVoice2Engine(tiny_dir, voices_dir=engine.store.directory, seed=1)
    assert {v.id for v in restarted.voices()} >= {voice.id, different.id}
    audio = np.concatenate(list(restarted.synthesize("Hello there.", SynthesisParams(voice=voice.id))))
    assert restarted.stats.frontend_runs == 0 and audio.size > 0


def test_a_voice_registered_by_another_process_is_found(engine, tiny_dir: Path) -> None:
    """--workers: each process has its own engine on one --voices-dir. One that started
    before a voice was registered elsewhere still finds it, by id and in its list."""
    other = CosyVoice2Engine(tiny_dir, voices_dir=engine.store.directory, seed=2)
    new = engine.register_voice(_reference_audio(2.5, f0=140.0), SR, "Registered elsewhere.", "late").voice
    assert other.has_voice(new.id)
    audio = np.concatenate(list(other.synthesize("Hi.", SynthesisParams(voice=new.id))))
    assert audio.size > 0 and other.stats.frontend_runs == 0
    late = engine.register_voice(_reference_audio(2.5, f0=220.0), SR, "Listed elsewhere.", "listed").voice
    assert late.id in {v.id for v in other.voices()}
    # Only ids of the store's own form are looked up on disk; junk files are skipped.
    (engine.store.directory / "cv2-0123456789abcdef0123.json").write_text("{not json", encoding="utf-8")
    assert not other.has_voice("cv2-0123456789abcdef0123")
    assert not other.has_voice("../" + new.id) and not other.has_voice(new.id + ".tmp")
    assert len(other.voices()) == len(engine.voices())


@pytest.mark.parametrize(
    "audio,rate,transcript,code",
    [
        (np.zeros(0, np.float32), SR, "hi", "bad_audio"),
        (np.array([[1, 2], [3, 4]], np.int16), SR, "hi", "bad_audio"),
        (np.full(SR * 2, np.nan, np.float32), SR, "hi", "bad_audio"),
        (np.zeros(SR * 2, np.float32), SR, "hi", "bad_audio"),  # silent
        (_reference_audio(3.0), 8000, "hi", "bad_audio"),  # below 16 kHz
        (_reference_audio(0.5), SR, "hi", "audio_too_short"),
        (_reference_audio(31.0), SR, "hi", "audio_too_long"),
        (_reference_audio(2.0), SR, "   ", "transcript_missing"),
        (_reference_audio(2.0), SR, "word " * 400, "transcript_too_long"),
    ],
)
def test_bad_uploads_have_stable_codes(engine, audio, rate, transcript, code) -> None:
    with pytest.raises(EngineError) as err:
        engine.register_voice(audio, rate, transcript, "x")
    assert err.value.code == code


def test_synthesize_streams_float32_pieces(engine, voice) -> None:
    steps = engine.stats.lm_steps
    pieces = list(engine.synthesize("Hello world, this is a test of streaming.", SynthesisParams(voice=voice.id)))
    assert len(pieces) >= 2
    assert all(p.dtype == np.float32 and p.ndim == 1 for p in pieces)
    audio = np.concatenate(pieces)
    n_tokens = engine.stats.lm_steps - steps - 1  # the last step drew the stop token
    assert audio.size == n_tokens * 2 * 480  # 2 mel frames per token, 480 samples per frame
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 0.99
    # The official schedule: the first piece is 25 + pad tokens of audio (pad brings the
    # flow prompt to a multiple of 25) minus the 8 frames withheld for the cross-fade.
    pad = -len(engine.store.get(voice.id).prompt.speech_tokens) % 25
    assert pieces[0].size == (2 * (25 + pad) - 8) * 480


def test_speed_changes_duration(engine, voice) -> None:
    normal = sum(p.size for p in engine.synthesize("Speed test.", SynthesisParams(voice=voice.id)))
    fast = sum(p.size for p in engine.synthesize("Speed test.", SynthesisParams(voice=voice.id, speed=1.5)))
    assert abs(fast / normal - 1 / 1.5) < 0.05
    with pytest.raises(EngineError) as err:
        engine.synthesize("x", SynthesisParams(voice=voice.id, speed=9.0))
    assert err.value.code == "bad_speed"


def test_unknown_voice(engine) -> None:
    with pytest.raises(EngineError) as err:
        engine.synthesize("Hello.", SynthesisParams(voice="nope"))
    assert err.value.code == "unknown_voice"


def test_closing_the_generator_stops_the_lm(engine, voice) -> None:
    text = "This sentence is long enough that the language model has many tokens left to emit. " * 2
    gen = engine.synthesize(text, SynthesisParams(voice=voice.id))
    first = next(gen)
    assert first.size > 0
    steps_at_close = engine.stats.lm_steps
    closed = engine.stats.utterances_closed
    gen.close()
    assert engine.stats.utterances_closed == closed + 1
    # Other work later does not resume the closed one's LM loop.
    list(engine.synthesize("Short.", SynthesisParams(voice=voice.id)))
    short_steps = engine.stats.lm_steps - steps_at_close
    assert short_steps < 20, short_steps
    with pytest.raises(StopIteration):
        next(gen)


def test_interleaved_utterances_are_independent(engine, voice, tiny_dir: Path) -> None:
    """Each utterance draws from its own generator, seeded by the engine's seed and its
    order of arrival: stepped in turn with another, it is sample for sample what it is alone."""
    texts = ("First utterance here.", "Second one, different.")
    p = SynthesisParams(voice=voice.id)

    def fresh() -> CosyVoice2Engine:
        return CosyVoice2Engine(tiny_dir, voices_dir=engine.store.directory, seed=7)

    alone_engine = fresh()
    alone = [list(alone_engine.synthesize(t, p)) for t in texts]  # one after the other

    mixed_engine = fresh()
    a, b = (mixed_engine.synthesize(t, p) for t in texts)  # both started, same order of arrival
    mixed: list[list[np.ndarray]] = [[], []]
    for x, y in zip(a, b):
        mixed[0].append(x)
        mixed[1].append(y)
    mixed[0] += list(a)
    mixed[1] += list(b)

    for together, by_itself in zip(mixed, alone):
        assert [x.size for x in together] == [x.size for x in by_itself]
        assert np.array_equal(np.concatenate(together), np.concatenate(by_itself))
    # Two different utterances: the comparison above is not between equal things.
    assert not np.array_equal(np.concatenate(alone[0])[:4000], np.concatenate(alone[1])[:4000])


def test_one_registration_wins_across_processes_and_all_list_the_same_order(tmp_path: Path) -> None:
    from voxwire.engine.cosyvoice2.frontend import Prompt
    from voxwire.engine.cosyvoice2.voices import StoredVoice, VoiceStore

    def prompt() -> Prompt:
        return Prompt(np.zeros(3, np.int64), np.zeros(4, np.int64), np.zeros((4, 80), np.float32),
                      np.zeros(192, np.float32))

    # Two stores on one directory stand for two worker processes.
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)
    mine = StoredVoice("cv2-" + "1" * 20, "first", prompt(), "t")
    theirs = StoredVoice("cv2-" + "1" * 20, "first", prompt(), "t")
    assert a.add(mine) is mine  # created here
    winner = b.add(theirs)  # the same content, registered again elsewhere: the first one stands
    assert winner is not theirs and winner.id == mine.id and winner.registered_at == mine.registered_at
    later = StoredVoice("cv2-" + "0" * 20, "second", prompt(), "t")  # sorts first by id, registered later
    b.add(later)
    assert [v.id for v in a.all()] == [v.id for v in b.all()] == [mine.id, later.id]
    assert not list(tmp_path.glob("*.tmp.*"))


def test_a_lexicon_respells_the_text_and_its_phonemes_are_refused(engine, voice, monkeypatch) -> None:
    from voxwire.engine.cosyvoice2.text import normalize_text
    from voxwire.engine.text.lexicon import Lexicon, entry

    read: list[list[int]] = []
    real = engine._open
    monkeypatch.setattr(engine, "_open", lambda prompt, ids, *a, **k: read.append(ids) or real(prompt, ids, *a, **k))
    engine.open("I use SQL daily.", SynthesisParams(voice=voice.id, lexicon=Lexicon([entry("SQL", "sequel")]))).close()
    assert read == [engine.tokenizer.encode(normalize_text("I use sequel daily."))]
    assert read[0] != engine.tokenizer.encode(normalize_text("I use SQL daily."))
    # CosyVoice2 reads text: its voices take no phonemes.
    assert voice.phonemes == ""
    with pytest.raises(EngineError, match="takes no phonemes; give a respelling") as e:
        voice.check_lexicon(Lexicon([entry("SQL", "/ˈsiːkwəl/")]))
    assert e.value.code == "invalid_lexicon"
