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

from voxwire.engine.threads import DEFAULT_MAX_THREADS, physical_cores
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


def serve_workers(config: ServerConfig, sock: socket.socket, poll_seconds: float = 0.5) -> int:
    """Run ``config.workers`` processes serving ``sock`` (listening already) until SIGTERM."""
    # spawn, not fork: each worker starts clean and loads its own engine and threads.
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    run_dir = Path(tempfile.mkdtemp(prefix="voxwire-"))
    metrics_dir = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or run_dir / "metrics")
    shutil.rmtree(metrics_dir, ignore_errors=True)  # counters start at zero with the server
    metrics_dir.mkdir(parents=True)
    admission_file = run_dir / "admission"
    SharedAdmission.create(admission_file, config.workers)

    # Each worker's engine takes its share of the cores, unless --threads says otherwise:
    # N pools each sized to every core fight over them (2.5-3x slower on 2 cores).
    share = max(1, min(physical_cores(), DEFAULT_MAX_THREADS) // config.workers)
    config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, threads=config.engine.threads or share))

    def start(i: int) -> multiprocessing.process.BaseProcess:
        environment = {
            WORKER_INDEX_ENV: str(i),
            SHARED_ADMISSION_ENV: str(admission_file),
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        }
        # multiprocessing passes the socket's descriptor to the spawned process.
        p = ctx.Process(
            target=_worker, args=(config, i, environment, sock), name=f"voxwire-worker-{i}", daemon=False
        )
        p.start()
        return p

    def forget(p: multiprocessing.process.BaseProcess, i: int) -> None:
        """A worker is gone: its slots and its live gauges go with it."""
        from prometheus_client import multiprocess

        SharedAdmission.clear_worker(admission_file, i)
        if p.pid is not None:
            multiprocess.mark_process_dead(p.pid, str(metrics_dir))

    def stop(sig: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.is_alive() and p.pid:
                try:
                    os.kill(p.pid, signal.SIGTERM)  # each drains its own utterances
                except ProcessLookupError:
                    pass

    if config.engine.voices_dir is None:
        log.warning(
            "no --voices-dir: with an engine that clones voices, one registered through "
            "POST /v1/voices stays in the worker that registered it; give the workers a "
            "shared --voices-dir"
        )
    procs = [start(i) for i in range(config.workers)]
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("%d workers on %s:%d", config.workers, config.host, config.port)
    try:
        while True:
            if stopping:
                for p in procs:
                    p.join(config.drain_seconds + 30)
                return 0
            for i, p in enumerate(procs):
                if not p.is_alive():
                    if p.exitcode == EXIT_CANNOT_START:
                        log.error("worker %d cannot start as configured: stopping", i)
                        stop(signal.SIGTERM, None)
                        for q in procs:
                            q.join(config.drain_seconds + 30)
                        return EXIT_CANNOT_START
                    log.error("worker %d exited (code %s): restarting it", i, p.exitcode)
                    forget(p, i)
                    procs[i] = start(i)
            time.sleep(poll_seconds)
    finally:
        sock.close()
        shutil.rmtree(run_dir, ignore_errors=True)
