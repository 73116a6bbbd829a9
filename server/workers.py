"""``--workers N``: N server processes on one port, each with its own engine.

Each process binds the port with SO_REUSEPORT, so the kernel spreads new connections
across them; a WebSocket then stays with the process that accepted it. The parent only
supervises: it restarts a worker that dies, and on SIGTERM passes the signal on, so each
worker drains its own utterances (server/run.py) before the parent exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import time
from types import FrameType

from server.config import ServerConfig

log = logging.getLogger(__name__)

EXIT_CANNOT_START = 2  # a worker's settings cannot work: restarting it would loop forever


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _worker(config: ServerConfig, index: int) -> None:
    from server.app import create_app
    from server.logs import configure_logging
    from server.run import serve

    from server.service import StartupError

    configure_logging(config.log_level, config.log_format)
    logging.getLogger(__name__).info("worker %d starting", index)
    app = create_app(config)
    try:
        app.state.service.load()
    except StartupError as e:
        logging.getLogger(__name__).error("worker %d cannot start: %s", index, e)
        raise SystemExit(EXIT_CANNOT_START) from None
    serve(app, config.host, config.port, config.log_level, sockets=[_bind(config.host, config.port)])


def serve_workers(config: ServerConfig, poll_seconds: float = 0.5) -> int:
    # spawn, not fork: each worker starts clean and loads its own engine and threads.
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def start(i: int) -> multiprocessing.process.BaseProcess:
        p = ctx.Process(target=_worker, args=(config, i), name=f"voxwire-worker-{i}", daemon=False)
        p.start()
        return p

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
                procs[i] = start(i)
        time.sleep(poll_seconds)
