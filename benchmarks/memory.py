"""Server memory with stalled readers: clients that ask for speech and never read it.

Each stalled reader holds a socket whose receive buffer is tiny. The kernel's send buffer
on the server side still takes a few MB (about 15 s of 48 kHz float audio) before the
server's send blocks; then the utterance's queue fills to its bound and the worker stops
computing for it. RSS is read once the queued audio stops growing, and compared with the
server idle after a warm-up with the same sentence (so allocator growth for its shapes
is not counted as the readers' cost).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import orjson
import websockets

from voxwire.benchmarks.process import gauge, rss_mb

SENTENCE = "This answer is long, and nobody is listening to it. "
LONG_TEXT = SENTENCE * 60
# The most bytes per second of audio: the kernel's socket buffers fill soonest.
SETTINGS = {"format": "pcm_f32le", "sample_rate": 48000}


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


async def stalled_readers(url: str, http: str, pid: int, readers: int = 50, timeout: float = 180.0) -> MemoryResult:
    async with websockets.connect(url, max_size=None) as warm:
        await warm.recv()
        await warm.send(orjson.dumps({"type": "speak", "ctx": "warm", "text": SENTENCE * 3, **SETTINGS}).decode())
        while not (isinstance(m := await warm.recv(), str) and '"done"' in m):
            pass
    idle = rss_mb(pid)
    host, port = url.split("//")[1].split("/")[0].split(":")
    sockets = []
    for i in range(readers):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        ws = await websockets.connect(url, sock=sock, max_queue=1, max_size=None)
        await ws.recv()  # ready
        await ws.send(orjson.dumps({"type": "speak", "ctx": f"stall{i}", "text": LONG_TEXT, **SETTINGS}).decode())
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
