"""Registered zero-shot voices: cached by content hash, kept on disk across restarts.

A voice is the frontend's output (:class:`Prompt`) plus a name. Its id is a hash of
the audio samples, sample rate and transcript, so registering the same content
twice returns the same voice without running the frontend again. On disk each
voice is ``<id>.npz`` (arrays) + ``<id>.json`` (metadata), written atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .frontend import Prompt

log = logging.getLogger(__name__)
FORMAT_VERSION = 1


def content_id(audio: np.ndarray, sample_rate: int, transcript: str) -> str:
    h = hashlib.sha256()
    h.update(b"cosyvoice2-voice-v1\0")
    h.update(str(int(sample_rate)).encode() + b"\0")
    h.update(transcript.strip().encode("utf-8") + b"\0")
    h.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    return "cv2-" + h.hexdigest()[:20]


@dataclass
class StoredVoice:
    id: str
    name: str
    prompt: Prompt
    transcript: str


class VoiceStore:
    def __init__(self, directory: Path | None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._voices: dict[str, StoredVoice] = {}
        self._lock = threading.Lock()  # voices() is read from other threads
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._load_all()

    def _load_all(self) -> None:
        assert self.directory is not None
        for meta_path in sorted(self.directory.glob("cv2-*.json")):
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                if meta.get("format") != FORMAT_VERSION:
                    continue
                with np.load(meta_path.with_suffix(".npz")) as arrays:
                    prompt = Prompt(
                        text_ids=arrays["text_ids"].astype(np.int64),
                        speech_tokens=arrays["speech_tokens"].astype(np.int64),
                        mel=arrays["mel"].astype(np.float32),
                        embedding=arrays["embedding"].astype(np.float32),
                    )
                self._voices[meta["id"]] = StoredVoice(meta["id"], meta["name"], prompt, meta.get("transcript", ""))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("skipping unreadable voice %s: %s", meta_path.name, exc)

    def get(self, voice_id: str) -> StoredVoice | None:
        with self._lock:
            return self._voices.get(voice_id)

    def all(self) -> list[StoredVoice]:
        with self._lock:
            return list(self._voices.values())

    def add(self, voice: StoredVoice) -> None:
        if self.directory is not None:
            stem = self.directory / voice.id
            tmp_npz = stem.with_name(voice.id + ".tmp.npz")
            np.savez(
                tmp_npz,
                text_ids=voice.prompt.text_ids,
                speech_tokens=voice.prompt.speech_tokens,
                mel=voice.prompt.mel,
                embedding=voice.prompt.embedding,
            )
            os.replace(tmp_npz, stem.with_suffix(".npz"))
            meta = {"format": FORMAT_VERSION, "id": voice.id, "name": voice.name, "transcript": voice.transcript}
            tmp_json = stem.with_name(voice.id + ".tmp.json")
            tmp_json.write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp_json, stem.with_suffix(".json"))
        with self._lock:
            self._voices[voice.id] = voice
