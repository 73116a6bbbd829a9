"""Chunked decoding against whole decoding of the same latent."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from voxwire.engine.piper import chunked
from voxwire.engine.piper.chunked import piece_spans, decode_chunks, stream_chunks
from voxwire.engine.piper.vits import Vits, VitsConfig

# Measured: ~120 dB (context >= the receptive field makes chunking exact up to float
# rounding). 80 dB is well past "inaudible" yet fails if context is even 2 frames short.
MIN_SNR_DB = 80.0


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    noise = np.sum((ref - test) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref**2) / noise))


@pytest.fixture(scope="module")
def latent(vits: Vits, phoneme_ids):
    """A real utterance with the voice's default noise (seeded), and its whole decode."""
    g = torch.Generator().manual_seed(1)
    z_p, durations = vits.infer_prior(torch.tensor(phoneme_ids["long"]), 0.667, 1.0, 0.8, g)
    z = vits.flow_reverse(z_p)
    return z_p, z, vits.decode(z)[0].numpy()


@pytest.fixture(scope="module")
def pieces(vits: Vits, latent) -> list[np.ndarray]:
    return list(decode_chunks(vits, latent[1]))


def seams_of(pieces: list[np.ndarray]) -> np.ndarray:
    return np.cumsum([len(p) for p in pieces])[:-1]


def near_seams(n: int, seams: np.ndarray, radius: int = 2) -> np.ndarray:
    """Mask over the n-1 sample-to-sample differences touching seam +- radius samples."""
    mask = np.zeros(n - 1, bool)
    for s in seams:
        mask[max(0, s - radius - 1) : s + radius] = True
    return mask


def test_chunked_matches_whole(vits: Vits, latent, pieces):
    _, z, whole = latent
    assert len(pieces) >= 4, "utterance too short to exercise several seams"
    assert [len(p) // vits.hop_length for p in pieces[:4]] == [14, 28, 56, 112]
    assert all(p.dtype == np.float32 and p.ndim == 1 for p in pieces)
    audio = np.concatenate(pieces)
    assert len(audio) == z.shape[2] * vits.hop_length
    assert snr_db(whole, audio) > MIN_SNR_DB


def test_no_clicks_at_seams(latent, pieces):
    whole = latent[2]
    audio = np.concatenate(pieces)
    seams = seams_of(pieces)
    jumps = np.abs(np.diff(audio))
    mask = near_seams(len(audio), seams)
    elsewhere = jumps[~mask].max()
    for s in seams:
        local = jumps[near_seams(len(audio), np.array([s]))].max()
        assert local <= elsewhere, f"seam at sample {s}: jump {local:.4f} > {elsewhere:.4f}"
    # Stricter: at each seam the waveform's steps are those of whole decoding, so the
    # seam adds no discontinuity at all, however quiet the signal is there.
    ref_jumps = np.diff(whole)
    assert np.max(np.abs(np.diff(audio)[mask] - ref_jumps[mask])) < 1e-4


def test_the_checks_catch_missing_context(vits: Vits, latent):
    """Negative control: without context the same metrics fail."""
    _, z, whole = latent
    pieces = list(decode_chunks(vits, z, context_frames=0))
    audio = np.concatenate(pieces)
    assert len(audio) == len(whole)
    assert snr_db(whole, audio) < 40
    mask = near_seams(len(audio), seams_of(pieces))
    assert np.max(np.abs(np.diff(audio)[mask] - np.diff(whole)[mask])) > 1e-3


def test_first_piece_is_what_the_defaults_promise(vits: Vits, pieces):
    first = pieces[0]
    assert len(first) == chunked.FIRST_PIECE_FRAMES * vits.hop_length
    assert len(first) / vits.sample_rate >= 0.150  # fills a first network frame
    assert len(first) / vits.sample_rate <= 0.200  # ...and is still small


def test_stream_chunks_runs_the_flow_lazily_and_exactly(vits: Vits, latent):
    z_p, z, whole = latent
    pieces = list(stream_chunks(vits, z_p))
    audio = np.concatenate(pieces)
    assert len(audio) == z.shape[2] * vits.hop_length
    assert len(pieces[0]) == chunked.FIRST_PIECE_FRAMES * vits.hop_length
    assert snr_db(whole, audio) > MIN_SNR_DB


def test_stream_chunks_flow_context_matters(vits: Vits, latent):
    z_p, _, whole = latent
    audio = np.concatenate(list(stream_chunks(vits, z_p, flow_context_frames=0)))
    assert snr_db(whole, audio) < 40


@pytest.mark.parametrize("frames", [1, 13, 20, 43])
def test_short_and_odd_lengths(vits: Vits, latent, frames):
    _, z, _ = latent
    part = z[:, :, :frames]
    audio = np.concatenate(list(decode_chunks(vits, part)))
    assert len(audio) == frames * vits.hop_length
    assert snr_db(vits.decode(part)[0].numpy(), audio) > MIN_SNR_DB


@pytest.mark.parametrize("n", [1, 7, 14, 15, 21, 22, 100, 629, 1000])
def test_piece_spans_tile_the_latent(n):
    spans = piece_spans(n, chunked.FIRST_PIECE_FRAMES, chunked.PIECE_FRAMES)
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    sizes = [e - s for s, e in spans]
    assert all(s >= 1 for s in sizes)
    assert sizes[0] == min(n, chunked.FIRST_PIECE_FRAMES) or len(spans) == 1
    # Sizes never shrink (a merged tail may be larger), so decoding stays ahead of playback.
    assert sizes[:-1] == sorted(sizes[:-1])
    assert max(sizes) < 2 * chunked.PIECE_FRAMES


def test_rejects_bad_input(vits: Vits, latent):
    _, z, _ = latent
    with pytest.raises(ValueError):
        next(decode_chunks(vits, z[0]))
    with pytest.raises(ValueError):
        next(decode_chunks(vits, z, piece_frames=0))


class _Recorder:
    """The model, recording the width of every flow and decoder call."""

    def __init__(self, model: Vits) -> None:
        self.model, self.flow_widths, self.decode_widths = model, [], []

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def flow_reverse(self, z_p: torch.Tensor, mask: torch.Tensor | None = None,
                     speaker: torch.Tensor | None = None) -> torch.Tensor:
        self.flow_widths.append(z_p.shape[2])
        return self.model.flow_reverse(z_p, mask, speaker)

    def decode(self, z: torch.Tensor, speaker: torch.Tensor | None = None) -> torch.Tensor:
        self.decode_widths.append(z.shape[2])
        return self.model.decode(z, speaker)


def test_the_contexts_are_the_voices_receptive_fields(vits: Vits):
    """A medium voice's (the constants, measured) and a high voice's: resblock 1's wider
    kernels reach further, so its windows need more context."""
    assert chunked.decoder_context(vits.cfg) == chunked.CONTEXT_FRAMES
    assert chunked.flow_context(vits.cfg) == chunked.FLOW_CONTEXT_FRAMES
    high = dataclasses.replace(
        vits.cfg, resblock="1", resblock_kernel_sizes=(3, 7, 11), resblock_dilation_sizes=((1, 3, 5),) * 3,
        upsample_rates=(8, 8, 2, 2), upsample_initial_channel=512, upsample_kernel_sizes=(16, 16, 4, 4),
    )
    assert chunked.decoder_context(high) == 14


def test_the_first_step_computes_no_more_than_the_first_piece_needs(vits: Vits, latent):
    """Every first audio pays for the first step's windows: the first piece and its
    decoder context, and the flow's context beyond that; rounding them up to the shape
    bucket (32 and 64 frames) made every first piece slower."""
    z_p, z, _ = latent
    recorder = _Recorder(vits)
    sentence = chunked.SentenceDecoder(recorder, z_p=z_p, pad_to=chunked.SHAPE_BUCKET)  # type: ignore[arg-type]
    decode_width = chunked.FIRST_PIECE_FRAMES + chunked.CONTEXT_FRAMES
    assert sentence.cost() == decode_width
    (first,) = chunked.SentenceDecoder.step_many([sentence])
    assert recorder.decode_widths == [decode_width]
    assert recorder.flow_widths == [decode_width + chunked.FLOW_CONTEXT_FRAMES]
    # ...and it is still exact: the first piece of the whole decode.
    whole_first = vits.decode(z)[0, : chunked.FIRST_PIECE_FRAMES * vits.hop_length].numpy()
    assert snr_db(whole_first, first) > MIN_SNR_DB


def test_a_long_sentence_flows_just_what_its_second_piece_needs(vits: Vits, latent):
    """The second piece has only the first one's 162.5 ms to arrive in. A burst of
    newcomers' second steps each carrying a 512-frame flow block made every listener
    but the first stall, so the block waits for the third step."""
    z_p, _, whole = latent
    recorder = _Recorder(vits)
    assert z_p.shape[2] > chunked.FLOW_BLOCK_FRAMES // 2 + 64, "the fixture must be long enough to need a block"
    ctx, flow_ctx = chunked.CONTEXT_FRAMES, chunked.FLOW_CONTEXT_FRAMES
    pieces = list(stream_chunks(recorder, z_p, pad_to=chunked.SHAPE_BUCKET))  # type: ignore[arg-type]
    first, second = chunked.FIRST_PIECE_FRAMES, 2 * chunked.FIRST_PIECE_FRAMES
    # The second window, unclipped, keeps its own width (50 frames, not 64)...
    assert recorder.decode_widths[1] == second + 2 * ctx
    # ...and the flow gives just the frames it reaches, from the start (its left context).
    assert recorder.flow_widths[1] == first + second + ctx + flow_ctx
    # The third step runs the rest as one block, and the audio is still exact.
    assert len(recorder.flow_widths) == 3
    assert snr_db(whole, np.concatenate(pieces)) > MIN_SNR_DB


def test_a_first_step_can_flow_ahead_so_that_the_second_only_decodes(vits: Vits, latent):
    """A burst's second steps run one after another on a CPU: the engine has its
    newcomers' first steps flow for the second piece too."""
    z_p, _, whole = latent
    recorder = _Recorder(vits)
    sentence = chunked.SentenceDecoder(
        recorder, z_p=z_p, first_piece_frames=2 * chunked.FIRST_PIECE_FRAMES, first_flow_pieces=2,  # type: ignore[arg-type]
    )
    pieces = chunked.SentenceDecoder.step_many([sentence])
    first, second = 2 * chunked.FIRST_PIECE_FRAMES, 4 * chunked.FIRST_PIECE_FRAMES
    assert recorder.flow_widths == [first + second + chunked.CONTEXT_FRAMES + chunked.FLOW_CONTEXT_FRAMES]
    pieces += chunked.SentenceDecoder.step_many([sentence])
    assert len(recorder.flow_widths) == 1 and len(recorder.decode_widths) == 2
    while not sentence.finished:
        pieces += chunked.SentenceDecoder.step_many([sentence])
    assert pieces[0].size == first * vits.hop_length
    assert snr_db(whole, np.concatenate(pieces)) > MIN_SNR_DB


def test_a_short_sentence_flows_its_rest_in_one_call(vits: Vits, latent):
    """One more flow call costs 2 x 32 frames of context: a rest shorter than half a
    block is not worth splitting."""
    z_p, z, _ = latent
    part = z_p[:, :, :200]
    recorder = _Recorder(vits)
    audio = np.concatenate(list(stream_chunks(recorder, part)))  # type: ignore[arg-type]
    assert recorder.flow_widths == [chunked.FIRST_WINDOW_FRAMES + chunked.FLOW_CONTEXT_FRAMES, 200]
    assert snr_db(vits.decode(vits.flow_reverse(part))[0].numpy(), audio) > MIN_SNR_DB


class _Shapes:
    """A model that only records the widths it is called with."""

    hop_length = 4
    cfg = VitsConfig()  # a medium voice's shape: its receptive fields set the contexts

    def __init__(self) -> None:
        self.flow_widths: set[int] = set()
        self.decode_widths: set[int] = set()

    def flow_reverse(self, z_p: torch.Tensor, mask: torch.Tensor | None = None,
                     speaker: torch.Tensor | None = None) -> torch.Tensor:
        self.flow_widths.add(z_p.shape[2])
        return z_p

    def decode(self, z: torch.Tensor, speaker: torch.Tensor | None = None) -> torch.Tensor:
        self.decode_widths.add(z.shape[2])
        return torch.zeros(z.shape[0], z.shape[2] * self.hop_length)


@pytest.mark.parametrize("first, flow_pieces", [(chunked.FIRST_PIECE_FRAMES, 1), (2 * chunked.FIRST_PIECE_FRAMES, 2)])
def test_window_widths_come_in_a_few_shapes_whatever_the_sentence_length(first: int, flow_pieces: int):
    """oneDNN compiles and keeps kernels per input shape, so the widths must not grow
    with the sentences served. Only a window cut off by the sentence's end is rounded up
    to the bucket; the others start and end at the same frames in every sentence."""

    def widths(lengths: range) -> tuple[set[int], set[int]]:
        model = _Shapes()
        for n in lengths:
            sentence = chunked.SentenceDecoder(
                model, z_p=torch.zeros(1, 2, n), pad_to=chunked.SHAPE_BUCKET,  # type: ignore[arg-type]
                first_piece_frames=first, first_flow_pieces=flow_pieces,
            )
            while not sentence.finished:
                chunked.SentenceDecoder.step_many([sentence])
        return model.decode_widths, model.flow_widths

    decodes, flows = widths(range(1, 2000, 7))
    longer_decodes, longer_flows = widths(range(2000, 4000, 7))
    assert longer_decodes <= decodes and longer_flows <= flows
    bucket = chunked.SHAPE_BUCKET
    assert first + chunked.CONTEXT_FRAMES in decodes  # the first window is not rounded up
    assert len({w for w in decodes if w % bucket}) <= 5 and len({w for w in flows if w % bucket}) <= 2
    assert len(decodes) <= 20 and len(flows) <= 60
