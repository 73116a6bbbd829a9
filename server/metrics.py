"""Prometheus metrics (prometheus-client), one registry per app.

Counters and histograms are updated where things happen (the session); the gauges that
describe current state are read at scrape time from the service, so they cannot drift.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from server.service import Service

TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0)
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)


class _StateCollector(Collector):
    def __init__(self, service: Service) -> None:
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.service
        worker = s.worker
        utterances = worker.utterances()
        yield GaugeMetricFamily("voxwire_connections", "Open WebSocket connections", s.admission.connections)
        yield GaugeMetricFamily("voxwire_active_utterances", "Utterances admitted and not ended", s.admission.utterances)
        yield GaugeMetricFamily("voxwire_worker_utterances", "Utterances alive in the worker", len(utterances))
        rate = worker.engine.sample_rate if worker.engine else 1
        queued = sum(u.queue.samples for u in utterances) / rate
        yield GaugeMetricFamily("voxwire_queued_audio_seconds", "Audio computed and not yet sent", queued)
        yield GaugeMetricFamily("voxwire_ready", "1 when the engine is loaded and serving", int(s.ready()))
        yield CounterMetricFamily("voxwire_worker_restarts", "Workers replaced after a hung step", s.supervisor.restarts)
        yield CounterMetricFamily("voxwire_engine_steps", "Engine steps run by the current worker", worker.stats.steps)
        yield CounterMetricFamily(
            "voxwire_worker_busy_seconds",
            "Seconds the current worker spent in engine steps (rate() of it is utilisation)",
            worker.stats.busy_seconds,
        )
        yield GaugeMetricFamily("voxwire_cache_bytes", "Audio held by the result cache", s.cache.bytes)
        yield CounterMetricFamily("voxwire_cache_hits", "Requests served from the result cache", s.cache.hits)
        yield GaugeMetricFamily("voxwire_threads", "Threads in the server process", threading.active_count())
        if self.loop is not None:
            tasks = len(asyncio.all_tasks(self.loop))
            yield GaugeMetricFamily("voxwire_asyncio_tasks", "Tasks alive on the event loop", tasks)


class Metrics:
    def __init__(self, service: Service) -> None:
        # No auto-describe: the state collector reads the service, which is still being built.
        self.registry = CollectorRegistry(auto_describe=False)
        self._state = _StateCollector(service)
        self.registry.register(self._state)
        self.utterances = Counter(
            "voxwire_utterances", "Utterances by outcome (done, cancelled, or an error code)", ["outcome"],
            registry=self.registry,
        )
        self.ttfa = Histogram(
            "voxwire_ttfa_seconds", "Server time to first audio frame", buckets=TTFA_BUCKETS, registry=self.registry
        )
        self.rtf = Histogram(
            "voxwire_rtf", "Engine compute time over audio duration, per utterance", buckets=RTF_BUCKETS,
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "voxwire_engine_step_seconds", "Duration of one engine step (one piece of audio computed)",
            buckets=STEP_BUCKETS, registry=self.registry,
        )
        from prometheus_client import ProcessCollector

        ProcessCollector(registry=self.registry)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._state.loop = loop
