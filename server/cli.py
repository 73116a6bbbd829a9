"""``voxwire serve``: the server's command line (also ``python -m voxwire.server serve``).

The ``voxwire`` command itself (serve, say, bench) is the top-level ``voxwire`` package,
which sits above the server, its client and its benchmarks; nothing here imports them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from voxwire.engine.base import EngineError

if TYPE_CHECKING:
    from voxwire.server.config import ServerConfig
    from voxwire.server.processes import Ports


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from voxwire.server import config_loader

    p = sub.add_parser(
        "serve",
        help="run the streaming TTS server",
        description="Run the server. Settings come from --config FILE (TOML), then VOXWIRE_* environment "
        "variables, then these flags, each overriding the one before.",
    )
    config_loader.add_arguments(p)


def serve(args: argparse.Namespace) -> int:
    from voxwire.server import config_loader
    from voxwire.server.app import create_app
    from voxwire.server.logs import configure_logging
    from voxwire.server.net import is_loopback
    from voxwire.server.run import serve as run
    from voxwire.server.sockets import held_socket

    try:
        config = config_loader.load(args)
    except config_loader.SettingsError as e:
        print(f"voxwire: {e}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format)
    if not config.auth.api_keys and not is_loopback(config.host):
        logging.warning("listening on %s with no API key: anyone who can reach it can use it", config.host)
    from voxwire.engine.registry import preflight

    problem = preflight(config.engine)
    if problem is not None:
        print(f"voxwire: {problem}", file=sys.stderr)
        return 2
    # The port before the engine: a port in use is one line now, not a traceback after
    # seconds of loading.
    if config.workers > 1:
        from voxwire.server.processes import serve_workers

        ports = _worker_ports(config)
        return 2 if ports is None else serve_workers(config, ports)
    try:
        sock = held_socket(config.host, config.port, config.limits.stall_timeout_seconds)
    except OSError as e:
        print(f"voxwire: cannot listen on {config.host}:{config.port}: {e.strerror}", file=sys.stderr)
        return 2
    from voxwire.server.service import StartupError

    try:
        app = create_app(config)
        # Load before serving, so a default that the engine lacks ends here, in one line.
        app.state.service.load()
    except (EngineError, StartupError) as e:
        sock.close()
        print(f"voxwire: {getattr(e, 'message', e)}", file=sys.stderr)
        return 2
    run(app, config.host, config.port, config.log_level, sockets=[sock])
    return 0


def _worker_ports(config: ServerConfig) -> list[Ports] | None:
    """Each worker's sockets on the HTTP port, and on the Wyoming port when it is served,
    claimed for the whole server (``port_group``: a second server is refused them); None
    when a port cannot be had, having said so in one line."""
    from voxwire.server.net import unauthenticated_host
    from voxwire.server.processes import Ports
    from voxwire.server.sockets import port_group

    stall, n = config.limits.stall_timeout_seconds, config.workers
    try:
        http = port_group(config.host, config.port, n, stall)
    except OSError as e:
        print(f"voxwire: cannot listen on {config.host}:{config.port}: {e.strerror}", file=sys.stderr)
        return None
    if config.wyoming_port is None:
        return [Ports(http=sock) for sock in http]
    host = unauthenticated_host(config.host, config.auth.required, config.wyoming_allow_unauthenticated)
    try:
        wyoming = port_group(host, config.wyoming_port, n, stall)
    except OSError as e:
        for sock in http:
            sock.close()
        print(f"voxwire: cannot listen for Wyoming on {host}:{config.wyoming_port}: {e.strerror}", file=sys.stderr)
        return None
    return [Ports(http=h, wyoming=w) for h, w in zip(http, wyoming)]


def main(argv: list[str] | None = None) -> int:
    """``argv`` starts with the command, ``serve``, as in ``voxwire serve --port 9000``."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="voxwire", description="Voxwire streaming text-to-speech server")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    args = parser.parse_args(argv)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
