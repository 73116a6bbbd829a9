"""What every door shares: the supervised worker, the utterance pipeline (with admission,
the result cache and accounting), the session defaults, the gate with the open
connections that a graceful shutdown drains, and the doors themselves, built from the
list it is given (it names none)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.registry import engine_factory
from voxwire.engine.supervisor import Supervisor
from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions
from voxwire.server.accounting import Accounting
from voxwire.server.cache import ResultCache
from voxwire.server.config import ServerConfig
from voxwire.server.doors.base import Door, Gate, Host
from voxwire.server.lexicons import ServerLexicons
from voxwire.server.limits import Admission, admission_for_process, worker_index
from voxwire.server.metrics import Metrics, Snapshot
from voxwire.server.pipeline import Pipeline
from voxwire.server.protocol import StreamSettings

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The server cannot serve as configured (its engine failed to load, or a default
    does not exist in it). The message is one line for the operator."""


class Service:
    def __init__(
        self, config: ServerConfig, doors: Sequence[type[Door]], make_worker: Callable[[], Worker] | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.config = config
        self.admission = admission or admission_for_process(config.limits)
        factory = engine_factory(config.engine)
        budget = config.engine.memory_budget_mb
        base = make_worker or (lambda: Worker(factory, WorkerOptions(
            max_queue_seconds=config.limits.max_queue_seconds, max_batch=config.engine.max_batch,
            max_utterance_seconds=config.limits.max_utterance_seconds,
            memory_budget=None if budget is None else int(budget * 2**20),
        )))
        self.metrics = Metrics(self.snapshot, [door.name for door in doors], worker=str(worker_index() or 0))
        self.cache = ResultCache(int(config.cache_mb * 1024 * 1024))

        def make() -> Worker:
            worker = base()
            worker.on_step = self.metrics.on_step
            return worker

        self.supervisor = Supervisor(make, step_timeout=config.step_timeout)
        self.supervisor.on_restart = self.metrics.restarts.labels(self.metrics.worker).inc
        key = config.log_digest_key.encode() if config.log_digest_key else None
        accounting = Accounting(self.metrics, config.log_text, key)
        self.gate = Gate(self.admission, accounting, self.ready)
        self.pipeline = Pipeline(lambda: self.supervisor.worker, self.admission, self.cache, accounting,
                                 lambda: self.gate.draining)
        self.defaults: StreamSettings | None = None
        self._refresher: asyncio.Task[None] | None = None
        host = Host(config, self.pipeline, self.gate, lambda: self.defaults)
        self.doors: dict[str, Door] = {}
        """The open doors by name; their listeners are bound by ``load``."""
        for door in doors:
            if door.name in self.doors:
                raise ValueError(f"two doors are named {door.name!r}")
            self.doors[door.name] = door(host)

    @property
    def draining(self) -> bool:
        return self.gate.draining

    @property
    def worker(self) -> Worker:
        """The current worker; the supervisor may have replaced the one from a minute ago."""
        return self.supervisor.worker

    def snapshot(self) -> Snapshot:
        worker = self.worker
        utterances = worker.utterances()
        return Snapshot(
            connections=self.admission.connections,
            active_utterances=self.admission.utterances,
            worker_utterances=len(utterances),
            queued_audio_seconds=sum(u.queue.samples / u.sample_rate for u in utterances),
            ready=self.ready(),
            cache_bytes=self.cache.bytes,
            engine_threads=worker.stats.cpu_threads,
            worker_load=worker.load(),
            engine=(worker.engine.name, worker.engine.device, worker.engine.precision) if worker.engine else None,
        )

    def load(self) -> None:
        """Load the engine and settle the session defaults against it, on this thread.
        The command line calls it before serving, so a bad setting ends the process with
        one clear line; the app's lifespan calls it for servers built in-process."""
        if self.defaults is not None:
            return
        self.supervisor.start()
        try:
            engine = self.supervisor.wait_ready()
        except EngineError as e:
            self.supervisor.stop()
            raise StartupError(e.message) from None
        except Exception as e:
            self.supervisor.stop()
            raise StartupError(f"the {self.config.engine.name} engine failed to load; see the log above ({e})") from None
        voices = engine.voices()
        voice = self.config.default_voice
        if voice and not engine.has_voice(voice):
            self.supervisor.stop()
            known = ", ".join(v.id for v in voices) or "none yet"
            raise StartupError(f"--voice {voice!r} is not a voice of the {engine.name} engine (its voices: {known})")
        described = engine.voice(voice) if voice else None
        if described is not None and not described.installed:
            # As wyoming-piper does: the default voice is here before the first request.
            log.info("downloading the default voice %s", voice)
            try:
                engine.load_voice(described.id)
            except EngineError as e:
                self.supervisor.stop()
                raise StartupError(f"--voice {voice!r}: {e.message}") from None
        try:
            self.pipeline.lexicons = ServerLexicons.load(self.config.lexicons, engine)
        except ValueError as e:
            self.supervisor.stop()
            raise StartupError(str(e)) from None
        for door in self.doors.values():
            try:
                door.check(engine)
            except ValueError as e:
                self.supervisor.stop()
                raise StartupError(str(e)) from None
        for door in self.doors.values():
            try:
                door.bind()
            except OSError as e:
                self.stop()
                raise StartupError(e.strerror or f"the {door.name} door cannot listen: {e}") from None
        self.defaults = StreamSettings(
            voice=voice or "",  # "": the engine's default voice, as it is when a request comes
            format=self.config.default_format,
            sample_rate=self.config.default_sample_rate or engine.sample_rate,
            chunk_ms=self.config.default_chunk_ms,
        )
        log.info("engine %s ready on %s in %s with voices %s", engine.name, engine.device, engine.precision,
                 [v.id for v in voices])

    async def start(self) -> None:
        self.metrics.bind_loop(asyncio.get_running_loop())
        await asyncio.to_thread(self.load)
        for door in self.doors.values():
            await door.start()
        if self.metrics.multiprocess:  # alone, a process refreshes its gauges at each scrape
            self._refresher = asyncio.create_task(self.metrics.refresh_every(), name="metrics-refresh")

    def stop(self) -> None:
        self.gate.draining = True
        if self._refresher is not None:
            self._refresher.cancel()
        for door in self.doors.values():
            door.close()
        self.supervisor.stop()

    def ready(self) -> bool:
        w = self.worker
        return self.defaults is not None and w.alive and w.ready.is_set() and not self.draining

    async def drain(self, deadline_seconds: float) -> None:
        """Stop taking work, let in-flight utterances finish up to the deadline, then
        close every socket with 1001 (going away)."""
        self.gate.draining = True
        end = time.monotonic() + deadline_seconds
        # This process's own utterances: another worker's are its own to drain.
        while self.pipeline.open_utterances and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if self.pipeline.open_utterances:
            log.warning("shutdown deadline reached with %d utterances in flight", self.pipeline.open_utterances)
        # Every utterance still open fails now, whichever door it came through: a socket
        # is told why, and an HTTP body ends without its last chunk (docs/reliability.md).
        self.pipeline.abort_all(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
        await asyncio.sleep(0)
        for shutdown in list(self.gate.connections.values()):
            try:
                await shutdown()
            except Exception:
                log.debug("socket already closed", exc_info=True)
