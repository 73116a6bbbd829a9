"""``voxwire say``: speak text through a server into a WAV file, and print the figures."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from voxwire_client.client import DEFAULT_URL, Closed, ServerError
from voxwire_client.sync import synthesize
from voxwire_client.wav import write_wav


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="voxwire", description="Voxwire client")
    sub = parser.add_subparsers(dest="command", required=True)
    say = sub.add_parser("say", help="speak text to a WAV file")
    say.add_argument("text", help="the text to speak ('-' reads standard input)")
    say.add_argument("-o", "--output", default="out.wav", help="WAV file to write (default: %(default)s)")
    say.add_argument("--url", default=DEFAULT_URL, help="server WebSocket URL (default: %(default)s)")
    say.add_argument("--voice", help="voice id (default: the server's)")
    say.add_argument("--format", choices=("pcm_s16le", "pcm_f32le", "mulaw"), help="audio encoding")
    say.add_argument("--sample-rate", type=int, help="output sample rate, 8000-48000")
    say.add_argument("--chunk-ms", type=int, help="chunk duration, 150-250 ms")
    say.add_argument("--speed", type=float, help="speaking rate, 0.5-2.0")
    say.add_argument("--timestamps", action="store_true", help="print when each word is spoken")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.text == "-" else args.text
    settings: dict[str, Any] = {
        k: v
        for k, v in {
            "voice": args.voice, "format": args.format, "sample_rate": args.sample_rate,
            "chunk_ms": args.chunk_ms, "speed": args.speed, "timestamps": args.timestamps or None,
        }.items()
        if v is not None
    }
    try:
        result = synthesize(text, args.url, **settings)
    except ServerError as e:
        print(f"voxwire: server error {e.code}: {e.message}", file=sys.stderr)
        return 1
    except (Closed, OSError) as e:
        print(f"voxwire: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    write_wav(args.output, result.data, result.sample_rate, result.format)
    d = result.done
    ttfa = f"{result.ttfa_ms:.0f} ms" if result.ttfa_ms is not None else "n/a"
    print(f"wrote {args.output}: {result.duration:.2f} s, {result.format} at {result.sample_rate} Hz, {result.chunks} chunks")
    print(f"time to first audio: {ttfa} (client), {d.get('ttfa_ms')} ms (server)")
    for w in result.words:
        print(f"{w['start_ms']:8.0f} {w['end_ms']:8.0f}  {w['word']}")
    print(f"server: audio {d.get('audio_ms')} ms, compute {d.get('compute_ms')} ms, rtf {d.get('rtf')}, segments {d.get('segments')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
