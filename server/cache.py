"""A bounded LRU of finished utterances' audio, by bytes.

Keyed by engine, voice, speed and normalised text: a repeated request (a prompt being
tuned, a fixed greeting) streams from memory at once. The audio is kept at the engine's
rate, before resampling and encoding, so one entry serves every output format. A voice
that is registered again drops its entries, so nothing stale is served.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine.queue import AudioQueue, Finished
from engine.text import normalize


@dataclass(frozen=True)
class CacheKey:
    engine: str
    voice: str
    speed: float
    text: str


@dataclass(frozen=True)
class Entry:
    audio: np.ndarray
    segments: int

    def replay(self, loop: asyncio.AbstractEventLoop) -> AudioQueue:
        """A queue that already holds the whole utterance, as the worker would have filled it."""
        queue = AudioQueue(loop, self.audio.size + 1)
        queue.put(self.audio)
        queue.put(Finished())
        return queue


class ResultCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[CacheKey, Entry] = OrderedDict()

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

    def get(self, key: CacheKey) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: CacheKey, entry: Entry) -> None:
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
