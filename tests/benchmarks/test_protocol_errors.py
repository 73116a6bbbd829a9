"""A server that answers with an error, or closes mid-stream, is an error in the bench's
results and never a latency figure, whatever the protocol. Each fake server here runs on
127.0.0.1 and misbehaves in one way after sending some real audio."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct

import msgpack
import pytest
import websockets
from wyoming.audio import AudioChunk, AudioStart
from wyoming.error import Error
from wyoming.event import async_read_event, async_write_event

from voxwire.benchmarks.bench import figures
from voxwire.benchmarks.protocols import Opener, Target, kind_of

TEXT = "Hello there. How are you?"
AUDIO = b"\x10\x00" * 2205  # 0.1 s of 22.05 kHz 16-bit audio that is not silence


@contextlib.asynccontextmanager
async def tcp_server(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), 0)
    await reader.readexactly(length)


def _http_handler(mode: str):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if mode == "status":
            body = json.dumps({"error": {"message": "no", "code": "overloaded"}}).encode()
            writer.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        elif mode == "chunked":  # audio, then the connection drops before the last chunk
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/pcm\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(AUDIO), AUDIO))
        else:  # "short": a WAV whose body ends before its Content-Length
            wav = b"RIFF" + struct.pack("<I", 36 + 4 * len(AUDIO)) + b"WAVEfmt " + struct.pack(
                "<IHHIIHH", 16, 1, 1, 22050, 44100, 2, 16) + b"data" + struct.pack("<I", 4 * len(AUDIO))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/wav\r\nContent-Length: %d\r\n\r\n%s%s"
                         % (len(wav) + 4 * len(AUDIO), wav, AUDIO))
        await writer.drain()
        writer.close()

    return handle


def _wyoming_handler(mode: str):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        event = await async_read_event(reader)
        assert event is not None and event.type == "synthesize"
        await async_write_event(AudioStart(rate=22050, width=2, channels=1).event(), writer)
        await async_write_event(AudioChunk(rate=22050, width=2, channels=1, audio=AUDIO).event(), writer)
        if mode == "error":
            await async_write_event(Error(text="the voice failed", code="synthesis_failed").event(), writer)
        writer.close()  # "closed": no audio-stop

    return handle


@contextlib.asynccontextmanager
async def v1_server(mode: str):
    async def handle(ws) -> None:
        await ws.send(json.dumps({"type": "ready", "protocol": 1}))
        speak = json.loads(await ws.recv())
        ctx = speak["ctx"]
        await ws.send(json.dumps({"type": "started", "ctx": ctx, "sample_rate": 22050, "format": "pcm_s16le"}))
        await ws.send(msgpack.packb({"ctx": ctx, "seq": 0, "samples": len(AUDIO) // 2, "audio": AUDIO}))
        if mode == "error":
            await ws.send(json.dumps({"type": "error", "ctx": ctx, "code": "engine_failed", "message": "no"}))
            await ws.wait_closed()
        # "closed": the socket goes away mid-stream

    async with websockets.serve(handle, "127.0.0.1", 0) as server:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/stream"


async def speak_twice(url: str, fmt: str = "pcm", streaming: bool | None = False) -> dict:
    opener = Opener(Target("broken", url, fmt))
    opener._streaming = streaming  # the fakes do not answer describe
    session = opener.session()
    try:
        results = [await session.speak(TEXT), await session.speak(TEXT)]
    finally:
        await session.close()
    return figures(results)


def assert_only_errors(row: dict, code: str | None = None) -> None:
    assert row["utterances"] == 2 and row["errors"] == 2, row
    assert row["ttfa_ms"]["n"] == 0 and row["last_audio_ms"]["n"] == 0 and row["whole_ms"]["n"] == 0
    if code is not None:
        assert row["error_codes"] == [code]


@pytest.mark.parametrize("mode", ["error", "closed"])
async def test_v1_error_or_close_mid_stream_is_an_error(mode):
    async with v1_server(mode) as url:
        row = await speak_twice(url)
    assert_only_errors(row, "engine_failed" if mode == "error" else None)


@pytest.mark.parametrize("mode", ["status", "chunked"])
async def test_openai_error_status_or_cut_body_is_an_error(mode):
    async with tcp_server(_http_handler(mode)) as port:
        url = f"http://127.0.0.1:{port}/v1/audio/speech"
        assert kind_of(url) == "openai"
        row = await speak_twice(url)
    assert_only_errors(row, "http_429" if mode == "status" else None)


@pytest.mark.parametrize("mode", ["status", "short"])
async def test_piper_http_error_status_or_short_body_is_an_error(mode):
    async with tcp_server(_http_handler(mode)) as port:
        url = f"http://127.0.0.1:{port}/synthesize"
        assert kind_of(url) == "piper_http"
        row = await speak_twice(url)
    assert_only_errors(row, "http_429" if mode == "status" else None)


@pytest.mark.parametrize("mode", ["error", "closed"])
async def test_wyoming_error_event_or_close_mid_stream_is_an_error(mode):
    async with tcp_server(_wyoming_handler(mode)) as port:
        url = f"tcp://127.0.0.1:{port}"
        assert kind_of(url) == "wyoming"
        row = await speak_twice(url)
    assert_only_errors(row, "synthesis_failed" if mode == "error" else "closed")


def test_urls_pick_their_protocol():
    assert kind_of("ws://h:1/v1/stream") == kind_of("wss://h/v1/stream") == "v1"
    assert kind_of("https://api.example/v1/audio/speech") == "openai"
    assert kind_of("tcp://127.0.0.1:10200") == "wyoming"
    assert kind_of("http://127.0.0.1:5000") == "piper_http"
    with pytest.raises(ValueError):
        kind_of("ftp://h/")
