"""``--workers 2`` and its ports: connections spread over the workers, a worker that dies
is counted, and a second server is refused both the HTTP and the Wyoming port, in one line."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import orjson
import pytest

from tests.conftest import Loopback, free_port
from tests.server.test_processes import pids, scrape_totals, wait_for

pytestmark = pytest.mark.slow  # servers of their own, in processes of their own

SERVE = [sys.executable, "-m", "voxwire", "serve", "--piper-backend", "onnx", "--log-level", "warning"]


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Loopback, int, subprocess.Popen[bytes]]]:
    """``voxwire serve --workers 2`` with the Wyoming door: its HTTP address, Wyoming port and process."""
    port, wyoming = free_port(), free_port()
    proc = subprocess.Popen(
        [*SERVE, "--port", str(port), "--workers", "2", "--wyoming-port", str(wyoming)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(pids(port)) == 2)
        yield Loopback("127.0.0.1", port), wyoming, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def worker_of_a_new_connection(port: int) -> tuple[socket.socket, int]:
    """A new connection, kept open, and the pid of the worker that took it."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    received = b""
    while not received.rstrip().endswith(b"}"):
        received += s.recv(4096)
    return s, orjson.loads(received.split(b"\r\n\r\n", 1)[1])["pid"]


def test_connections_opened_apart_are_spread_over_the_workers(workers):
    """One socket shared by both workers went to whichever woke first: 16 connections
    300 ms apart went 16 to 0, twice in five tries. With a socket each (SO_REUSEPORT) the
    kernel spreads them by a hash of their addresses: each worker gets at least 4 of 24
    unless the hash is off by odds of 1 in 3,600."""
    server, _, _ = workers
    held, taken = [], []
    for _ in range(24):
        s, pid = worker_of_a_new_connection(server.port)
        held.append(s)
        taken.append(pid)
        time.sleep(0.2)
    for s in held:
        s.close()
    shares = collections.Counter(taken)
    assert len(shares) == 2 and min(shares.values()) >= 4, shares


@pytest.mark.parametrize("second", ["wyoming-with-workers", "wyoming-alone", "http-with-workers"])
def test_a_second_server_is_refused_the_ports_in_one_line(workers, second):
    """A second ``--workers`` server used to share the Wyoming port silently (SO_REUSEPORT):
    four listeners, two servers, nothing logged. It ends now, saying why in one line, as
    it does for the HTTP port."""
    server, wyoming, _ = workers
    args = {
        "wyoming-with-workers": ["--port", str(free_port()), "--workers", "2", "--wyoming-port", str(wyoming)],
        "wyoming-alone": ["--port", str(free_port()), "--wyoming-port", str(wyoming)],
        "http-with-workers": ["--port", str(server.port), "--workers", "2"],
    }[second]
    proc = subprocess.Popen([*SERVE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # its workers stop with it
        proc.communicate(timeout=60)
        pytest.fail("the second server kept running")
    said = stderr.strip().splitlines()
    assert proc.returncode == 2 and len(said) == 1, stderr
    if second == "http-with-workers":
        assert said[0] == f"voxwire: cannot listen on 127.0.0.1:{server.port}: Address already in use"
    else:
        assert said[0].startswith("voxwire: cannot listen for Wyoming on ")
        assert said[0].endswith(f"{wyoming}: Address already in use")
    assert len(pids(server.port)) == 2  # the first server serves on


def test_a_worker_that_dies_is_counted_and_its_replacement_takes_connections(workers):
    server, _, _ = workers
    key = "voxwire_worker_process_restarts_total{{worker={}}}"
    before = scrape_totals(server.port)
    assert (before[key.format(0)], before[key.format(1)]) == (0, 0)  # there from the first scrape
    both = pids(server.port)
    victim = min(both)
    os.kill(victim, signal.SIGKILL)
    def replaced() -> set[int] | None:
        seen = pids(server.port)
        return seen if len(seen) == 2 and victim not in seen else None

    again = wait_for(replaced)
    assert len(again - both) == 1  # the replacement joined the port's sockets and is handed connections
    for _ in range(4):  # whichever worker answers the scrape
        after = scrape_totals(server.port)
        assert sorted((after[key.format(0)], after[key.format(1)])) == [0, 1]
