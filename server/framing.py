"""What a speech gives its door, and the sans-I/O core that makes it.

``Framer`` takes the worker's queue items (pieces, word timings, ``Flushed``, then
``Done`` or ``Failed``) and gives the events a door sends in its own shape: audio frames,
word timings, ``FlushedEvent``, then ``DoneEvent`` with the utterance's ``Figures`` or
``FailedEvent`` (each item's event named after it). It does no I/O and knows no door, so
it is tested with synthetic items, without sockets.
docs/glossary.md says what each word (piece, chunk, frame, event) names.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

from voxwire.engine.audio_queue import Done, Flushed, Item
from voxwire.engine.base import WordTiming, WordTimings
from voxwire.server.audio import ChunkCutter, open_encoder
from voxwire.server.cache import CachedAudio
from voxwire.server.protocol import StreamSettings


# -- what a door is given to send -------------------------------------------------------


@dataclass(frozen=True)
class AudioFrame:
    seq: int
    offset: int
    """Index of the frame's first sample within the utterance, at the stream's rate."""
    samples: int
    data: bytes
    """The samples in the stream's format; for a compressed one, the bytes its encoder
    let go of with these samples (the frames, concatenated, are one stream)."""


@dataclass(frozen=True)
class Words:
    """Word timings, sent just ahead of the frame the first of them starts in."""

    words: tuple[dict[str, object], ...]


@dataclass(frozen=True)
class FlushedEvent:
    pass


@dataclass(frozen=True)
class DoneEvent:
    figures: Figures


@dataclass(frozen=True)
class FailedEvent:
    code: str
    message: str


Event = AudioFrame | Words | FlushedEvent | DoneEvent | FailedEvent


@dataclass(frozen=True)
class Figures:
    """An utterance's own figures, as ``done`` reports them (docs/protocol.md)."""

    ttfa_ms: float | None
    audio_ms: float
    compute_ms: float
    rtf: float | None
    chunks: int
    samples: int
    segments: int
    engine_steps: int
    engine_steps_at_first_chunk: int | None
    cached: bool
    bytes: int
    """Audio bytes sent: what the format costs on the wire."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# -- the sans-I/O core ------------------------------------------------------------------


class Framer:
    """The worker's queue items in; frames, word timings and markers out.

    It resamples and cuts the pieces into chunks (server/audio.py), encodes each into a
    frame, moves word timings onto the stream's timeline, and keeps a copy of the
    engine's audio and words for the result cache while it stays under ``capture_bytes``.
    """

    def __init__(self, engine_rate: int, settings: StreamSettings, capture_bytes: int = 0) -> None:
        self.settings = settings
        self._engine_rate = engine_rate
        self._out = ChunkCutter(engine_rate, settings.sample_rate, settings.chunk_ms)
        self._encoder = open_encoder(settings.format, settings.sample_rate)
        self._words: deque[WordTiming] = deque()
        self._spoken: list[WordTiming] = []
        """Every word timed so far, on the stream's timeline, asked for or not: what a
        cancel says was sent and played."""
        self.timed = False
        """The engine has timed words of this utterance."""
        self.frames = 0
        self.samples = 0
        self.bytes = 0
        self.finished = False
        self._capture: list[np.ndarray] | None = [] if capture_bytes > 0 else None
        self._capture_bytes = capture_bytes
        self._captured_bytes = 0
        self._captured_words: list[WordTiming] = []

    def receive(self, item: Item) -> list[Event]:
        if isinstance(item, np.ndarray):
            self._keep(item)
            return self._frames(self._out.push(item))
        if isinstance(item, WordTimings):
            if self._capture is not None:
                self._captured_words.extend(item.words)
            scale = self.settings.sample_rate / self._engine_rate  # engine samples -> the stream's
            words = [WordTiming(w.word, round(w.start * scale), round(w.end * scale)) for w in item.words]
            self._spoken += words
            self.timed = True
            if self.settings.timestamps:
                self._words.extend(words)
            return []
        if isinstance(item, Flushed):
            return [*self._frames(self._out.flush()), FlushedEvent()]
        if isinstance(item, Done):
            self.finished = True
            events = self._frames(self._out.finish(), last=True)
            return events + self._words_before(None)
        self._encoder.close()
        return [FailedEvent(item.code, item.message)]

    def close(self) -> None:
        """The utterance ended without finishing (cancelled, disconnected): the encoder's
        held samples are dropped; what was sent is whole frames, and stays decodable."""
        self._encoder.close()

    def captured(self, segments: int) -> CachedAudio | None:
        """What the cache may keep of a finished utterance: its engine audio, and its
        words where the engine timed them (asked for or not: a replay's cancel says what
        was heard); None when it grew too big to keep."""
        if not self.finished or not self._capture:
            return None
        words = tuple(self._captured_words) if self.timed else None
        return CachedAudio(np.concatenate(self._capture), segments, words)

    def words_within(self, samples: int) -> list[str] | None:
        """The words whose audio begins within the first ``samples`` of the stream; None
        where the engine times no words (and some audio there was)."""
        if not self.timed:
            return None if samples else []
        return [w.word for w in self._spoken if w.start < samples]

    def _keep(self, piece: np.ndarray) -> None:
        if self._capture is None:
            return
        self._capture.append(piece)
        self._captured_bytes += piece.nbytes
        if self._captured_bytes > self._capture_bytes:
            self._capture = None  # too long to cache: stop holding it

    def _frames(self, frames: list[np.ndarray], last: bool = False) -> list[Event]:
        """Frames encoded; with ``last``, the encoder's end goes with the last of them
        (or alone, covering no samples, when the utterance ends on a frame boundary)."""
        events: list[Event] = []
        if last and not frames:
            frames = [np.zeros(0, np.float32)]
        for i, frame in enumerate(frames):
            data = self._encoder.push(frame)
            if last and i == len(frames) - 1:
                data += self._encoder.finish()
                if not frame.size and not data:
                    break  # nothing held back (PCM): no empty frame
            events += self._words_before(self.samples + frame.size)
            events.append(AudioFrame(self.frames, self.samples, frame.size, data))
            self.frames += 1
            self.samples += frame.size
            self.bytes += len(data)
        return events

    def _words_before(self, end: int | None) -> list[Event]:
        """The words that start before sample ``end`` (all of them when None)."""
        words = []
        while self._words and (end is None or self._words[0].start < end):
            words.append(self._words.popleft())
        if not words:
            return []
        rate = self.settings.sample_rate
        return [
            Words(tuple(
                {"word": w.word, "start_ms": round(w.start * 1000 / rate, 1), "end_ms": round(w.end * 1000 / rate, 1)}
                for w in words
            ))
        ]
