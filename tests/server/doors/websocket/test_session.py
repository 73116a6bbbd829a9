"""One connection's utterances: names, slots, the cache, flush, barge-in and idleness,
against a real server on loopback. Each test here guards a bug that a user found."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
import websockets

from voxwire.server.config import ServerConfig
from voxwire.server.limits import Limits
from tests.conftest import RunningServer, run_server
from tests.fixtures.engines import WORD_SECONDS, ToneEngine


def send(ws: websockets.ClientConnection, **message: object) -> asyncio.Future:
    return ws.send(orjson.dumps(message).decode())


async def events(ws: websockets.ClientConnection, until: str, ctx: str | None = None, limit: float = 20) -> list[dict]:
    """Control messages up to and including the first of type ``until`` (for ``ctx``)."""
    out = []
    while True:
        m = await asyncio.wait_for(ws.recv(), limit)
        if isinstance(m, bytes):
            continue
        event = orjson.loads(m)
        out.append(event)
        if event["type"] == until and (ctx is None or event.get("ctx") == ctx):
            return out


async def connect(server: RunningServer) -> websockets.ClientConnection:
    ws = await websockets.connect(server.ws)
    await ws.recv()  # ready
    return ws


async def settled(server: RunningServer) -> None:
    """Wait (bounded) until the server has let go of every utterance, then check that
    nothing is held: no admission slot, no worker utterance, no queued audio."""
    for _ in range(200):
        if server.service.admission.utterances == 0 and not server.service.worker.utterances():
            break
        await asyncio.sleep(0.05)
    assert server.service.admission.utterances == 0
    worker = server.service.worker.utterances()
    assert worker == [] and sum(u.queue.samples for u in worker) == 0


@pytest.fixture
def tone(request) -> RunningServer:
    limits = Limits(max_utterances_total=3, idle_timeout_seconds=getattr(request, "param", 300.0))
    with run_server(ServerConfig(limits=limits, cache_mb=16), engine=lambda: ToneEngine(step_delay=0.005)) as s:
        yield s


async def test_an_automatic_name_never_takes_a_client_name_and_no_slot_leaks(tone):
    # The user's sequence: the client names an open utterance "auto-1", then speaks
    # without a ctx, then leaves. Three times, against a server-wide limit of 3.
    for _ in range(3):
        async with await connect(tone) as ws:
            await send(ws, type="speak", ctx="auto-1", text="Hello there, this is the", final=False)
            await events(ws, "started", "auto-1")
            await send(ws, type="speak", text="Hi.")
            started = (await events(ws, "started"))[-1]
            assert started["ctx"] != "auto-1"
            await events(ws, "done", started["ctx"])
    await settled(tone)
    async with await connect(tone) as ws:  # every slot is free again
        for i in range(3):
            await send(ws, type="speak", ctx=f"c{i}", text="la", final=False)
        got = [(await events(ws, "started", f"c{i}"))[-1]["type"] for i in range(3)]
        assert got == ["started"] * 3


@pytest.mark.parametrize("tone", [1.0], indirect=True)
async def test_every_way_an_utterance_ends_gives_back_its_slot(tone):
    async with await connect(tone) as ws:
        await send(ws, type="speak", ctx="done", text="la la.")
        await events(ws, "done", "done")
        await send(ws, type="speak", ctx="replay", text="la la.")  # a cache replay
        assert (await events(ws, "done", "replay"))[-1]["cached"] is True
        await send(ws, type="speak", ctx="cancel", text="la " * 200 + ".")
        await events(ws, "started", "cancel")
        await send(ws, type="cancel", ctx="cancel")
        await events(ws, "cancelled", "cancel")
        await send(ws, type="speak", ctx="boom", text="la explode.")
        assert (await events(ws, "error", "boom"))[-1]["code"] == "engine_error"
        await send(ws, type="speak", ctx="auto-1", text="la", final=False)
        await events(ws, "started", "auto-1")
        await send(ws, type="speak", text="la.")  # named automatically, never "auto-1"
        assert (await events(ws, "started"))[-1]["ctx"] != "auto-1"
        await send(ws, type="speak", ctx="auto-1", text=" la.", final=True)
        await events(ws, "done", "auto-1")
        await send(ws, type="speak", ctx="waits", text="la", final=False)  # then no more text
        idle = (await events(ws, "error", "waits"))[-1]
        assert (idle["code"], idle["terminal"]) == ("idle_timeout", True)
        with pytest.raises(websockets.ConnectionClosed):  # and the quiet connection closes
            await asyncio.wait_for(ws.recv(), 20)
    await settled(tone)
    async with await connect(tone) as ws:
        await send(ws, type="speak", ctx="mid", text="la " * 400 + ".")  # cut by the disconnect
        await events(ws, "started", "mid")
    await settled(tone)
    assert tone.service.admission.connections == 0


async def test_a_cached_repeat_keeps_its_word_timings():
    with run_server(ServerConfig(cache_mb=16)) as s:
        async def words(ctx: str) -> tuple[list[dict], dict]:
            async with await connect(s) as ws:
                await send(ws, type="speak", ctx=ctx, text="Timestamps twice please.", timestamps=True)
                got = await events(ws, "done", ctx)
                return [w for e in got if e["type"] == "timestamps" for w in e["words"]], got[-1]

        first, first_done = await words("a")
        again, again_done = await words("b")
        assert (first_done["cached"], again_done["cached"]) == (False, True)
        assert [w["word"] for w in first] == ["Timestamps", "twice", "please"]
        assert again == first


async def test_flush_of_a_cached_one_shot_is_answered(tone):
    async with await connect(tone) as ws:
        await send(ws, type="speak", ctx="a", text="la la la.")
        await events(ws, "done", "a")
        await send(ws, type="speak", ctx="b", text="la la la.")
        await send(ws, type="flush", ctx="b")
        got = [e["type"] for e in await events(ws, "flushed", "b", limit=5)]
        if "done" not in got:  # answered before the replay's end, which follows
            got += [e["type"] for e in await events(ws, "done", "b", limit=5)]
        # Before or after done, depending on whether the replay had ended: never unanswered.
        assert sorted(got) == ["done", "flushed", "started"]


async def test_text_sent_after_a_barge_in_opens_nothing(tone):
    async with await connect(tone) as ws:
        await send(ws, type="speak", ctx="turn", text="la " * 100, final=False)
        await events(ws, "started", "turn")
        await send(ws, type="cancel", ctx="turn")
        await send(ws, type="speak", ctx="turn", text="Actually", final=False)  # already on its way
        await send(ws, type="speak", ctx="turn", text=" yes.", final=True)
        got = await events(ws, "error", "turn")
        assert [e["type"] for e in got] == ["cancelled", "error"]
        assert got[-1]["code"] == "ctx_finished"
        assert (await events(ws, "error", "turn"))[-1]["code"] == "ctx_finished"  # the final piece too
        await settled(tone)
        assert tone.service.worker.utterances() == []


@pytest.mark.slow  # waits out an idle timeout
@pytest.mark.parametrize("tone", [0.5], indirect=True)
async def test_idle_counts_from_the_end_of_the_audio_not_from_the_last_message(tone):
    words = 30  # 3 s of audio, computed in a fraction of that
    async with await connect(tone) as ws:
        await send(ws, type="speak", ctx="a", text="la " * words + ".")
        first_frame = None
        while True:
            m = await asyncio.wait_for(ws.recv(), 20)
            if isinstance(m, bytes):
                first_frame = first_frame or time.monotonic()
            elif orjson.loads(m)["type"] == "done":
                break
        with pytest.raises(websockets.ConnectionClosed) as e:
            await asyncio.wait_for(ws.recv(), 20)
        closed = time.monotonic()
    assert e.value.rcvd.code == 1000
    # The listener is still hearing the audio for most of the 3 s: no idle close before it ends.
    assert closed - first_frame >= words * WORD_SECONDS - 0.3


@pytest.mark.parametrize("tone", [0.5], indirect=True)
async def test_an_open_utterance_does_not_hold_the_connection_open(tone):
    async with await connect(tone) as ws:
        await send(ws, type="speak", ctx="open", text="la", final=False)
        got = await events(ws, "error", "open")
        assert got[-1]["code"] == "idle_timeout"
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 20)
    await settled(tone)


async def test_timestamps_on_an_engine_without_them_are_refused_and_ready_says_so():
    from voxwire.engine.piper.engine import PiperEngine

    with run_server(ServerConfig(cache_mb=0), engine=lambda: PiperEngine(backend="onnx")) as s:
        async with websockets.connect(s.ws) as ws:
            ready = orjson.loads(await ws.recv())
            assert ready["features"] == {"timestamps": False, "voice_cloning": False}
            await send(ws, type="speak", ctx="a", text="Hello.", timestamps=True)
            error = (await events(ws, "error", "a"))[-1]
            assert error["code"] == "timestamps_unsupported"
            await send(ws, type="config", timestamps=True)
            assert (await events(ws, "error"))[-1]["code"] == "timestamps_unsupported"
        await settled(s)


async def test_a_bad_progress_report_ends_nothing_and_its_ctx_is_still_spoken(tone):
    async with await connect(tone) as ws:
        # A report for a ctx not yet used, one that is malformed, and one for an ended ctx:
        # progress neither opens nor ends an utterance, so none of them is terminal.
        await send(ws, type="progress", ctx="later", played=-1)
        bad = (await events(ws, "error", "later"))[-1]
        assert (bad["code"], bad["terminal"]) == ("invalid_field", False) and '"played"' in bad["message"]
        await send(ws, type="progress", ctx="later", played=0)  # well formed, inactive: ignored
        await send(ws, type="speak", ctx="later", text="la la.")
        got = await events(ws, "done", "later")
        assert [e["type"] for e in got] == ["started", "done"]  # nothing answered the valid report
        await send(ws, type="progress", ctx="later", played="all")
        after_done = (await events(ws, "error", "later"))[-1]
        assert (after_done["code"], after_done["terminal"]) == ("invalid_field", False)
        await send(ws, type="speak", ctx="later", text="la.")  # still ended: done is what ended it
        assert (await events(ws, "error", "later"))[-1]["code"] == "ctx_finished"


async def test_a_setting_in_a_later_speak_is_refused_by_its_own_name(tone):
    async with await connect(tone) as ws:
        await send(ws, type="speak", ctx="s", text="la la", final=False)
        await events(ws, "started", "s")
        await send(ws, type="speak", ctx="s", text=" la", final=False, speed=1.5)
        refused = (await events(ws, "error", "s"))[-1]
        assert (refused["code"], refused["terminal"]) == ("invalid_field", False)
        assert refused["message"] == '"speed" can only be set in the first speak of an utterance'
        await send(ws, type="speak", ctx="s", text=" la", final=False, chunk_ms=150, timestamps=False)
        both = (await events(ws, "error", "s"))[-1]["message"]
        assert both == '"chunk_ms" and "timestamps" can only be set in the first speak of an utterance'
        await send(ws, type="speak", ctx="s", text=" la.", final=True)  # the utterance went on
        assert (await events(ws, "done", "s"))[-1]["type"] == "done"
