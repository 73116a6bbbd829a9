"""The lock a worker shares with its utterances, and the check that each side keeps to
its thread.

The thread contract: the worker's thread alone touches engine streams, segments text
and puts into audio queues; any other thread (the event loop, a watchdog) reaches an
utterance only through methods that take this lock. Methods reserved for the worker's
thread say so by calling ``on_worker_thread``; ones that may also run under the lock
call ``on_worker_thread_or_held``. The checks cost a comparison and are off unless
``VOXWIRE_CHECK_THREADS`` is set (the test suite sets it), so a call from the wrong
thread fails loudly in tests instead of racing under load.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

CHECKS = os.environ.get("VOXWIRE_CHECK_THREADS", "") not in ("", "0")


class ThreadContractError(AssertionError):
    """A method reserved for the worker's thread ran on another one."""


class WorkerLock:
    """A condition variable that knows which threads hold it and which thread is the
    worker's. Re-entrant; ``wait`` and ``changed`` are for its holder."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._depth = threading.local()  # per thread: how deep it holds the lock
        self.changes = 0
        """Counts what callers changed, so an idle worker knows to look again."""
        self.thread: threading.Thread | None = None
        """The worker's thread (set before it starts)."""

    def __enter__(self) -> WorkerLock:
        self._cond.acquire()
        self._depth.n = getattr(self._depth, "n", 0) + 1
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None,
    ) -> None:
        self._depth.n -= 1
        self._cond.release()

    def wait(self, timeout: float | None = None) -> bool:
        return self._cond.wait(timeout)

    def changed(self) -> None:
        """Under the lock: something the worker acts on changed; wake it."""
        self.changes += 1
        self._cond.notify()

    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return getattr(self._depth, "n", 0) > 0

    def on_worker_thread(self, what: str) -> None:
        if CHECKS and threading.current_thread() is not self.thread:
            raise ThreadContractError(f"{what} runs on the worker's thread, not {threading.current_thread().name}")

    def on_worker_thread_or_held(self, what: str) -> None:
        if CHECKS and threading.current_thread() is not self.thread and not self.held():
            raise ThreadContractError(
                f"{what} runs on the worker's thread or under its lock, not on {threading.current_thread().name}"
            )
