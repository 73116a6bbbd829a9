"""The streaming schedule: the pinned official one by default, the trimmed fast start as
an option of the engine, of a voice and of a request (the narrowest wins). Counted in LM
steps (Stats, or engine steps of one LM token each), never timed."""

from __future__ import annotations

from pathlib import Path

import contextlib
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from voxwire.engine.base import EngineError, Step, SynthesisParams
from voxwire.engine.cosyvoice2.engine import CosyVoice2Engine
from voxwire.engine.cosyvoice2.pipeline import Schedule, prompt_trim
from voxwire.engine.cosyvoice2.voices import VoiceStore
from voxwire.engine.registry import EngineOptions

SR = 16000
TEXT = "Hello world, this is a test of the streaming schedule."  # 33 tokens: no stop before 66


def _renders(schedule: Schedule, n: int) -> list[int]:
    return [i for i in range(1, n + 1) if schedule.due(i)]


@pytest.mark.parametrize(
    ("n_prompt", "expected"),
    [
        # pad = ceil(P/25)*25 - P; first after 25 + pad + 3, then hops of 50, 100, 100 ...
        (67, [25 + 8 + 3, 33 + 50 + 3, 83 + 100 + 3, 183 + 100 + 3]),
        (75, [28, 25 + 50 + 3, 75 + 100 + 3, 175 + 100 + 3]),
        (51, [25 + 24 + 3, 49 + 50 + 3, 99 + 100 + 3, 199 + 100 + 3]),
    ],
)
def test_official_schedule(n_prompt: int, expected: list[int]) -> None:
    s = Schedule(n_prompt, 25, 3, fast_start=False, first_chunk=10)
    assert s.drop == 0
    assert _renders(s, expected[-1]) == expected
    # Every render ends on a 25-token boundary of [prompt, generated]: the chunk-causal
    # flow's mel there is final (the rendered tokens are n - 3).
    assert all((n_prompt + n - 3) % 25 == 0 for n in expected)


def test_fast_start_trims_and_renders_every_ready_chunk() -> None:
    s = Schedule(67, 25, 3, fast_start=True, first_chunk=10)
    assert s.drop == prompt_trim(67, 10, 25) == 2 and s.next_at() is None
    assert all(s.due(i) for i in range(1, 60))


def _reference() -> np.ndarray:
    t = np.arange(3 * SR) / SR
    return (0.3 * np.sin(2 * np.pi * 180 * t + 2 * np.sin(2 * np.pi * 5 * t))).astype(np.float32)


def _first_audio_steps(engine: CosyVoice2Engine, voice_id: str, fast_start: bool | None = None) -> tuple[int, int]:
    """LM steps before the first audio piece, and that piece's samples."""
    before = engine.stats.lm_steps
    pieces = engine.synthesize(TEXT, SynthesisParams(voice=voice_id, fast_start=fast_start))
    first = next(iter(pieces))
    steps = engine.stats.lm_steps - before
    pieces.close()
    return steps, first.size


def test_fast_start_first_chunk_after_fewer_lm_steps(tiny_dir: Path, tmp_path: Path) -> None:
    official = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3)
    voice = official.register_voice(_reference(), SR, "A short reference recording.", "ref").voice
    fast = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3, fast_start=True)
    n_prompt = len(official.store.get(voice.id).prompt.speech_tokens)
    pad = -n_prompt % 25

    steps, size = _first_audio_steps(official, voice.id)
    assert steps == 25 + pad + 3
    assert size == (2 * (25 + pad) - 8) * 480  # 8 frames withheld for the seam

    fast_steps, fast_size = _first_audio_steps(fast, voice.id)
    assert fast_steps == 10 + 3 < steps
    assert fast_size == (2 * 10 - 8) * 480


def test_fast_start_is_an_engine_option(tiny_dir: Path) -> None:
    from voxwire.engine.registry import engine_factory

    assert EngineOptions(name="cosyvoice2").cosyvoice2_fast_start is False
    import argparse

    from voxwire.server import config_loader

    parser = argparse.ArgumentParser()
    config_loader.add_arguments(parser)
    for argv, on in ((["--engine", "cosyvoice2"], False), (["--engine", "cosyvoice2", "--cosyvoice2-fast-start"], True)):
        assert config_loader.load(parser.parse_args(argv), env={}).engine.cosyvoice2_fast_start is on
    for on in (False, True):
        engine = engine_factory(EngineOptions(name="cosyvoice2", model_dir=tiny_dir, cosyvoice2_fast_start=on))()
        assert engine.fast_start is on and engine.batcher.fast_start is on


@contextlib.contextmanager
def no_early_stop(engine: CosyVoice2Engine) -> Iterator[None]:
    """Below its minimum length the LM may not draw EOS, but (as the official one) it may
    draw the two other stop ids; the random LM sometimes does, ending a segment before the
    official schedule's first chunk. Closed here, so the first audio is the schedule's,
    whatever the seeds."""
    size = engine.models.cfg.lm.speech_token_size
    bias = engine.models.lm.llm_decoder.bias
    saved = bias[size + 1 : size + 3].clone()
    with torch.no_grad():
        bias[size + 1 : size + 3] = -float("inf")
    try:
        yield
    finally:
        with torch.no_grad():
            bias[size + 1 : size + 3] = saved


def _official_steps(engine: CosyVoice2Engine, voice_id: str) -> int:
    n_prompt = len(engine.store.get(voice_id).prompt.speech_tokens)
    return 25 + (-n_prompt % 25) + 3


def test_a_request_chooses_its_own_schedule(tiny_dir: Path, tmp_path: Path) -> None:
    engine = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3)  # the official schedule by default
    voice = engine.register_voice(_reference(), SR, "A short reference recording.", "ref").voice
    official = _official_steps(engine, voice.id)
    assert official > 13
    with no_early_stop(engine):
        assert _first_audio_steps(engine, voice.id)[0] == official
        assert _first_audio_steps(engine, voice.id, fast_start=True)[0] == 10 + 3
        assert _first_audio_steps(engine, voice.id, fast_start=False)[0] == official
    # And the other way round: an engine that starts fast by default, asked not to.
    fast = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3, fast_start=True)
    with no_early_stop(fast):
        assert _first_audio_steps(fast, voice.id)[0] == 10 + 3
        assert _first_audio_steps(fast, voice.id, fast_start=False)[0] == official


def test_a_voice_carries_its_own_default_and_a_request_overrides_it(tiny_dir: Path, tmp_path: Path) -> None:
    engine = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3)
    fast_voice = engine.register_voice(_reference(), SR, "A short reference recording.", "fast", fast_start=True)
    assert fast_voice.created and fast_voice.voice.to_dict()["fast_start"] is True
    voice_id = fast_voice.voice.id
    official = _official_steps(engine, voice_id)
    with no_early_stop(engine):
        assert _first_audio_steps(engine, voice_id)[0] == 10 + 3  # the voice's default
        assert _first_audio_steps(engine, voice_id, fast_start=False)[0] == official  # the request's, over it
        assert _first_audio_steps(engine, voice_id, fast_start=True)[0] == 10 + 3

    # The same content again: the same voice, its default unchanged; another default is
    # refused, as another name is (those who use the voice rely on what it does).
    runs = engine.stats.frontend_runs
    assert engine.register_voice(_reference(), SR, "A short reference recording.", "fast", fast_start=True).created is False
    assert engine.register_voice(_reference(), SR, "A short reference recording.", "fast").created is False
    with pytest.raises(EngineError) as e:
        engine.register_voice(_reference(), SR, "A short reference recording.", "fast", fast_start=False)
    assert e.value.code == "voice_exists" and "fast_start" in e.value.message
    assert engine.stats.frontend_runs == runs

    # Kept on disk: another engine on the same directory (a restart) has the same default.
    again = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3)
    assert again.store.get(voice_id).fast_start is True
    with no_early_stop(again):
        assert _first_audio_steps(again, voice_id)[0] == 10 + 3


def test_voices_stored_before_fast_start_existed_still_load(tiny_dir: Path, tmp_path: Path) -> None:
    engine = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3)
    voice_id = engine.register_voice(_reference(), SR, "A short reference recording.", "old").voice.id
    meta_path = tmp_path / f"{voice_id}.json"
    meta = json.loads(meta_path.read_text())
    assert meta["fast_start"] is None
    del meta["fast_start"]  # as the store wrote it before the field existed
    meta_path.write_text(json.dumps(meta))
    old = VoiceStore(tmp_path).get(voice_id)
    assert old is not None and old.fast_start is None and old.name == "old"
    # A value that is not a boolean is a damaged file: skipped, not guessed at.
    meta["fast_start"] = "yes"
    meta_path.write_text(json.dumps(meta))
    assert VoiceStore(tmp_path).get(voice_id) is None


def _steps_to_first_audio_together(engine: CosyVoice2Engine, params: list[SynthesisParams]) -> list[int]:
    """Open one stream per request and step them together, as the worker batches them, each
    until its first audio: the engine steps (one LM token each) it took."""
    streams = [engine.open(TEXT, p) for p in params]
    first: list[int | None] = [None] * len(streams)
    try:
        for n in range(1, 200):
            waiting = [i for i, f in enumerate(first) if f is None]
            results = engine.step([streams[i] for i in waiting])
            for i, result in zip(waiting, results):
                assert isinstance(result, Step), result
                if any(isinstance(p, np.ndarray) and p.size for p in result.pieces):
                    first[i] = n
                assert not result.done or first[i] is not None, "ended before its first audio"
            if all(f is not None for f in first):
                return first  # type: ignore[return-value]
    finally:
        for s in streams:
            s.close()
    raise AssertionError(f"no first audio after 200 steps: {first}")


def test_streams_of_one_batch_keep_their_own_schedules(tiny_dir: Path, tmp_path: Path) -> None:
    engine = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3)
    voice_id = engine.register_voice(_reference(), SR, "A short reference recording.", "ref").voice.id
    official = _official_steps(engine, voice_id)
    choices = [None, True, False, True]
    with no_early_stop(engine):
        got = _steps_to_first_audio_together(engine, [SynthesisParams(voice=voice_id, fast_start=c) for c in choices])
    assert got == [official, 13, official, 13]
