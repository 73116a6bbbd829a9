"""``voxwire say``: speak text through a server into a file, and print the figures.

The output's extension picks the format: ``.opus``, ``.mp3``, ``.aac`` or ``.flac`` ask
the server for that stream, which is written as it came (it is the file); anything else
is a WAV file of PCM (``--format`` picks which PCM).

Mistakes a user can make on the command line (a wrong URL, an output path that cannot be
written, no text) are reported as one ``voxwire: ...`` line on standard error, never a
traceback: exit status 2 for arguments refused before anything is sent, 1 for a failure on
the way (a text the server speaks no audio for writes no file).

An API key (``--api-key``, or ``VOXWIRE_API_KEY``) goes in the ``Authorization`` header, not
the URL, so that it stays out of access logs and shell history; it is never printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.exceptions import InvalidHandshake

from voxwire_client.client import DEFAULT_URL, Closed, ServerError, bearer_header
from voxwire_client.formats import COMPRESSED, PCM_FORMATS, as_file, format_for_path
from voxwire_client.sync import synthesize
from voxwire_client.wav import write_wav

STREAM_PATH = urlsplit(DEFAULT_URL).path
# http(s) URLs name the same server as ws(s) ones: a WebSocket starts as an HTTP request.
_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}
API_KEY_ENV = "VOXWIRE_API_KEY"
KEY_HINT = f"--api-key KEY or the {API_KEY_ENV} environment variable"


class UsageError(ValueError):
    """An argument refused before connecting; its message is the whole line shown."""


def websocket_url(url: str) -> str:
    """``url`` with an http(s) scheme turned into ws(s); refuses one with no host or
    another scheme (websockets would raise InvalidURI, with a traceback)."""
    refused = UsageError(f"--url {url}: not a WebSocket URL; expected ws://, wss://, http:// or https://, "
                         f"as in {DEFAULT_URL}")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # an unclosed IPv6 bracket, say
        raise refused from None
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None or not host:
        raise refused
    return urlunsplit(parts._replace(scheme=scheme))


def shown(url: str) -> str:
    """``url`` as it may be printed: a key given as ``?token=`` is masked."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(k == "token" for k, _ in query):
        return url
    masked = urlencode([(k, "***" if k == "token" else v) for k, v in query], safe="*")
    return urlunsplit(parts._replace(query=masked))


def api_key(flag: str | None, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The key to send and where it came from: ``--api-key``, else ``VOXWIRE_API_KEY`` (an
    empty variable is unset). Refuses one no header can carry, without showing it."""
    key, source = (flag, "--api-key") if flag is not None else (environ.get(API_KEY_ENV) or None, API_KEY_ENV)
    if key is None:
        return None, None
    try:
        bearer_header(key)
    except ValueError as e:
        raise UsageError(f"{source}: {e}") from None
    return key, source


def read_text(text: str) -> str:
    """The text to speak (``-``: standard input); none at all is a usage error, found before
    connecting (the server would answer an empty utterance with no audio)."""
    text = sys.stdin.read() if text == "-" else text
    if not text.strip():
        raise UsageError("no text to speak: give it as an argument, or '-' to read it from standard input")
    return text


def describe_closed(url: str, closed: Closed, key_source: str | None) -> str:
    """One line for a connection the server closed; for a refusal (1008), how to pass a key."""
    if not closed.refused:
        code = closed.code if closed.code is not None else "no close code"
        reason = f": {closed.reason}" if closed.reason else ""
        return f"voxwire: {shown(url)}: the server closed the connection ({code}{reason})"
    sent = key_source or ("?token= in the URL" if "token" in dict(parse_qsl(urlsplit(url).query)) else None)
    said = f' The server says: "{closed.reason}".' if closed.reason else ""
    advice = f"The key from {sent} was refused: check it, or pass another with {KEY_HINT}" if sent \
        else f"Pass a key with {KEY_HINT}"
    return (f"voxwire: {shown(url)}: the server closed the connection (1008, refused: a missing or wrong API key, "
            f"or a policy such as the origin).{said} {advice}")


def read_lexicon(path: str | None) -> dict[str, str] | None:
    """A lexicon file, in the server's format (``KEY = VALUE`` a line; ``#`` comments),
    sent as the request's own ``lexicon``. Only the lines are split here: the server
    checks the entries against the voice, and names any it refuses."""
    if path is None:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--lexicon {path}: cannot be read ({e.strerror or e})") from None
    entries: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UsageError(f"--lexicon {path}:{number}: write KEY = VALUE")
        entries[key.strip()] = value.strip()
    return entries


def check_output(path: str) -> None:
    """Refuse an output path that cannot be written, before any text is synthesised."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"-o {path}: is a directory; name a .wav file to write")
    folder = p.parent
    if not folder.is_dir():
        raise UsageError(f"-o {path}: the directory {folder} does not exist")
    writable = os.access(p, os.W_OK) if p.exists() else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise UsageError(f"-o {path}: permission denied")


def output_format(path: str, asked: str | None) -> str | None:
    """The format to ask for: the one the file's extension names, else ``--format``."""
    by_name = format_for_path(path)
    if by_name is not None:
        if asked is not None and asked != by_name:
            raise UsageError(f"-o {path}: a {COMPRESSED[by_name]} file holds {by_name}, not {asked}; drop --format")
        return by_name
    if asked in COMPRESSED:
        raise UsageError(f"--format {asked}: name the output {COMPRESSED[asked]} (-o out{COMPRESSED[asked]})")
    return asked


def http_status(error: InvalidHandshake) -> int | None:
    """The HTTP status of a refused WebSocket handshake, if it was one."""
    response = getattr(error, "response", None)  # websockets >= 14: InvalidStatus
    status = getattr(response, "status_code", None) or getattr(error, "status_code", None)  # 13: InvalidStatusCode
    return status if isinstance(status, int) else None


def describe_status(url: str, status: int) -> str:
    """One line saying why the server did not open a WebSocket, and what to check."""
    path = urlsplit(url).path or "/"
    if status == 404:
        why = f"no WebSocket endpoint at this path; the default is {STREAM_PATH}"
    elif status == 401:
        why = f"an API key is needed or was refused; pass one with {KEY_HINT}"
    elif status == 403:
        why = "the API key was refused or this origin is not allowed"
        if path != STREAM_PATH:
            # Servers and proxies also refuse a WebSocket to an unknown path with 403.
            why += f", or there is no WebSocket endpoint at {path}; the default is {STREAM_PATH}"
    else:
        why = "instead of opening a WebSocket"
    return f"voxwire: {shown(url)}: the server answered HTTP {status} ({why})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="voxwire", description="Voxwire client")
    sub = parser.add_subparsers(dest="command", required=True)
    say = sub.add_parser("say", help="speak text to a WAV, Opus, MP3, AAC or FLAC file")
    say.add_argument("text", help="the text to speak ('-' reads standard input)")
    say.add_argument("-o", "--output", default="out.wav", help="file to write; .opus, .mp3, .aac or .flac pick that format, "
                     "anything else is WAV (default: %(default)s)")
    say.add_argument("--url", default=DEFAULT_URL,
                     help="server WebSocket URL; http(s):// is taken as ws(s):// (default: %(default)s)")
    say.add_argument("--voice", help="voice id (default: the server's)")
    say.add_argument("--speaker", help="a multi-speaker voice's speaker, by name or number (default: the voice's)")
    say.add_argument("--format", choices=(*PCM_FORMATS, *COMPRESSED), help="audio encoding (default: by -o's extension)")
    say.add_argument("--sample-rate", type=int, help="output sample rate, 8000-48000")
    say.add_argument("--chunk-ms", type=int, help="chunk duration, 150-250 ms")
    say.add_argument("--speed", type=float, help="speaking rate, 0.5-2.0")
    say.add_argument("--timestamps", action="store_true", help="print when each word is spoken")
    say.add_argument("--ssml", action="store_true", help="the text is an SSML document (docs/ssml.md)")
    say.add_argument("--lexicon", metavar="FILE", help="how words are said: KEY = VALUE lines, as for "
                     "voxwire serve --lexicon; sent with the request (at most 500 entries; docs/lexicons.md)")
    say.add_argument("--api-key", metavar="KEY", help="API key, for a server started with keys; sent as "
                     f"Authorization: Bearer, never printed (default: ${API_KEY_ENV})")
    args = parser.parse_args(argv)
    try:
        url = websocket_url(args.url)
        check_output(args.output)  # now, not after the whole text has been synthesised
        fmt = output_format(args.output, args.format)
        key, key_source = api_key(args.api_key, os.environ)
        text = read_text(args.text)
        lexicon = read_lexicon(args.lexicon)
    except UsageError as e:
        print(f"voxwire: {e}", file=sys.stderr)
        return 2
    settings: dict[str, Any] = {
        k: v
        for k, v in {
            "voice": args.voice, "speaker": args.speaker, "format": fmt, "sample_rate": args.sample_rate,
            "chunk_ms": args.chunk_ms, "speed": args.speed, "timestamps": args.timestamps or None,
            "lexicon": lexicon, "text_format": "ssml" if args.ssml else None,
        }.items()
        if v is not None
    }
    try:
        result = synthesize(text, url, api_key=key, **settings)
    except ServerError as e:
        print(f"voxwire: server error {e.code}: {e.message}", file=sys.stderr)
        return 1
    except InvalidHandshake as e:
        status = http_status(e)
        if status is None:  # not an HTTP refusal: a server that does not speak WebSocket
            print(f"voxwire: {shown(url)}: the WebSocket handshake failed: {e}", file=sys.stderr)
        else:
            print(describe_status(url, status), file=sys.stderr)
        return 1
    except Closed as e:  # the server answered, then closed: it was reached
        print(describe_closed(url, e, key_source), file=sys.stderr)
        return 1
    except OSError as e:
        print(f"voxwire: cannot reach {shown(url)}: {e}", file=sys.stderr)
        return 1
    if not result.done.get("samples"):
        # A file of no audio would pass for a result; nothing in the text was pronounceable.
        print(f"voxwire: the server spoke no audio for this text (nothing in it to pronounce); "
              f"{args.output} was not written", file=sys.stderr)
        return 1
    try:
        if result.format in COMPRESSED:
            # The stream is the file; its length is known now (FLAC's header wants it).
            Path(args.output).write_bytes(as_file(result.data, result.format, int(result.done.get("samples", 0))))
        else:
            write_wav(args.output, result.data, result.sample_rate, result.format)
    except OSError as e:  # checked above, but the disk may fill or the folder go meanwhile
        print(f"voxwire: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    d = result.done
    ttfa = f"{result.ttfa_ms:.0f} ms" if result.ttfa_ms is not None else "n/a"
    print(f"wrote {args.output}: {result.duration:.2f} s, {result.format} at {result.sample_rate} Hz, {result.chunks} chunks")
    print(f"time to first audio: {ttfa} (client), {d.get('ttfa_ms')} ms (server)")
    for w in result.words:
        print(f"{w['start_ms']:8.0f} {w['end_ms']:8.0f}  {w['word']}")
    print(f"server: audio {d.get('audio_ms')} ms, compute {d.get('compute_ms')} ms, rtf {d.get('rtf')}, segments {d.get('segments')}")
    return 0


def say_command(argv: list[str] | None = None) -> int:
    """``voxwire-say TEXT ...``: the client distribution's own command, which is
    ``voxwire say TEXT ...`` without the server installed (the server owns ``voxwire``)."""
    return main(["say", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
