"""One WebSocket connection's state: its defaults and its live utterances.

The session turns parsed protocol messages into worker calls and runs one asyncio task
per utterance, which pulls audio from the worker's bounded queue and sends frames. It
never touches a socket itself: it is given two coroutines that send text and bytes, so
the same session serves any transport and is easy to test.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from engine.base import EngineError, SynthesisParams, WordTiming, WordTimings
from engine.queue import AudioQueue, Failed, Finished, Flushed
from engine.text import normalize
from engine.worker import Utterance
from server import protocol
from server.audio import OutputStream, encode
from server.cache import CacheKey, Entry, Replay
from server.logs import log_utterance
from server.limits import TokenBucket
from server.protocol import Cancel, Config, Flush, ProtocolError, Speak, StreamSettings

if TYPE_CHECKING:
    from server.service import Service

log = logging.getLogger(__name__)

SendText = Callable[[str], Awaitable[None]]
SendBytes = Callable[[bytes], Awaitable[None]]

RETRY_AFTER_MS = 1000  # a hint: one second is long next to an utterance's first step
ENDED_CTX_REMEMBERED = 4096
"""Ended ctx ids a connection remembers: a late cancel for one is not an error, and text
for one is refused (ctx_finished) instead of opening a new utterance under its name."""


@dataclass
class _Live:
    """An utterance as its session sees it."""

    ctx: str
    settings: StreamSettings
    utterance: Utterance | None
    """The worker's side of it; None when it is replayed from the result cache."""
    queue: AudioQueue | Replay
    received_at: float
    last_text_at: float
    text: list[str] = field(default_factory=list)
    samples_sent: int = 0
    frames: int = 0
    first_frame_at: float | None = None
    steps_at_first_frame: int | None = None
    cache_key: CacheKey | None = None
    produced: list[np.ndarray] | None = None
    """Engine-rate audio kept for the result cache, until it would be too big to keep."""
    produced_bytes: int = 0
    produced_words: list[WordTiming] = field(default_factory=list)
    """Engine-rate word timings kept with ``produced``, so a cached repeat has them too."""
    cached_segments: int = 0
    words: deque[WordTiming] = field(default_factory=deque)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    released: bool = False
    """Its admission slot has been given back: exactly once, however it ended."""

    @property
    def text_chars(self) -> int:
        return sum(map(len, self.text))

    @property
    def complete(self) -> bool:
        return self.utterance is None or self.utterance.complete


class Session:
    def __init__(self, service: Service, send_text: SendText, send_bytes: SendBytes) -> None:
        assert service.defaults is not None
        self.service = service
        self.admission = service.admission
        self.limits = service.config.limits
        self.defaults = service.defaults
        self._send_text = send_text
        self._send_bytes = send_bytes
        # Several utterance tasks share one socket; frames must not interleave mid-send.
        self._send_lock = asyncio.Lock()
        self._live: dict[str, _Live] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()  # a bounded set, oldest first
        self._auto_ctx = 0
        self.last_message_at = time.monotonic()
        self._playing_until = 0.0
        """When the client will have played every frame it was sent (monotonic clock)."""
        self._closed = False
        self._bucket = TokenBucket(self.limits.messages_per_second, self.limits.message_burst)
        self._session_chars = 0
        self.id = secrets.token_hex(6)

    # -- messages -------------------------------------------------------------------------

    def ready_message(self) -> str:
        engine = self.service.worker.loaded_engine()
        return protocol.event(
            "ready",
            protocol=protocol.PROTOCOL_VERSION,
            session=self.id,
            engine=engine.name,
            sample_rate=engine.sample_rate,
            voices=[v.to_dict() for v in engine.voices()],
            defaults=self.defaults.to_dict(),
            formats=list(protocol.FORMATS),
            features={"timestamps": engine.timestamps, "voice_cloning": engine.clones_voices},
            limits=self.limits.to_dict(),
        )

    async def handle(self, data: str | bytes) -> None:
        """Act on one client message. Protocol errors are answered, never raised."""
        self.last_message_at = time.monotonic()
        try:
            message = protocol.parse(data)
            # Parsed first, so the refusal can name the utterance whose text was dropped.
            if not self._bucket.take():
                raise ProtocolError(
                    "rate_limited",
                    f"more than {self.limits.messages_per_second:g} messages per second; this message was dropped",
                    getattr(message, "ctx", None),
                )
            if isinstance(message, Config):
                await self._config(message)
            elif isinstance(message, Speak):
                await self._speak(message)
            elif isinstance(message, Flush):
                if message.ctx in self._ended:
                    # It ended while the flush was on its way: all its audio was sent,
                    # which is what flushed says.
                    await self._send(protocol.event("flushed", ctx=message.ctx))
                    return
                live = self._get(message.ctx)
                if live.utterance is not None:
                    live.utterance.flush()
                else:
                    live.queue.flush()
            elif isinstance(message, Cancel):
                await self._cancel(message.ctx)
        except ProtocolError as e:
            # "terminal": the utterance this error names is not (or no longer) alive.
            terminal = {"terminal": e.ctx not in self._live} if e.ctx is not None else {}
            await self._send(protocol.error(e.code, e.message, e.ctx, **terminal, **e.extra))

    async def _config(self, message: Config) -> None:
        settings = protocol.apply(self.defaults, message.settings)
        self._check_engine(settings, None)
        self.defaults = settings
        await self._send(protocol.event("configured", **settings.to_dict()))

    async def _speak(self, message: Speak) -> None:
        ctx = message.ctx
        live = self._live.get(ctx) if ctx is not None else None
        if live is not None:
            if live.complete or live.utterance is None:
                raise ProtocolError("ctx_finished", f"utterance {ctx!r} already received its final text", ctx)
            if message.settings:
                raise ProtocolError(
                    "invalid_field", "voice and format can only be set in the first speak of an utterance", ctx
                )
            self._check_text(live, message.text)
            live.text.append(message.text)
            live.last_text_at = time.monotonic()
            self._session_chars += len(message.text)
            live.utterance.feed(message.text, message.final)
            return
        if ctx is not None and ctx in self._ended:
            # Text that was on its way when the client cancelled (a barge-in) must not
            # open a new utterance, or it would be spoken at the start of the next turn.
            raise ProtocolError(
                "ctx_finished", f"utterance {ctx!r} has ended; start a new utterance with a new ctx", ctx
            )
        if ctx is None:
            ctx = self._auto_name()
        settings = protocol.apply(self.defaults, message.settings)
        self._check_engine(settings, ctx)
        if len(message.text) > self.limits.max_text_chars:
            raise ProtocolError("text_too_long", f"text is limited to {self.limits.max_text_chars} characters", ctx)
        self._check_session_text(message.text, ctx)
        if self.service.draining:
            raise ProtocolError("shutting_down", "the server is shutting down; reconnect shortly", ctx)
        if len(self._live) >= self.limits.max_utterances_per_socket:
            raise ProtocolError(
                "too_many_utterances",
                f"at most {self.limits.max_utterances_per_socket} utterances may be active on one connection",
                ctx,
            )
        if not self.admission.try_start_utterance():
            raise ProtocolError(
                "overloaded", "the server is at capacity; try again shortly", ctx, retry_after_ms=RETRY_AFTER_MS
            )
        received = time.monotonic()
        cache = self.service.cache
        key = cache.key(self.service.worker.loaded_engine().name, settings.voice, settings.speed, message.text)
        # Only a one-shot utterance can be looked up: streamed text is not known yet.
        hit = cache.get(key, with_words=settings.timestamps) if cache.enabled and message.final else None
        if hit is not None:
            live = _Live(ctx, settings, None, Replay(hit), received_at=received, last_text_at=received,
                         text=[message.text], cache_key=key, cached_segments=hit.segments)
        else:
            try:
                utterance = self.service.worker.submit(
                    SynthesisParams(voice=settings.voice, speed=settings.speed, timestamps=settings.timestamps),
                    asyncio.get_running_loop(),
                )
            except EngineError as e:
                self.admission.end_utterance()
                raise ProtocolError(e.code, e.message, ctx) from None
            live = _Live(ctx, settings, utterance, utterance.queue, received_at=received, last_text_at=received,
                         text=[message.text])
            if cache.enabled:
                live.produced, live.cache_key = [], key
        self._session_chars += len(message.text)
        self._live[ctx] = live
        await self._send(protocol.event("started", ctx=ctx, **settings.to_dict()))
        live.task = asyncio.create_task(self._stream(live), name=f"utterance-{ctx}")
        if live.utterance is not None:
            live.utterance.feed(message.text, message.final)

    async def _cancel(self, ctx: str) -> None:
        live = self._live.get(ctx)
        if live is None:
            if ctx in self._ended:
                return  # it finished while the cancel was on its way: nothing to stop
            raise ProtocolError("unknown_ctx", f"no active utterance {ctx!r}", ctx)
        await self._stop(live)
        self._record(live, "cancelled")
        await self._send(protocol.event("cancelled", ctx=ctx, samples_sent=live.samples_sent, frames=live.frames))

    def _get(self, ctx: str) -> _Live:
        live = self._live.get(ctx)
        if live is None:
            raise ProtocolError("unknown_ctx", f"no active utterance {ctx!r}", ctx)
        return live

    def _auto_name(self) -> str:
        """A ctx for a speak that named none: never one the client uses or used here."""
        while True:
            self._auto_ctx += 1
            ctx = f"auto-{self._auto_ctx}"
            if ctx not in self._live and ctx not in self._ended:
                return ctx

    def _check_engine(self, settings: StreamSettings, ctx: str | None) -> None:
        """What only the loaded engine can tell: whether it has the voice, and whether it
        can time words."""
        try:
            engine = self.service.worker.loaded_engine()
        except EngineError as e:
            raise ProtocolError(e.code, e.message, ctx, retry_after_ms=RETRY_AFTER_MS) from None
        if not engine.has_voice(settings.voice):
            raise ProtocolError("unknown_voice", f"unknown voice {settings.voice!r}; GET /v1/voices lists them", ctx)
        if settings.timestamps and not engine.timestamps:
            raise ProtocolError(
                "timestamps_unsupported",
                f"this server's engine ({engine.name}) cannot time words; ready.features says what it can do",
                ctx,
            )

    def _check_text(self, live: _Live, text: str) -> None:
        if live.text_chars + len(text) > self.limits.max_text_chars:
            raise ProtocolError(
                "text_too_long", f"text is limited to {self.limits.max_text_chars} characters per utterance", live.ctx
            )
        self._check_session_text(text, live.ctx)

    def _check_session_text(self, text: str, ctx: str | None) -> None:
        if self._session_chars + len(text) > self.limits.max_session_chars:
            raise ProtocolError(
                "session_text_limit",
                f"a connection may send at most {self.limits.max_session_chars} characters; open a new one",
                ctx,
            )

    # -- one utterance ----------------------------------------------------------------------

    async def _stream(self, live: _Live) -> None:
        s = live.settings
        rate = self.service.worker.sample_rate
        out = OutputStream(rate, s.sample_rate, s.chunk_ms)
        try:
            while True:
                item = await live.queue.get()
                if isinstance(item, np.ndarray):
                    self._keep(live, item)
                    await self._send_frames(live, out.push(item))
                elif isinstance(item, WordTimings):
                    if live.produced is not None:
                        live.produced_words.extend(item.words)
                    if s.timestamps:
                        scale = s.sample_rate / rate  # engine samples -> the stream's own timeline
                        live.words.extend(
                            WordTiming(w.word, round(w.start * scale), round(w.end * scale)) for w in item.words
                        )
                elif isinstance(item, Flushed):
                    await self._send_frames(live, out.flush())
                    await self._send(protocol.event("flushed", ctx=live.ctx))
                elif isinstance(item, Finished):
                    await self._send_frames(live, out.finish())
                    await self._send_words(live, None)
                    figures = self._figures(live)
                    await self._send(protocol.event("done", ctx=live.ctx, **figures))
                    self._store(live)
                    self._record(live, "done", figures)
                    return
                elif isinstance(item, Failed):
                    self._record(live, item.code)
                    await self._send(protocol.error(item.code, item.message, live.ctx, terminal=True))
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            # A send that fails means the socket is gone; the session's close cleans up.
            log.debug("utterance %s stopped: socket closed", live.ctx, exc_info=True)
            self._record(live, "disconnected")
        finally:
            self._release(live)

    def _keep(self, live: _Live, piece: np.ndarray) -> None:
        if live.produced is None:
            return
        live.produced.append(piece)
        live.produced_bytes += piece.nbytes
        if live.produced_bytes > self.service.cache.max_entry_bytes:
            live.produced = None  # too long to cache: stop holding it

    def _store(self, live: _Live) -> None:
        if live.produced and live.cache_key is not None and live.utterance is not None:
            # Streamed text is keyed by what it added up to, for one-shot repeats of it.
            key = replace(live.cache_key, text=normalize("".join(live.text)))
            words = tuple(live.produced_words) if live.settings.timestamps else None
            self.service.cache.put(key, Entry(np.concatenate(live.produced), live.utterance.segments, words))

    async def _send_words(self, live: _Live, before: int | None) -> None:
        """A ``timestamps`` event for the words that start before sample ``before`` (all
        of them when None), sent just ahead of the frame they start in."""
        words = []
        while live.words and (before is None or live.words[0].start < before):
            words.append(live.words.popleft())
        if words:
            rate = live.settings.sample_rate
            await self._send(
                protocol.event(
                    "timestamps",
                    ctx=live.ctx,
                    words=[
                        {"word": w.word, "start_ms": round(w.start * 1000 / rate, 1),
                         "end_ms": round(w.end * 1000 / rate, 1)}
                        for w in words
                    ],
                )
            )

    async def _send_frames(self, live: _Live, frames: list[np.ndarray]) -> None:
        for frame in frames:
            await self._send_words(live, live.samples_sent + frame.size)
            data = protocol.audio_frame(
                live.ctx, live.frames, live.samples_sent, frame.size, encode(frame, live.settings.format)
            )
            await self._send(data)
            if live.first_frame_at is None:
                live.first_frame_at = time.monotonic()
                live.steps_at_first_frame = live.utterance.steps if live.utterance else 0
            live.frames += 1
            live.samples_sent += frame.size
            played_by = live.first_frame_at + live.samples_sent / live.settings.sample_rate
            self._playing_until = max(self._playing_until, played_by)
            # A send into a socket with room does not suspend; yield anyway, so a cancel
            # waiting on this connection is read between two frames, not after a burst.
            await asyncio.sleep(0)

    def _figures(self, live: _Live) -> dict[str, object]:
        u = live.utterance
        compute = u.compute_seconds if u else 0.0
        audio_s = live.samples_sent / live.settings.sample_rate
        ttfa = None if live.first_frame_at is None else round((live.first_frame_at - live.received_at) * 1000, 1)
        return {
            "ttfa_ms": ttfa,
            "audio_ms": round(audio_s * 1000, 1),
            "compute_ms": round(compute * 1000, 1),
            "rtf": round(compute / audio_s, 4) if audio_s else None,
            "chunks": live.frames,
            "samples": live.samples_sent,
            "segments": u.segments if u else live.cached_segments,
            "engine_steps": u.steps if u else 0,
            "engine_steps_at_first_chunk": live.steps_at_first_frame,
            "cached": u is None,
        }

    def _record(self, live: _Live, outcome: str, figures: dict[str, object] | None = None) -> None:
        m = self.service.metrics
        m.utterances.labels(outcome).inc()
        if figures is not None:
            if isinstance(figures["ttfa_ms"], float):
                m.ttfa.observe(figures["ttfa_ms"] / 1000)
            if isinstance(figures["rtf"], float) and live.utterance is not None:
                m.rtf.observe(figures["rtf"])
        fields = {"session": self.id, "ctx": live.ctx, "outcome": outcome, "voice": live.settings.voice,
                  **(figures or {"samples": live.samples_sent, "chunks": live.frames})}
        log_utterance(fields, "".join(live.text), self.service.config.log_text)

    def _release(self, live: _Live) -> None:
        # However the stream ended (a failed send included), the worker must stop too.
        if live.utterance is not None and live.utterance.outcome is None:
            live.utterance.cancel()
        if self._live.get(live.ctx) is live:
            del self._live[live.ctx]
            self._ended[live.ctx] = None
            if len(self._ended) > ENDED_CTX_REMEMBERED:
                self._ended.popitem(last=False)
        if not live.released:
            live.released = True
            self.admission.end_utterance()

    async def _stop(self, live: _Live) -> None:
        if live.utterance is not None:
            live.utterance.cancel()
        if live.task is not None and not live.task.done():
            live.task.cancel()
            # wait() rather than await: a cancel of this coroutine itself must propagate.
            await asyncio.wait({live.task})
        live.queue.clear()
        self._release(live)

    # -- transport ---------------------------------------------------------------------------

    async def _send(self, message: str | bytes) -> None:
        if self._closed:
            raise ConnectionError("session closed")
        async with self._send_lock:
            if isinstance(message, str):
                await self._send_text(message)
            else:
                await self._send_bytes(message)

    # -- idleness ------------------------------------------------------------------------------

    def idle_in(self, now: float) -> float:
        """Seconds until this connection is idle (0 or less: it is), as protocol.md defines
        it: no message and nothing playing for the idle timeout, where playing lasts until
        the audio sent has been heard. Infinite while an utterance with all its text is
        still being computed or sent."""
        if any(live.complete for live in self._live.values()):
            return math.inf
        quiet_since = max(self.last_message_at, self._playing_until)
        return quiet_since + self.limits.idle_timeout_seconds - now

    def open_utterance_expires_in(self, now: float) -> float:
        """Seconds until the first streamed utterance that is waiting for text has waited
        the idle timeout (infinite when none waits)."""
        waiting = [live.last_text_at for live in self._live.values() if not live.complete]
        return min(waiting) + self.limits.idle_timeout_seconds - now if waiting else math.inf

    async def end_waiting_utterances(self, now: float) -> None:
        """End each streamed utterance that received no text for the idle timeout: its
        producer has gone quiet, and it must not hold a slot for ever."""
        idle = self.limits.idle_timeout_seconds
        for live in list(self._live.values()):
            if not live.complete and now - live.last_text_at >= idle:
                await self._stop(live)
                self._record(live, "idle_timeout")
                await self._send(
                    protocol.error(
                        "idle_timeout", f"utterance {live.ctx!r} received no text for {idle:g} s and has ended",
                        live.ctx, terminal=True,
                    )
                )

    async def fail_all(self, code: str, message: str) -> None:
        """Stop every utterance, telling its client why (a shutdown past its deadline)."""
        for live in list(self._live.values()):
            await self._stop(live)
            await self._send(protocol.error(code, message, live.ctx, terminal=True))

    async def close(self) -> None:
        """The socket is gone: stop every utterance, so no computation outlives it."""
        self._closed = True
        for live in list(self._live.values()):
            await self._stop(live)

    @property
    def active(self) -> int:
        return len(self._live)
