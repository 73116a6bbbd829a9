"""Per-connection limits: message rate, text per session, idle connections."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time

import httpx
import msgpack
import orjson
import pytest
import websockets

from voxwire.server.config import ServerConfig
from voxwire.server.doors.base import FLOOD_WINDOW_SECONDS
from voxwire.server.limits import (
    SHARED_ADMISSION_ENV,
    WORKER_INDEX_ENV,
    Admission,
    Limits,
    SharedAdmission,
    admission_for_process,
    parse_worker_index,
    worker_index,
)
from tests.conftest import run_server
from tests.fixtures.engines import ToneEngine
from tests.fixtures.waiting import wait_until
from voxwire_client import Client
from voxwire_client.client import ServerError


async def recv_json(ws: websockets.ClientConnection, timeout: float = 10) -> dict:
    """The next control message, past any audio frame."""
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(message, str):
            return orjson.loads(message)


def speak(ctx: str, text: str, final: bool) -> str:
    return orjson.dumps({"type": "speak", "ctx": ctx, "text": text, "final": final}).decode()


async def test_message_flood_is_rate_limited_and_the_session_goes_on():
    limits = Limits(messages_per_second=20, message_burst=30)
    with run_server(ServerConfig(limits=limits), engine=ToneEngine) as s:
        async with await Client.connect(s.ws) as client:
            u = await client.speak("", ctx="flood", final=False)
            for _ in range(60):  # far faster than 20 per second
                await u.send("word ")
            with pytest.raises(ServerError) as dropped:  # terminal: the utterance lost text
                async for _ in u:
                    pass
            assert dropped.value.code == "rate_limited"
            await asyncio.sleep(1.0)  # the bucket refills
            frames, done = await (await client.speak("The session goes on.", ctx="next")).collect()
            assert done.type == "done" and frames


async def test_a_dropped_text_message_never_leaves_its_utterance_open_or_holed():
    """The trial's case: streams whose final speak was dropped never ended (no done in
    25 s), each holding a slot until the idle timeout. A dropped text piece now ends its
    utterance, terminally and at once; a ctx whose first piece was dropped is spent, so
    its later pieces cannot open an utterance missing its start."""
    limits = Limits(messages_per_second=5, message_burst=4)
    with run_server(ServerConfig(limits=limits), engine=ToneEngine) as s:
        async with websockets.connect(s.ws) as ws:
            await recv_json(ws)  # ready
            await ws.send(speak("a", "one ", False))
            assert (await recv_json(ws))["type"] == "started"
            for word in ("two ", "three ", "four "):
                await ws.send(speak("a", word, False))
            await ws.send(speak("a", "five.", True))  # the final piece: over the burst, dropped
            await ws.send(speak("b", "never started ", False))  # a new ctx's first piece, dropped
            answers = [await recv_json(ws), await recv_json(ws)]
            ended, spent = answers
            assert ended["code"] == "rate_limited" and ended["ctx"] == "a" and ended["terminal"] is True
            assert "ended" in ended["message"]
            assert spent["code"] == "rate_limited" and spent["ctx"] == "b" and spent["terminal"] is True
            await asyncio.sleep(1.2)  # the bucket refills
            await ws.send(speak("b", "the rest.", True))
            refused = await recv_json(ws)
            assert refused["code"] == "ctx_finished" and refused["ctx"] == "b"
        await wait_until(lambda: s.service.pipeline.admission.utterances == 0)


async def test_a_cancel_is_never_dropped_by_the_rate_limit():
    limits = Limits(messages_per_second=0.1, message_burst=1)
    with run_server(ServerConfig(limits=limits), engine=lambda: ToneEngine(step_delay=0.05)) as s:
        async with websockets.connect(s.ws) as ws:
            await recv_json(ws)
            await ws.send(speak("a", "la " * 200 + ".", True))  # the bucket's only token
            assert (await recv_json(ws))["type"] == "started"
            await ws.send(orjson.dumps({"type": "flush", "ctx": "a"}).decode())
            assert (await recv_json(ws))["code"] == "rate_limited"  # the bucket is empty
            await ws.send(orjson.dumps({"type": "cancel", "ctx": "a"}).decode())
            assert (await recv_json(ws))["type"] == "cancelled"


async def test_a_client_that_keeps_flooding_is_cut_and_the_others_are_served():
    """The trial's flood: sockets writing pre-built progress frames as fast as they could
    drew 78 MB of rate_limited answers in 30 s and were never disconnected. Past
    max_dropped_messages within 10 s the socket is closed with 1008."""
    limits = Limits(messages_per_second=20, message_burst=20, max_dropped_messages=100)
    progress = msgpack.packb({"type": "progress", "ctx": "x", "played": 1})
    with run_server(ServerConfig(limits=limits), engine=ToneEngine) as s:
        async with websockets.connect(s.ws) as flooder, await Client.connect(s.ws) as client:
            await recv_json(flooder)
            answers = 0
            began = time.monotonic()
            with pytest.raises(websockets.ConnectionClosed) as closed:
                for _ in range(5000):
                    await flooder.send(progress)
                    while True:  # read what has come, so the answers do not back up
                        try:
                            message = await asyncio.wait_for(flooder.recv(), 0.0001)
                        except TimeoutError:
                            break
                        answers += orjson.loads(message)["code"] == "rate_limited"
                await asyncio.wait_for(flooder.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert "dropped" in closed.value.rcvd.reason
            # Every drop answered, up to the cut: 100, and one more for each drop the
            # window gave back while the flood ran (its bucket refills 10 a second here;
            # on a loaded machine the flood took long enough for one).
            refilled = math.ceil((time.monotonic() - began) * 100 / FLOOD_WINDOW_SECONDS)
            assert 0 < answers <= 101 + refilled
            frames, done = await (await client.speak("Another client is served.")).collect()
            assert done.type == "done" and frames


async def test_newcomers_are_refused_while_the_worker_cannot_keep_up_with_its_listeners():
    """At 32 real-time listeners on 2 cores every one of them underran, because the fixed
    utterance limit (64) was above what the cores could serve. Admission now follows the
    measure: while a listener is out of audio still to be computed, a newcomer is
    refused (overloaded, retry_after_ms), and served once the worker keeps up again."""
    # 0.1 s of tone a step of 0.05 s: this worker keeps two listeners in real time, not four.
    with run_server(ServerConfig(cache_mb=0), engine=lambda: ToneEngine(step_delay=0.05)) as s:
        async with websockets.connect(s.ws, max_size=None) as ws:
            await recv_json(ws)
            for i in range(4):
                await ws.send(speak(f"p{i}", "la " * 60 + ".", True))
            worker = s.service.worker
            await wait_until(lambda: worker.behind_seconds() > 0.5)
            await ws.send(speak("late", "one more.", True))
            while (refused := await recv_json(ws)).get("ctx") != "late":
                pass
            assert refused["code"] == "overloaded" and "cannot keep up" in refused["message"]
            assert refused["retry_after_ms"] > 0 and refused["terminal"] is True
            for i in range(4):
                await ws.send(orjson.dumps({"type": "cancel", "ctx": f"p{i}"}).decode())
            await ws.send(speak("later", "one more.", True))
            while (answer := await recv_json(ws)).get("ctx") != "later" or answer["type"] == "started":
                pass
            assert answer["type"] == "done"


async def _event(ws: websockets.ClientConnection, heard: dict[str, int]) -> dict:
    """The next control message; the audio frames before it are counted in ``heard``
    (samples by ctx)."""
    while True:
        message = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(message, str):
            return orjson.loads(message)
        frame = msgpack.unpackb(message)
        heard[frame["ctx"]] = heard.get(frame["ctx"], 0) + frame["samples"]


async def _listen(ws: websockets.ClientConnection, ctxs: set[str], heard: dict[str, int]) -> None:
    """Reads until each of ``ctxs`` is done."""
    while ctxs:
        event = await _event(ws, heard)
        if event["type"] in ("done", "error"):
            assert event["type"] == "done", event
            ctxs.discard(event["ctx"])


@pytest.mark.parametrize("most", [0.7, 0.0])
async def test_a_newcomer_past_the_measured_capacity_is_refused_before_anyone_falls_behind(most):
    """Reacting to a listener already behind left every listener admitted before that to
    break. The worker measures what each stream costs: 0.1 s of tone a step of 0.025 s
    here, a quarter of its time each. Two listeners take half; a third would take three
    quarters, past ``max_worker_load`` (0.7 here), and is refused (overloaded, with
    retry_after_ms) while nobody is behind; the two are heard out whole. The control, the
    limit at 0, admits it."""
    limits = Limits(max_worker_load=most)
    heard: dict[str, int] = {}
    with run_server(ServerConfig(cache_mb=0, limits=limits), engine=lambda: ToneEngine(step_delay=0.025)) as s:
        worker = s.service.worker
        async with websockets.connect(s.ws, max_size=None) as ws:
            await _event(ws, heard)
            for i in range(2):
                await ws.send(speak(f"p{i}", "la " * 40 + ".", True))
                assert (await _event(ws, heard))["type"] == "started"
                await wait_until(lambda: worker.load() > 0)  # its voice's cost is measured
            load = worker.load() + worker.stream_cost("tone")
            assert 0.7 < load < 1.1, load  # three streams' worth: a quarter each, and a little
            gauge = re.search(r'^voxwire_worker_load\{worker="0"\} (\S+)$', httpx.get(f"{s.http}/metrics").text, re.M)
            assert gauge is not None and 0.4 < float(gauge.group(1)) < load  # the two alone, on /metrics
            assert worker.behind_seconds() == 0
            await ws.send(speak("late", "one more.", True))
            answer = await _event(ws, heard)
            assert answer["ctx"] == "late"
            if most:
                assert answer["type"] == "error" and answer["code"] == "overloaded", answer
                assert "measured capacity" in answer["message"] and answer["retry_after_ms"] > 0
                await _listen(ws, {"p0", "p1"}, heard)
            else:
                assert answer["type"] == "started", answer
                await _listen(ws, {"p0", "p1", "late"}, heard)
                assert heard.pop("late") == 2 * 1600
            assert heard == {f"p{i}": 41 * 1600 for i in range(2)}  # a word is 0.1 s at 16 kHz
            # They are done: nothing is left to compute, and the newcomer is served.
            assert worker.load() == 0
            await ws.send(speak("later", "one more.", True))
            assert (await _event(ws, heard))["type"] == "started"
            await _listen(ws, {"later"}, heard)
            assert heard["later"] == 2 * 1600


async def test_a_server_slower_than_real_time_still_speaks_to_one_listener():
    """0.1 s of tone a step of 0.15 s: each stream needs 1.5 times the worker's time. A
    newcomer alone is served whatever its cost; one beside it is refused."""
    heard: dict[str, int] = {}
    with run_server(ServerConfig(cache_mb=0), engine=lambda: ToneEngine(step_delay=0.15)) as s:
        worker = s.service.worker
        async with websockets.connect(s.ws, max_size=None) as ws:
            await _event(ws, heard)
            for ctx in ("a", "b"):  # the second once the first has been measured
                await ws.send(speak(ctx, "one two.", True))
                await _listen(ws, {ctx}, heard)
            assert heard == {"a": 2 * 1600, "b": 2 * 1600} and worker.stream_cost("tone") > 1
            await ws.send(speak("long", "la " * 20 + ".", True))
            assert (await _event(ws, heard))["type"] == "started"
            await ws.send(speak("beside", "one more.", True))
            answer = await _event(ws, heard)
            assert (answer["ctx"], answer["code"]) == ("beside", "overloaded"), answer
            await ws.send(orjson.dumps({"type": "cancel", "ctx": "long"}).decode())
            while (await _event(ws, heard))["type"] != "cancelled":
                pass


async def test_text_per_session_is_bounded():
    limits = Limits(max_session_chars=100)
    with run_server(ServerConfig(limits=limits), engine=ToneEngine) as s:
        async with await Client.connect(s.ws) as client:
            frames, done = await (await client.speak("a b c d e f g h i j " * 4)).collect()
            assert done.type == "done"
            with pytest.raises(Exception) as e:
                await (await client.speak("k l m n o p q r s t " * 4)).collect()
            assert e.value.code == "session_text_limit"


@pytest.mark.slow  # waits out idle timeouts
async def test_idle_connection_is_closed_but_a_busy_one_is_not():
    limits = Limits(idle_timeout_seconds=0.5)
    with run_server(ServerConfig(limits=limits), engine=lambda: ToneEngine(step_delay=0.02)) as s:
        async with websockets.connect(s.ws) as ws:
            await ws.recv()  # ready
            # 60 words at 20 ms a step: well over the idle bound while audio flows.
            await ws.send(orjson.dumps({"type": "speak", "ctx": "a", "text": "la " * 60 + "."}).decode())
            while True:
                m = await asyncio.wait_for(ws.recv(), 10)
                if isinstance(m, str) and '"done"' in m:
                    break
            with pytest.raises(websockets.ConnectionClosed) as e:
                await asyncio.wait_for(ws.recv(), 10)
            assert e.value.rcvd.code == 1000 and "idle" in e.value.rcvd.reason


@pytest.mark.parametrize("given,index", [("0", 0), ("7", 7), (" 1\n", 1), (None, None), ("", None),
                                         ("3f2a9c1e", None), ("-1", None), ("+1", None), ("1.0", None), ("٣", None)])
def test_a_worker_index_is_a_whole_number_from_0_or_none(given, index):
    assert parse_worker_index(given) == index
    assert worker_index({} if given is None else {WORKER_INDEX_ENV: given}) == index


def test_shared_admission_needs_a_worker_index_or_falls_back_to_its_own(tmp_path, monkeypatch, caplog):
    path = tmp_path / "admission"
    SharedAdmission.create(path, 2)
    monkeypatch.setenv(SHARED_ADMISSION_ENV, str(path))
    monkeypatch.setenv(WORKER_INDEX_ENV, "1")
    shared = admission_for_process(Limits())
    assert isinstance(shared, SharedAdmission) and shared.try_connect()
    assert path.read_bytes()[SharedAdmission.SLOT.size:] == SharedAdmission.SLOT.pack(1, 0)  # worker 1's slot
    monkeypatch.setenv(WORKER_INDEX_ENV, "3f2a9c1e")  # a Ray replica id, say: no slot of its own
    with caplog.at_level(logging.WARNING, logger="voxwire.server.limits"):
        own = admission_for_process(Limits())
    assert type(own) is Admission and own.try_connect() and own.connections == 1
    assert shared.connections == 1  # nothing counted in another worker's slot
    assert "'3f2a9c1e', not a worker index" in caplog.text and "limits are its own" in caplog.text
