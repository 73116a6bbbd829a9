"""What a listener would hear: a jitter buffer replayed over the frames' arrival times.

Playback starts once ``start_ms`` of audio is buffered (or the stream has ended); after
that the clock runs in real time, and a frame that arrives after the audio before it has
finished playing is an underrun, heard as silence until it arrives. This is the policy
of the JS player (clients/js), applied offline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Playback:
    start_at: float
    """When sound starts, seconds after the request."""
    end_at: float
    underruns: int
    stall_ms: float


def simulate(arrivals: list[float], durations: list[float], start_ms: float = 100.0) -> Playback:
    """``arrivals``: seconds after the request; ``durations``: seconds of audio per frame."""
    if not arrivals:
        return Playback(start_at=float("nan"), end_at=float("nan"), underruns=0, stall_ms=0.0)
    buffered, start = 0.0, arrivals[-1]
    for t, d in zip(arrivals, durations):
        buffered += d
        if buffered * 1000 >= start_ms:
            start = t
            break
    end, underruns, stall = start, 0, 0.0
    for t, d in zip(arrivals, durations):
        if t > end:
            underruns += 1
            stall += t - end
            end = t
        end += d
    return Playback(start_at=start, end_at=end, underruns=underruns, stall_ms=stall * 1000)
