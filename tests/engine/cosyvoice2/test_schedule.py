"""The streaming schedule: the pinned official one by default, the trimmed fast start as
an option. Counted in LM steps (Stats), never timed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.base import SynthesisParams
from engine.cosyvoice2.engine import CosyVoice2Engine
from engine.cosyvoice2.pipeline import Schedule, prompt_trim
from engine.registry import EngineOptions

SR = 16000


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


def _first_audio_steps(engine: CosyVoice2Engine, voice_id: str) -> tuple[int, int]:
    """LM steps before the first audio piece, and that piece's samples."""
    before = engine.stats.lm_steps
    pieces = engine.synthesize("Hello world, this is a test of the streaming schedule.", SynthesisParams(voice=voice_id))
    first = next(iter(pieces))
    steps = engine.stats.lm_steps - before
    pieces.close()
    return steps, first.size


def test_fast_start_first_chunk_after_fewer_lm_steps(tiny_dir: Path, tmp_path: Path) -> None:
    t = np.arange(3 * SR) / SR
    audio = (0.3 * np.sin(2 * np.pi * 180 * t + 2 * np.sin(2 * np.pi * 5 * t))).astype(np.float32)
    official = CosyVoice2Engine(tiny_dir, voices_dir=tmp_path, seed=3)
    voice = official.register_voice(audio, SR, "A short reference recording.", "ref").voice
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
    from engine.registry import engine_factory

    assert EngineOptions(name="cosyvoice2").cosyvoice2_fast_start is False
    import argparse

    from server import config_loader

    parser = argparse.ArgumentParser()
    config_loader.add_arguments(parser)
    for argv, on in ((["--engine", "cosyvoice2"], False), (["--engine", "cosyvoice2", "--cosyvoice2-fast-start"], True)):
        assert config_loader.load(parser.parse_args(argv), env={}).engine.cosyvoice2_fast_start is on
    for on in (False, True):
        engine = engine_factory(EngineOptions(name="cosyvoice2", model_dir=tiny_dir, cosyvoice2_fast_start=on))()
        assert engine.fast_start is on and engine.batcher.fast_start is on
