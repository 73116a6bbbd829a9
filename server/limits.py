"""Bounds on what one client, and all of them together, may ask of the server."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


def _limit(default: float, help: str, low: float = 1, high: float | None = None) -> Any:
    return field(default=default, metadata={"help": help, "range": (low, high)})


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = _limit(256 * 1024, "largest client message; larger ones close with 1009", low=1024)
    max_text_chars: int = _limit(20_000, "text per utterance, summed over its streamed pieces")
    max_utterances_per_socket: int = _limit(8, "utterances active at once on one connection")
    max_utterances_total: int = _limit(64, "utterances active at once server-wide; beyond: overloaded, 1013")
    max_connections: int = _limit(256, "open connections; beyond: close 1013")
    # At least one whole chunk (250 ms) and a little: a smaller queue could never release one.
    max_queue_seconds: float = _limit(
        5.0, "audio computed ahead of a slow reader before its utterance is skipped", low=0.5
    )
    max_session_chars: int = _limit(1_000_000, "text per connection over its whole life")
    messages_per_second: float = _limit(
        100.0, "client messages per second per connection (token bucket rate)", low=0.1
    )
    message_burst: int = _limit(200, "token bucket size: a burst of messages allowed at once")
    idle_timeout_seconds: float = _limit(
        300.0, "close a connection with no message and nothing playing after this; end an open utterance "
        "that receives no text for as long", low=0.1,
    )

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
