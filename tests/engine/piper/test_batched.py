"""Batched Piper steps equal each stream stepped alone: the prior batched with masks, the
flow and the decoder batched across equal window widths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.base import SynthesisParams, WordTimings
from tests.engine.piper.conftest import TEXTS

PARAMS = SynthesisParams(voice="joe", timestamps=True)
SENTENCES = [
    TEXTS["long"],
    "Hi. " + TEXTS["medium"],  # two sentences: the second starts while others are mid-chunk
    "Yes!",
    TEXTS["medium"] + " " + TEXTS["long"],
]


@pytest.fixture(scope="module")
def engine():
    from engine.piper.engine import PiperEngine

    e = PiperEngine(backend="torch", device="cpu")
    torch.set_num_threads(1)  # PiperEngine sets its own count; see conftest for why 1
    # Without noise each stream's audio is a function of its text alone, so a batch can
    # be compared with the streams one by one (the noise's own order is tested below).
    for voice in e._voices.values():
        voice.config = dataclasses.replace(voice.config, noise_scale=0.0, noise_w_scale=0.0)
    return e


def split(pieces) -> tuple[np.ndarray, list]:
    pieces = list(pieces)
    audio = [p for p in pieces if isinstance(p, np.ndarray)]
    words = [w for p in pieces if isinstance(p, WordTimings) for w in p.words]
    return np.concatenate(audio), words


def run_batched(engine, texts: list[str], joins: list[int]) -> tuple[list[list], list[int]]:
    """Step the texts together; text i joins at step ``joins[i]``. Its pieces, and the
    batch size of every step."""
    streams = [None] * len(texts)
    pieces: list[list] = [[] for _ in texts]
    done = [False] * len(texts)
    sizes = []
    step = 0
    while not all(done):
        for i, t in enumerate(texts):
            if joins[i] == step:
                streams[i] = engine.open(t, PARAMS)
        live = [i for i in range(len(texts)) if streams[i] is not None and not done[i]]
        results = engine.step([streams[i] for i in live])
        sizes.append(len(live))
        for i, r in zip(live, results):
            assert not isinstance(r, Exception), r
            pieces[i] += r.pieces
            done[i] = r.done
        step += 1
    return pieces, sizes


def test_a_batch_equals_each_stream_alone_audio_and_word_timings(engine):
    alone = [split(engine.synthesize(t, PARAMS)) for t in SENTENCES]
    together, sizes = run_batched(engine, SENTENCES, joins=[0, 0, 2, 3])
    assert max(sizes) == 4  # all four were in a step together
    for (audio, words), pieces in zip(alone, together):
        b_audio, b_words = split(pieces)
        assert b_audio.shape == audio.shape
        assert np.abs(b_audio - audio).max() < 1e-4  # float rounding of batched kernels
        snr = 10 * np.log10(np.sum(audio**2) / max(np.sum((b_audio - audio) ** 2), 1e-30))
        assert snr > 60
        assert b_words == words


def test_every_newcomer_of_a_burst_has_audio_after_the_first_step(engine):
    texts = [TEXTS["long"], TEXTS["medium"], "Good morning, everyone.", TEXTS["long"] + " Again."] * 2
    streams = [engine.open(t, PARAMS) for t in texts]
    results = engine.step(streams)
    for r in results:
        assert not isinstance(r, Exception)
        audio = [p for p in r.pieces if isinstance(p, np.ndarray)]
        assert audio and audio[0].size >= 0.15 * engine.sample_rate  # a whole first frame's worth
        assert isinstance(r.pieces[0], WordTimings)  # the words come ahead of their audio


def test_a_wide_burst_flows_ahead_so_its_second_steps_only_decode(engine):
    """On a CPU a burst's second steps run one after another, each within the first
    pieces' 162.5 ms: the newcomers' first step computes their second pieces' flow too.
    The audio is the same."""
    from engine.piper.engine import WIDE_START

    vits = engine._voices["joe"].vits
    texts = [TEXTS["long"], TEXTS["medium"], TEXTS["medium"] + " Again."]
    flows = []
    real_flow = vits.flow_reverse

    def counting_flow(*args, **kwargs):
        flows.append(1)
        return real_flow(*args, **kwargs)

    def second_step_flows(n: int) -> int:
        streams = [engine.open(t, PARAMS) for t in texts[:n]]
        first = engine.step(streams)
        flows.clear()
        second = engine.step(streams)
        assert not any(isinstance(r, Exception) for r in first + second)
        return len(flows)

    vits.flow_reverse = counting_flow
    try:
        assert second_step_flows(WIDE_START) == 0
        assert second_step_flows(WIDE_START - 1) > 0  # fewer keep the cheapest first step
    finally:
        del vits.flow_reverse
    alone = [split(engine.synthesize(t, PARAMS))[0] for t in texts]
    together, sizes = run_batched(engine, texts, joins=[0] * len(texts))
    assert sizes[0] == WIDE_START
    for a, pieces in zip(alone, together):
        b = split(pieces)[0]
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-4


def test_batched_priors_draw_each_sentences_noise_as_alone(vits, phoneme_ids):
    ids = [torch.tensor(phoneme_ids[k]) for k in ("long", "short", "medium")]
    scales = [1.0, 0.8, 1.25]
    def seeded(base: int) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(base + k) for k in range(len(ids))]

    together = vits.infer_priors(ids, 0.667, scales, 0.8, seeded(7), bucket=32)
    alone = [vits.infer_prior(i, 0.667, s, 0.8, g, bucket=32) for i, s, g in zip(ids, scales, seeded(7))]
    for (z_b, d_b), (z_a, d_a) in zip(together, alone):
        assert torch.equal(d_b, d_a)
        assert z_b.shape == z_a.shape
        assert torch.allclose(z_b, z_a, atol=1e-4)
    # A different seed gives different noise: the comparison above can fail.
    other = vits.infer_priors(ids, 0.667, scales, 0.8, seeded(8), bucket=32)
    assert not torch.allclose(other[0][0][..., :10], together[0][0][..., :10], atol=1e-3) or not torch.equal(
        other[0][1], together[0][1]
    )
