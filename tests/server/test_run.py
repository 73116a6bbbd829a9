"""The server's own listening socket: a capped send buffer, so that backpressure holds for
an HTTP client that stops reading (its body has no other flow control)."""

from __future__ import annotations

import asyncio
import errno
import socket

import orjson
import pytest

from voxwire.server.config import ServerConfig
from voxwire.server.limits import Limits
from voxwire.server.sockets import SEND_BUFFER_BYTES, listening_socket
from voxwire.server.sockets import held_socket
from tests.conftest import run_server

PCM_BYTES_PER_SECOND = 24000 * 2
CLIENT_RECEIVE_BUFFER = 16 * 1024


def test_connections_inherit_the_capped_send_buffer():
    listener = listening_socket("127.0.0.1", 0)
    listener.listen()
    with socket.create_connection(listener.getsockname()) as client:
        accepted, _ = listener.accept()
        with accepted:
            # Linux doubles what is asked, for its bookkeeping; autotuning would go to megabytes.
            assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * SEND_BUFFER_BYTES
    listener.close()


def test_connections_are_dropped_by_the_kernel_well_after_the_stall_timeout():
    """A listener that takes nothing keeps, after its utterances end, a connection that a
    graceful close waits on; TCP_USER_TIMEOUT has the kernel drop it in the end."""
    for stall, expected_ms in ((30.0, 60_000), (45.0, 90_000)):
        listener = listening_socket("127.0.0.1", 0, stall_timeout_seconds=stall)
        listener.listen()
        with listener, socket.create_connection(listener.getsockname()):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == expected_ms


@pytest.mark.parametrize("reuse_port", [False, True])
def test_a_held_port_is_refused_to_every_other_socket(reuse_port):
    """The port a server holds, for itself and the workers it hands it to: not another
    server's, even one that asks to share it (SO_REUSEPORT) as --workers once did."""
    held = held_socket("127.0.0.1", 0)
    with held, pytest.raises(OSError) as e:
        listening_socket("127.0.0.1", held.getsockname()[1], reuse_port=reuse_port)
    assert e.value.errno == errno.EADDRINUSE


@pytest.mark.slow  # about 9 s of a paused reader
async def test_a_paused_http_reader_has_a_bounded_amount_of_audio_computed_ahead():
    limits = Limits(max_queue_seconds=1.0)
    with run_server(ServerConfig(limits=limits, cache_mb=0)) as s:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER)  # before connect: the window
        client.connect(("127.0.0.1", s.port))
        text = "The lighthouse keeper climbed the stairs and wound the clock again. " * 30  # minutes of audio
        body = orjson.dumps({"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm"})
        client.sendall(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        received = len(client.recv(4096))  # the head and the first audio, then the reader pauses
        await asyncio.sleep(8.0)  # long enough for unbounded kernel buffers to fill with many seconds
        (utterance,) = s.service.worker.utterances()
        ahead = utterance.produced_seconds - received / PCM_BYTES_PER_SECOND
        client.close()
    # What may wait between the engine and the paused reader, as docs/reliability.md says:
    # the utterance's queue, the send buffer (doubled by Linux), uvicorn's 64 KiB write
    # buffer, the client's own receive buffer (doubled), and what is in flight inside the
    # server: a frame being cut, the resampler's delay, one engine step (2 s covers them).
    buffers = 2 * SEND_BUFFER_BYTES + 64 * 1024 + 2 * CLIENT_RECEIVE_BUFFER
    bound = limits.max_queue_seconds + buffers / PCM_BYTES_PER_SECOND + 2.0
    assert ahead <= bound, (ahead, bound)
