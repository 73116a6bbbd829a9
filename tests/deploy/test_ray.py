"""Voxwire on Ray Serve (server/ray_app.py), through Ray's own proxy, on loopback.

One small local Ray instance for the module (2 CPUs, no dashboard, a small object
store): the machine is shared, and each replica loads Piper. The deployment has two
replicas of half a CPU each, each with its own metrics port; the drain test stops it, and
the last test deploys an autoscaling one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

ray = pytest.importorskip("ray", reason="the ray extra (make test installs it)")
from ray import serve  # noqa: E402

from voxwire.server.ray_app import Voxwire, build, replica_config, replica_index  # noqa: E402
from tests.clients.js.test_browser import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    COMPARE,
    RECORDER,
    assert_played_all,
    click_speak,
    demo_page,
    wait_played,
)
from tests.conftest import free_port  # noqa: E402
from tests.server.test_stream import ONE_LONG_SENTENCE  # noqa: E402
from voxwire_client import Client  # noqa: E402
from voxwire_client.client import Closed, ServerError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # Ray; replicas load Piper on a busy 2-core machine

WINDOW_S = 1.0
DRAIN_S = 20  # as the plain server's drain test: room for a busy machine
SETTINGS = {"engine": "piper", "cache_mb": 0, "flow_window_seconds": WINDOW_S, "drain_seconds": DRAIN_S}
GRACE_S = 2 * DRAIN_S  # Ray's graceful_shutdown_timeout_s: longer than the drain, as in deploy/ray
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
            graceful_shutdown_timeout_s=GRACE_S, graceful_shutdown_wait_loop_s=0.5,
        ).bind(SETTINGS, metrics_port=0)
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
    with pytest.raises(ValueError, match="metrics_port"):
        build({"settings": {"engine": "piper"}, "metrics_port": "9500"})


def test_a_replica_is_numbered_by_its_rank_in_the_deployment():
    from types import SimpleNamespace

    from ray.serve.schema import ReplicaRank

    assert replica_index(SimpleNamespace(rank=ReplicaRank(rank=1, node_rank=0, local_rank=1))) == 1
    assert replica_index(SimpleNamespace(rank=3)) == 3  # a Ray that gives the int itself
    for no_rank in (SimpleNamespace(rank=None), SimpleNamespace(), SimpleNamespace(rank=True),
                    SimpleNamespace(rank=-1)):
        assert replica_index(no_rank) is None


async def test_real_speech_through_the_proxy(proxy):
    async with await Client.connect(proxy) as client:
        assert client.ready["engine"] == "piper"
        frames, done = await (await client.speak("Hello from a Ray Serve replica.")).collect()
    audio = np.concatenate([f.to_float32() for f in frames])
    rate = frames[0].sample_rate
    assert done["samples"] == audio.size and audio.size / rate > 1.0  # about two seconds of speech
    assert np.sqrt(np.mean(audio**2)) > 0.01  # speech, not silence


def replica_log_files(pid: int) -> list[Path]:
    """What a replica process wrote to its stdout and stderr: Ray keeps them as files."""
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    return sorted(logs.glob(f"worker-*-{pid}.out")) + sorted(logs.glob(f"worker-*-{pid}.err"))


async def test_a_replica_logs_as_voxwire_serve_does_and_no_key_reaches_rays_logs(proxy):
    """Each replica configures logging from its settings as ``voxwire serve`` does: JSON
    lines through the handler that redacts credentials. A key sent as ``?token=`` reaches
    no log of Ray's, the replicas' own included, even in a line that carries the request's
    URL as uvicorn logs it (where a replica serves HTTP itself, as with Ray's direct ingress)."""
    key = "rk-Secret-7d3e19"
    async with websockets.connect(f"{proxy}?token={key}") as ws:
        assert orjson.loads(await ws.recv())["type"] == "ready"

    def log_in_replica(_replica: object, key: str) -> dict[str, Any]:
        import logging
        import os

        logging.getLogger("uvicorn.error").info('%s - "WebSocket %s" [accepted]', "127.0.0.1:50000",
                                                f"/v1/stream?token={key}")
        logging.getLogger("voxwire.server.app").warning("request failed: %s", f"http://h/v1/voices?token={key}")
        root = logging.getLogger()
        for handler in root.handlers:
            handler.flush()
        return {"pid": os.getpid(), "level": logging.getLevelName(root.level),
                "handlers": [[type(f).__name__ for f in h.filters] for h in root.handlers]}

    for replica, probe in (await replicas()).items():
        actor = ray.get_actor(f"SERVE_REPLICA::two#Voxwire#{replica}", namespace="serve")
        seen = await actor.__ray_call__.remote(log_in_replica, key)
        assert seen["pid"] == probe["pid"] and seen["level"] == "INFO"  # log_level, as the settings give it
        assert len(seen["handlers"]) == 1 and "RedactCredentials" in seen["handlers"][0], seen
        lines: list[dict[str, Any]] = []
        for _ in range(100):  # the lines are flushed; Ray's log files may trail a little
            text = "".join(f.read_text(errors="replace") for f in replica_log_files(probe["pid"]))
            lines = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
            if sum("[redacted]" in line.get("msg", "") for line in lines) >= 2:
                break
            await asyncio.sleep(0.1)
        # Voxwire's JSON lines, with the replica's worker index, and the key redacted.
        accepted = [line for line in lines if line["logger"] == "uvicorn.error" and "WebSocket" in line["msg"]]
        assert accepted and accepted[-1]["msg"].endswith('"WebSocket /v1/stream?token=[redacted]" [accepted]')
        assert accepted[-1]["worker"] == probe["worker"] and accepted[-1]["pid"] == probe["pid"]
        failed = [line for line in lines if line["msg"].startswith("request failed")]
        assert failed and failed[-1]["msg"] == "request failed: http://h/v1/voices?token=[redacted]"
    # Nowhere in Ray's logs: replicas, proxy, controller, Serve's own files.
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    leaked = [str(f) for f in logs.rglob("*") if f.is_file() and key.encode() in f.read_bytes()]
    assert leaked == []


# Counts what the page's client sends, by message type (the demo's JS client sends JSON text).
COUNT_SENT = """(() => {
    window.sent = {};
    const send = WebSocket.prototype.send;
    WebSocket.prototype.send = function (data) {
        if (typeof data === 'string') { const t = JSON.parse(data).type; window.sent[t] = (window.sent[t] || 0) + 1; }
        return send.call(this, data);
    };
})();"""
BROWSER_TEXT = "Streaming speech through Ray's proxy, to a browser. Each chunk plays as it arrives."


@pytest.fixture
def chromium() -> Iterator[object]:
    """Chromium for one test, as tests/clients/js launches it. Not the module-wide
    ``browser`` fixture there: sync Playwright keeps its event loop running on this thread
    while it is open, and this module's other tests are async."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            yield b
        finally:
            b.close()


def test_the_js_client_in_chromium_plays_real_speech_through_the_proxy(proxy, chromium):
    # Ray's proxy serves the whole app, the demo page and the JS client included, and the
    # page talks to /v1/stream on the host that served it: here, the proxy.
    page_url = proxy.replace("ws://", "http://").removesuffix("/v1/stream") + "/"
    with demo_page(chromium, page_url, init_script=COUNT_SENT) as page:
        page.evaluate(RECORDER)
        click_speak(page, BROWSER_TEXT)
        run = wait_played(page)
        page.wait_for_timeout(100)  # the recorder's last blocks are a message away
        cmp = page.evaluate(COMPARE)
        sent = page.evaluate("window.sent")
    assert run["error"] is None and run["done"]["samples"] > run["started"]["sample_rate"]  # over a second
    assert_played_all(run)
    # What the worklet played is what came through the proxy, sample for sample, and it is
    # speech, not silence.
    assert cmp["sent"] == run["done"]["samples"], cmp
    assert cmp["mismatched"] == 0 and cmp["matched_to"] == cmp["sent"] and cmp["peak"] > 0.1, cmp
    # The player's playback progress went through the proxy too (its first report, 0, and
    # more as it played), and the paced utterance still played to its end.
    assert sent.get("speak", 0) >= 1 and sent.get("progress", 0) >= 2, sent


async def test_cancel_through_the_proxy_stops_the_generator(proxy):
    closed_before = total(await replicas(), "streams_closed")
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
    assert total(probes, "streams_closed") == closed_before + 1


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


def scrape(port: int) -> dict[str, list[Any]]:
    """A replica's own metrics port (server/ray_app.py): samples by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


async def ongoing_requests(replica: str, app: str = "two") -> int:
    """Ray's count of a replica's ongoing requests: what its autoscaling reads."""
    actor = ray.get_actor(f"SERVE_REPLICA::{app}#Voxwire#{replica}", namespace="serve")
    return await actor.get_num_ongoing_requests.remote()


async def test_each_replica_serves_its_metrics_labelled_as_ray_labels_it_and_agreeing_with_autoscaling(proxy):
    async with websockets.connect(proxy) as a, websockets.connect(proxy) as b:
        await a.recv()
        await b.recv()
        probes = await replicas()
        assert len({p["metrics_port"] for p in probes.values()}) == 2
        for replica, p in probes.items():
            samples = scrape(p["metrics_port"])
            labels = {"application": "two", "deployment": "Voxwire", "replica": replica}
            # Every series is this replica's, labelled as Ray labels its Serve metrics.
            every = [s for group in samples.values() for s in group]
            assert every and all(s.labels.items() >= labels.items() for s in every)
            # Its worker index, as a --workers process has one: an int, the same in its
            # limits, its log lines and its series' `worker` label (the id is `replica`).
            assert isinstance(p["worker"], int) and p["log_fields"] == {"pid": p["pid"], "worker": p["worker"]}
            assert [s.labels["worker"] for s in samples["voxwire_peak_resident_memory_bytes"]] == [str(p["worker"])]
            # Its open sockets, the autoscaling signal, read both ways: one each.
            (connections,) = samples["voxwire_connections"]
            assert connections.value == p["connections"] == await ongoing_requests(replica) == 1
            # Absent until the replica's first step: then this replica's steps, nobody else's.
            assert sum(s.value for s in samples.get("voxwire_engine_steps_total", [])) == p["steps"]
        # Numbered 0 .. N-1 among the deployment's replicas, as --workers N numbers its processes.
        assert sorted(p["worker"] for p in probes.values()) == [0, 1]


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


async def both_replicas_answer(timeout: float = 300) -> None:
    """Wait until both replicas answer a probe: the one killed by the test before is
    replaced by then (Serve's status may still count it as running for a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await replicas()
            return
        except (AssertionError, ray.exceptions.RayError):
            assert time.monotonic() < deadline, "the killed replica was never replaced"
            await asyncio.sleep(1.0)


STOPPING_TEXT = "This sentence is spoken while the replica stops. " * 3


async def test_a_replica_ray_stops_finishes_its_utterance_then_closes_1001(proxy):
    """As ``voxwire serve`` on SIGTERM (docs/reliability.md): no new work, the utterance
    in flight plays to its end, then the socket closes with 1001 (going away)."""
    await both_replicas_answer()
    async with await Client.connect(proxy) as client:
        # Held in flight: the client reports progress (0 so far) and nothing is taken yet,
        # so the replica computes a window of it and waits.
        u = await client.speak(STOPPING_TEXT)
        (held,) = await settle()
        serve.delete("two", _blocking=False)  # stops every replica of the application
        # The replica has begun its drain once a new utterance on the socket is refused.
        for i in range(240):
            try:
                await (await client.speak("Late.", ctx=f"late-{i}")).collect()
            except ServerError as e:
                assert (e.code, e.ctx) == ("shutting_down", f"late-{i}")
                break
            await asyncio.sleep(0.25)
        else:
            raise AssertionError("the replica never began to drain")
        # The one in flight is released by taking its audio, and plays to its end.
        frames, done = await asyncio.wait_for(u.collect(), GRACE_S)
        assert done.type == "done" and sum(f.samples for f in frames) == done["samples"]
        assert held["produced_samples"] < done["samples"]  # the rest was computed during the drain
        # Then the socket closes, going away.
        await asyncio.wait_for(client.ws.wait_closed(), GRACE_S)
        assert client.ws.close_code == 1001
    await wait_for(lambda: "two" not in serve.status().applications, 120)


def running(app: str) -> dict[str, int]:
    """The deployment's replicas by state, as Serve's controller reports them."""
    return dict(serve.status().applications[app].deployments["Voxwire"].replica_states)


async def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(1.0)


async def test_autoscaling_follows_held_sockets_up_and_back_down(proxy):
    # The two-replica application goes (if the drain test has not stopped it already),
    # to leave room (and CPUs) for this one.
    if "two" in serve.status().applications:
        serve.delete("two")
    app = Voxwire.options(
        ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=4,
        graceful_shutdown_timeout_s=GRACE_S, graceful_shutdown_wait_loop_s=0.5,
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


async def test_stalled_listeners_behind_the_proxy_are_reclaimed(proxy):
    """Ray's proxy buffers without bound, so a socket there never pushes back: only
    playback progress shows that a listener has stopped. Two clients report `played: 0`
    once and never again, one reading everything, one reading nothing; within the stall
    timeout both utterances end `listener_stalled` (the reader is told), their slots and
    computation are given back, and a new client is served."""
    app = Voxwire.options(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=8).bind(
        SETTINGS | {"stall_timeout_seconds": 2.0, "max_utterances_total": 2}, metrics_port=0,
    )
    serve.run(app, name="stall", route_prefix="/stall")
    url = proxy.replace("/v1/stream", "/stall/v1/stream")
    port = int(proxy.split(":")[2].split("/")[0])
    deaf = socket.socket()
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    deaf.connect(("127.0.0.1", port))
    try:
        async with websockets.connect(url) as reader:
            silent = await websockets.connect(url, sock=deaf, max_queue=1, compression=None, ping_interval=None)
            for ws, ctx in ((reader, "reader"), (silent, "silent")):
                await ws.recv()
                await ws.send(speak(ctx, LONG))
                await ws.send(orjson.dumps({"type": "progress", "ctx": ctx, "played": 0}).decode())
            (probe,) = (await replicas("stall", 1)).values()
            before = scrape(probe["metrics_port"])
            async with asyncio.timeout(120):
                while True:
                    raw = await reader.recv()
                    if isinstance(raw, str) and orjson.loads(raw)["type"] in ("done", "error"):
                        break
            end = orjson.loads(raw)
            assert end["code"] == "listener_stalled" and end["ctx"] == "reader" and end["terminal"] is True, end
            for _ in range(240):
                probes = await replicas("stall", 1)
                if not utterances(probes):
                    break
                await asyncio.sleep(0.25)
            assert not utterances(probes)  # the deaf one's too: computation and queue gone
            stalled = scrape(probe["metrics_port"])["voxwire_listeners_stalled_total"]
            counted = {s.labels["reason"]: s.value for s in stalled if s.labels["door"] == "ws"}
            was = {s.labels["reason"]: s.value for s in before.get("voxwire_listeners_stalled_total", [])
                   if s.labels["door"] == "ws"}
            assert counted["no_progress"] - was.get("no_progress", 0) == 2
        async with await Client.connect(url) as client:
            frames, done = await asyncio.wait_for((await client.speak("Still serving.")).collect(), 120)
        assert done["samples"] == sum(f.samples for f in frames) > 0
    finally:
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        deaf.close()
        serve.delete("stall")
