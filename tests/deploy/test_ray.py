"""Voxwire on Ray Serve (server/ray_app.py), through Ray's own proxy, on loopback.

One small local Ray instance for the module (2 CPUs, no dashboard, a small object
store): the machine is shared, and each replica loads Piper. The deployment has two
replicas of half a CPU each; the last test replaces it with an autoscaling one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import websockets

ray = pytest.importorskip("ray", reason="the ray extra (make test installs it)")
from ray import serve  # noqa: E402

from server.ray_app import Voxwire, replica_config  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.server.test_stream import ONE_LONG_SENTENCE  # noqa: E402
from voxwire_client import Client  # noqa: E402
from voxwire_client.client import Closed  # noqa: E402

pytestmark = pytest.mark.timeout(600)  # replicas load Piper on a busy 2-core machine

WINDOW_S = 1.0
SETTINGS = {"engine": "piper", "cache_mb": 0, "flow_window_seconds": WINDOW_S, "drain_seconds": 3}
LONG = " ".join(f"This is sentence number {i} of a long answer that nobody is listening to." for i in range(60))


@pytest.fixture(scope="module")
def proxy() -> Iterator[str]:
    """Ray's HTTP proxy on a loopback port, in front of two Voxwire replicas."""
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = Voxwire.options(
            num_replicas=2, ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=8,
            graceful_shutdown_timeout_s=10, graceful_shutdown_wait_loop_s=0.5,
        ).bind(SETTINGS)
        serve.run(app, name="two", route_prefix="/")
        yield f"ws://127.0.0.1:{port}/v1/stream"
    finally:
        serve.shutdown()
        ray.shutdown()


async def replicas(app: str = "two", count: int = 2) -> dict[str, dict[str, Any]]:
    """Each replica's probe (server/ray_app.py). A handle call reaches a replica of Ray's
    choosing, so ask until every one has answered (a bounded number of times)."""
    handle = serve.get_app_handle(app)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(60):
        p = await handle.probe.remote()
        seen.setdefault(p["replica"], p)
        if len(seen) == count:
            break
    assert len(seen) == count, seen
    return seen


def total(probes: dict[str, dict[str, Any]], key: str) -> int:
    return sum(p[key] for p in probes.values())


def utterances(probes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [u for p in probes.values() for u in p["utterances"]]


async def settle(timeout: float = 120) -> list[dict[str, Any]]:
    """The replicas' utterances once each is held (backlogged) and its step count has
    stopped changing."""
    last = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = utterances(await replicas())
        held = now and all(u["backlogged"] and u["steps"] > 0 for u in now)
        if held and last is not None and [u["steps"] for u in now] == [u["steps"] for u in last]:
            return now
        last = now
        await asyncio.sleep(1.0)
    raise AssertionError(f"the utterances never settled: {last}")


def speak(ctx: str, text: str) -> str:
    return orjson.dumps({"type": "speak", "ctx": ctx, "text": text}).decode()


def test_replica_settings_are_checked_as_voxwire_serve_checks_them():
    assert replica_config({"engine": "piper", "cache_mb": 8}, env={}).cache_mb == 8
    with pytest.raises(ValueError, match="unknown setting"):
        replica_config({"cache_megabytes": 8}, env={})
    with pytest.raises(ValueError):
        replica_config({"chunk_ms": 1}, env={})


async def test_real_speech_through_the_proxy(proxy):
    async with await Client.connect(proxy) as client:
        assert client.ready["engine"] == "piper"
        frames, done = await (await client.speak("Hello from a Ray Serve replica.")).collect()
    audio = np.concatenate([f.to_float32() for f in frames])
    rate = frames[0].sample_rate
    assert done["samples"] == audio.size and audio.size / rate > 1.0  # about two seconds of speech
    assert np.sqrt(np.mean(audio**2)) > 0.01  # speech, not silence


async def test_cancel_through_the_proxy_stops_the_generator(proxy):
    closed_before = total(await replicas(), "generators_closed")
    async with websockets.connect(proxy) as ws:
        await ws.recv()
        # One unsplittable sentence: at its first frame the engine is inside it, so a
        # generator is open for the cancel to close.
        await ws.send(speak("a", ONE_LONG_SENTENCE))
        while not isinstance(await ws.recv(), bytes):
            pass
        await ws.send(orjson.dumps({"type": "cancel", "ctx": "a"}).decode())
        while True:
            raw = await ws.recv()
            if isinstance(raw, str) and orjson.loads(raw)["type"] == "cancelled":
                break
        # Nothing follows ``cancelled`` for that ctx.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ws.recv(), 2.0)
    # The step running when the cancel came finishes first (seconds on a busy machine).
    for _ in range(240):
        probes = await replicas()
        if not utterances(probes):
            break
        await asyncio.sleep(0.25)
    assert utterances(probes) == []
    assert total(probes, "generators_closed") == closed_before + 1


async def test_a_stalled_reader_is_computed_only_the_window_ahead_and_memory_stays_bounded(proxy):
    # A client that stops reading at once: tiny buffers, and it never calls recv().
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(proxy.split(":")[2].split("/")[0])))
    ws = await websockets.connect(proxy, sock=sock, max_queue=1)
    try:
        await ws.recv()
        await ws.send(speak("a", LONG))
        await ws.send(orjson.dumps({"type": "progress", "ctx": "a", "played": 0}).decode())
        (u,) = await settle()
        rate = next(p["engine_rate"] for p in (await replicas()).values())
        step = u["produced_samples"] / u["steps"]  # the engine's audio per step, on average
        assert u["backlogged"] and u["ahead_samples"] >= WINDOW_S * rate
        assert u["produced_samples"] <= WINDOW_S * rate + 3 * step  # not the minutes of text
        rss = {r: p["rss_bytes"] for r, p in (await replicas()).items()}
        await asyncio.sleep(5)
        later = await replicas()
        assert [x["steps"] for x in utterances(later)] == [u["steps"]]  # still nothing computed
        for r, p in later.items():
            assert p["rss_bytes"] - rss[r] < 32 * 1024**2
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


async def test_a_client_that_vanishes_stops_its_utterance_before_its_next_step(proxy):
    sock = socket.create_connection(("127.0.0.1", int(proxy.split(":")[2].split("/")[0])))
    ws = await websockets.connect(proxy, sock=sock)
    await ws.recv()
    await ws.send(speak("a", LONG))  # no progress: it computes as fast as it can
    while not isinstance(await ws.recv(), bytes):
        pass
    before = await replicas()
    assert len(utterances(before)) == 1
    # An abort, not a close: RST, no close frame (SO_LINGER 0).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    for _ in range(120):
        after = await replicas()
        if not utterances(after):
            break
        await asyncio.sleep(0.25)
    assert not utterances(after)
    # The step running at the probe, and one begun before the abort arrived, may finish.
    assert total(after, "steps") - total(before, "steps") <= 2


async def test_two_held_sockets_go_to_different_replicas(proxy):
    async with websockets.connect(proxy) as a, websockets.connect(proxy) as b:
        await a.recv()
        await b.recv()
        probes = await replicas()
        assert sorted(p["connections"] for p in probes.values()) == [1, 1]


async def test_a_client_whose_replica_dies_gets_a_close_and_reconnects(proxy):
    async with await Client.connect(proxy) as client:
        (victim,) = [p for p in (await replicas()).values() if p["connections"] == 1]
        u = await client.speak(LONG)
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.raises(Closed):
            await asyncio.wait_for(u.collect(), 60)
    # The proxy sends new sockets to the replica that is still there.
    async with await Client.connect(proxy) as client:
        frames, done = await (await client.speak("Still here.")).collect()
        assert done["samples"] > 0


def running(app: str) -> dict[str, int]:
    """The deployment's replicas by state, as Serve's controller reports them."""
    return dict(serve.status().applications[app].deployments["Voxwire"].replica_states)


async def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(1.0)


async def test_autoscaling_follows_held_sockets_up_and_back_down(proxy):
    # The two-replica application goes, to leave room (and CPUs) for this one.
    serve.delete("two")
    app = Voxwire.options(
        ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=4,
        graceful_shutdown_timeout_s=10, graceful_shutdown_wait_loop_s=0.5,
        autoscaling_config={
            "min_replicas": 1, "initial_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
            "upscale_delay_s": 0, "downscale_delay_s": 2, "metrics_interval_s": 0.5, "look_back_period_s": 1,
        },
    ).bind(SETTINGS)
    # Under a route prefix, as a second application beside another would be.
    serve.run(app, name="auto", route_prefix="/auto")
    url = proxy.replace("/v1/stream", "/auto/v1/stream")
    assert running("auto") == {"RUNNING": 1}
    # An open socket is an ongoing request: two of them, against a target of one.
    async with websockets.connect(url) as a, websockets.connect(url) as b:
        for ws in (a, b):
            assert orjson.loads(await ws.recv())["type"] == "ready"
        await wait_for(lambda: running("auto").get("RUNNING", 0) == 2, 400)
    await wait_for(lambda: running("auto") == {"RUNNING": 1}, 120)
    # The one left serves.
    async with await Client.connect(url) as client:
        frames, done = await (await client.speak("Back to one.")).collect()
        assert done["samples"] > 0
