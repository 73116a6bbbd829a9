"""``--workers N``: several processes on one port, supervised."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import Loopback, free_port
from tests.server.test_metrics import scrape

pytestmark = pytest.mark.slow  # --workers N: several server processes


def pids(port: int, n: int = 40) -> set[int]:
    seen = set()
    for _ in range(n):
        # A fresh connection each time: the kernel spreads connections across workers.
        try:
            with httpx.Client(timeout=10) as http:
                r = http.get(f"http://127.0.0.1:{port}/readyz", headers={"Connection": "close"})
        except httpx.HTTPError:
            continue  # not listening yet, or a worker restarting
        if r.status_code == 200:
            seen.add(r.json()["pid"])
    return seen


def wait_for(predicate, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("timed out")


def test_two_workers_share_the_port_and_a_dead_one_is_replaced():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--workers", "2", "--piper-backend", "onnx",
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        both = wait_for(lambda: _two(pids(port)))
        assert proc.pid not in both  # the parent only supervises
        victim = min(both)
        os.kill(victim, signal.SIGKILL)
        again = wait_for(lambda: _two(pids(port), without=victim))
        assert len(again - both) == 1  # a new worker took the dead one's place
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for pid in again:
            assert wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 30)
    finally:
        proc.kill()
        proc.wait()


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    except OSError:
        return True


def _two(seen: set[int], without: int | None = None) -> set[int] | None:
    return seen if len(seen) == 2 and without not in seen else None


def scrape_totals(port: int) -> dict[str, float]:
    # A fresh connection each time, so the kernel may hand it to either worker.
    return scrape(Loopback("127.0.0.1", port), headers={"Connection": "close"})


DONE = "voxwire_utterances_total{code=,door=ws,outcome=done}"


async def _speak_once(url: str, text: str) -> dict:
    """One utterance on a fresh connection: its last control message (done, or why not)."""
    import orjson
    import websockets

    try:
        async with websockets.connect(url) as ws:
            await ws.recv()
            await ws.send(orjson.dumps({"type": "speak", "text": text}).decode())
            while True:
                m = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(m, str) and orjson.loads(m)["type"] in ("done", "error"):
                    return orjson.loads(m)
    except websockets.ConnectionClosed as e:
        return {"type": "closed", "code": e.rcvd.code if e.rcvd else None}


async def test_metrics_and_limits_are_server_wide_across_workers():
    import orjson
    import websockets

    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/stream"
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--workers", "2", "--piper-backend", "onnx",
         "--log-level", "warning", "--max-utterances-total", "1", "--cache-mb", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        both = await asyncio.to_thread(wait_for, lambda: _two(pids(port)))
        for i in range(6):  # fresh connections: the kernel spreads them over both workers
            assert (await _speak_once(url, f"Number {i}."))["type"] == "done"
        scrapes = [await asyncio.to_thread(scrape_totals, port) for _ in range(8)]
        assert {s[DONE] for s in scrapes} == {6}  # every scrape, whichever worker answered
        assert {s["voxwire_ready_workers"] for s in scrapes} == {2}

        # One utterance held open takes the only slot, whichever worker holds it.
        async with websockets.connect(url) as holder:
            await holder.recv()
            await holder.send(orjson.dumps({"type": "speak", "ctx": "hold", "text": "Hello", "final": False}).decode())
            assert orjson.loads(await holder.recv())["type"] == "started"
            turned_away = [await _speak_once(url, "Me too.") for _ in range(6)]
            # Refused at the door (1013) or at the speak (overloaded), on either worker.
            assert all(r.get("code") in (1013, "overloaded") for r in turned_away), turned_away
            totals = await asyncio.to_thread(scrape_totals, port)
            assert totals["voxwire_active_utterances"] == 1
            refused = totals.get("voxwire_connections_refused_total{reason=at_capacity}", 0) + sum(
                v for k, v in totals.items() if k.startswith("voxwire_utterances_total") and "overloaded" in k
            )
            assert refused == 6

        # A worker killed: its counts go, and no counter goes backwards.
        before = await asyncio.to_thread(scrape_totals, port)
        victim = min(both)
        os.kill(victim, signal.SIGKILL)
        await asyncio.to_thread(wait_for, lambda: _two(pids(port), without=victim))
        after = await asyncio.to_thread(scrape_totals, port)
        for key, value in before.items():
            if key.endswith("_total") or "_total{" in key:
                assert after.get(key, 0) >= value, key
        assert after[DONE] == 6
        assert (await _speak_once(url, "Still here."))["type"] == "done"  # the dead worker's slots were freed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_second_server_refuses_the_port_that_workers_serve():
    """Only the workers of one server share its port: another server, with workers of its
    own, is refused it (it would otherwise take a share of the first one's connections)."""
    port = free_port()
    args = ["--port", str(port), "--workers", "2", "--piper-backend", "onnx", "--log-level", "warning"]
    # Own process groups: whatever happens, no worker of either outlives the test.
    first = subprocess.Popen([sys.executable, "-m", "voxwire", "serve", *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    second = None
    try:
        workers = wait_for(lambda: _two(pids(port)))
        second = subprocess.Popen([sys.executable, "-m", "voxwire", "serve", *args], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        _, stderr = second.communicate(timeout=120)
        assert second.returncode == 2
        assert stderr.splitlines() == [f"voxwire: cannot listen on 127.0.0.1:{port}: Address already in use"]
        assert pids(port, 12) <= workers  # every connection still reaches the first server
    finally:
        for proc in (first, second):
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
