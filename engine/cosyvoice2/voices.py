"""Registered zero-shot voices: cached by content hash, kept on disk across restarts.

A voice is the frontend's output (:class:`Prompt`) plus a name, and optionally its own
default ``fast_start`` (see engine.py; a file written before it existed has none). Its id
is a hash of the audio samples, sample rate and transcript, so registering the same
content twice returns the same voice without running the frontend again. On disk each
voice is ``<id>.npz`` (arrays) + ``<id>.json`` (metadata), written atomically.

Several server processes (``--workers``) may share one directory: a voice that one of
them registers is read from disk by the others the first time they are asked for it.
Exactly one registration of a content creates it, even across processes: the metadata
file is linked into place, which fails for every writer but the first. Voices are listed
in the order they were registered, so every process names the same default voice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .frontend import Prompt

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
# What content_id makes; only such ids are looked up on disk (no path tricks).
_ID = re.compile(r"cv2-[0-9a-f]{20}")


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
    registered_at: float = 0.0
    fast_start: bool | None = None
    """This voice's default for a request that does not choose (None: the engine's).
    Voices stored before the setting existed have none."""


class VoiceStore:
    def __init__(self, directory: Path | None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._voices: dict[str, StoredVoice] = {}
        self._unreadable: set[str] = set()  # listed once, not re-read on every listing
        self._lock = threading.Lock()  # voices() is read from other threads
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.all()

    @staticmethod
    def _read(meta_path: Path) -> StoredVoice | None:
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("format") != FORMAT_VERSION:
                return None
            # The .json is written after the .npz, so a .json that exists has its arrays.
            with np.load(meta_path.with_suffix(".npz")) as arrays:
                prompt = Prompt(
                    text_ids=arrays["text_ids"].astype(np.int64),
                    speech_tokens=arrays["speech_tokens"].astype(np.int64),
                    mel=arrays["mel"].astype(np.float32),
                    embedding=arrays["embedding"].astype(np.float32),
                )
            registered_at = float(meta.get("registered_at", meta_path.stat().st_mtime))
            fast_start = meta.get("fast_start")  # absent from voices stored before it existed
            if fast_start is not None and not isinstance(fast_start, bool):
                raise ValueError(f"fast_start is {fast_start!r}, not true, false or null")
            return StoredVoice(meta["id"], meta["name"], prompt, meta.get("transcript", ""), registered_at, fast_start)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("skipping unreadable voice %s: %s", meta_path.name, exc)
            return None

    def _from_disk(self, voice_id: str) -> StoredVoice | None:
        """A voice another process registered since this one loaded the directory."""
        if self.directory is None or not _ID.fullmatch(voice_id):
            return None
        meta_path = self.directory / f"{voice_id}.json"
        if not meta_path.is_file():
            return None
        voice = self._read(meta_path)
        with self._lock:
            if voice is None or voice.id != voice_id:
                self._unreadable.add(voice_id)
                return None
            return self._voices.setdefault(voice_id, voice)

    def get(self, voice_id: str) -> StoredVoice | None:
        with self._lock:
            known = self._voices.get(voice_id)
        return known if known is not None else self._from_disk(voice_id)

    def all(self) -> list[StoredVoice]:
        if self.directory is not None:
            with self._lock:
                seen = set(self._voices) | self._unreadable
            for meta_path in sorted(self.directory.glob("cv2-*.json")):
                if meta_path.stem not in seen:
                    self._from_disk(meta_path.stem)
        with self._lock:
            return sorted(self._voices.values(), key=lambda v: (v.registered_at, v.id))

    def add(self, voice: StoredVoice) -> StoredVoice:
        """Keep ``voice``; return the voice stored under its id, which is another's when
        another registration (in this process or another) got there first."""
        voice.registered_at = voice.registered_at or time.time()
        if self.directory is not None:
            stem = self.directory / voice.id
            tmp_npz = stem.with_name(f"{voice.id}.{os.getpid()}.tmp.npz")
            np.savez(
                tmp_npz,
                text_ids=voice.prompt.text_ids,
                speech_tokens=voice.prompt.speech_tokens,
                mel=voice.prompt.mel,
                embedding=voice.prompt.embedding,
            )
            os.replace(tmp_npz, stem.with_suffix(".npz"))
            meta = {
                "format": FORMAT_VERSION, "id": voice.id, "name": voice.name, "transcript": voice.transcript,
                "registered_at": voice.registered_at, "fast_start": voice.fast_start,
            }
            tmp_json = stem.with_name(f"{voice.id}.{os.getpid()}.tmp.json")
            tmp_json.write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
            try:
                os.link(tmp_json, stem.with_suffix(".json"))  # fails if another registration won
            except FileExistsError:
                winner = self._from_disk(voice.id)
                if winner is not None:
                    return winner
            finally:
                tmp_json.unlink(missing_ok=True)
        with self._lock:
            stored = self._voices.setdefault(voice.id, voice)
            self._unreadable.discard(voice.id)
            return stored
