"""Every HTTP request body is bounded before it is read: a server in its own process (so
its memory is its own), sent bodies far past any bound by a client that stops sending as
soon as it has an answer, as a careful client would."""

from __future__ import annotations

import re
import select
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from voxwire.benchmarks.process import free_port, spawn_voxwire, stop

pytestmark = pytest.mark.slow  # a spawned server fed 256 MiB and 2 GiB bodies

MiB = 1024 * 1024
HUGE_JSON = 256 * MiB
HUGE_UPLOAD = 2048 * MiB
# What a client may get into the server's side before the answer stops it: the bound read
# (at most the 16 MiB upload limit), uvicorn's 64 KiB buffer, and the kernel's socket
# buffers on both sides (autotuned to a few MiB each on loopback). A server that reads the
# whole body lets the client send all of it, and the client gives up here.
SENT_BOUND = 64 * MiB
# The server's peak memory while it refuses a body: what it reads (128 KiB, 16 MiB drained
# and dropped a message at a time) and the allocator's noise, far below any of the bodies.
RSS_BOUND_MB = 32
PIECE = b"x" * MiB


def json_body(size: int) -> Iterator[bytes]:
    """Valid JSON of about ``size`` bytes, a request but for one huge ignored field, made a
    MiB at a time so that the test never holds it."""
    yield b'{"model": "tts-1", "voice": "alloy", "input": "Hello.", "response_format": "pcm", "padding": "'
    for _ in range(size // len(PIECE)):
        yield PIECE
    yield b'"}'


def multipart_body(size: int) -> Iterator[bytes]:
    """A voice upload whose audio file is ``size`` bytes of junk."""
    yield b'--cut\r\nContent-Disposition: form-data; name="audio"; filename="me.wav"\r\nContent-Type: audio/wav\r\n\r\n'
    for _ in range(size // len(PIECE)):
        yield PIECE
    yield b"\r\n--cut--\r\n"


def chunked(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """HTTP/1.1 chunked framing, lazily."""
    for piece in pieces:
        yield b"%x\r\n" % len(piece) + piece + b"\r\n"
    yield b"0\r\n\r\n"


@dataclass
class Answer:
    status: int
    """0 when the client gave up, having sent ``SENT_BOUND`` bytes without an answer."""
    headers: dict[str, str]
    body: bytes
    sent: int
    """Bytes of the body the client managed to send before the answer came (or the server
    closed the connection, or the client gave up at ``SENT_BOUND``)."""

    def json(self) -> dict:
        return orjson.loads(self.body)


def send_until_answered(
    port: int, path: str, content_type: str, body: Iterable[bytes], length: int | None = None
) -> Answer:
    """POST ``body`` (chunked unless ``length`` is declared) over a raw socket, sending only
    while the server has not answered and gives up past ``SENT_BOUND``; then read the answer."""
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n"
    pieces = iter(body if length is not None else chunked(body))
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head.encode())
        pending = memoryview(b"")
        while sent < SENT_BOUND:
            if not pending:
                pending = memoryview(next(pieces, b""))
                if not pending:
                    break  # all sent: the answer comes now
            readable, writable, _ = select.select([s], [s], [], 60)
            if readable or not writable:
                break  # the answer (or the close) is here, or the server stopped reading for a minute
            try:
                n = s.send(pending)
            except OSError:  # the server closed the connection: its answer is in our buffer
                break
            sent, pending = sent + n, pending[n:]
        if sent >= SENT_BOUND and not select.select([s], [], [], 5)[0]:
            return Answer(0, {}, b"", sent)  # no answer: the server is still reading the body
        return Answer(*read_answer(s), sent=sent)


def read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    try:
        while b"\r\n\r\n" not in data or len(data) < answer_length(data):
            more = s.recv(65536)
            if not more:
                break
            data += more
    except (ConnectionResetError, TimeoutError):
        pass  # a reset after the answer (the server closed with our body unread) loses nothing read
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"no answer; the server sent {data[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def answer_length(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
    return len(head) + 4 + int(match.group(1)) if match else len(data) + 1


class Server:
    """``voxwire serve`` (Piper) in a process of its own: its memory is what it read."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.http = f"http://127.0.0.1:{port}"
        self.pid = httpx.get(f"{self.http}/readyz", timeout=10).json()["pid"]

    def status(self, field: str) -> float:
        text = Path(f"/proc/{self.pid}/status").read_text()
        return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) / 1024  # type: ignore[union-attr]

    def reset_peak(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0+)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    port = free_port()
    proc = spawn_voxwire(port, "--cache-mb", "0")
    try:
        yield Server(port)
    finally:
        stop(proc)


def measured(server: Server, send) -> tuple[Answer, float]:
    """The answer to ``send()``, and how far the server's peak memory rose meanwhile."""
    server.reset_peak()
    before = server.status("VmRSS")
    answer = send()
    return answer, server.status("VmHWM") - before


@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "content-length"])
def test_256_mib_of_json_is_refused_with_413_unread(server, declared):
    answer, growth = measured(server, lambda: send_until_answered(
        server.port, "/v1/audio/speech", "application/json", json_body(HUGE_JSON),
        length=sum(map(len, json_body(HUGE_JSON))) if declared else None,
    ))
    assert answer.status == 413, answer
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("request_too_large", "invalid_request_error") and "128 KiB" in error["message"]
    # The rest of the body was not read: the connection closes, so no client waits on it.
    assert answer.headers.get("connection") == "close"
    assert answer.sent < SENT_BOUND, answer.sent
    assert growth <= RSS_BOUND_MB, growth
    assert httpx.post(f"{server.http}/v1/audio/speech", json={"model": "m", "input": "Hi.", "voice": "alloy"}).status_code == 200


def test_piper_answers_a_2_gib_upload_without_reading_it(server):
    answer, growth = measured(server, lambda: send_until_answered(
        server.port, "/v1/voices", "multipart/form-data; boundary=cut", multipart_body(HUGE_UPLOAD),
    ))
    assert answer.status == 501, answer
    assert answer.json()["error"]["code"] == "voice_registration_unsupported"
    assert answer.headers.get("connection") == "close"
    assert answer.sent < SENT_BOUND, answer.sent
    assert growth <= RSS_BOUND_MB, growth
