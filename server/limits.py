"""Bounds on what one client, and all of them together, may ask of the server."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 256 * 1024
    max_text_chars: int = 20_000
    """Text per utterance, summed over its streamed pieces."""
    max_utterances_per_socket: int = 8
    max_utterances_total: int = 64
    max_connections: int = 256
    max_queue_seconds: float = 5.0
    """Audio computed ahead of a slow reader before the worker skips that utterance."""
    max_session_chars: int = 1_000_000
    """Text per connection over its whole life."""
    messages_per_second: float = 100.0
    message_burst: int = 200
    idle_timeout_seconds: float = 300.0
    """A connection with no message and nothing playing for this long is closed."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class Admission:
    """Counts what is active server-wide; refuses rather than queueing without bound."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.connections = 0
        self.utterances = 0

    def try_connect(self) -> bool:
        # A connection arriving while every utterance slot is taken could not speak.
        if self.connections >= self.limits.max_connections or self.utterances >= self.limits.max_utterances_total:
            return False
        self.connections += 1
        return True

    def disconnect(self) -> None:
        self.connections -= 1

    def try_start_utterance(self) -> bool:
        if self.utterances >= self.limits.max_utterances_total:
            return False
        self.utterances += 1
        return True

    def end_utterance(self) -> None:
        self.utterances -= 1


class TokenBucket:
    """Messages per second with a burst allowance: an LLM's token stream is bursty."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
