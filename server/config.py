"""The server's configuration: one object, handed to the app at creation.

server/config_loader.py fills it from a TOML file, VOXWIRE_* environment variables and
command-line flags; each field's ``help`` is its documentation in ``voxwire serve --help``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voxwire.engine.registry import EngineOptions
from voxwire.server.audio import FORMATS, MAX_CHUNK_MS, MAX_SAMPLE_RATE, MIN_CHUNK_MS, MIN_SAMPLE_RATE
from voxwire.server.limits import Limits


def setting(default: Any, help: str, **metadata: Any) -> Any:
    """A field that is a setting. ``range=(low, high)`` bounds a number (high None: no
    upper bound); server/config_loader.py refuses to start with a value outside it.
    ``default_text`` says in words what a default of None means (``--help`` shows it in
    place of the value)."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass(frozen=True)
class AuthConfig:
    api_keys: tuple[str, ...] = setting(
        (), "keys clients must present (Bearer, ?token= or subprotocol); none: no key is asked for",
        flag="api-key", env="VOXWIRE_API_KEYS",
    )
    allowed_origins: tuple[str, ...] = setting(
        (), "browser origins allowed to connect (e.g. https://app.example.com); none: any",
        flag="allow-origin", env="VOXWIRE_ALLOWED_ORIGINS",
    )

    @property
    def required(self) -> bool:
        return bool(self.api_keys)


@dataclass(frozen=True)
class ServerConfig:
    host: str = setting("127.0.0.1", "address to listen on; with no API key, keep it on loopback")
    port: int = setting(8000, "port to listen on", range=(1, 65535))
    forwarded_allow_ips: str = setting(
        "127.0.0.1", "proxies whose X-Forwarded-For/-Proto are believed (comma-separated addresses, or *): "
        "the address of nginx in front",
    )
    workers: int = setting(1, "server processes, each with its own engine (for many-core CPUs)", range=(1, 256))
    # uvicorn times out nothing before a request has arrived (server/run.py).
    header_timeout_seconds: float = setting(
        10.0, "close an HTTP connection whose request line and headers have not all arrived this long after "
        "it opened, or after their first byte on a kept-alive connection (408 when some had)", range=(0.1, None),
    )
    body_timeout_seconds: float = setting(
        30.0, "close an HTTP connection whose request body stops arriving for this long", range=(0.1, None),
    )
    max_http_connections: int = setting(
        1024, "open connections on the HTTP port, per server process, idle or in a request (a WebSocket counts "
        "against max_connections instead); a newcomer beyond it closes the one that has waited longest on its "
        "client for a request or its body, or itself when every one is being answered. Lowered to what the "
        "descriptor limit (ulimit -n) leaves room for", range=(8, None),
    )
    log_level: str = setting("info", "log level", choices=("debug", "info", "warning", "error"))
    log_format: str = setting(
        "auto", "logs: json lines, or text for people; auto picks text in a terminal", choices=("auto", "json", "text")
    )
    log_text: bool = setting(False, "include utterance text in the logs (redacted by default)")
    log_digest_key: str | None = setting(
        None, "key for the redacted text's digest in the logs, to compare digests across processes and restarts",
        default_text="a random key per process",
    )
    engine: EngineOptions = field(default_factory=EngineOptions)
    limits: Limits = field(default_factory=Limits)
    auth: AuthConfig = field(default_factory=AuthConfig)
    default_voice: str | None = setting(None, "default voice", flag="voice", default_text="the engine's first")
    # Any format the socket serves (docs/protocol.md); the loader checks that it can carry
    # the default rate, as a session would.
    default_format: str = setting(
        "pcm_s16le", "default output format of the socket: PCM, mu-law, A-law, or compressed (opus is always 48000 Hz; "
        "mp3 and aac take only their standard rates)", flag="format", choices=FORMATS,
    )
    default_sample_rate: int | None = setting(
        None, f"default output rate, {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz", flag="sample-rate",
        range=(MIN_SAMPLE_RATE, MAX_SAMPLE_RATE), default_text="the engine's own",
    )
    openai_voices: tuple[str, ...] = setting(
        (), "the voice a name on the OpenAI route speaks with, as NAME=VOICE or NAME=VOICE:SPEAKER (repeat the flag for "
        "more); stock OpenAI clients send only OpenAI's names (alloy, nova, ...), and a name of "
        "theirs left unmapped speaks with the default voice", flag="openai-voice", env="VOXWIRE_OPENAI_VOICES",
        default_text="every OpenAI name speaks with the default voice",
    )
    lexicons: tuple[str, ...] = setting(
        (), "a pronunciation lexicon file (docs/lexicons.md), for every voice as FILE or for one as VOICE=FILE "
        "(repeat the flag for more; a voice's entries win over everyone's, a request's over both)", flag="lexicon",
        env="VOXWIRE_LEXICONS", default_text="none",
    )
    default_chunk_ms: int = setting(
        200, f"default chunk duration, {MIN_CHUNK_MS}-{MAX_CHUNK_MS} ms", flag="chunk-ms", range=(MIN_CHUNK_MS, MAX_CHUNK_MS)
    )
    cache_mb: float = setting(
        64.0, "result cache size in MB (repeated requests stream from it); 0 turns it off", range=(0, None)
    )
    # At least a second: a first step on a CPU takes a few hundred ms, and a timeout below
    # that would abandon every healthy utterance.
    step_timeout: float = setting(
        30.0, "seconds before a hung engine step is abandoned and the worker replaced (at least 1)", range=(1, None)
    )
    drain_seconds: float = setting(
        10.0, "on SIGTERM, seconds in-flight utterances get before sockets close (1001)", range=(0, None)
    )
    # Wyoming (Home Assistant's protocol) has no authentication: see server/doors/wyoming/.
    wyoming_port: int | None = setting(
        None, "also serve the Wyoming protocol (Home Assistant) on this TCP port, 10200 by convention; "
        "0: any free port (one process only: not with --workers)", range=(0, 65535),
    )
    wyoming_allow_unauthenticated: bool = setting(
        False, "with API keys set, let the Wyoming port listen on --host anyway (Wyoming has no authentication; "
        "without this it listens on 127.0.0.1 only)",
    )
