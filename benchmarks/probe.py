"""Before ``voxwire bench --url`` measures a server: whether it can be reached at all, and
what it says it is.

A run against a server that cannot be reached measures nothing but errors, phase after
phase; one connection first says why, in a line (``Unreachable``). Reached means the
protocol's own opening went through: the WebSocket handshake and protocol v1's ``ready``
message, an HTTP answer (whatever its status: what the server then answers to each
utterance is a figure of the report), or a Wyoming server's TCP port.

What each protocol lets a server say of itself (``ServerFacts``):

- protocol v1 (``ws://``, Voxwire's): the ``ready`` message names the engine and its
  precision;
- the OpenAI route: Voxwire answers ``GET /readyz`` beside it with engine, device and
  precision; another OpenAI-compatible server says nothing there;
- Wyoming (``tcp://``): ``describe`` is answered by ``info``, whose TTS program has a
  name, a description and a version; Wyoming has no word for precision;
- Piper's HTTP server: ``GET /info`` names its voice; nothing on precision.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
import websockets

from voxwire.benchmarks.protocols import Target

PROBE_TIMEOUT_S = 10.0
"""The longest wait for each part of the opening (connection, handshake, first message)."""


@dataclass(frozen=True)
class ServerFacts:
    """What a server said of itself; None where it said nothing."""

    server: str | None = None
    """Who it is: ``Voxwire``, a Wyoming TTS program's name, ``Piper HTTP``."""
    engine: str | None = None
    precision: str | None = None
    device: str | None = None
    version: str | None = None
    description: str | None = None
    said_by: str | None = None
    """The message that told, for the report: ``its ready message``, ``GET /readyz``…"""


class Unreachable(Exception):
    """The server's protocol could not be opened at ``url``; ``reason`` says why."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the server at {url}: {reason}")
        self.url = url
        self.reason = reason


async def probe(target: Target, timeout_s: float = PROBE_TIMEOUT_S) -> ServerFacts:
    """Open the target's protocol once and return what the server said of itself, or
    raise ``Unreachable``."""
    opening = _PROBES[target.kind]
    try:
        return await opening(target.url, timeout_s)
    except Unreachable:
        raise
    except Exception as e:  # whatever stopped the opening is the reason, in words
        raise Unreachable(target.url, reason(e, timeout_s)) from e


def reason(e: BaseException, timeout_s: float) -> str:
    """A failure to connect as a person would say it: the operating system's words for a
    refused or unresolved connection (found under a client library's own exception),
    else the exception's own message."""
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return f"no answer within {timeout_s:g} s"
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            # asyncio's "Connect call failed ('127.0.0.1', 1)" hides the errno's own words.
            return cause.strerror if cause.errno < 0 and cause.strerror else os.strerror(cause.errno)
        cause = cause.__cause__ or cause.__context__
    return str(e) or type(e).__name__


async def _v1(url: str, timeout_s: float) -> ServerFacts:
    async with websockets.connect(url, open_timeout=timeout_s, max_size=None) as ws:
        first = await asyncio.wait_for(ws.recv(), timeout_s)
    said = orjson.loads(first) if isinstance(first, str) else None
    if not isinstance(said, dict) or said.get("type") != "ready":
        raise Unreachable(url, "the WebSocket opened, but its first message was not protocol v1's ready")
    # Only Voxwire speaks protocol v1.
    return ServerFacts(server="Voxwire", engine=_text(said.get("engine")), precision=_text(said.get("precision")),
                       said_by="its ready message")


async def _openai(url: str, timeout_s: float) -> ServerFacts:
    parts = urlsplit(url)
    # Beside the route, under the same prefix a proxy may have put it.
    prefix = parts.path[: parts.path.rstrip("/").rindex("/v1/audio/speech")]
    said = await _get_json(f"{parts.scheme}://{parts.netloc}{prefix}/readyz", timeout_s)
    if said.get("status") != "ready" or "engine" not in said:
        return ServerFacts()  # an OpenAI-compatible server that does not describe itself
    return ServerFacts(server="Voxwire", engine=_text(said.get("engine")), precision=_text(said.get("precision")),
                       device=_text(said.get("device")), said_by="GET /readyz")


async def _piper_http(url: str, timeout_s: float) -> ServerFacts:
    parts = urlsplit(url)
    said = await _get_json(f"{parts.scheme}://{parts.netloc}/info", timeout_s)
    voice = said.get("voice")
    if not isinstance(voice, dict):
        return ServerFacts()
    # /info's shape is Piper's HTTP server's own; it runs Piper, and names only its voice.
    return ServerFacts(server="Piper HTTP", engine="piper", description=f"voice {voice.get('name')}",
                       said_by="GET /info")


async def _wyoming(url: str, timeout_s: float) -> ServerFacts:
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info

    parts = urlsplit(url)
    client = AsyncTcpClient(parts.hostname or "127.0.0.1", parts.port or 10200)
    await asyncio.wait_for(client.connect(), timeout_s)  # refused or silent: unreachable
    try:
        await client.write_event(Describe().event())
        while True:
            try:
                event = await asyncio.wait_for(client.read_event(), timeout_s)
            except asyncio.TimeoutError:
                return ServerFacts()  # reached, but it does not describe itself
            if event is None:
                return ServerFacts()
            if Info.is_type(event.type):
                break
    finally:
        await client.disconnect()
    programs = Info.from_event(event).tts
    if not programs:
        return ServerFacts(said_by="Wyoming info")
    program = programs[0]
    return ServerFacts(server=program.name, version=program.version, description=program.description,
                       said_by="Wyoming info")


async def _get_json(url: str, timeout_s: float) -> dict[str, Any]:
    """A GET's JSON object; {} for any other answer. Only a failure to connect raises:
    whatever the status, the server answered."""
    import httpx  # the bench extra's (bench.py checks for it first)

    async with httpx.AsyncClient(timeout=timeout_s) as http:
        r = await http.get(url)
    try:
        said = r.json()
    except ValueError:
        return {}
    return said if isinstance(said, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


_PROBES: dict[str, Callable[[str, float], Awaitable[ServerFacts]]] = {
    "v1": _v1, "openai": _openai, "piper_http": _piper_http, "wyoming": _wyoming,
}
