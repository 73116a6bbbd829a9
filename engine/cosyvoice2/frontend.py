"""Reference audio + transcript -> what a zero-shot voice needs, computed once per voice.

* speech tokens (25 Hz) from ``speech_tokenizer_v2.onnx`` on a 16 kHz Whisper log-mel,
* a speaker embedding (192) from ``campplus.onnx`` on a 16 kHz Kaldi fbank,
* the 24 kHz prompt mel for the flow, trimmed so mel frames = 2 x tokens,
* the transcript's text tokens for the LM prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime
import torch
import torchaudio

from ..base import EngineError
from ..errors import ErrorCode
from ..threads import onnx_session_options
from .features import kaldi_fbank, matcha_mel, whisper_log_mel
from .model_config import CosyVoice2Config
from .text import load_normalizers, normalize_text
from .tokenizer import TextTokenizer

MIN_SECONDS = 1.0
MAX_SECONDS = 30.0  # the speech tokenizer's limit in the reference
MIN_SAMPLE_RATE = 16000  # the reference refuses to up-sample reference audio
MAX_TRANSCRIPT_TOKENS = 300


@dataclass
class Prompt:
    """A voice's conditioning; everything synthesis needs, nothing it must recompute."""

    text_ids: np.ndarray  # (n,) int64: transcript tokens
    speech_tokens: np.ndarray  # (P,) int64
    mel: np.ndarray  # (2P, 80) float32
    embedding: np.ndarray  # (192,) float32


def _session(path: Path) -> onnxruntime.InferenceSession:
    options = onnx_session_options(threads=1)  # engine/threads.py
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def prepare_audio(audio: np.ndarray, sample_rate: int) -> torch.Tensor:
    """Validate an upload and return mono float32 at its own rate, or raise EngineError."""
    if not isinstance(audio, np.ndarray) or audio.size == 0:
        raise EngineError(ErrorCode.BAD_AUDIO, "the reference audio is empty or not an array")
    if not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise EngineError(ErrorCode.BAD_AUDIO, f"invalid sample rate {sample_rate!r}")
    if sample_rate < MIN_SAMPLE_RATE:
        raise EngineError(ErrorCode.BAD_AUDIO, f"reference audio must be sampled at {MIN_SAMPLE_RATE} Hz or more")
    if not np.issubdtype(audio.dtype, np.floating):
        raise EngineError(ErrorCode.BAD_AUDIO, "reference audio must be floating point in [-1, 1]")
    if audio.ndim == 2:  # (samples, channels) or (channels, samples): mix down
        axis = 0 if audio.shape[0] < audio.shape[1] else 1
        audio = audio.mean(axis=axis)
    if audio.ndim != 1:
        raise EngineError(ErrorCode.BAD_AUDIO, f"reference audio must be mono or stereo, got shape {audio.shape}")
    audio = audio.astype(np.float32)
    if not np.isfinite(audio).all():
        raise EngineError(ErrorCode.BAD_AUDIO, "reference audio contains NaN or infinity")
    seconds = audio.shape[0] / sample_rate
    if seconds < MIN_SECONDS:
        raise EngineError(
            ErrorCode.AUDIO_TOO_SHORT, f"reference audio is {seconds:.2f} s; at least {MIN_SECONDS:.0f} s needed"
        )
    if seconds > MAX_SECONDS:
        raise EngineError(ErrorCode.AUDIO_TOO_LONG, f"reference audio is {seconds:.1f} s; at most {MAX_SECONDS:.0f} s")
    if float(np.abs(audio).max()) < 1e-4:
        raise EngineError(ErrorCode.BAD_AUDIO, "reference audio is silent")
    return torch.from_numpy(np.clip(audio, -1.0, 1.0))


class Frontend:
    def __init__(self, model_dir: Path, cfg: CosyVoice2Config, tokenizer: TextTokenizer) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self.campplus = _session(model_dir / "campplus.onnx")
        self.speech_tokenizer = _session(model_dir / "speech_tokenizer_v2.onnx")
        load_normalizers()  # at engine load, so the first request does not pay for it

    def transcript_ids(self, transcript: str) -> np.ndarray:
        text = normalize_text(transcript or "")
        if not text:
            raise EngineError(ErrorCode.TRANSCRIPT_MISSING, "a transcript of the reference audio is required")
        ids = self.tokenizer.encode(text)
        if len(ids) > MAX_TRANSCRIPT_TOKENS:
            raise EngineError(
                ErrorCode.TRANSCRIPT_TOO_LONG, f"the transcript is {len(ids)} tokens; at most {MAX_TRANSCRIPT_TOKENS}"
            )
        return np.asarray(ids, dtype=np.int64)

    @torch.inference_mode()
    def extract(self, audio: np.ndarray, sample_rate: int, transcript: str) -> Prompt:
        text_ids = self.transcript_ids(transcript)
        wav = prepare_audio(audio, int(sample_rate))
        wav16 = torchaudio.functional.resample(wav, int(sample_rate), 16000) if sample_rate != 16000 else wav
        sr = self.cfg.mel.sampling_rate
        wav24 = torchaudio.functional.resample(wav, int(sample_rate), sr) if sample_rate != sr else wav

        feats = whisper_log_mel(wav16).unsqueeze(0).numpy()
        inputs = self.speech_tokenizer.get_inputs()
        tokens = self.speech_tokenizer.run(
            None, {inputs[0].name: feats, inputs[1].name: np.array([feats.shape[2]], dtype=np.int32)}
        )[0].reshape(-1).astype(np.int64)

        fbank = kaldi_fbank(wav16).unsqueeze(0).numpy()
        embedding = self.campplus.run(None, {self.campplus.get_inputs()[0].name: fbank})[0].reshape(-1)

        mel = matcha_mel(wav24, self.cfg.mel).numpy()
        # The flow needs exactly token_mel_ratio frames per token.
        ratio = self.cfg.token_mel_ratio
        n = min(mel.shape[0] // ratio, tokens.shape[0])
        if n < 1:
            raise EngineError(ErrorCode.AUDIO_TOO_SHORT, "the reference audio yields no speech tokens")
        return Prompt(
            text_ids=text_ids,
            speech_tokens=tokens[:n],
            mel=np.ascontiguousarray(mel[: ratio * n], dtype=np.float32),
            embedding=embedding.astype(np.float32),
        )
