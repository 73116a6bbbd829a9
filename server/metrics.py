"""Prometheus metrics (prometheus-client), one set per server, whatever its process count.

In one process the metrics live in the app's own registry. With ``--workers N`` the
processes use prometheus-client's multiprocess mode: each writes its values to files in
one directory (``PROMETHEUS_MULTIPROC_DIR``, set by server/processes.py before any worker
starts), and a scrape of whichever worker answers sums them all. So every scrape gives
the whole server's totals, and a counter never goes backwards when a worker is replaced:
the files of a dead process keep counting. Per-worker breakdowns carry a ``worker``
label (the process's index) where they are useful.

Counters and histograms are updated where things happen (server/accounting.py, the
worker's step hook). Gauges of current state are set by ``refresh`` from a ``Snapshot``,
at each scrape and once a second, so a gauge is at most a second old in another worker.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest, multiprocess,
)

TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0)
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
OUTCOMES = ("done", "cancelled", "disconnected")
"""Zero-initialised for each door the server opens, so a rate() sees them from the first
scrape; ``failed`` and ``refused`` appear with their codes."""
STALL_REASONS = ("not_reading", "no_progress")
"""Why a listener was found stalled: its socket took nothing, or, reporting playback
progress, it reported none (server/doors/websocket/session.py)."""


@dataclass(frozen=True)
class Snapshot:
    """This process's current state, as the metrics see it."""

    connections: int
    """Server-wide (admission is shared across workers)."""
    active_utterances: int
    """Server-wide."""
    worker_utterances: int
    queued_audio_seconds: float
    ready: bool
    cache_bytes: int
    engine_threads: int
    """The CPU threads the engine's last step ran with."""
    worker_load: float = 0.0
    """The share of the worker's time its listeners need (``Worker.load``)."""
    engine: tuple[str, str, str] | None = None
    """The loaded engine's name, device and precision; None until it is loaded."""


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


@dataclass(frozen=True)
class Series:
    """One metric family: the ``Metrics`` attribute that holds it and what Prometheus
    is told of it."""

    attr: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    """Histograms only."""
    mode: Literal["livemax", "livesum", "liveall"] | None = None
    """Gauges only: how a multiprocess scrape joins the processes' values (``livemax``:
    server-wide values every process reports alike; ``livesum``: per-process values)."""


SERIES = (
    Series("utterances", Counter, "voxwire_utterances",
           "Utterances by door, outcome and error code (once each, however they end)", ("door", "outcome", "code")),
    Series("connections_refused", Counter, "voxwire_connections_refused",
           "Connections refused before they could speak, by reason (every door)", ("reason",)),
    Series("ttfa", Histogram, "voxwire_ttfa_seconds", "Server time to first audio, by door", ("door",),
           buckets=TTFA_BUCKETS),
    Series("rtf", Histogram, "voxwire_rtf_ratio", "Engine compute time over audio duration, per computed utterance",
           buckets=RTF_BUCKETS),
    Series("step_seconds", Histogram, "voxwire_engine_step_seconds", "Duration of one engine step, by worker process",
           ("worker",), buckets=STEP_BUCKETS),
    Series("engine_steps", Counter, "voxwire_engine_steps", "Engine steps run, by worker process", ("worker",)),
    Series("batch_size", Histogram, "voxwire_batch_size",
           "Utterances advanced together by one engine step, by worker process", ("worker",), buckets=BATCH_BUCKETS),
    Series("busy_seconds", Counter, "voxwire_worker_busy_seconds",
           "Seconds spent in engine steps, by worker process (rate() is utilisation)", ("worker",)),
    Series("restarts", Counter, "voxwire_worker_restarts",
           "Inference threads replaced after a hung step, by worker process", ("worker",)),
    Series("listeners_stalled", Counter, "voxwire_listeners_stalled",
           "Utterances ended because their listener stopped taking audio, by door and reason (not_reading: the "
           "socket took nothing; no_progress: no playback progress reported)", ("door", "reason")),
    Series("cache_hits", Counter, "voxwire_cache_hits", "Utterances served from the result cache"),
    Series("connections", Gauge, "voxwire_connections", "Open connections (every door)", mode="livemax"),
    Series("active_utterances", Gauge, "voxwire_active_utterances", "Utterances admitted and not ended",
           mode="livemax"),
    Series("worker_utterances", Gauge, "voxwire_worker_utterances", "Utterances alive in the inference threads",
           mode="livesum"),
    Series("queued_audio", Gauge, "voxwire_queued_audio_seconds", "Audio computed and not yet sent", mode="livesum"),
    Series("ready", Gauge, "voxwire_ready_workers", "Worker processes whose engine is loaded and serving",
           mode="livesum"),
    Series("cache_bytes", Gauge, "voxwire_cache_bytes", "Audio held by the result caches", mode="livesum"),
    Series("engine_threads", Gauge, "voxwire_engine_threads",
           "CPU threads of the engine's last step: fewer while other processes keep the cores busy", mode="livesum"),
    Series("engine_info", Gauge, "voxwire_engine_info",
           "1 for the engine each worker process runs: its name, device and the precision it computes in",
           ("worker", "engine", "device", "precision"), mode="liveall"),
    Series("threads", Gauge, "voxwire_threads", "Threads in the server processes", mode="livesum"),
    Series("tasks", Gauge, "voxwire_asyncio_tasks", "Tasks alive on the event loops", mode="livesum"),
    Series("worker_load", Gauge, "voxwire_worker_load",
           "The share of the inference thread's time its listeners need to be heard in real time, each by its "
           "measured compute per second of audio (admission refuses past max_worker_load), by worker process",
           ("worker",), mode="liveall"),
    Series("peak_memory", Gauge, "voxwire_peak_resident_memory_bytes", "Peak resident memory, by worker process",
           ("worker",), mode="liveall"),
)
"""Every family ``Metrics`` serves, in the order a scrape lists them."""


class Metrics:
    utterances: Counter
    connections_refused: Counter
    ttfa: Histogram
    rtf: Histogram
    step_seconds: Histogram
    engine_steps: Counter
    batch_size: Histogram
    busy_seconds: Counter
    restarts: Counter
    listeners_stalled: Counter
    cache_hits: Counter
    connections: Gauge
    active_utterances: Gauge
    worker_utterances: Gauge
    queued_audio: Gauge
    worker_load: Gauge
    ready: Gauge
    cache_bytes: Gauge
    engine_threads: Gauge
    engine_info: Gauge
    threads: Gauge
    tasks: Gauge
    peak_memory: Gauge

    def __init__(self, snapshot: Callable[[], Snapshot], doors: Sequence[str], worker: str = "0") -> None:
        self._snapshot = snapshot
        self.worker = worker
        self.multiprocess = multiprocess_dir() is not None
        # Multiprocess: values go to files, and the scrape registry reads the files only.
        self.registry = CollectorRegistry(auto_describe=False)
        for series in SERIES:
            setattr(self, series.attr, _family(series, None if self.multiprocess else self.registry))
        # Zero-initialised, so that a rate() sees them from the first scrape.
        for door in doors:
            self.ttfa.labels(door)
            for outcome in OUTCOMES:
                self.utterances.labels(door, outcome, "")
            for reason in STALL_REASONS:
                self.listeners_stalled.labels(door, reason)
        for family in (self.step_seconds, self.engine_steps, self.batch_size, self.busy_seconds, self.restarts):
            family.labels(worker)
        self._engine_labels: tuple[str, ...] | None = None
        if not self.multiprocess:
            ProcessCollector(registry=self.registry)
        self._loop: asyncio.AbstractEventLoop | None = None

    def on_step(self, seconds: float, batch_size: int) -> None:
        """The worker's step hook (called on the inference thread)."""
        self.step_seconds.labels(self.worker).observe(seconds)
        self.batch_size.labels(self.worker).observe(batch_size)
        self.engine_steps.labels(self.worker).inc()
        self.busy_seconds.labels(self.worker).inc(seconds)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def refresh(self) -> None:
        s = self._snapshot()
        self.connections.set(s.connections)
        self.active_utterances.set(s.active_utterances)
        self.worker_utterances.set(s.worker_utterances)
        self.queued_audio.set(s.queued_audio_seconds)
        self.ready.set(int(s.ready))
        self.cache_bytes.set(s.cache_bytes)
        self.engine_threads.set(s.engine_threads)
        self.worker_load.labels(self.worker).set(s.worker_load)
        labels = (self.worker, *s.engine) if s.engine else None
        if labels != self._engine_labels:
            if self._engine_labels is not None:
                self.engine_info.remove(*self._engine_labels)
            if labels is not None:
                self.engine_info.labels(*labels).set(1)
            self._engine_labels = labels
        self.threads.set(threading.active_count())
        if self._loop is not None:
            self.tasks.set(len(asyncio.all_tasks(self._loop)))
        self.peak_memory.labels(self.worker).set(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    async def refresh_every(self, seconds: float = 1.0) -> None:
        """Keep this process's gauges current for scrapes that another worker answers."""
        while True:
            self.refresh()
            await asyncio.sleep(seconds)

    def render(self) -> tuple[bytes, str]:
        """The scrape: this server's metrics in the Prometheus text format."""
        self.refresh()
        if not self.multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST


def _family(series: Series, registry: CollectorRegistry | None) -> Counter | Gauge | Histogram:
    labels = list(series.labels)
    if series.kind is Histogram:
        assert series.buckets is not None
        return Histogram(series.name, series.help, labels, buckets=series.buckets, registry=registry)
    if series.kind is Gauge:
        assert series.mode is not None
        return Gauge(series.name, series.help, labels, registry=registry, multiprocess_mode=series.mode)
    return Counter(series.name, series.help, labels, registry=registry)
