"""Which utterance the worker advances next: the policy that decides latency under load.

1. Utterances with no audio out yet come first, oldest first: time to first audio is
   what a listener notices most.
2. Then the utterance whose listener would run out of audio soonest. Its playback
   deadline is the time of its first chunk plus the audio produced so far: a listener
   who started hearing at t0 and was given d seconds runs dry at t0 + d.
3. An utterance whose queue is full is skipped: its client reads slowly, and computing
   further ahead would only buffer audio without bound.
"""

from __future__ import annotations

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


def priority(u: Schedulable) -> tuple[int, float]:
    if u.first_audio_at is None:
        return (0, u.submitted_at)
    return (1, playback_deadline(u))


T = TypeVar("T", bound=Schedulable)


def pick(utterances: Iterable[T], limit: int = 1) -> list[T]:
    """Up to ``limit`` utterances to advance in the next step, most urgent first."""
    ready = [u for u in utterances if u.runnable() and not u.backlogged()]
    ready.sort(key=priority)
    return ready[:limit]
