"""A bounded LRU of finished utterances' audio, by bytes.

Keyed by engine, voice, speed and normalised text: a repeated request (a prompt being
tuned, a fixed greeting) streams from memory at once. The audio is kept at the engine's
rate, before resampling and encoding, so one entry serves every output format. A voice
that is registered again drops its entries, so nothing stale is served.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from engine.base import WordTiming, WordTimings
from engine.audio_queue import Finished, Flushed, Item
from engine.text import normalize


@dataclass(frozen=True)
class CacheKey:
    engine: str
    voice: str
    speed: float
    text: str


@dataclass(frozen=True)
class CachedAudio:
    audio: np.ndarray
    segments: int
    words: tuple[WordTiming, ...] | None = None
    """Word timings at the engine's rate, or None when the utterance was made without them."""


class Replay:
    """A cached utterance streamed again: what the worker once produced, then Finished.

    It reads like the worker's queue (``get``), but it is its own kind: nothing computes
    behind it, a ``flush`` is answered in order (before Finished), and there is nothing to
    bound, because the audio is already in memory."""

    def __init__(self, entry: CachedAudio) -> None:
        self._items: deque[Item] = deque()
        if entry.words:
            self._items.append(WordTimings(entry.words))
        self._items.append(entry.audio)

    async def get(self) -> Item:
        return self._items.popleft() if self._items else Finished()

    def flush(self) -> None:
        self._items.append(Flushed())

    def fail(self, failure: Failed) -> None:
        """End the replay with ``failure`` next, whatever was left to send."""
        self._items.clear()
        self._items.append(failure)

    def clear(self) -> int:
        dropped = sum(i.shape[0] for i in self._items if isinstance(i, np.ndarray))
        self._items.clear()
        return dropped


class ResultCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self._entries: OrderedDict[CacheKey, CachedAudio] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def max_entry_bytes(self) -> int:
        """One utterance may take at most a quarter of the cache."""
        return self.max_bytes // 4

    @staticmethod
    def key(engine: str, voice: str, speed: float, text: str) -> CacheKey:
        return CacheKey(engine, voice, speed, normalize(text))

    def get(self, key: CacheKey, with_words: bool = False) -> CachedAudio | None:
        """The entry for ``key``; with ``with_words``, only one that has word timings (a
        request for timestamps is then computed again, and its result replaces the entry)."""
        entry = self._entries.get(key)
        if entry is None or (with_words and entry.words is None):
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: CacheKey, entry: CachedAudio) -> None:
        size = entry.audio.nbytes
        if not self.enabled or size > self.max_entry_bytes or not key.text:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.audio.nbytes
        self._entries[key] = entry
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.audio.nbytes

    def invalidate_voice(self, voice: str) -> None:
        for key in [k for k in self._entries if k.voice == voice]:
            self.bytes -= self._entries.pop(key).audio.nbytes

    def __len__(self) -> int:
        return len(self._entries)
