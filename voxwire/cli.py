"""``voxwire serve | say | bench | voices``: dispatch to the part that owns the command.

Each part is imported only when its command runs, so ``voxwire say`` loads no model code
and ``voxwire serve`` loads neither the client nor the benchmarks.
"""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "serve": "run the streaming TTS server (see: voxwire serve --help)",
    "say": "speak text through a server to a WAV file (see: voxwire say --help)",
    "bench": "measure any TTS server's first audio: Voxwire, OpenAI-compatible, Wyoming, Piper HTTP "
             "(see: voxwire bench --help)",
    "voices": "list Piper's public voices, or download some for --piper-voices-dir (see: voxwire voices --help)",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else None
    if command == "serve":
        from voxwire.server.cli import main as serve_main

        return serve_main(argv)
    if command == "say":
        try:
            from voxwire_client.cli import main as say_main
        except ModuleNotFoundError as e:
            if e.name != "voxwire_client":
                raise
            print("voxwire: `voxwire say` is the Python client's command; install it: pip install -e clients/python",
                  file=sys.stderr)
            return 2
        return say_main(argv)
    if command == "voices":
        from voxwire.engine.piper.catalog import main as voices_main

        return voices_main(argv[1:])
    if command == "bench":
        from voxwire.benchmarks.bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="voxwire", description="Voxwire streaming text-to-speech")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help in COMMANDS.items():
        sub.add_parser(name, help=help, add_help=False)
    parser.parse_args(argv)  # prints the help, or the error, and exits
    return 2


if __name__ == "__main__":
    sys.exit(main())
