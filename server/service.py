"""What every connection shares: the supervised worker, admission, defaults, and the
list of open sessions that a graceful shutdown drains."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from engine.base import EngineError
from engine.registry import engine_factory
from engine.supervisor import Supervisor
from engine.worker import Worker
from server.config import ServerConfig
from server.limits import Admission
from server.cache import ResultCache
from server.metrics import Metrics
from server.protocol import StreamSettings

if TYPE_CHECKING:
    from server.session import Session

log = logging.getLogger(__name__)

CloseSocket = Callable[[int, str], Awaitable[None]]


class StartupError(Exception):
    """The server cannot serve as configured (its engine failed to load, or a default
    does not exist in it). The message is one line for the operator."""


class Service:
    def __init__(self, config: ServerConfig, make_worker: Callable[[], Worker] | None = None) -> None:
        self.config = config
        self.admission = Admission(config.limits)
        factory = engine_factory(config.engine)
        base = make_worker or (lambda: Worker(factory, max_queue_seconds=config.limits.max_queue_seconds))
        self.metrics = Metrics(self)
        self.cache = ResultCache(int(config.cache_mb * 1024 * 1024))

        def make() -> Worker:
            worker = base()
            worker.on_step = self.metrics.step_seconds.observe
            return worker

        self.supervisor = Supervisor(make, step_timeout=config.step_timeout)
        self.defaults: StreamSettings | None = None
        self.draining = False
        self.sessions: dict[Session, CloseSocket] = {}

    @property
    def worker(self) -> Worker:
        """The current worker; the supervisor may have replaced the one from a minute ago."""
        return self.supervisor.worker

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
        voice = self.config.default_voice or (voices[0].id if voices else "")
        if self.config.default_voice and not engine.has_voice(voice):
            self.supervisor.stop()
            known = ", ".join(v.id for v in voices) or "none yet"
            raise StartupError(f"--voice {voice!r} is not a voice of the {engine.name} engine (its voices: {known})")
        self.defaults = StreamSettings(
            voice=voice,
            format=self.config.default_format,
            sample_rate=self.config.default_sample_rate or engine.sample_rate,
            chunk_ms=self.config.default_chunk_ms,
        )
        log.info("engine %s ready on %s with voices %s", engine.name, engine.device, [v.id for v in voices])

    async def start(self) -> None:
        self.metrics.bind_loop(asyncio.get_running_loop())
        await asyncio.to_thread(self.load)

    def stop(self) -> None:
        self.draining = True
        self.supervisor.stop()

    def ready(self) -> bool:
        w = self.worker
        return self.defaults is not None and w.alive and w.ready.is_set() and not self.draining

    async def drain(self, deadline_seconds: float) -> None:
        """Stop taking work, let in-flight utterances finish up to the deadline, then
        close every socket with 1001 (going away)."""
        self.draining = True
        end = time.monotonic() + deadline_seconds
        while self.admission.utterances > 0 and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if self.admission.utterances > 0:
            log.warning("shutdown deadline reached with %d utterances in flight", self.admission.utterances)
        for session, close in list(self.sessions.items()):
            try:
                await session.fail_all("shutting_down", "the server is shutting down")
                await close(1001, "the server is shutting down")
            except Exception:
                log.debug("socket already closed", exc_info=True)
