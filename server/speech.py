"""An admitted utterance, as a door sees it: fed with text, its events read, ended once.

A door gets a ``Speech`` from the pipeline (server/pipeline.py) and reads its events
(server/framing.py) in order, up to ``DoneEvent`` or ``FailedEvent``. What the door may read
of it (the samples and frames sent, when a listener will have heard them) is here, so
that no door reaches into the framer or the worker's utterance. The speech tells the one
that opened it (a ``SpeechOwner``: the pipeline) when it has ended and when its listener
stalled, and nothing more: it holds none of the pipeline's parts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from voxwire.engine.audio_queue import Done, Failed
from voxwire.engine.errors import ErrorCode
from voxwire.engine.text import expanded_length
from voxwire.engine.text.words import join as join_words
from voxwire.engine.utterance import Utterance
from voxwire.server.cache import CachedAudio, Replay
from voxwire.server.framing import AudioFrame, DoneEvent, Event, Figures, FlushedEvent, Framer
from voxwire.server.protocol import StreamSettings


@dataclass(frozen=True)
class UtteranceRequest:
    """What a door asks for: the first text, and how the audio is to be delivered."""

    door: str
    """The door's name (``ws``, ``http``, ``wyoming``), for the metrics and the log."""
    text: str
    final: bool
    settings: StreamSettings
    ids: dict[str, str]
    """What names this utterance in the log (session and ctx, or a request id)."""


class SpeechOwner(Protocol):
    """What a speech tells the one that opened it."""

    def ended(
        self, speech: Speech, outcome: str, code: str | None, figures: dict[str, object], result: CachedAudio | None,
    ) -> None:
        """``speech`` is over, as ``outcome`` (its worker's side stopped): give
        back its slot, keep ``result`` (a finished one's audio, when it may be cached) and
        account for it with its ``figures``. Called once."""

    def stalled(self, speech: Speech, reason: str) -> None:
        """Its listener stopped taking its audio, for ``reason`` (counted by door and reason)."""


class Speech:
    """An admitted utterance, as a door sees it: fed, streamed, ended once."""

    def __init__(
        self, owner: SpeechOwner, request: UtteranceRequest, source: Utterance | Replay, engine_rate: int,
        capture_bytes: int, ignored: Sequence[str] = (),
    ) -> None:
        """``capture_bytes``: how much of its engine audio to keep for the result cache
        (0: none, as for a replay, or with the cache off). ``ignored``: what of its SSML
        was spoken as plain text or left out, for the door to say once."""
        self.request = request
        self.ignored = tuple(ignored)
        self.settings = request.settings
        self.received_at = time.monotonic()
        self.first_frame_at: float | None = None
        self.outcome: str | None = None
        self._owner = owner
        self._source = source
        self._text = [request.text]
        self._chars = expanded_length(request.text)
        self._framer = Framer(engine_rate, request.settings, capture_bytes)
        self._engine_rate = engine_rate
        self._steps_at_first_frame: int | None = None
        # Once the queue has given Done, a flush can no longer go through it: the events
        # answer it themselves before DoneEvent, or, once DoneEvent is out, the door does.
        self._finishing = False
        self._flush_at_end = False
        self._sent_all = False
        self._played: int | None = None

    # -- what a door reads ------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """All its text has arrived (a cached replay always has it)."""
        return self._source.complete

    @property
    def cached(self) -> bool:
        """It is replayed from the result cache."""
        return isinstance(self._source, Replay)

    @property
    def text(self) -> str:
        """All its text so far, as it arrived."""
        return "".join(self._text)

    @property
    def text_chars(self) -> int:
        """Its text's length so far, as normalisation expands it (``expanded_length``)."""
        return self._chars

    @property
    def samples_sent(self) -> int:
        """The samples its frames so far carry, at the stream's rate."""
        return self._framer.samples

    @property
    def frames_sent(self) -> int:
        """How many frames its events have given so far."""
        return self._framer.frames

    @property
    def text_sent(self) -> str | None:
        """The words whose audio has been given to the door, as the engine timed them,
        space-separated but in scripts written without spaces (``words.join``); None
        where the engine times no words."""
        words = self._framer.words_within(self._framer.samples)
        return None if words is None else join_words(words)

    @property
    def text_played(self) -> str | None:
        """The words whose audio the client has reported played (``progress``); None
        before any report, or where the engine times no words."""
        if self._played is None:
            return None
        words = self._framer.words_within(self._played)
        return None if words is None else join_words(words)

    @property
    def heard_by(self) -> float | None:
        """When a listener that plays from its first frame on, in real time, will have
        heard every frame given so far (monotonic clock); None before the first."""
        if self.first_frame_at is None:
            return None
        return self.first_frame_at + self._framer.samples / self.settings.sample_rate

    @property
    def held_by_listener(self) -> bool:
        """The engine has more to compute for it but waits for its listener: the queue is
        full, or the playback window is in hand. Waiting for the producer's text is not
        this; a cached replay computes nothing, so it is never held."""
        return self._source.held_by_listener()

    # -- what a door does -------------------------------------------------------------------

    def feed(self, text: str, final: bool) -> None:
        self._text.append(text)
        self._chars += expanded_length(text)
        self._source.feed(text, final)

    def flush(self) -> bool:
        """Ask for a FlushedEvent once the audio of the text so far is out: False when all
        of it already is (the events have reached DoneEvent), and the door answers at once."""
        if self._sent_all:
            return False
        if self._finishing:
            self._flush_at_end = True
        else:
            self._source.flush()
        return True

    async def events(self) -> AsyncIterator[Event]:
        """What the client is sent, in order, up to and including DoneEvent or FailedEvent."""
        while True:
            item = await self._source.queue.get()
            self._finishing = isinstance(item, Done)
            for event in self._framer.receive(item):
                if isinstance(event, AudioFrame) and self.first_frame_at is None:
                    self.first_frame_at = time.monotonic()
                    self._steps_at_first_frame = self._source.steps
                yield event
            if isinstance(item, Done):
                if self._flush_at_end:
                    yield FlushedEvent()
                self._sent_all = True
                yield DoneEvent(self.figures())
                return
            if isinstance(item, Failed):
                return

    def figures(self) -> Figures:
        source = self._source
        audio_s = self._framer.samples / self.settings.sample_rate
        ttfa = None if self.first_frame_at is None else round((self.first_frame_at - self.received_at) * 1000, 1)
        return Figures(
            ttfa_ms=ttfa,
            audio_ms=round(audio_s * 1000, 1),
            compute_ms=round(source.compute_seconds * 1000, 1),
            rtf=round(source.compute_seconds / audio_s, 4) if audio_s else None,
            chunks=self._framer.frames,
            samples=self._framer.samples,
            segments=source.segments,
            engine_steps=source.steps,
            engine_steps_at_first_chunk=self._steps_at_first_frame,
            cached=self.cached,
            bytes=self._framer.bytes,
        )

    def abort(self, code: str, message: str) -> None:
        """Fail it from the server's side (a shutdown past its deadline): the worker stops,
        and the door's next event is FailedEvent, whatever was queued."""
        if self.outcome is not None:
            return
        self._source.abort(code, message)

    def played(self, samples: int, window_seconds: float) -> None:
        """The client has played ``samples`` of this utterance (at the stream's rate):
        compute at most ``window_seconds`` of audio beyond that. A cached replay computes
        nothing, so there is nothing to hold."""
        self._played = min(samples, self._framer.samples)
        if isinstance(self._source, Replay):
            return
        rate = self._engine_rate
        played = self._played * rate // self.settings.sample_rate
        self._source.queue.pace(round(window_seconds * rate), played)

    def drop_queued(self) -> None:
        """A barge-in: the audio queued for the client goes, now."""
        self._source.queue.clear()

    def end_stalled(self, reason: str) -> None:
        """Its listener stopped taking its audio (``reason``: ``not_reading``, its socket
        took nothing; ``no_progress``, it reported no playback): it ends ``listener_stalled``,
        counted by door and reason. Only the first end counts, as for ``end``."""
        if self.outcome is None:
            self.end("failed", ErrorCode.LISTENER_STALLED)
            self._owner.stalled(self, reason)

    def end(self, outcome: str, code: str | None = None) -> None:
        """The utterance is over (``done``, ``cancelled``, ``disconnected`` or ``failed``
        with its code): stop the worker's side, then its owner gives back the slot, keeps
        a finished result for the cache, and accounts for it. Only the first call counts."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        if self._source.outcome is None:
            self._source.cancel()
        self._framer.close()
        done = outcome == "done"
        figures: dict[str, object] = self.figures().to_dict() if done else {
            "samples": self._framer.samples, "chunks": self._framer.frames,
            # What the listener got of an utterance cut short: its text goes to the log
            # only as the rest of its text does (log_text).
            "text_sent": self.text_sent, "text_played": self.text_played,
        }
        self._owner.ended(self, outcome, code, figures, self._framer.captured(self._source.segments) if done else None)
