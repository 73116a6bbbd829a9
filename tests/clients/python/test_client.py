"""The Python client's utterance life cycle: after a barge-in (or once the server or the
connection has ended an utterance) its text is dropped by the client, as the JavaScript
client does, so it can never reach the server under a ctx that is over.

A scripted WebSocket server on loopback shows what reached the wire, frame by frame; the
real server (Piper) shows the barge-in of a voice assistant end to end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import orjson
import pytest
from websockets.asyncio.server import ServerConnection, serve

from tests.server.test_stream import SEVERAL, assert_speech
from voxwire_client import Audio, Client, ServerError, Utterance
from voxwire_client.client import Closed

READY = {"type": "ready", "defaults": {"format": "pcm_s16le", "sample_rate": 16000}}


def dumps(message: dict[str, Any]) -> str:
    return orjson.dumps(message).decode()


class Scripted:
    """A stand-in server that records every frame and answers like protocol v1 would:
    `started` for a new ctx, `done` after final text, `cancelled` for a cancel. Text
    "!fail" ends its utterance with a terminal error; "!close" closes the socket."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.url = ""
        self._open: set[str] = set()

    async def handle(self, ws: ServerConnection) -> None:
        await ws.send(dumps(READY))
        async for raw in ws:
            m = orjson.loads(raw)
            self.received.append(m)
            for reply in self._answer(m):
                await ws.send(dumps(reply))
            if m.get("text") == "!close":
                await ws.close()

    def _answer(self, m: dict[str, Any]) -> list[dict[str, Any]]:
        ctx = m.get("ctx", "")
        if m["type"] == "cancel":
            self._open.discard(ctx)
            return [{"type": "cancelled", "ctx": ctx, "samples_sent": 0, "frames": 0}]
        if m["type"] != "speak":
            return []
        out = [] if ctx in self._open else [{"type": "started", "ctx": ctx, **READY["defaults"]}]
        self._open.add(ctx)
        if m.get("text") == "!fail":
            self._open.discard(ctx)
            return [*out, {"type": "error", "ctx": ctx, "code": "engine_error", "message": "x", "terminal": True}]
        if m.get("final"):
            self._open.discard(ctx)
            out.append({"type": "done", "ctx": ctx, "samples": 0})
        return out

    def for_ctx(self, ctx: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m.get("ctx") == ctx]


@asynccontextmanager
async def scripted() -> AsyncIterator[tuple[Scripted, Client]]:
    server = Scripted()
    async with serve(server.handle, "127.0.0.1", 0) as ws_server:
        port = next(iter(ws_server.sockets)).getsockname()[1]
        async with await Client.connect(f"ws://127.0.0.1:{port}/v1/stream") as client:
            yield server, client


async def all_of(u: Utterance) -> list[Audio | Any]:
    return [item async for item in u]


async def barrier(client: Client) -> None:
    """Wait until the server has read everything sent before this: one socket keeps
    order, so once a later utterance is done, every earlier frame has arrived."""
    await (await client.speak("barrier")).collect()


async def test_no_frame_is_sent_for_an_utterance_after_its_cancel():
    async with scripted() as (server, client):
        u = await client.speak("", final=False)
        assert await u.send("Hello there.") is True
        assert await u.cancel() is True
        assert not u.active
        # What an LLM producer had already on its way when the user interrupted.
        assert await u.send(" Actually") is False
        assert await u.flush() is False
        assert await u.send(" never mind.", final=True) is False
        assert await u.cancel() is False  # a second cancel has nothing to stop
        assert (await all_of(u))[-1].type == "cancelled"
        await barrier(client)
    # Playback progress (flow control) is no text: only what the producer sent counts here.
    assert [(m["type"], m.get("text")) for m in server.for_ctx(u.ctx) if m["type"] != "progress"] == [
        ("speak", ""), ("speak", "Hello there."), ("cancel", None),
    ]


@pytest.mark.parametrize(
    "ending,final_event",
    [
        ("!fail", "error"),  # a terminal error: the server holds nothing for this ctx
        ("cancel-elsewhere", "cancelled"),  # cancelled by a raw message, not this object
    ],
)
async def test_text_for_an_utterance_the_server_ended_is_dropped(ending, final_event):
    async with scripted() as (server, client):
        u = await client.speak("", final=False)
        if ending == "!fail":
            await u.send("!fail")
        else:
            await client.send_raw(dumps({"type": "cancel", "ctx": u.ctx}))
        if final_event == "error":
            with pytest.raises(ServerError):
                await all_of(u)
        else:
            assert (await all_of(u))[-1].type == "cancelled"
        assert not u.active
        assert await u.send("more text", final=True) is False
        await barrier(client)
    assert all(m.get("text") != "more text" for m in server.received)


async def test_text_after_the_connection_closed_is_dropped_not_raised():
    async with scripted() as (server, client):
        u = await client.speak("", final=False)
        await u.send("!close")
        with pytest.raises(Closed):
            await all_of(u)
        assert not u.active
        assert await u.send("more") is False
        assert await u.cancel() is False


async def test_text_after_the_final_text_is_a_mistake_that_raises():
    async with scripted() as (server, client):
        u = await client.speak("Hello.")  # final by default
        with pytest.raises(RuntimeError, match="final text"):
            await u.send("more")
        await u.collect()


async def test_non_terminal_errors_leave_the_utterance_open(tone_server):
    """Only an ending error stops the text: an over-long piece is refused on its own."""
    limits = tone_server.service.config.limits
    async with await Client.connect(tone_server.ws) as client:
        u = await client.speak("a few words ", final=False)
        assert await u.send("word " * (limits.max_text_chars // 5))
        async for item in u:
            if getattr(item, "type", None) == "error":
                break
        assert item["code"] == "text_too_long" and u.active
        assert await u.send("the end.", final=True)
        assert (await all_of(u))[-1].type == "done"


# -- a voice assistant's barge-in, against the real server ------------------------------


def record_frames(client: Client) -> list[dict[str, Any]]:
    """Every text frame the client sends from now on, decoded: what went on the wire."""
    sent: list[dict[str, Any]] = []
    send: Callable[[str | bytes], Awaitable[None]] = client.ws.send

    async def recording(data: str | bytes) -> None:
        sent.append(orjson.loads(data))
        await send(data)

    client.ws.send = recording
    return sent


async def reply(client: Client, tokens: list[str]) -> Utterance:
    """The assistant's one code path for every turn: open an utterance, stream tokens."""
    u = await client.speak("", final=False)
    for token in tokens:
        await u.send(token)
    return u


async def test_text_sent_after_a_barge_in_never_reaches_the_server(piper_server):
    async with await Client.connect(piper_server.ws) as client:
        sent = record_frames(client)
        # The LLM is still producing (no final text) when the user interrupts, on the
        # first audio frame.
        first = await reply(client, [w + " " for w in SEVERAL.split(" ")])
        async for item in first:
            if isinstance(item, Audio):
                await first.cancel()
                break
        # The producer's next tokens were already on their way.
        dropped = [await first.send("Actually"), await first.send(" never mind.", final=True)]
        async for item in first:
            pass
        assert item.type == "cancelled"
        second = await reply(client, ["Hello", " there."])
        await second.send("", final=True)
        frames, done = await second.collect()
    cancel_at = sent.index({"type": "cancel", "ctx": first.ctx})
    assert [m for m in sent[cancel_at + 1 :] if m.get("ctx") == first.ctx] == []
    assert dropped == [False, False]
    # The next turn speaks its own words, and none of the dropped ones.
    assert second.started is not None and second.started["ctx"] != first.ctx
    assert done["segments"] == 1 and done["samples"] == sum(f.samples for f in frames)
    assert_speech(np.concatenate([f.to_float32() for f in frames]), second.started["sample_rate"], words=2)
