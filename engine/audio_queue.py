"""The bounded hand-off from the inference thread to an asyncio consumer.

The worker thread never blocks on it: it asks ``full()`` before it computes a step for
the utterance, and skips the utterance while its listener is behind. The bound is in
samples, not items, because one engine step may yield 40 ms or 4 s of audio.

A second bound, the playback window, holds for clients that report what they have
played (docs/protocol.md, ``progress``): behind a proxy that buffers without limit the
queue empties at once, so only the listener's own count says how far ahead we are.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voxwire.engine.base import WordTimings
from voxwire.engine.worker_lock import WorkerLock


@dataclass(frozen=True)
class Flushed:
    """All audio for the text before a ``flush`` is now in the queue."""


@dataclass(frozen=True)
class Done:
    """The utterance is complete: nothing follows."""


@dataclass(frozen=True)
class Failed:
    code: str
    message: str


Item = np.ndarray | WordTimings | Flushed | Done | Failed


class AudioQueue:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        max_samples: int,
        on_drain: Callable[[], None] = lambda: None,
        producer: WorkerLock | None = None,
    ) -> None:
        """``producer``: the worker whose thread alone may ``put`` (checked when thread
        checks are on; None: unchecked)."""
        self._loop = loop
        self._producer = producer
        self._max_samples = max_samples
        self._on_drain = on_drain
        self._items: deque[Item] = deque()
        self._samples = 0
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._window: int | None = None
        self._produced = 0
        self._played = 0
        self._ended = False  # end_with was called: the last item is in, nothing follows

    @property
    def samples(self) -> int:
        return self._samples

    @property
    def ahead(self) -> int:
        """Samples computed but not yet reported played (all computed ones, unpaced)."""
        return self._produced - self._played

    def full(self) -> bool:
        """The worker must not compute for this utterance now: its queue is full, or its
        listener has the whole playback window in hand."""
        if self._samples >= self._max_samples:
            return True
        return self._window is not None and self._produced - self._played >= self._window

    def pace(self, window: int, played: int) -> None:
        """The listener has played ``played`` of the samples put here (a running total,
        at this queue's rate): compute no more than ``window`` samples beyond it. The first
        call turns pacing on; a count lower than one already given changes nothing."""
        with self._lock:
            was_full = self.full()
            self._window = window
            self._played = max(self._played, min(played, self._produced))
            released = was_full and not self.full()
        if released:
            self._on_drain()

    def put(self, item: Item) -> None:
        """Called from the worker thread. Dropped once ``end_with`` has ended the queue."""
        if self._producer is not None:
            self._producer.on_worker_thread("AudioQueue.put")
        with self._lock:
            if self._ended:
                return
            self._items.append(item)
            if isinstance(item, np.ndarray):
                self._samples += item.shape[0]
                self._produced += item.shape[0]
        self._wake_reader()

    def end_with(self, item: Failed) -> None:
        """Drop everything queued and make ``item`` the last and only item the consumer
        gets: later puts are dropped, and ``clear`` keeps it. Any thread; the first call
        counts."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self._items.clear()
            self._items.append(item)
            self._samples = 0
        self._wake_reader()
        self._on_drain()

    def _wake_reader(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:
            pass  # the loop has closed: nobody is listening any more

    async def get(self) -> Item:
        while True:
            with self._lock:
                if self._items:
                    item = self._items.popleft()
                    was_full = self.full()
                    if isinstance(item, np.ndarray):
                        self._samples -= item.shape[0]
                    drained = was_full and not self.full()
                    if not self._items:
                        self._ready.clear()
                    break
                self._ready.clear()
            await self._ready.wait()
        if drained:
            self._on_drain()
        return item

    def clear(self) -> int:
        """Drop everything queued; return how many samples were dropped. An ended queue
        holds only its last item, which stays."""
        with self._lock:
            if self._ended:
                return 0
            dropped = self._samples
            self._items.clear()
            self._samples = 0
            self._ready.clear()
        self._on_drain()
        return dropped
