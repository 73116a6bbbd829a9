"""Per-connection limits: message rate, text per session, idle connections."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
import websockets

from voxwire.server.config import ServerConfig
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
from voxwire_client import Client


async def test_message_flood_is_rate_limited_and_the_session_goes_on():
    limits = Limits(messages_per_second=20, message_burst=30)
    with run_server(ServerConfig(limits=limits), engine=ToneEngine) as s:
        async with await Client.connect(s.ws) as client:
            u = await client.speak("", ctx="flood", final=False)
            for _ in range(60):  # far faster than 20 per second
                await u.send("word ")
            items = []
            async for item in u:
                items.append(item)
                if getattr(item, "type", None) == "error":
                    break
            assert items[-1]["code"] == "rate_limited" and items[-1]["terminal"] is False
            await asyncio.sleep(1.0)  # the bucket refills
            await u.send("end.", final=True)
            async for item in u:
                pass
            assert item.type == "done"


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
