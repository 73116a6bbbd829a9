"""The server's configuration: one object, handed to the app at creation."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.registry import EngineOptions
from server.limits import Limits


@dataclass(frozen=True)
class AuthConfig:
    api_keys: tuple[str, ...] = ()
    """Empty: no key is asked for. Bind to loopback (the default) when it is empty."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins allowed to open the socket (e.g. https://app.example.com); empty:
    any. Requests without an Origin header are not from a browser and are not checked."""

    @property
    def required(self) -> bool:
        return bool(self.api_keys)


@dataclass(frozen=True)
class ServerConfig:
    engine: EngineOptions = field(default_factory=EngineOptions)
    limits: Limits = field(default_factory=Limits)
    auth: AuthConfig = field(default_factory=AuthConfig)
    default_voice: str | None = None
    default_format: str = "pcm_s16le"
    default_sample_rate: int | None = None
    """None: the engine's own rate, so nothing is resampled unless a client asks."""
    default_chunk_ms: int = 200
    step_timeout: float = 30.0
    """An engine step running longer than this is hung: the worker is replaced."""
    drain_seconds: float = 10.0
    """On SIGTERM, how long in-flight utterances may take to finish before their
    sockets are closed with 1001."""
