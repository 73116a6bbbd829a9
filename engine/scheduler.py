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

Each step advances a batch: utterances are taken in that order up to the engine's batch
size, and while their work fits the step budget (the first always goes in, so a step is
never empty). Where every member makes a step longer (a CPU), a step serves one kind:
listeners about to run dry, or newcomers, or comfortable listeners, the first kind in
that order. A dry listener's step has to end before its audio does, and a newcomer's
first audio should not wait for chunks that nobody needs yet; the others wait one short
step. There a newcomers' step is bounded by the batch size alone, not the step budget.
On a GPU the kinds share steps, which cost little more for being wider.

A stream joins only while its memory fits what is left of the budget; the first
newcomer that does not fit waits, and no later newcomer passes it, so a large utterance
is not starved by a run of small ones.
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
    def cost(self) -> int: ...
    def memory_needed(self) -> int: ...


def playback_deadline(u: Schedulable) -> float:
    """When this utterance's listener runs out of audio (monotonic seconds)."""
    assert u.first_audio_at is not None
    return u.first_audio_at + u.produced_seconds


# About one engine step on a CPU (the torch Piper path's first step is the longest, at
# ~100 ms here): a listener with less than this left would stall behind a newcomer's step.
URGENT_SECONDS = 0.2


DRY, NEW, PLAYING = 0, 1, 2
"""The kinds, in the order they are served."""


def priority(u: Schedulable, now: float) -> tuple[int, float]:
    if u.first_audio_at is None:
        return (NEW, u.submitted_at)
    deadline = playback_deadline(u)
    return (DRY if deadline - now < URGENT_SECONDS else PLAYING, deadline)


T = TypeVar("T", bound=Schedulable)


def pick(
    utterances: Iterable[T],
    limit: int = 1,
    budget: int | None = None,
    memory_left: int | None = None,
    now: float | None = None,
    one_kind: bool = False,
) -> list[T]:
    """The next step's batch, most urgent first: at most ``limit`` utterances whose
    ``cost`` adds up to at most ``budget`` (past the first), and whose new streams'
    ``memory_needed`` fits ``memory_left`` (None: no bound). With ``one_kind``, only
    utterances of the first one's kind (about to run dry, new, comfortable)."""
    now = time.monotonic() if now is None else now
    ready = [u for u in utterances if u.runnable() and not u.backlogged()]
    ready.sort(key=lambda u: priority(u, now))
    if one_kind and ready:
        kind = priority(ready[0], now)[0]
        ready = [u for u in ready if priority(u, now)[0] == kind]
        if kind == NEW:
            # Newcomers wait for their first audio whatever the step's length, and the
            # burst's saving is its width: only the batch size bounds their step. The
            # budget keeps the listeners' steps short, so none waits long to be served.
            budget = None
    batch: list[T] = []
    spent = 0
    memory_blocked = False
    for u in ready:
        if len(batch) == limit:
            break
        need = u.memory_needed()
        if need and (memory_blocked or (memory_left is not None and need > memory_left)):
            memory_blocked = True  # it waits for memory, and the newcomers behind it too
            continue
        cost = u.cost()
        if batch and budget is not None and spent + cost > budget:
            continue
        batch.append(u)
        spent += cost
        if memory_left is not None:
            memory_left -= need
    return batch
