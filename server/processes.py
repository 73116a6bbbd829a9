"""``--workers N``: N server processes on one port, each with its own engine.

The parent claims the port before anything starts (server/cli.py): one socket per worker,
listening together with SO_REUSEPORT (``port_group``, server/sockets.py), so the kernel
spreads connections over the workers by a hash of their addresses, and a WebSocket stays
with the worker it reached. One socket shared by every worker went to whichever process
woke first: of 16 connections opened 300 ms apart, 11 to all 16 reached the same one. The
claim refuses the port to another server, as one held socket did. The Wyoming port, when
served, is claimed the same way. Each worker takes its sockets; the parent keeps no copy,
so a worker's connections go with it when it dies and its siblings take the new ones.

The parent only supervises: it restarts a worker that dies, which joins the port's group
with sockets of its own once its engine has loaded (no connection waits on it
meanwhile), and counts it (``voxwire_worker_process_restarts_total``); on SIGTERM it
passes the signal on, so each worker drains its own utterances (server/run.py) before
the parent exits.

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


@dataclasses.dataclass(frozen=True)
class Ports:
    """What a worker listens on: the sockets the parent claimed for it, or, for one that
    replaces a dead worker, none (it joins the ports' groups itself, once it can serve)."""

    http: socket.socket | None = None
    wyoming: socket.socket | None = None

    def close(self) -> None:
        for sock in (self.http, self.wyoming):
            if sock is not None:
                sock.close()


def _worker(config: ServerConfig, index: int, environment: dict[str, str], ports: Ports, replaces: bool) -> None:
    # Before anything imports prometheus_client, which reads its mode at import.
    os.environ.update(environment)
    count_restart(index, replaces)
    from voxwire.server.app import create_app
    from voxwire.server.logs import configure_logging
    from voxwire.server.run import serve
    from voxwire.server.service import StartupError
    from voxwire.server.sockets import hand_over, joined_group

    configure_logging(config.log_level, config.log_format)
    logging.getLogger(__name__).info("worker %d starting", index)
    if ports.wyoming is not None:
        hand_over(ports.wyoming)  # the Wyoming door's, when it binds (server/doors/wyoming/)
    app = create_app(config)
    try:
        app.state.service.load()
    except StartupError as e:
        logging.getLogger(__name__).error("worker %d cannot start: %s", index, e)
        raise SystemExit(EXIT_CANNOT_START) from None
    try:
        sock = ports.http or joined_group(config.host, config.port, config.limits.stall_timeout_seconds)
    except OSError as e:  # another server took the port while no worker held it
        logging.getLogger(__name__).error(
            "worker %d cannot listen on %s:%d: %s", index, config.host, config.port, e.strerror,
        )
        raise SystemExit(EXIT_CANNOT_START) from None
    serve(app, config.host, config.port, config.log_level, sockets=[sock])


def count_restart(index: int, replaces: bool) -> None:
    """``voxwire_worker_process_restarts_total{worker}``: worker processes that died and were
    started again. The replacement counts its predecessor, first thing, in the metrics'
    shared files, which outlive it (server/metrics.py); each worker counts 0 so that the
    series is there from the first scrape."""
    from prometheus_client import Counter

    restarts = Counter(
        "voxwire_worker_process_restarts", "Worker processes (--workers) that died and were started again, "
        "by worker index", ["worker"], registry=None,  # multiprocess mode: the files are the registry
    )
    restarts.labels(str(index)).inc(1 if replaces else 0)


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

    def __init__(self, config: ServerConfig, ports: list[Ports], shared: RunDir) -> None:
        # spawn, not fork: each worker starts clean and loads its own engine and threads.
        self._ctx = multiprocessing.get_context("spawn")
        self._config = config
        self._ports = ports
        self._shared = shared
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.stopping = False

    def start(self, i: int, replaces: bool = False) -> multiprocessing.process.BaseProcess:
        ports = Ports() if replaces else self._ports[i]
        # multiprocessing passes the sockets' descriptors to the spawned process.
        p = self._ctx.Process(
            target=_worker, args=(self._config, i, self._shared.environment(i), ports, replaces),
            name=f"voxwire-worker-{i}", daemon=False,
        )
        p.start()
        # The worker has its copies: one kept here would hold its share of the connections
        # waiting should it die.
        ports.close()
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
                    self.procs[i] = self.start(i, replaces=True)
            time.sleep(poll_seconds)


def serve_workers(config: ServerConfig, ports: list[Ports], poll_seconds: float = 0.5) -> int:
    """Run ``config.workers`` processes, each serving its ``ports`` (listening already), until SIGTERM."""
    shared = RunDir.create(config.workers)
    config = with_core_share(config)
    if config.engine.voices_dir is None:
        log.warning(
            "no --voices-dir: with an engine that clones voices, one registered through "
            "POST /v1/voices stays in the worker that registered it; give the workers a "
            "shared --voices-dir"
        )
    workers = Workers(config, ports, shared)
    workers.start_all()
    signal.signal(signal.SIGTERM, workers.stop)
    signal.signal(signal.SIGINT, workers.stop)
    log.info("%d workers on %s:%d", config.workers, config.host, config.port)
    try:
        return workers.supervise(poll_seconds)
    finally:
        shared.remove()
