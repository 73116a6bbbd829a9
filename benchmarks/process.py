"""Servers under test as child processes on 127.0.0.1, and readings of them."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 120.0, *,
              alive: Callable[[], bool] | None = None, interval: float = 0.1) -> float:
    """Until ``url`` answers 200; returns the seconds that took. The server is ``proc``, or
    something ``alive`` says is still running (a container): its end is an error at once."""
    import httpx  # the bench extra's: `voxwire bench` starts without it, to say so (bench.py)

    running = alive or (lambda: proc is None or proc.poll() is None)
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        if not running():
            what = " ".join(map(str, proc.args)) if proc is not None else url
            raise RuntimeError(f"the server exited during start-up ({what})")
        time.sleep(interval)
    if proc is not None:
        proc.kill()
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


def launch_voxwire(port: int, *args: str, nice: int = 0) -> subprocess.Popen[bytes]:
    """``voxwire serve`` on 127.0.0.1:port, starting (see :func:`wait_http`); ``nice``: run
    it as ``nice -n NICE`` would (below 0 needs CAP_SYS_NICE, as it does for a user)."""
    prefix = ["nice", "-n", str(nice)] if nice else []
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "voxwire", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def spawn_voxwire(port: int, *args: str) -> subprocess.Popen[bytes]:
    """``voxwire serve`` on 127.0.0.1:port, once it is ready."""
    proc = launch_voxwire(port, *args)
    wait_http(f"http://127.0.0.1:{port}/readyz", proc)
    return proc


def wait_tcp(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Until something accepts connections on 127.0.0.1:port."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited during start-up ({' '.join(map(str, proc.args))})")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"127.0.0.1:{port} did not accept connections within {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def gauges(http: str, *names: str) -> tuple[float, ...]:
    """Values from one scrape of the server's /metrics, in the order named."""
    import httpx  # the bench extra's, as in wait_http

    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(f"{http}/metrics")).text
    values = []
    for name in names:
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        if m is None:
            raise KeyError(name)
        values.append(float(m.group(1)))
    return tuple(values)


async def gauge(http: str, name: str) -> float:
    """One value from the server's /metrics."""
    return (await gauges(http, name))[0]
