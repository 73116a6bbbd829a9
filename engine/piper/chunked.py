"""Chunked (streaming) decoding of a VITS latent.

HiFi-GAN is a stack of convolutions, so its output for frames [a, b) depends only on
the latent frames within its receptive field of [a, b). Decoding a window with that
much context on both sides and cropping the context from the output reproduces whole
decoding: no crossfade is needed and there are no seams to hide. The same holds for the
flow (a stack of WaveNet couplings), which ``stream_chunks`` exploits so that nothing
length-proportional except the text encoder runs before the first audio.

Measured with ``benchmarks/piper_chunked.py --receptive-field`` (perturb one latent
frame and see which output samples move, in float64):
  decoder: +-10.09 frames (conv_pre 3 + ups/resblocks), so 11 frames of context make
           chunked output equal whole decoding to float rounding (SNR > 110 dB).
  flow:    +-32 frames (4 couplings x 4 WaveNet layers x kernel 5 -> 4*4*2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from .vits import Vits

# 14 frames = 162.5 ms at 22050 Hz / hop 256: the first piece fills a whole 150 ms
# network frame, so the rechunker downstream can send it without waiting for piece two,
# while costing only 14 + 11 frames of decoding.
FIRST_CHUNK_FRAMES = 14
# Later chunks double up to this size (28, 56, 112, 128...). Each piece is then at
# least as long as the one before, so playback never catches up with decoding, and at
# 128 frames (1.5 s) the 2 x 11 frames of context cost ~15% extra on that chunk while
# per-call overhead is amortised; measured total is within a few % of whole decoding.
CHUNK_FRAMES = 128
# Decoder receptive field is +-10.09 frames (measured, see module docstring).
CONTEXT_FRAMES = 11
# Flow receptive field is +-32 frames; with 32 the streamed flow is exact.
FLOW_CONTEXT_FRAMES = 32
# After the first piece the flow runs ahead of the decoder in blocks of up to this many
# frames (6 s of audio), so most utterances need just two flow calls and its context
# costs < 10% extra flow work; a full block (~4 GMAC, ~40 ms on one core) still finishes
# well within the 160 ms the first piece plays for.
FLOW_BLOCK_FRAMES = 512


def chunk_spans(n_frames: int, first_chunk_frames: int, chunk_frames: int) -> list[tuple[int, int]]:
    """[start, end) frame spans: first_chunk_frames, then doubling up to chunk_frames.
    A tail shorter than half a chunk is merged into the span before it."""
    spans: list[tuple[int, int]] = []
    start, size = 0, max(1, min(first_chunk_frames, chunk_frames))
    while start < n_frames:
        end = min(n_frames, start + size)
        if n_frames - end < size // 2:
            end = n_frames
        spans.append((start, end))
        start, size = end, min(chunk_frames, 2 * size)
    return spans


# Window lengths are rounded up to a multiple of this. oneDNN compiles and caches kernels
# per input shape: with every utterance bringing new lengths, a server would pay that
# set-up again and again and its cache (and RSS) would keep growing.
SHAPE_BUCKET = 16


def _window(start: int, end: int, context: int, n_frames: int, min_size: int) -> tuple[int, int]:
    """Context-padded window, clipped at the ends. A window shorter than ``min_size``
    (the last one) is widened to the left instead, and every window is widened (right
    first, then left) to a multiple of SHAPE_BUCKET: extra context is harmless, and a
    repeated input length lets oneDNN reuse its compiled kernels."""
    lo, hi = max(0, start - context), min(n_frames, end + context)
    if hi - lo < min_size:
        lo = max(0, hi - min_size)
    short = -(hi - lo) % SHAPE_BUCKET
    grow = min(short, n_frames - hi)
    hi += grow
    lo = max(0, lo - (short - grow))
    return lo, hi


def _decode_spans(
    model: Vits,
    n_frames: int,
    latent: Callable[[int, int], torch.Tensor],
    chunk_frames: int,
    context_frames: int,
    first_chunk_frames: int,
) -> Iterator[np.ndarray]:
    hop = model.hop_length
    widest = 0
    for start, end in chunk_spans(n_frames, first_chunk_frames, chunk_frames):
        lo, hi = _window(start, end, context_frames, n_frames, widest)
        widest = max(widest, hi - lo)
        audio = model.decode(latent(lo, hi))[0]
        # .cpu() is free on a CPU tensor and the device-to-host copy on CUDA.
        yield audio[(start - lo) * hop : (end - lo) * hop].cpu().numpy()


def _check(z: torch.Tensor, chunk_frames: int, context_frames: int) -> None:
    if z.dim() != 3 or z.shape[0] != 1:
        raise ValueError(f"expected a latent of shape [1, C, F], got {tuple(z.shape)}")
    if chunk_frames < 1 or context_frames < 0:
        raise ValueError("chunk_frames must be >= 1 and context_frames >= 0")


def decode_chunks(
    model: Vits,
    z: torch.Tensor,
    chunk_frames: int = CHUNK_FRAMES,
    context_frames: int = CONTEXT_FRAMES,
    first_chunk_frames: int = FIRST_CHUNK_FRAMES,
) -> Iterator[np.ndarray]:
    """Decode z [1, C, F] (from ``Vits.infer_latent``) piece by piece.

    Yields float32 arrays whose concatenation has exactly F * hop_length samples; with
    context_frames >= CONTEXT_FRAMES it equals ``model.decode(z)`` up to rounding."""
    _check(z, chunk_frames, context_frames)
    yield from _decode_spans(
        model, z.shape[2], lambda lo, hi: z[:, :, lo:hi], chunk_frames, context_frames,
        first_chunk_frames,
    )


def stream_chunks(
    model: Vits,
    z_p: torch.Tensor,
    chunk_frames: int = CHUNK_FRAMES,
    context_frames: int = CONTEXT_FRAMES,
    first_chunk_frames: int = FIRST_CHUNK_FRAMES,
    flow_context_frames: int = FLOW_CONTEXT_FRAMES,
    flow_block_frames: int = FLOW_BLOCK_FRAMES,
    pad_to: int = 1,
) -> Iterator[np.ndarray]:
    """Like ``decode_chunks`` but from the prior sample z_p (``Vits.infer_prior``): the
    flow runs lazily, just ahead of the decoder, so the first piece costs the same for a
    3-word and a 40-word sentence (apart from the text encoder).

    ``pad_to`` pads the latent to a multiple of that many frames, so that short
    sentences too reuse a few input shapes (see SHAPE_BUCKET)."""
    _check(z_p, chunk_frames, context_frames)
    real = z_p.shape[2]
    if pad_to > 1 and real % pad_to:
        # Masked, the flow treats the padding as VITS treats padding in a batch: exactly.
        # The decoder has no mask: it sees silence there, which touches the last ~10
        # frames (its receptive field) of the sentence's trailing silence, slightly.
        z_p = torch.nn.functional.pad(z_p, (0, pad_to - real % pad_to))
    n = z_p.shape[2]
    mask = (torch.arange(n, device=z_p.device) < real).to(z_p.dtype)[None, None, None, :]
    z = torch.empty_like(z_p)
    done = 0  # frames of z computed so far

    def latent(lo: int, hi: int) -> torch.Tensor:
        nonlocal done
        if hi > done:
            # The first block is just what the first piece needs; later ones run ahead,
            # swallowing a remainder shorter than half a block.
            if done == 0:
                end = hi
            else:
                end = max(hi, done + flow_block_frames)
                end = n if n - end < flow_block_frames // 2 else min(n, end)
            f_lo, f_hi = _window(done, end, flow_context_frames, n, 0)
            block = model.flow_reverse(z_p[:, :, f_lo:f_hi], mask[..., f_lo:f_hi])
            z[:, :, done:end] = block[:, :, done - f_lo : end - f_lo]
            done = end
        return z[:, :, lo:hi]

    pieces = _decode_spans(model, n, latent, chunk_frames, context_frames, first_chunk_frames)
    if n == real:
        yield from pieces
        return
    left = real * model.hop_length  # the padding's audio is cut off the end
    for piece in pieces:
        if left > 0:
            yield piece[:left]
        left -= piece.shape[0]
