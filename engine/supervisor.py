"""Keeps a working worker: replaces one whose engine step has hung.

A Python thread cannot be interrupted, so a hung step cannot be stopped. The supervisor
fails the utterance in that step (and tells the others on the same thread to retry),
leaves the stuck thread to exit if it ever returns, and starts a fresh worker with a
fresh engine, so the service keeps serving. A step is "hung" after ``step_timeout``
seconds; real steps take milliseconds to a second, so the default bound is generous.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from voxwire.engine.base import Engine
from voxwire.engine.errors import ErrorCode
from voxwire.engine.worker import Worker

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, make_worker: Callable[[], Worker], step_timeout: float = 30.0) -> None:
        self._make_worker = make_worker
        self.step_timeout = step_timeout
        self.worker = make_worker()
        self.restarts = 0
        self.on_restart: Callable[[], None] | None = None
        """Called after a worker was replaced (a metrics hook)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="voxwire-watchdog", daemon=True)

    def start(self) -> Supervisor:
        self.worker.start()
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> Engine:
        return self.worker.wait_ready(timeout)

    def stop(self) -> None:
        self._stop.set()
        self.worker.stop()

    def check(self) -> bool:
        """Replace the worker if its current step has run too long; True if it did."""
        running = self.worker.step_running_for()
        if running <= self.step_timeout:
            return False
        stuck = self.worker
        log.error("engine step has run %.1f s (bound %.1f s): replacing the worker", running, self.step_timeout)
        # The replacement is in place before anyone hears of the failure, so a client
        # that retries at once reaches the new worker (loading, at worst).
        self.worker = self._make_worker().start()
        self.restarts += 1
        if self.on_restart is not None:
            self.on_restart()
        stuck.abandon(ErrorCode.ENGINE_TIMEOUT, f"the engine did not answer within {self.step_timeout:g} s")
        return True

    def _watch(self) -> None:
        interval = max(0.05, min(1.0, self.step_timeout / 4))
        while not self._stop.wait(interval):
            try:
                self.check()
            except Exception:
                log.exception("watchdog check failed")
