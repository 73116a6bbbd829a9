"""More voices than stay loaded (``max_loaded_voices``): every voice is known from its
config, the first few are loaded at start, the others when first used (or on another
thread, ahead of their use: ``load_voice``), and the least recently used is unloaded to
keep within the bound, without harm to a stream already speaking in it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.engine.piper.test_reference_voices import audio, quiet, snr_db
from voxwire.engine.base import EngineError, SynthesisParams
from voxwire.engine.errors import ErrorCode
from voxwire.engine.registry import EngineOptions

TEXT = "One voice at a time is loaded here."


@pytest.fixture
def files(reference_voices):
    from voxwire.engine.piper.engine import voice_files_from_path

    return [voice_files_from_path(reference_voices[name]) for name in ("x_low", "german", "speakers")]


def test_the_first_voices_load_at_start_and_the_others_when_first_used(files):
    from voxwire.engine.piper.engine import PiperEngine

    engine = PiperEngine(files, precision="fp32", max_loaded_voices=2)
    assert [v.id for v in engine.voices()] == ["x_low", "german", "speakers"]  # all known, from their configs
    assert list(engine._loaded) == ["x_low", "german"]
    assert not engine.voice_loaded("speakers") and engine.voice_loaded("no-such-voice")
    said = audio(engine.synthesize(TEXT, SynthesisParams(voice="speakers", speaker="carol")))
    assert said.size > 0.5 * 16000 and np.abs(said).max() > 0.01
    assert list(engine._loaded) == ["german", "speakers"]  # x_low, the least recently used, made room
    audio(engine.synthesize(TEXT, SynthesisParams(voice="german")))
    assert list(engine._loaded) == ["speakers", "german"]
    with pytest.raises(EngineError) as unknown:
        engine.open(TEXT, SynthesisParams(voice="no-such-voice"))
    assert unknown.value.code == ErrorCode.UNKNOWN_VOICE


def test_voices_loaded_on_another_thread_are_taken_in_when_next_asked_for(files):
    """``load_voice`` runs off the worker's thread: its model waits until the worker asks,
    and is not unloaded before its first use, even past the bound."""
    from voxwire.engine.piper.engine import PiperEngine

    engine = PiperEngine(files, precision="fp32", max_loaded_voices=1)
    loaders = [threading.Thread(target=engine.load_voice, args=(v,)) for v in ("german", "speakers")]
    for t in loaders:
        t.start()
    for t in loaders:
        t.join()
    assert list(engine._loaded) == ["x_low"]  # not yet taken in: the worker's thread alone changes it
    assert engine.voice_loaded("german")
    assert sorted(engine._loaded) == ["german", "speakers"]  # x_low made room; neither new one has spoken yet
    audio(engine.synthesize(TEXT, SynthesisParams(voice="german")))
    assert sorted(engine._loaded) == ["german", "speakers"]  # speakers still waits for its first use
    audio(engine.synthesize(TEXT, SynthesisParams(voice="speakers")))
    assert list(engine._loaded) == ["speakers"]


def test_a_stream_keeps_its_model_when_its_voice_is_unloaded(files):
    """Noise off, the audio of a stream whose voice was unloaded after it opened (another
    voice's use took its place) is the audio of the same stream left alone."""
    from voxwire.engine.piper.engine import PiperEngine

    engine = quiet(PiperEngine(files, precision="fp32", max_loaded_voices=1))
    alone = audio(engine.synthesize(TEXT, SynthesisParams(voice="x_low")))
    stream = engine.open(TEXT, SynthesisParams(voice="x_low"))
    audio(engine.synthesize(TEXT, SynthesisParams(voice="german")))
    assert list(engine._loaded) == ["german"]
    pieces = []
    while True:
        (step,) = engine.step([stream])
        assert not isinstance(step, Exception), step
        pieces += step.pieces
        if step.done:
            break
    unloaded = audio(pieces)
    assert unloaded.size == alone.size and snr_db(alone, unloaded) > 60.0


def test_the_bound_is_at_least_one_and_the_server_setting_defaults_to_the_engines():
    from voxwire.engine.piper.engine import DEFAULT_LOADED_VOICES, PiperEngine

    assert EngineOptions().piper_loaded_voices == DEFAULT_LOADED_VOICES
    with pytest.raises(EngineError) as refused:
        PiperEngine(max_loaded_voices=0)
    assert refused.value.code == ErrorCode.BAD_CONFIG
