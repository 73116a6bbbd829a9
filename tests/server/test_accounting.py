"""Every utterance is counted once and logged once, through either door, however it ends;
and a connection turned away is counted by its reason."""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson
import pytest
import websockets

from voxwire.server.config import ServerConfig
from voxwire.server.limits import Limits
from tests.conftest import run_server
from tests.fixtures.engines import ToneEngine
from tests.server.test_metrics import scrape


def counted(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The utterance counters that moved, by their labels."""
    return {
        key.removeprefix("voxwire_utterances_total"): after[key] - before.get(key, 0)
        for key in after
        if key.startswith("voxwire_utterances_total{") and after[key] != before.get(key, 0)
    }


async def speak(ws: websockets.ClientConnection, until: tuple[str, ...], **message: object) -> dict:
    await ws.send(orjson.dumps({"type": "speak", **message}).decode())
    while True:
        m = await asyncio.wait_for(ws.recv(), 20)
        if isinstance(m, str) and (event := orjson.loads(m))["type"] in until:
            return event


async def test_each_way_an_utterance_ends_is_one_count_and_one_line(caplog):
    limits = Limits(max_utterances_total=2, max_connections=2)
    with run_server(ServerConfig(limits=limits, cache_mb=0), engine=lambda: ToneEngine(step_delay=0.005)) as s:
        before = scrape(s)
        with caplog.at_level(logging.INFO, logger="voxwire"):
            async with websockets.connect(s.ws) as ws:
                await ws.recv()
                await speak(ws, ("done",), ctx="a", text="la la.")
                await speak(ws, ("error",), ctx="b", text="la.", voice="nobody")  # refused: unknown_voice
                await speak(ws, ("error",), ctx="c", text="la explode.")  # failed: engine_error
                await speak(ws, ("started",), ctx="d", text="la " * 300 + ".")
                await ws.send(orjson.dumps({"type": "cancel", "ctx": "d"}).decode())  # cancelled
                with pytest.raises(websockets.ConnectionClosed) as turned_away:  # max_connections is 2
                    async with websockets.connect(s.ws) as second, websockets.connect(s.ws) as third:
                        await second.recv()
                        await third.recv()
                assert turned_away.value.rcvd.code == 1013
                await speak(ws, ("started",), ctx="e", text="la", final=False)  # holds a slot
                await speak(ws, ("started",), ctx="f", text="la", final=False)  # holds the other
                assert (await speak(ws, ("error",), ctx="g", text="la."))["code"] == "overloaded"
            # e and f were open when the socket closed: disconnected.
            async with httpx.AsyncClient(timeout=30) as http:
                body = {"model": "tts-1", "voice": "tone", "response_format": "pcm"}
                ok = await http.post(f"{s.http}/v1/audio/speech", json={**body, "input": "la la."})
                bad = await http.post(f"{s.http}/v1/audio/speech", json={**body, "input": "la.", "voice": "nobody"})
                async with http.stream("POST", f"{s.http}/v1/audio/speech", json={**body, "input": "la " * 300}) as r:
                    async for _ in r.aiter_raw():
                        break  # and hang up mid-body
            for _ in range(100):
                if s.service.admission.utterances == 0:
                    break
                await asyncio.sleep(0.05)
        after = scrape(s)
        lines = [r for r in caplog.records if r.name == "voxwire.utterance"]
        connections = [r for r in caplog.records if r.name == "voxwire.connection"]
    assert (ok.status_code, bad.status_code) == (200, 400)
    assert counted(before, after) == {
        "{code=,door=ws,outcome=done}": 1,
        "{code=unknown_voice,door=ws,outcome=refused}": 1,
        "{code=engine_error,door=ws,outcome=failed}": 1,
        "{code=,door=ws,outcome=cancelled}": 1,
        "{code=overloaded,door=ws,outcome=refused}": 1,
        "{code=,door=ws,outcome=disconnected}": 2,
        "{code=,door=http,outcome=done}": 1,
        "{code=unknown_voice,door=http,outcome=refused}": 1,
        "{code=,door=http,outcome=disconnected}": 1,
    }
    outcomes = sorted((r.door, r.outcome, getattr(r, "code", "")) for r in lines)
    assert len(outcomes) == 10  # one line each, no more
    assert ("http", "disconnected", "") in outcomes and ("ws", "refused", "overloaded") in outcomes
    assert after["voxwire_connections_refused_total{reason=at_capacity}"] == 1
    assert [r.reason for r in connections] == ["at_capacity"]
