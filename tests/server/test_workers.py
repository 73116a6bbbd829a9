"""``--workers N``: several processes on one port, supervised."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.conftest import free_port


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
        [sys.executable, "-m", "server", "serve", "--port", str(port), "--workers", "2", "--piper-backend", "onnx",
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
