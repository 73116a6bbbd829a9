"""How a worker is set up: its bounds, its batching and its CPU thread policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from voxwire.engine.text.segment import SegmenterLimits
from voxwire.engine.threads import adapt_cpu_threads

# An idle worker woken by a request waits until none has come for this long (at most
# GATHER_CAP times as long) before its first step, so that a burst of newcomers (whose
# requests land a few milliseconds apart) shares one step: otherwise the first is
# stepped alone, the others join the step after, and the ones that then miss the budget
# (behind listeners already urgent) wait a third. A lone request pays GATHER_SECONDS.
GATHER_SECONDS = 0.004
GATHER_CAP = 5


@dataclass(frozen=True)
class WorkerOptions:
    max_queue_seconds: float = 5.0
    """Audio an utterance's queue holds before the worker waits for its listener."""
    segmenter_limits: SegmenterLimits = field(default_factory=SegmenterLimits)
    name: str = "voxwire-worker"
    """The worker thread's name."""
    warmup: bool = True
    max_batch: int | None = None
    """Caps the engine's own batch size (1 turns batching off)."""
    memory_budget: int | None = None
    """Bytes: replaces the engine's own budget for its streams."""
    gather_seconds: float = GATHER_SECONDS
    """How long an idle worker lets newcomers gather before its first step."""
    max_utterance_seconds: float | None = None
    """The most audio one utterance may produce: it then fails with
    ``utterance_too_long``, after the audio up to that point."""
    cpu_threads: Callable[[], int] = adapt_cpu_threads
    """The thread policy, asked before each step: how many CPU threads the step runs
    with (engine/threads.py; it sets them too)."""
