"""``--workers N``: N server processes on one port, each with its own engine.

The parent binds the port once (server/cli.py) and hands that one listening socket to
every worker: each accepts from it, and a WebSocket stays with the process that accepted
it. Not SO_REUSEPORT, with which each worker would bind the port for itself: any other
process of the same user could then bind it too, and two unrelated servers would split
one port's connections between them. The parent only supervises: it restarts a worker
that dies (handing it the same socket), and on SIGTERM passes the signal on, so each
worker drains its own utterances (server/run.py) before the parent exits.

What the workers share lives in a run directory the parent makes: the admission counts
(server/limits.py, so limits are server-wide) and prometheus-client's multiprocess files
(server/metrics.py, so any scrape gives the whole server's totals). Each worker also
takes its share of the cores for its engine's thread pools.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from types import FrameType

from voxwire.engine.threads import DEFAULT_MAX_THREADS, usable_cores
from voxwire.server.config import ServerConfig
from voxwire.server.limits import SHARED_ADMISSION_ENV, WORKER_INDEX_ENV, SharedAdmission

log = logging.getLogger(__name__)

EXIT_CANNOT_START = 2  # a worker's settings cannot work: restarting it would loop forever


def _worker(config: ServerConfig, index: int, environment: dict[str, str], sock: socket.socket) -> None:
    # Before anything imports prometheus_client, which reads its mode at import.
    os.environ.update(environment)
    from voxwire.server.app import create_app
    from voxwire.server.logs import configure_logging
    from voxwire.server.run import serve

    from voxwire.server.service import StartupError

    configure_logging(config.log_level, config.log_format)
    logging.getLogger(__name__).info("worker %d starting", index)
    app = create_app(config)
    try:
        app.state.service.load()
    except StartupError as e:
        logging.getLogger(__name__).error("worker %d cannot start: %s", index, e)
        raise SystemExit(EXIT_CANNOT_START) from None
    serve(app, config.host, config.port, config.log_level, sockets=[sock])


@dataclasses.dataclass(frozen=True)
class RunDir:
    """What the workers share, in a directory the parent makes and removes: the admission
    counts (one slot per worker) and prometheus-client's multiprocess files."""

    path: Path
    metrics: Path
    admission: Path

    @classmethod
    def create(cls, workers: int) -> RunDir:
        path = Path(tempfile.mkdtemp(prefix="voxwire-"))
        metrics = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or path / "metrics")
        shutil.rmtree(metrics, ignore_errors=True)  # counters start at zero with the server
        metrics.mkdir(parents=True)
        admission = path / "admission"
        SharedAdmission.create(admission, workers)
        return cls(path, metrics, admission)

    def environment(self, index: int) -> dict[str, str]:
        """Worker ``index``'s variables: its index and where the shared state is."""
        return {
            WORKER_INDEX_ENV: str(index),
            SHARED_ADMISSION_ENV: str(self.admission),
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics),
        }

    def forget(self, index: int, pid: int | None) -> None:
        """A worker is gone: its slots and its live gauges go with it."""
        from prometheus_client import multiprocess

        SharedAdmission.clear_worker(self.admission, index)
        if pid is not None:
            multiprocess.mark_process_dead(pid, str(self.metrics))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def with_core_share(config: ServerConfig) -> ServerConfig:
    """Each worker's engine takes its share of the cores, unless --threads says otherwise:
    N pools each sized to every core fight over them (2.5-3x slower on 2 cores)."""
    share = max(1, min(usable_cores(), DEFAULT_MAX_THREADS) // config.workers)
    engine = dataclasses.replace(config.engine, threads=config.engine.threads or share)
    return dataclasses.replace(config, engine=engine)


class Workers:
    """The parent's side: starts the workers, replaces one that dies, and passes a stop on."""

    def __init__(self, config: ServerConfig, sock: socket.socket, shared: RunDir) -> None:
        # spawn, not fork: each worker starts clean and loads its own engine and threads.
        self._ctx = multiprocessing.get_context("spawn")
        self._config = config
        self._sock = sock
        self._shared = shared
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.stopping = False

    def start(self, i: int) -> multiprocessing.process.BaseProcess:
        # multiprocessing passes the socket's descriptor to the spawned process.
        p = self._ctx.Process(
            target=_worker, args=(self._config, i, self._shared.environment(i), self._sock),
            name=f"voxwire-worker-{i}", daemon=False,
        )
        p.start()
        return p

    def start_all(self) -> None:
        self.procs = [self.start(i) for i in range(self._config.workers)]

    def stop(self, sig: int, frame: FrameType | None) -> None:
        """The SIGTERM (and SIGINT) handler: each worker is told, and drains its own utterances."""
        self.stopping = True
        for p in self.procs:
            if p.is_alive() and p.pid:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def join_all(self) -> None:
        for p in self.procs:
            p.join(self._config.drain_seconds + 30)

    def supervise(self, poll_seconds: float) -> int:
        """Until stopped: 0 once every worker has drained, or EXIT_CANNOT_START when one
        cannot start as configured (the others are stopped)."""
        while True:
            if self.stopping:
                self.join_all()
                return 0
            for i, p in enumerate(self.procs):
                if not p.is_alive():
                    if p.exitcode == EXIT_CANNOT_START:
                        log.error("worker %d cannot start as configured: stopping", i)
                        self.stop(signal.SIGTERM, None)
                        self.join_all()
                        return EXIT_CANNOT_START
                    log.error("worker %d exited (code %s): restarting it", i, p.exitcode)
                    self._shared.forget(i, p.pid)
                    self.procs[i] = self.start(i)
            time.sleep(poll_seconds)


def serve_workers(config: ServerConfig, sock: socket.socket, poll_seconds: float = 0.5) -> int:
    """Run ``config.workers`` processes serving ``sock`` (listening already) until SIGTERM."""
    shared = RunDir.create(config.workers)
    config = with_core_share(config)
    if config.engine.voices_dir is None:
        log.warning(
            "no --voices-dir: with an engine that clones voices, one registered through "
            "POST /v1/voices stays in the worker that registered it; give the workers a "
            "shared --voices-dir"
        )
    workers = Workers(config, sock, shared)
    workers.start_all()
    signal.signal(signal.SIGTERM, workers.stop)
    signal.signal(signal.SIGINT, workers.stop)
    log.info("%d workers on %s:%d", config.workers, config.host, config.port)
    try:
        return workers.supervise(poll_seconds)
    finally:
        sock.close()
        shared.remove()
