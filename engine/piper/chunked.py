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

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
import numpy as np
import torch

from voxwire.engine.pieces import batch_parts, piece_spans

from .vits import Vits, VitsConfig

__all__ = ["batch_parts", "piece_spans"]  # re-exported: the Piper engine and tests take them from here

# 14 frames = 162.5 ms at 22050 Hz / hop 256: the first piece fills a whole 150 ms
# first chunk, so the server's ChunkCutter can send it without waiting for piece two,
# while costing only 14 + 11 frames of decoding (and 14 + 11 + 32 of flow).
FIRST_PIECE_FRAMES = 14
# Later pieces double up to this size (28, 56, 112, 128...). Each piece is then at
# least as long as the one before, so playback never catches up with decoding, and at
# 128 frames (1.5 s) the 2 x 11 frames of context cost ~15% extra on that piece while
# per-call overhead is amortised; measured total is within a few % of whole decoding.
PIECE_FRAMES = 128
# Decoder receptive field is +-10.09 frames (measured, see module docstring), for a
# medium voice; ``decoder_context`` gives it for any voice's shape.
CONTEXT_FRAMES = 11
# What a sentence's first step decodes: its first piece and the context after it.
FIRST_WINDOW_FRAMES = FIRST_PIECE_FRAMES + CONTEXT_FRAMES
# Flow receptive field is +-32 frames; with 32 the streamed flow is exact.
FLOW_CONTEXT_FRAMES = 32


def decoder_context(cfg: VitsConfig) -> int:
    """Frames of latent context on each side that make a decoded window's inner part
    whole decoding's: an upper bound of HiFi-GAN's receptive field, added up layer by
    layer (each conv's reach in samples at its stage's rate, over the frames' rate). 11
    for a medium voice (measured: 10.09), 14 for a high one (resblock 1's kernel 11)."""
    reach = (7 - 1) / 2  # conv_pre, at the frame rate
    rate = 1
    for up, kernel in zip(cfg.upsample_rates, cfg.upsample_kernel_sizes):
        reach += kernel / (2 * up) / rate  # the transposed conv, in its input's samples
        rate *= up
        blocks = []
        for k, dilations in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
            side = (k - 1) // 2
            # ResBlock1 follows each dilated conv with an undilated one; ResBlock2 does not.
            blocks.append(side * sum(dilations) + (side * len(dilations) if cfg.resblock == "1" else 0))
        reach += max(blocks) / rate  # the blocks run side by side: the widest counts
    reach += (7 - 1) / 2 / rate  # conv_post
    return math.ceil(reach)


def flow_context(cfg: VitsConfig) -> int:
    """The flow's receptive field in frames, each side: every coupling's WaveNet layers'
    reach, added up (32 for every Piper quality: 4 couplings of 4 layers, kernel 5)."""
    side = (cfg.flow_kernel_size - 1) // 2
    return cfg.flow_n_flows * sum(side * cfg.flow_dilation_rate**i for i in range(cfg.flow_n_layers))
# The flow runs ahead of the decoder in blocks of up to FLOW_BLOCK_FRAMES (6 s of
# audio), so most sentences need few flow calls and its context costs < 10% extra flow
# work. The steps of a sentence's first FLOW_JUST_IN_TIME_PIECES pieces are the
# exception: they flow just the frames their decoder windows need (the second's takes
# the whole rest instead when that is at most half a block), because first audio waits
# for the first step and the second piece must be out before the first has played; a
# block's flow would make those steps too long. The first block comes with the third
# piece, which has the second's longer play time to arrive in; a long sentence pays one
# more flow call (2 x FLOW_CONTEXT_FRAMES of context). The measurements:
# benchmarks/README.md, "Bursts: the steps after the first".
FLOW_JUST_IN_TIME_PIECES = 2
FLOW_BLOCK_FRAMES = 512


# Window lengths are rounded up to a multiple of this, unless they are already one of a
# few. oneDNN compiles and caches kernels per input shape: with every utterance bringing
# new lengths, a server would pay that set-up again and again and its cache (and RSS)
# would keep growing.
SHAPE_BUCKET = 16


def _window(start: int, end: int, context: int, n_frames: int, min_size: int) -> tuple[int, int]:
    """Context-padded window, clipped at the ends. A window shorter than ``min_size``
    (the last one) is widened to the left instead.

    A window with its whole right context starts and ends where it does in every
    sentence long enough to have it (spans and flow blocks are laid out from the start),
    so its width is one of a few already: it is left as it is, since widening it would
    add to the cost of every first audio (25 -> 32 frames) and second (50 -> 64). A
    window cut off by the sentence's end is widened (right first, then left) to a
    multiple of SHAPE_BUCKET: extra context is harmless."""
    lo, hi = max(0, start - context), min(n_frames, end + context)
    if hi - lo < min_size:
        lo = max(0, hi - min_size)
    if end + context <= n_frames:
        return lo, hi
    short = -(hi - lo) % SHAPE_BUCKET
    grow = min(short, n_frames - hi)
    hi += grow
    lo = max(0, lo - (short - grow))
    return lo, hi


class SentenceDecoder:
    """One sentence's chunked decoding, as state between steps: each step decodes its
    next span, running the flow lazily just ahead of it; ``step_many`` steps many sentences
    together.

    A step is planned (its flow and decoder windows), computed, then committed, so a
    step that raises leaves the sentence as it was."""

    def __init__(
        self,
        model: Vits,
        z_p: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        piece_frames: int = PIECE_FRAMES,
        context_frames: int | None = None,
        first_piece_frames: int = FIRST_PIECE_FRAMES,
        flow_context_frames: int | None = None,
        flow_block_frames: int = FLOW_BLOCK_FRAMES,
        pad_to: int = 1,
        first_flow_pieces: int = 1,
        speaker: torch.Tensor | None = None,
    ) -> None:
        """From the prior sample ``z_p`` (the flow runs here) or the decoder latent ``z``
        (``Vits.infer_latent``: it does not). ``pad_to`` pads z_p to a multiple of that
        many frames, so that short sentences too reuse a few input shapes. The first
        step's flow computes what the first ``first_flow_pieces`` pieces need, so that
        the steps after it, up to that piece, only decode. ``speaker``: a multi-speaker
        voice's ``Vits.speaker_embedding`` for this sentence, [1, G, 1, 1]. The contexts
        default to the model's receptive fields (``decoder_context``, ``flow_context``)."""
        latent = z_p if z is None else z
        assert latent is not None
        if context_frames is None:
            context_frames = decoder_context(model.cfg)
        if flow_context_frames is None:
            flow_context_frames = flow_context(model.cfg)
        _check(latent, piece_frames, context_frames)
        self.model = model
        self.speaker = speaker
        self.real = latent.shape[2]
        if z is None and pad_to > 1 and self.real % pad_to:
            # Masked, the flow treats the padding as VITS treats padding in a batch: exactly.
            # The decoder has no mask: it sees silence there, which touches the last ~10
            # frames (its receptive field) of the sentence's trailing silence, slightly.
            latent = torch.nn.functional.pad(latent, (0, pad_to - self.real % pad_to))
        self.n = latent.shape[2]
        self._z_p = latent if z is None else None
        self._z = latent if z is not None else torch.empty_like(latent)
        self._mask = (torch.arange(self.n, device=latent.device) < self.real).to(latent.dtype)[None, None, None, :]
        self._flowed = self.n if z is not None else 0  # frames of z computed so far
        self._spans = piece_spans(self.n, first_piece_frames, piece_frames)
        self._next = 0
        self._widest = 0
        self._left = self.real * model.hop_length  # samples still to give: padding's audio is cut
        self._context = context_frames
        self._flow_context = flow_context_frames
        self._flow_block = flow_block_frames
        self._first_flow_pieces = max(1, first_flow_pieces)

    @property
    def finished(self) -> bool:
        return self._next == len(self._spans)

    def cost(self) -> int:
        """Frames the next step decodes (its window, context included)."""
        lo, hi = self._decode_window()
        return hi - lo

    def _decode_window(self) -> tuple[int, int]:
        start, end = self._spans[self._next]
        return _window(start, end, self._context, self.n, self._widest)

    def _flow_window(self, hi: int) -> tuple[int, int, int] | None:
        """(flow window lo, hi, new end of z) when the decoder needs z up to ``hi``."""
        done = self._flowed
        if hi <= done:
            return None
        # A block ahead, swallowing a remainder shorter than half a block. The first
        # step gets just what its pieces need (every first audio waits for it); so does
        # the second, unless the block is short.
        end = max(hi, done + self._flow_block)
        end = self.n if self.n - end < self._flow_block // 2 else min(self.n, end)
        if self._next == 0:
            last = self._spans[min(self._first_flow_pieces, len(self._spans)) - 1]
            end = max(hi, _window(*last, self._context, self.n, 0)[1])
        elif self._next < FLOW_JUST_IN_TIME_PIECES and end - done > self._flow_block // 2:
            end = hi
        f_lo, f_hi = _window(done, end, self._flow_context, self.n, 0)
        return f_lo, f_hi, end

    def plan(self) -> StepPlan:
        """What the next step computes: its piece's span, its decoder window and the flow
        it needs first. Changes nothing."""
        decode = self._decode_window()
        return StepPlan(self._spans[self._next], decode, self._flow_window(decode[1]))

    def flow_inputs(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """The prior sample and its mask over ``plan``'s flow window (it has one)."""
        assert plan.flow is not None and self._z_p is not None
        lo, hi, _ = plan.flow
        return self._z_p[:, :, lo:hi], self._mask[..., lo:hi]

    def store_flow(self, plan: StepPlan, block: torch.Tensor) -> None:
        """Keep the flow's output over ``plan``'s flow window: the new frames of z. Written
        in place but not committed: the same inputs give the same z, so a step that fails
        later and is run again rewrites the same values."""
        assert plan.flow is not None
        lo, _, end = plan.flow
        self._z[:, :, self._flowed : end] = block[:, :, self._flowed - lo : end - lo]

    def decoder_input(self, plan: StepPlan) -> torch.Tensor:
        """z over ``plan``'s decoder window (its flow stored first)."""
        lo, hi = plan.decode
        return self._z[:, :, lo:hi]

    def piece(self, plan: StepPlan, audio: torch.Tensor) -> np.ndarray:
        """The piece within the decoder's output ``audio`` (1, samples) for ``plan``'s
        window: its span, context cut off, padding's audio cut off."""
        (start, end), (lo, _) = plan.span, plan.decode
        hop = self.model.hop_length
        # .cpu() is free on a CPU tensor and the device-to-host copy on CUDA.
        piece = audio[0, (start - lo) * hop : (end - lo) * hop].cpu().numpy()
        return piece[: max(0, self._left)]

    def commit(self, plan: StepPlan) -> None:
        """Move past the step ``plan`` describes, once its piece is computed."""
        if plan.flow is not None:
            self._flowed = plan.flow[2]
        self._widest = max(self._widest, plan.decode[1] - plan.decode[0])
        self._left -= (plan.span[1] - plan.span[0]) * self.model.hop_length
        self._next += 1

    @staticmethod
    def step_many(sentences: list[SentenceDecoder]) -> list[np.ndarray]:
        """Advance each sentence by one span: the flow blocks, then the decoder windows, each
        batched across the sentences whose windows are equally wide (exact: nothing is
        padded, and window widths come in a few multiples of SHAPE_BUCKET). All share one
        model. Nothing is committed until every piece is computed. A lone sentence is a
        batch of one."""
        if not sentences:
            return []
        model = sentences[0].model
        plans = [s.plan() for s in sentences]

        def speakers(members: list[int]) -> torch.Tensor | None:
            """The members' speaker embeddings, a row each (a batch may mix speakers); None
            for a one-speaker voice, whose sentences have none."""
            rows = [r for m in members if (r := sentences[m].speaker) is not None]
            return torch.cat(rows) if rows else None

        def batched(jobs: list[tuple[int, int]], run: Callable[[list[int]], torch.Tensor]) -> dict[int, torch.Tensor]:
            """Run ``run`` once per window width over the members of that width; each
            member's output row."""
            by_width: dict[int, list[int]] = {}
            for member, (lo, hi) in enumerate(jobs):
                if hi > lo:
                    by_width.setdefault(hi - lo, []).append(member)
            rows: dict[int, torch.Tensor] = {}
            for same_width in by_width.values():
                for members in batch_parts(same_width):
                    out = run(members)
                    for k, member in enumerate(members):
                        rows[member] = out[k : k + 1]
            return rows

        def flow(members: list[int]) -> torch.Tensor:
            inputs = [sentences[m].flow_inputs(plans[m]) for m in members]
            return model.flow_reverse(torch.cat([z_p for z_p, _ in inputs]), torch.cat([mask for _, mask in inputs]),
                                      speakers(members))

        flowed = batched([(p.flow[0], p.flow[1]) if p.flow else (0, 0) for p in plans], flow)
        for m, block in flowed.items():
            sentences[m].store_flow(plans[m], block)
        audio = batched([p.decode for p in plans], lambda ms: model.decode(
            torch.cat([sentences[m].decoder_input(plans[m]) for m in ms]), speakers(ms)
        ))
        pieces = [s.piece(p, audio[m]) for m, (s, p) in enumerate(zip(sentences, plans))]
        for s, p in zip(sentences, plans):  # commit
            s.commit(p)
        return pieces


@dataclass(frozen=True)
class StepPlan:
    """One ``SentenceDecoder`` step, planned: what ``step_many`` computes for it."""

    span: tuple[int, int]
    """[start, end) frames of the piece the step gives."""
    decode: tuple[int, int]
    """[lo, hi) frames of z the decoder runs on: the span and its context."""
    flow: tuple[int, int, int] | None
    """The flow to run first, if z is not yet computed up to ``decode``'s end: its
    window's [lo, hi) frames of z_p, and the frame z is then computed up to."""


def _check(z: torch.Tensor, piece_frames: int, context_frames: int) -> None:
    if z.dim() != 3 or z.shape[0] != 1:
        raise ValueError(f"expected a latent of shape [1, C, F], got {tuple(z.shape)}")
    if piece_frames < 1 or context_frames < 0:
        raise ValueError("piece_frames must be >= 1 and context_frames >= 0")


def _pieces(sentence: SentenceDecoder) -> Iterator[np.ndarray]:
    while not sentence.finished:
        (piece,) = SentenceDecoder.step_many([sentence])
        if piece.size:
            yield piece


def decode_chunks(
    model: Vits,
    z: torch.Tensor,
    piece_frames: int = PIECE_FRAMES,
    context_frames: int | None = None,
    first_piece_frames: int = FIRST_PIECE_FRAMES,
    speaker: torch.Tensor | None = None,
) -> Iterator[np.ndarray]:
    """Decode z [1, C, F] (from ``Vits.infer_latent``) piece by piece.

    Yields float32 arrays whose concatenation has exactly F * hop_length samples; with
    the default context (the decoder's receptive field) it equals ``model.decode(z)`` up
    to rounding."""
    yield from _pieces(SentenceDecoder(
        model, z=z, piece_frames=piece_frames, context_frames=context_frames, first_piece_frames=first_piece_frames,
        speaker=speaker,
    ))


def stream_chunks(
    model: Vits,
    z_p: torch.Tensor,
    piece_frames: int = PIECE_FRAMES,
    context_frames: int | None = None,
    first_piece_frames: int = FIRST_PIECE_FRAMES,
    flow_context_frames: int | None = None,
    flow_block_frames: int = FLOW_BLOCK_FRAMES,
    pad_to: int = 1,
    speaker: torch.Tensor | None = None,
) -> Iterator[np.ndarray]:
    """Like ``decode_chunks`` but from the prior sample z_p (``Vits.infer_prior``): the
    flow runs lazily, just ahead of the decoder, so the first piece costs the same for a
    3-word and a 40-word sentence (apart from the text encoder)."""
    yield from _pieces(SentenceDecoder(
        model, z_p=z_p, piece_frames=piece_frames, context_frames=context_frames,
        first_piece_frames=first_piece_frames, flow_context_frames=flow_context_frames,
        flow_block_frames=flow_block_frames, pad_to=pad_to, speaker=speaker,
    ))
