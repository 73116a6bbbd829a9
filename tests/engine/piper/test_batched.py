"""Batched Piper steps equal each stream stepped alone: the prior batched with masks, the
flow and the decoder batched across equal window widths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from voxwire.engine.base import SynthesisParams, WordTimings
from tests.engine.piper.conftest import TEXTS

PARAMS = SynthesisParams(voice="joe", timestamps=True)
SENTENCES = [
    TEXTS["long"],
    "Hi. " + TEXTS["medium"],  # two sentences: the second starts while others are mid-chunk
    "Yes!",
    TEXTS["medium"] + " " + TEXTS["long"],
]


# (largest sample difference, least SNR in dB) between a stream stepped in a batch and
# alone. In fp32 batched kernels differ by float rounding. In bf16 a batch of equal windows
# measured exactly equal; a stream cut elsewhere (a wide burst's longer first piece) decodes
# other windows, whose bf16 roundings moved samples by up to 1.7e-3.
# Where bf16 is emulated (no AVX512-BF16 or AMX; `auto` computes in fp32 there) the text
# encoder's batched kernels round otherwise than its unbatched ones: a stream batched with
# any other moved by up to 0.036 (36.8 dB SNR) on an AVX2 EPYC, and not at all with the
# encoder left in fp32.
MATCH = {"fp32": (1e-4, 60.0), "bf16": (5e-3, 60.0), "emulated bf16": (0.1, 30.0)}


def match(engine) -> tuple[float, float]:
    from voxwire.engine.precision import native_bf16

    if engine.precision == "bf16" and not native_bf16("cpu"):
        return MATCH["emulated bf16"]
    return MATCH[engine.precision]


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def engine(request):
    from voxwire.engine.piper.engine import PiperEngine

    e = PiperEngine(backend="torch", device="cpu", precision=request.param)
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
        largest, least_snr = match(engine)
        assert b_audio.shape == audio.shape
        snr = 10 * np.log10(np.sum(audio**2) / max(np.sum((b_audio - audio) ** 2), 1e-30))
        assert np.abs(b_audio - audio).max() < largest
        assert snr > least_snr
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


def test_a_wide_burst_gets_longer_first_pieces_and_the_same_audio(engine):
    """On a CPU a burst's second steps run one after another, so its first pieces must
    last longer than a lone newcomer's; the audio is the same, cut elsewhere."""
    from voxwire.engine.piper.chunked import FIRST_PIECE_FRAMES
    from voxwire.engine.piper.engine import WIDE_START

    hop = engine._voices["joe"].config.hop_length
    texts = [TEXTS["long"], TEXTS["medium"], TEXTS["medium"] + " Again.", "Good morning, everyone.",
             "The weather will be mild today."]
    wide_start = WIDE_START[engine.precision]

    def first_audio(pieces) -> np.ndarray:
        return next(p for p in pieces if isinstance(p, np.ndarray))

    wide = texts[:wide_start]
    alone = [list(engine.synthesize(t, PARAMS)) for t in wide]
    together, sizes = run_batched(engine, wide, joins=[0] * len(wide))
    assert sizes[0] == wide_start
    for one, batched in zip(alone, together):
        assert first_audio(one).size == FIRST_PIECE_FRAMES * hop
        assert first_audio(batched).size == 2 * FIRST_PIECE_FRAMES * hop
        a, b = split(one)[0], split(batched)[0]
        assert a.shape == b.shape and np.abs(a - b).max() < match(engine)[0]
    # Fewer at once keep the short first piece.
    pieces, _ = run_batched(engine, texts[: wide_start - 1], joins=[0] * (wide_start - 1))
    assert all(first_audio(p).size == FIRST_PIECE_FRAMES * hop for p in pieces)


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


async def test_a_stream_that_fails_a_batched_step_fails_alone_in_the_worker(engine, monkeypatch):
    """A faulty stream (a negative speed, whose length scale the batched prior refuses)
    makes the whole step raise with every stream as it was. The engine does not retry:
    the worker steps each stream alone (engine/worker.py), so only that one fails, and
    the others speak as they do without it."""
    import asyncio

    from voxwire.engine.audio_queue import Done, Failed
    from voxwire.engine.worker import Worker
    from voxwire.engine.worker_options import WorkerOptions
    from tests.fixtures.waiting import drain

    calls: list[tuple[int, bool]] = []  # (streams, raised) per engine step
    real = engine.step

    def step(streams):
        try:
            results = real(streams)
        except Exception:
            calls.append((len(streams), True))
            raise
        calls.append((len(streams), False))
        return results

    monkeypatch.setattr(engine, "step", step)

    async def speak(requests: list[tuple[str, SynthesisParams]]) -> list[tuple[np.ndarray, object]]:
        # A long gather window: the utterances share the first step however slow the machine.
        # Keep the single thread this module pins: the default policy would adapt the engine's own.
        options = WorkerOptions(warmup=False, gather_seconds=0.5, cpu_threads=torch.get_num_threads)
        worker = Worker(lambda: engine, options).start()
        try:
            worker.wait_ready(60)
            await asyncio.sleep(0.05)  # the worker waits idle, so the first request gathers the rest
            loop = asyncio.get_running_loop()
            utterances = []
            for text, params in requests:
                u = worker.submit(params, loop)
                u.feed(text, final=True)
                utterances.append(u)
            return list(await asyncio.gather(*(drain(u, timeout=120) for u in utterances)))
        finally:
            worker.stop()

    params = dataclasses.replace(PARAMS, timestamps=False)  # audio alone, then the end
    good = [TEXTS["medium"], "Good morning, everyone."]
    faulty = await speak([(good[0], params), ("Yes!", dataclasses.replace(params, speed=-1.0)), (good[1], params)])
    assert calls[:4] == [(3, True), (1, False), (1, True), (1, False)]
    assert isinstance(faulty[1][1], Failed) and faulty[1][1].code == "engine_error"
    calls.clear()
    clean = await speak([(t, params) for t in good])
    assert calls[0] == (2, False)
    largest, _ = match(engine)
    for (audio, end), (clean_audio, clean_end) in zip([faulty[0], faulty[2]], clean):
        assert isinstance(end, Done) and isinstance(clean_end, Done)
        assert audio.shape == clean_audio.shape and audio.size > 0
        assert np.abs(audio - clean_audio).max() < largest
