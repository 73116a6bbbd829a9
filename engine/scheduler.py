"""Which utterance the worker advances next: the policy that decides latency under load.

1. Utterances with no audio out yet come first, oldest first: time to first audio is
   what a listener notices most...
2. ...unless a playing utterance is about to run dry: one whose playback deadline is
   less than ``URGENT_SECONDS`` away goes before them, or a burst of new requests would
   make every current listener stall while their first chunks are computed.
3. Then the utterance whose listener would run out of audio soonest. Its playback
   deadline is the time of its first chunk plus the audio produced so far: a listener
   who started hearing at t0 and was given d seconds runs dry at t0 + d.
4. An utterance whose queue is full is skipped: its client reads slowly, and computing
   further ahead would only buffer audio without bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol, TypeVar


class Schedulable(Protocol):
    @property
    def submitted_at(self) -> float: ...
    @property
    def first_audio_at(self) -> float | None: ...
    @property
    def produced_seconds(self) -> float: ...
    def runnable(self) -> bool: ...
    def backlogged(self) -> bool: ...


def playback_deadline(u: Schedulable) -> float:
    """When this utterance's listener runs out of audio (monotonic seconds)."""
    assert u.first_audio_at is not None
    return u.first_audio_at + u.produced_seconds


# About one engine step on a CPU (the torch Piper path's first step is the longest, at
# ~100 ms here): a listener with less than this left would stall behind a newcomer's step.
URGENT_SECONDS = 0.2


def priority(u: Schedulable, now: float) -> tuple[int, float]:
    if u.first_audio_at is None:
        return (1, u.submitted_at)
    deadline = playback_deadline(u)
    return (0 if deadline - now < URGENT_SECONDS else 2, deadline)


T = TypeVar("T", bound=Schedulable)


def pick(utterances: Iterable[T], limit: int = 1, now: float | None = None) -> list[T]:
    """Up to ``limit`` utterances to advance in the next step, most urgent first."""
    now = time.monotonic() if now is None else now
    ready = [u for u in utterances if u.runnable() and not u.backlogged()]
    ready.sort(key=lambda u: priority(u, now))
    return ready[:limit]
