"""The rate a session is told it will get (``ready.defaults``, ``configured``) is the rate
its streams arrive at, whatever the format: Opus is sent at 48 kHz (server/codecs.py)."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import av
import msgpack
import orjson
import pytest
import websockets

from voxwire.server.protocol import StreamSettings
from tests.conftest import free_port
from tests.server.test_faults import _wait_listening

PIPER_RATE = 22050


async def _speak(ws: Any, ctx: str, text: str) -> tuple[dict[str, Any], bytes, dict[str, Any]]:
    """``started``, the frames' bytes joined, and ``done`` for one utterance."""
    await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": text}).decode())
    started: dict[str, Any] = {}
    audio = bytearray()
    while True:
        raw = await ws.recv()
        if isinstance(raw, bytes):
            audio += msgpack.unpackb(raw)["audio"]
            continue
        message = orjson.loads(raw)
        if message["type"] == "started":
            started = message
        elif message["type"] == "done":
            return started, bytes(audio), message
        elif message["type"] == "error":
            raise AssertionError(message)


def _decoded_rate(ogg: bytes) -> tuple[int, int]:
    """The rate an Opus decoder gives the stream at, and the samples it gives."""
    with av.open(io.BytesIO(ogg), format="ogg") as container:
        frames = list(container.decode(audio=0))
    return frames[0].sample_rate, sum(f.samples for f in frames)


def test_the_settings_shown_carry_the_rate_the_format_sends_and_keep_the_rate_asked():
    opus = StreamSettings(voice="joe", format="opus", sample_rate=PIPER_RATE)
    assert opus.to_dict()["sample_rate"] == 48000 and opus.sample_rate == PIPER_RATE
    assert StreamSettings(voice="joe", format="mp3", sample_rate=16000).to_dict()["sample_rate"] == 16000
    # A rate the format cannot take is shown as asked; the utterance that asks for it is refused.
    assert StreamSettings(voice="joe", format="mp3", sample_rate=12345).to_dict()["sample_rate"] == 12345


@pytest.mark.slow  # a spawned server
async def test_ready_defaults_under_format_opus_give_the_rate_the_audio_arrives_at():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--format", "opus", "--cache-mb", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"ws://127.0.0.1:{port}/v1/stream"
        await _wait_listening(url, proc)
        async with websockets.connect(url) as ws:
            ready = orjson.loads(await ws.recv())
            assert ready["sample_rate"] == PIPER_RATE  # the engine's own rate
            defaults = ready["defaults"]
            assert defaults["format"] == "opus"
            started, ogg, done = await _speak(ws, "a", "Hello from an Opus stream.")
            rate, samples = _decoded_rate(ogg)
            assert defaults["sample_rate"] == started["sample_rate"] == rate == 48000
            assert samples >= done["samples"] > rate  # over a second of speech, all of it decoded
            # Back to PCM: the rate asked (the engine's, by default) comes back with it.
            await ws.send(orjson.dumps({"type": "config", "format": "pcm_s16le"}).decode())
            configured = orjson.loads(await ws.recv())
            assert (configured["type"], configured["sample_rate"]) == ("configured", PIPER_RATE)
            started, pcm, done = await _speak(ws, "b", "And now in PCM.")
            assert started["sample_rate"] == PIPER_RATE and len(pcm) == 2 * done["samples"]
            # And to Opus again: told 48 kHz, as it is sent.
            await ws.send(orjson.dumps({"type": "config", "format": "opus"}).decode())
            assert orjson.loads(await ws.recv())["sample_rate"] == 48000
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
