"""Server memory with stalled readers: clients that ask for speech and never read it.

Each stalled reader holds a socket whose receive buffer is tiny; the server's send blocks,
its utterance's queue fills to its bound and the worker stops computing for it. RSS is
read once the queued audio stops growing, and compared with the idle server.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import orjson
import websockets

from benchmarks.process import gauge, rss_mb

LONG_TEXT = "This answer is long, and nobody is listening to it. " * 60


@dataclass(frozen=True)
class MemoryResult:
    readers: int
    idle_rss_mb: float
    stalled_rss_mb: float
    queued_audio_s: float
    """Audio computed and held for the stalled readers, server-wide."""

    @property
    def per_reader_mb(self) -> float:
        return (self.stalled_rss_mb - self.idle_rss_mb) / self.readers


async def stalled_readers(url: str, http: str, pid: int, readers: int = 50, timeout: float = 60.0) -> MemoryResult:
    idle = rss_mb(pid)
    host, port = url.split("//")[1].split("/")[0].split(":")
    sockets = []
    for i in range(readers):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        ws = await websockets.connect(url, sock=sock, max_queue=1, max_size=None)
        await ws.recv()  # ready
        await ws.send(orjson.dumps({"type": "speak", "ctx": f"stall{i}", "text": LONG_TEXT}).decode())
        sockets.append(ws)
    # Steady state: the queued audio has stopped growing for a second.
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    last, queued = -1.0, 0.0
    while loop.time() < end:
        queued = await gauge(http, "voxwire_queued_audio_seconds")
        if queued == last and queued > 0:
            break
        last = queued
        await asyncio.sleep(1.0)
    stalled = rss_mb(pid)
    for ws in sockets:
        ws.transport.abort()
    return MemoryResult(readers=readers, idle_rss_mb=idle, stalled_rss_mb=stalled, queued_audio_s=queued)
