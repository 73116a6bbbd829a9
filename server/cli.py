"""The ``voxwire`` command: ``serve`` runs the server; ``say`` is the Python client's."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from engine.base import EngineError
from engine.registry import ENGINES, EngineOptions
from server.audio import FORMATS
from server.limits import Limits


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="run the streaming TTS server")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument("--engine", choices=ENGINES, default="piper", help="engine (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 (default: %(default)s)")
    p.add_argument(
        "--piper-backend", choices=("torch", "onnx"), default="torch",
        help="Piper runtime: torch streams within a sentence, onnx synthesises sentence by sentence (default: %(default)s)",
    )
    p.add_argument(
        "--piper-voice", type=Path, action="append", default=[], metavar="MODEL.onnx",
        help="a Piper voice file (with MODEL.onnx.json beside it); repeat for several; default: the embedded joe voice",
    )
    p.add_argument(
        "--model-dir", type=Path, default=Path("pretrained_models/CosyVoice2-0.5B"),
        help="CosyVoice2 model directory (default: %(default)s)",
    )
    p.add_argument("--voices-dir", type=Path, default=None, help="where registered voices are stored")
    p.add_argument("--voice", default=None, help="default voice (default: the engine's first)")
    p.add_argument("--format", choices=FORMATS, default="pcm_s16le", help="default output format")
    p.add_argument("--sample-rate", type=int, default=None, help="default output rate (default: the engine's)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    d = Limits()
    p.add_argument("--max-utterances", type=int, default=d.max_utterances_total, help="active utterances in total")
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    p.add_argument(
        "--api-key", action="append", default=[],
        help="a key clients must present (repeat for several; or VOXWIRE_API_KEYS=k1,k2)",
    )
    p.add_argument(
        "--allow-origin", action="append", default=[],
        help="a browser origin allowed to connect (repeat; or VOXWIRE_ALLOWED_ORIGINS); default: any",
    )
    p.add_argument("--step-timeout", type=float, default=30.0, help="seconds before a hung engine step is abandoned")
    p.add_argument("--drain-seconds", type=float, default=10.0, help="on SIGTERM, time given to in-flight utterances")


def serve(args: argparse.Namespace) -> int:
    from server.app import create_app
    from server.config import AuthConfig, ServerConfig
    from server.run import serve as run

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limits = Limits(max_utterances_total=args.max_utterances, max_connections=args.max_connections)
    options = EngineOptions(
        name=args.engine,
        device=args.device,
        piper_backend=args.piper_backend,
        piper_voices=tuple(args.piper_voice),
        model_dir=args.model_dir,
        voices_dir=args.voices_dir,
    )
    if args.engine == "cosyvoice2":
        from engine.cosyvoice2.engine import missing_files

        missing = missing_files(args.model_dir)
        if missing:
            print(
                f"voxwire: the CosyVoice2 model directory {args.model_dir} lacks: {', '.join(missing)}.\n"
                "Download CosyVoice2-0.5B into it (see pretrained_models/README.md); nothing is downloaded for you.",
                file=sys.stderr,
            )
            return 2
    keys = tuple(k for k in (args.api_key or os.environ.get("VOXWIRE_API_KEYS", "").split(",")) if k.strip())
    origins = tuple(o for o in (args.allow_origin or os.environ.get("VOXWIRE_ALLOWED_ORIGINS", "").split(",")) if o)
    if not keys and args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.warning("listening on %s with no API key: anyone who can reach it can use it", args.host)
    config = ServerConfig(
        engine=options, limits=limits, auth=AuthConfig(api_keys=keys, allowed_origins=origins),
        default_voice=args.voice, default_format=args.format, default_sample_rate=args.sample_rate,
        step_timeout=args.step_timeout, drain_seconds=args.drain_seconds,
    )
    try:
        app = create_app(config)
    except EngineError as e:
        print(f"voxwire: {e.message}", file=sys.stderr)
        return 2
    run(app, args.host, args.port, args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "say":
        from voxwire_client.cli import main as client_main

        return client_main(argv)
    if argv and argv[0] == "bench":
        from benchmarks.bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="voxwire", description="Voxwire streaming text-to-speech")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("say", help="speak text through a server to a WAV file (see: voxwire say --help)")
    sub.add_parser("bench", help="measure latency, underruns and capacity (see: voxwire bench --help)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
