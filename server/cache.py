"""A bounded LRU of finished utterances' audio, by bytes.

Keyed by engine, voice and speaker, speed and normalised text: a repeated request (a
prompt being tuned, a fixed greeting) streams from memory at once. The audio is kept at
the engine's rate, before resampling and encoding, so one entry serves every output
format. A voice that is registered again drops its entries, so nothing stale is served.

A replay gives its audio in slices, as the engine gave it the first time: encoding a
whole utterance in one go (Opus, MP3, AAC) would hold back its first frame, and every
other stream on the event loop, until all of it was encoded.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from voxwire.engine.base import WordTiming, WordTimings
from voxwire.engine.audio_queue import Done, Failed, Flushed, Item
from voxwire.engine.text import normalize

REPLAY_SLICE_SECONDS = 0.2
"""Audio a replay encodes at a time: its first frame leaves after this much, and the
event loop has a turn between two slices."""


@dataclass(frozen=True)
class CacheKey:
    engine: str
    voice: str
    speed: float
    text: str
    fast_start: bool | None = None
    """The request's own schedule choice: a rendering on one schedule never answers a
    request for the other."""
    speaker: str | None = None
    """A multi-speaker voice's speaker as the request named it (None: the default one):
    one speaker's audio never answers a request for another."""
    lexicon: str | None = None
    """The fingerprint of the lexicon in force (None: none): a word said one way never
    answers a request that says it another."""
    text_format: str = "text"
    """``ssml``: the text is a document, whose markup says what is spoken."""


@dataclass(frozen=True)
class CachedAudio:
    audio: np.ndarray
    segments: int
    words: tuple[WordTiming, ...] | None = None
    """Word timings at the engine's rate, or None when the utterance was made without them."""


class Replay:
    """A cached utterance streamed again: an utterance of its own kind.

    It offers what the pipeline reads of the worker's utterance (a queue, flush, cancel,
    its figures), but nothing computes behind it: its queue already holds what the worker
    once produced (in slices, each word timing ahead of the slice it starts in), a
    ``flush`` is answered in order (before Done, which its queue gives last), and
    there is nothing to bound, as the audio is already in memory."""

    complete = True
    steps = 0
    compute_seconds = 0.0
    outcome: str | None = None

    def __init__(self, audio: CachedAudio, rate: int) -> None:
        self.segments = audio.segments
        self.queue = _ReplayQueue()
        for item in replay_items(audio, max(1, round(rate * REPLAY_SLICE_SECONDS))):
            self.queue.put(item)

    def feed(self, text: str, final: bool = False) -> None:
        raise RuntimeError("a replay has all its text")

    def flush(self) -> None:
        self.queue.put(Flushed())

    def cancel(self) -> None:
        self.queue.clear()

    def abort(self, code: str, message: str) -> None:
        """End it with ``Failed(code, message)``, whatever was queued: one thread (the
        event loop) both puts and takes here, so nothing comes between."""
        self.queue.clear()
        self.queue.put(Failed(code, message))

    def held_by_listener(self) -> bool:
        """Never: nothing computes behind a replay."""
        return False


def replay_items(audio: CachedAudio, size: int) -> Iterator[WordTimings | np.ndarray]:
    """A cached utterance's queue items: slices of ``size`` samples (views, not copies),
    each preceded by the timings of the words that start in it, as fresh audio is; words
    that start past the end go with the last slice."""
    words = audio.words or ()
    total = audio.audio.shape[0]
    taken = 0
    for start in range(0, max(total, 1), size):
        end = start + size
        last = end >= total
        upto = taken
        while upto < len(words) and (last or words[upto].start < end):
            upto += 1
        if upto > taken:
            yield WordTimings(words[taken:upto])
            taken = upto
        if total:
            yield audio.audio[start:end]


class _ReplayQueue:
    def __init__(self) -> None:
        self._items: deque[Item] = deque()

    async def get(self) -> Item:
        # Its items are all here already, so nothing would suspend the reader: give the
        # event loop a turn per item, or a long replay encodes without letting anyone in.
        await asyncio.sleep(0)
        return self._items.popleft() if self._items else Done()

    def put(self, item: Item) -> None:
        self._items.append(item)

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
    def key(
        engine: str, voice: str, speed: float, text: str, fast_start: bool | None = None, speaker: str | None = None,
        lexicon: str | None = None, text_format: str = "text",
    ) -> CacheKey:
        return CacheKey(engine, voice, speed, normalize(text), fast_start, speaker, lexicon, text_format)

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
