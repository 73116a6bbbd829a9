"""An asyncio client for protocol v1 (docs/protocol.md in the Voxwire repository).

One ``Client`` is one WebSocket. A reader task routes every server message to the
utterance it names (``ctx``), so several utterances can stream at once on one socket and
each is consumed with ``async for`` independently.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import orjson
import websockets

from voxwire_client.formats import to_float32

DEFAULT_URL = "ws://127.0.0.1:8000/v1/stream"
CLOSE_POLICY = 1008
"""The server refused the connection by policy: a missing or wrong API key, or the origin."""
CLOSE_LOST = 1006
"""No close frame came: the server process or the network went away (never sent on the wire)."""
# What a close code means, for a close frame that came without a reason of its own.
_CLOSE_MEANINGS = {
    1000: "closed normally",
    1001: "the server is going away (stopping or restarting)",
    CLOSE_POLICY: "refused by policy: a missing or wrong API key, or the origin",
    1009: "a message was larger than the server takes",
    1011: "the server failed",
    1013: "the server is at its limit or not ready: try again later",
}
_LOST_REASON = "connection lost with no close frame: the server stopped or the network failed"

# websockets 14 renamed the client's extra headers (13's default client is its legacy one).
_HEADERS_ARG = "additional_headers" if int(websockets.__version__.split(".")[0]) >= 14 else "extra_headers"


def bearer_header(api_key: str) -> dict[str, str]:
    """``Authorization: Bearer KEY``: a key in a header, not in the URL, stays out of
    access logs and shell history. Refuses a key no header can carry, without naming it."""
    if not api_key:
        raise ValueError("the API key is empty")
    if not all(" " < c <= "~" for c in api_key):
        raise ValueError("an API key must be printable ASCII, without spaces (it is sent in an HTTP header)")
    return {"Authorization": f"Bearer {api_key}"}


class ServerError(Exception):
    """An ``error`` message from the server."""

    def __init__(self, code: str, message: str, ctx: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.ctx = ctx


class Closed(ConnectionError):
    """The connection closed before the utterance ended."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"connection closed ({code}): {reason}")
        self.code = code
        self.reason = reason

    @property
    def refused(self) -> bool:
        """Closed by policy (1008): an API key is missing or wrong, or the origin is not allowed."""
        return self.code == CLOSE_POLICY

    @classmethod
    def of(cls, e: websockets.ConnectionClosed) -> Closed:
        """Why ``e`` happened, in words, whatever the peer said (often nothing)."""
        if e.rcvd is None:
            # No close frame: a killed server or a dead network path, where "(None): " said
            # nothing. The OS's own error, when there is one, names which.
            cause = e.__cause__ or e.__context__
            detail = f" ({type(cause).__name__}: {cause})" if isinstance(cause, OSError) else ""
            return cls(CLOSE_LOST, _LOST_REASON + detail)
        return cls.with_code(e.rcvd.code, e.rcvd.reason)

    @classmethod
    def with_code(cls, code: int | None, reason: str) -> Closed:
        """A close as the connection saw it; a code without a reason is said in words."""
        if code is None:
            return cls(CLOSE_LOST, _LOST_REASON)
        return cls(code, reason or _CLOSE_MEANINGS.get(code, "the server gave no reason"))


@dataclass(frozen=True)
class Audio:
    ctx: str
    seq: int
    offset: int
    samples: int
    data: bytes
    format: str
    sample_rate: int
    received_at: float

    def to_float32(self) -> np.ndarray:
        return to_float32(self.data, self.format)


@dataclass(frozen=True)
class Event:
    type: str
    data: dict[str, Any]
    received_at: float

    @property
    def ctx(self) -> str | None:
        return self.data.get("ctx")

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


_TERMINAL = frozenset({"done", "cancelled"})
PROGRESS_INTERVAL = 0.1
"""Seconds between two progress reports of one utterance, at least."""
PACE_SHARE = 0.9
"""The share of the server's message rate and burst that a pacing client spends. The
server counts messages as they arrive: a network or a busy server that bunches them
must not make a paced client's messages look like a burst over the limit."""
MERGE_CHARS = 16384
"""At most this much text is coalesced into one message (a server's limit may be lower)."""


class _Bucket:
    """The server's token bucket for this connection's messages (``ready.limits``:
    ``messages_per_second``, ``message_burst``), as the client can know it: full when the
    connection opens, refilled at the rate, kept to ``PACE_SHARE`` of both."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate * PACE_SHARE
        self.size = max(1.0, float(int(burst * PACE_SHARE)))
        self._tokens = self.size
        self._at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.size, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait(self) -> float:
        """Seconds until one more message may go; 0 for now."""
        self._refill()
        return max(0.0, (1 - self._tokens) / self.rate)

    def take(self) -> None:
        self._refill()
        self._tokens -= 1  # below zero for a message sent regardless (send_raw): later ones wait


@dataclass
class _Outgoing:
    """A message waiting for the bucket; ``opening`` for an utterance's first ``speak``."""

    message: dict[str, Any]
    opening: bool = False


class Utterance:
    """One utterance: send it text, then iterate over its audio and events."""

    def __init__(self, client: Client, ctx: str) -> None:
        self.client = client
        self.ctx = ctx
        self.started: Event | None = None
        self.sent_at: float | None = None
        self.words: list[dict[str, Any]] = []
        """``{word, start_ms, end_ms}`` from ``timestamps`` events (``timestamps=True``)."""
        self._inbox: asyncio.Queue[Audio | Event | BaseException] = asyncio.Queue()
        self._ended = False
        # Set when the server's final event is routed here, not when it is iterated: text
        # sent from another task (an LLM producer) must stop at once, whoever reads the audio.
        self._active = True
        self._complete = False  # its final text has been sent
        # Flow control (docs/protocol.md, progress): samples the application has taken,
        # and how many of them the server has been told about.
        self._played = 0
        self._reported = 0
        self._reported_at = 0.0
        self._auto_progress = client.report_progress
        self._more_text = False  # a speak went after the opening one

    @property
    def active(self) -> bool:
        """False once cancelled, ended by the server (``done``, ``cancelled``, a terminal
        error) or cut off by the connection's end: ``send``, ``flush`` and ``cancel`` then
        send nothing and return False."""
        return self._active

    async def send(self, text: str, final: bool = False) -> bool:
        """Add text (an LLM's tokens, say); ``final=True`` says the text is complete.

        Returns False, sending nothing, when the utterance is no longer ``active``: tokens
        a producer was still sending after a barge-in are dropped here, so they cannot
        reach the server under the cancelled ``ctx``. Text after the final text is a
        mistake in the caller and raises ``RuntimeError``, as in the JavaScript client.
        """
        if self._complete:
            raise RuntimeError(f"utterance {self.ctx!r} already has its final text")
        if not self._active:
            return False
        self._complete = final
        self._more_text = True
        return await self._send({"type": "speak", "ctx": self.ctx, "text": text, "final": final})

    async def flush(self) -> bool:
        """Speak the buffered text now; False (nothing sent) if no longer ``active``."""
        if not self._active:
            return False
        return await self._send({"type": "flush", "ctx": self.ctx})

    async def cancel(self) -> bool:
        """Barge-in: the server stops generating and drops what it had queued; it answers
        ``cancelled``, which ends the iteration (audio already on its way comes first).

        From this call on, ``send`` and ``flush`` drop their text. Returns False when
        nothing was sent: the utterance had already ended or been cancelled, or its
        connection had closed (which stops every utterance on it).
        """
        if not self._active:
            return False
        self._active = False  # before the await: a send racing this cancel is dropped
        return await self._send({"type": "cancel", "ctx": self.ctx})

    async def close(self) -> None:
        """Cancel the utterance if the server is still speaking it, and stop receiving it:
        for a consumer that reads no further (a stream its application closed). Audio
        still on its way is dropped by the connection's reader, not queued here."""
        await self.cancel()
        self._ended = True
        self.client._utterances.pop(self.ctx, None)

    async def played(self, samples: int) -> bool:
        """Tell the server how many samples of this utterance have been played so far (a
        running total): it then computes at most its flow window (a few seconds) beyond
        them. An application that plays the audio itself calls this from its player;
        doing so stops the client's own report of frames taken from the iteration."""
        self._auto_progress = False
        return await self._report(samples)

    async def _report(self, samples: int) -> bool:
        if not self._active:
            return False
        self._reported = samples
        return await self._send({"type": "progress", "ctx": self.ctx, "played": samples})

    async def _send(self, message: dict[str, Any]) -> bool:
        try:
            await self.client._send(message)
        except websockets.ConnectionClosed:
            # Whoever iterates this utterance is told by the reader (``Closed``); a
            # producer only needs to know that its text went nowhere.
            self._active = False
            return False
        return True

    def __aiter__(self) -> AsyncIterator[Audio | Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Audio | Event]:
        while not self._ended:
            item = await self._next()
            if isinstance(item, BaseException):
                self._ended = True
                self.client._utterances.pop(self.ctx, None)
                raise item
            if isinstance(item, Event):
                if item.type == "started":
                    self.started = item
                elif item.type == "timestamps":
                    self.words.extend(item["words"])
                if item.type in _TERMINAL:
                    self._ended = True
                    self.client._utterances.pop(self.ctx, None)
            yield item
            if isinstance(item, Audio) and self._auto_progress:
                # Asked for the next item: the application is done with this frame.
                self._played += item.samples

    async def _next(self) -> Audio | Event | BaseException:
        """The next item; meanwhile, progress for what was taken. At most one report per
        ``PROGRESS_INTERVAL``, as reports share the connection's message rate with the
        text, but never one held back while waiting: the server may be waiting for it."""
        while self._played > self._reported and self._active:
            wait = self._reported_at + PROGRESS_INTERVAL - time.monotonic()
            if wait <= 0:
                self._reported_at = time.monotonic()
                await self._report(self._played)
                break
            if not self._inbox.empty():
                break  # busy: report after a later frame
            try:
                return await asyncio.wait_for(self._inbox.get(), wait)
            except asyncio.TimeoutError:  # not the builtin before Python 3.11
                continue
        return await self._inbox.get()

    async def collect(self) -> tuple[list[Audio], Event]:
        """Wait for the whole utterance: its audio frames and its final event."""
        frames: list[Audio] = []
        async for item in self:
            if isinstance(item, Audio):
                frames.append(item)
            elif item.type in _TERMINAL:
                return frames, item
        raise Closed(None, "the utterance ended without a final event")


@dataclass
class Client:
    ws: Any
    ready: dict[str, Any]
    _utterances: dict[str, Utterance] = field(default_factory=dict)
    _errors: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    _configured: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _reader: asyncio.Task[None] | None = None
    _settings: dict[str, Any] = field(default_factory=dict)
    report_progress: bool = True
    """Report each utterance's frames as played once the application takes them, so the
    server computes only a few seconds ahead of a slow consumer, behind any proxy."""
    _bucket: _Bucket | None = None
    """Set when pacing: every message waits for it, in order, text coalesced meanwhile."""
    _outbox: deque[_Outgoing] = field(default_factory=deque)
    _pump: asyncio.Task[None] | None = None
    _sending: asyncio.Lock = field(default_factory=asyncio.Lock)
    _merge_chars: int = MERGE_CHARS
    _swept: set[str] = field(default_factory=set)
    """Ctxs cancelled by the client itself after a refused opening (``_sweep``): whatever
    the server says of them now is no one's business."""
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    async def connect(
        cls,
        url: str = DEFAULT_URL,
        report_progress: bool = True,
        api_key: str | None = None,
        pace: bool = False,
        **kwargs: Any,
    ) -> Client:
        """``report_progress=False``: send no playback progress (the server then paces the
        connection by its queue and TCP alone, as before flow control). ``api_key``: for a
        server started with keys, sent as ``Authorization: Bearer``; a missing or wrong
        one raises ``Closed`` with ``refused`` true (close code 1008).

        ``pace=True``: keep under the server's message rate (``ready.limits``), so that no
        message is dropped with ``rate_limited``, however many utterances stream at once.
        A message goes at once while the server's bucket has room; past it, messages wait
        their turn in the order they were made, and the text of an utterance that is
        waiting is joined into one ``speak`` (a token at a time costs a message each).
        A server that states no rate is not paced. Off by default: it changes what goes
        on the wire, and tools that test the server's own limits need it off."""
        if api_key is not None:
            kwargs[_HEADERS_ARG] = {**dict(kwargs.get(_HEADERS_ARG) or {}), **bearer_header(api_key)}
        ws = await websockets.connect(url, max_size=None, **kwargs)
        try:
            hello = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
        except websockets.ConnectionClosed as e:
            raise Closed.of(e) from None
        if hello.get("type") != "ready":
            await ws.close()
            raise ServerError(hello.get("code", "protocol"), hello.get("message", f"expected ready, got {hello!r}"))
        client = cls(ws=ws, ready=hello, report_progress=report_progress)
        client._settings = dict(hello.get("defaults", {}))
        limits = hello.get("limits") or {}
        if pace and limits.get("messages_per_second"):
            client._bucket = _Bucket(float(limits["messages_per_second"]), int(limits.get("message_burst") or 1))
            if limits.get("max_message_bytes"):
                # A character may take 6 bytes in JSON (\uXXXX), and a message has its other fields.
                client._merge_chars = max(1, min(MERGE_CHARS, int(limits["max_message_bytes"]) // 8))
        client._reader = asyncio.create_task(client._read())
        return client

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        await self.ws.close()
        await self.wait_closed()

    @property
    def closed(self) -> bool:
        """The connection has ended, and with it every utterance on it (a new ``Client``
        is needed): its reader has stopped."""
        return self._reader is None or self._reader.done()

    async def wait_closed(self) -> None:
        """Return once the connection has ended and every utterance on it has been told."""
        if self._reader is not None:
            await asyncio.wait({self._reader})

    async def configure(self, **settings: Any) -> Event:
        """Set this connection's defaults (voice, speaker, format, sample_rate, chunk_ms,
        speed, timestamps, fast_start, first_clause_words, lexicon)."""
        await self._send({"type": "config", **settings})
        get_ok = asyncio.ensure_future(self._configured.get())
        get_err = asyncio.ensure_future(self._errors.get())
        done, pending = await asyncio.wait({get_ok, get_err}, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        if get_err in done:
            err = get_err.result()
            raise ServerError(err["code"], err["message"])
        ev = get_ok.result()
        self._settings.update({k: v for k, v in ev.data.items() if k != "type"})
        return ev

    async def speak(self, text: str = "", ctx: str | None = None, final: bool = True, **settings: Any) -> Utterance:
        """Start an utterance. With ``final=False``, send the rest with ``Utterance.send``.
        ``settings`` are protocol v1's stream settings (voice, speaker, format, sample_rate,
        chunk_ms, speed, timestamps, fast_start, first_clause_words, lexicon), sent as given."""
        ctx = ctx or f"c{next(self._ids)}"
        u = Utterance(self, ctx)
        u._complete = final
        self._utterances[ctx] = u
        u.sent_at = time.perf_counter()
        try:
            await self._send({"type": "speak", "ctx": ctx, "text": text, "final": final, **settings}, opening=True)
        except asyncio.CancelledError:
            # The caller gave up while the opening was being written (a stream its
            # application closed): the server may have it, and would wait for the rest of
            # its text until the idle timeout, holding a slot. The caller never got the
            # utterance to cancel, so the client does.
            if not self.closed:
                self._sweep(u)
            raise
        if self.report_progress:
            # Nothing played yet: paced from the first step, not from the first report.
            await u._report(0)
        return u

    async def next_error(self) -> Event:
        """The next ``error`` that concerns no utterance (a malformed message, say)."""
        return await self._errors.get()

    async def send_raw(self, data: str | bytes) -> None:
        """Send a message as it is, at once: for tools and tests of the server's validation.
        It counts against the rate when pacing, so the messages after it wait the longer."""
        if self._bucket is not None:
            self._bucket.take()
        await self.ws.send(data)

    async def _send(self, message: dict[str, Any], opening: bool = False) -> None:
        """Send now, or (pacing, and the server's bucket empty) queue it behind the others.
        Raises ``websockets.ConnectionClosed`` when the connection is known to be gone."""
        bucket = self._bucket
        if bucket is None or self.closed:
            await self.ws.send(orjson.dumps(message).decode())
            return
        if not self._outbox and not self._sending.locked() and bucket.wait() == 0:
            async with self._sending:
                bucket.take()
                await self.ws.send(orjson.dumps(message).decode())
            return
        self._queue(_Outgoing(message, opening))

    def _queue(self, out: _Outgoing) -> None:
        """Queue a message, folding it into one already waiting where the protocol allows:
        text into its utterance's waiting text, a progress report into the waiting one."""
        m, ctx = out.message, out.message.get("ctx")
        if m["type"] == "progress":
            waiting = next(
                (o for o in self._outbox if o.message["type"] == "progress" and o.message["ctx"] == ctx), None
            )
            if waiting is not None:
                waiting.message["played"] = m["played"]  # a running total: the latest says all
                return
        elif m["type"] == "speak" and ctx is not None and not out.opening:
            # Progress aside (its order does not matter), the utterance's last waiting message:
            # text joins it only if nothing of the utterance (a flush, say) must come between.
            last = next(
                (o for o in reversed(self._outbox) if o.message.get("ctx") == ctx and o.message["type"] != "progress"),
                None,
            )
            if (
                last is not None
                and last.message["type"] == "speak"
                and not last.message.get("final")
                and len(last.message["text"]) + len(m["text"]) <= self._merge_chars
            ):
                last.message["text"] += m["text"]
                last.message["final"] = m["final"]
                return
        elif m["type"] == "cancel":
            # Its waiting text would only be spoken to be cut off; its opening speak still
            # goes, so that the server answers the cancel (an unknown ctx would be an error).
            self._outbox = deque(o for o in self._outbox if o.message.get("ctx") != ctx or o.opening)
        self._outbox.append(out)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._drain_outbox())

    async def _drain_outbox(self) -> None:
        """Send the waiting messages in order, each when the bucket has room for it."""
        assert self._bucket is not None
        try:
            while self._outbox:
                wait = self._bucket.wait()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                async with self._sending:
                    if not self._outbox:
                        break
                    out = self._outbox.popleft()
                    self._bucket.take()
                    await self.ws.send(orjson.dumps(out.message).decode())
        except websockets.ConnectionClosed:
            self._outbox.clear()  # the reader tells every utterance that the connection is gone

    async def _read(self) -> None:
        closed: BaseException
        try:
            async for raw in self.ws:
                now = time.perf_counter()
                if isinstance(raw, bytes):
                    self._route_audio(msgpack.unpackb(raw, raw=False), now)
                else:
                    self._route_event(orjson.loads(raw), now)
            closed = Closed.with_code(self.ws.close_code, self.ws.close_reason or "")
        except websockets.ConnectionClosed as e:
            closed = Closed.of(e)
        if self._pump is not None:
            self._pump.cancel()  # nothing more can be sent
        self._outbox.clear()
        for u in list(self._utterances.values()):
            u._active = False
            u._inbox.put_nowait(closed)

    def _sweep(self, u: Utterance) -> None:
        """The server refused an utterance's opening speak (an unknown voice, say), which
        leaves its ctx free (docs/protocol.md), while text sent after it was on its way: that
        text opened an utterance of its own, from mid-sentence, which would speak to no one
        and hold a slot until its idle timeout. A cancel ends it, or finds nothing."""
        self._utterances.pop(u.ctx, None)
        self._swept.add(u.ctx)

        async def cancel() -> None:
            try:
                await self._send({"type": "cancel", "ctx": u.ctx})
            except websockets.ConnectionClosed:
                pass

        task = asyncio.create_task(cancel())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _route_audio(self, frame: dict[str, Any], now: float) -> None:
        u = self._utterances.get(frame.get("ctx", ""))
        if u is None:
            return  # audio for an utterance this client has stopped listening to
        settings = u.started.data if u.started else self._settings
        u._inbox.put_nowait(
            Audio(
                ctx=frame["ctx"], seq=frame["seq"], offset=frame["offset"], samples=frame["samples"],
                data=frame["audio"], format=settings["format"], sample_rate=settings["sample_rate"], received_at=now,
            )
        )

    def _route_event(self, message: dict[str, Any], now: float) -> None:
        ev = Event(type=message.get("type", ""), data=message, received_at=now)
        if ev.ctx in self._swept:
            if ev.type == "cancelled" or (ev.type == "error" and message.get("terminal")):
                self._swept.discard(ev.ctx)  # the answer to the sweeping cancel
            return
        u = self._utterances.get(ev.ctx) if ev.ctx else None
        if ev.type == "started" and u is not None:
            u.started = ev  # now, not when iterated: the audio that follows is decoded by it
        if u is not None:
            terminal_error = ev.type == "error" and bool(message.get("terminal"))
            if terminal_error or ev.type in _TERMINAL:
                u._active = False  # the server holds nothing for this ctx any more
            if terminal_error:
                u._inbox.put_nowait(ServerError(ev["code"], ev["message"], ev.ctx))
                if u.started is None and u._more_text:
                    self._sweep(u)
            else:
                u._inbox.put_nowait(ev)
        elif ev.type == "configured":
            self._configured.put_nowait(ev)
        elif ev.type == "error":
            self._errors.put_nowait(ev)
