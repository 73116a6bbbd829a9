"""``voxwire serve``: the server's command line (also ``python -m voxwire.server serve``).

The ``voxwire`` command itself (serve, say, bench) is the top-level ``voxwire`` package,
which sits above the server, its client and its benchmarks; nothing here imports them.
"""

from __future__ import annotations

import argparse
import logging
import sys

from voxwire.engine.base import EngineError


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    # seconds of loading. One socket for the whole server, however many workers.
    try:
        sock = held_socket(config.host, config.port, config.limits.stall_timeout_seconds)
    except OSError as e:
        print(f"voxwire: cannot listen on {config.host}:{config.port}: {e.strerror}", file=sys.stderr)
        return 2
    if config.workers > 1:
        from voxwire.server.processes import serve_workers

        return serve_workers(config, sock)
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
