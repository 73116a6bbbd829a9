"""One JSON line per utterance; its text redacted unless asked for."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from typing import Any

import httpx
import orjson
import pytest
import websockets

from voxwire.server.limits import WORKER_INDEX_ENV
from voxwire.server.logs import (
    MAX_LOGGED_CHARS,
    BoundLines,
    JsonFormatter,
    RedactCredentials,
    TextFormatter,
    configure_logging,
    process_fields,
    redact_text,
)
from tests.conftest import free_port
from tests.server.test_faults import _wait_listening
from voxwire_client.sync import synthesize_async

SECRET = "My account number is four four two."


async def _utterance_lines(*flags: str) -> list[dict]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--log-format", "json", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"ws://127.0.0.1:{port}/v1/stream"
        await _wait_listening(url, proc)
        result = await synthesize_async(SECRET, url)
        assert result.done["type"] == "done"
        await asyncio.sleep(0.3)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert lines and all("ts" in line and "level" in line for line in lines)  # every line is JSON
    return [line for line in lines if line["logger"] == "voxwire.utterance"]


@pytest.mark.slow  # a spawned server
async def test_one_json_line_per_utterance_with_text_redacted():
    (line,) = await _utterance_lines()
    assert line["outcome"] == "done" and line["ctx"] and line["session"] and line["voice"] == "joe"
    for figure in ("ttfa_ms", "audio_ms", "compute_ms", "rtf", "chunks", "segments"):
        assert figure in line
    assert line["text_chars"] == len(SECRET) and len(line["text_digest"]) == 12
    assert "text" not in line and "four four" not in orjson.dumps(line).decode()


@pytest.mark.slow  # spawned servers
async def test_text_is_logged_only_when_asked():
    (line,) = await _utterance_lines("--log-text")
    assert line["text"] == SECRET


def test_formatters():
    record = logging.LogRecord("voxwire.utterance", logging.INFO, __file__, 1, "utterance %s", ("done",), None)
    record.ctx = "a1"
    record.color_message = "\x1b[32mutterance done\x1b[0m"  # as uvicorn's records carry
    assert orjson.loads(JsonFormatter().format(record)) | {"ts": 0} == {
        "ts": 0, "level": "info", "logger": "voxwire.utterance", "msg": "utterance done", "ctx": "a1",
        "pid": os.getpid(),  # lines from several processes can be told apart
    }
    text = TextFormatter().format(record)
    assert "INFO" in text and "utterance done" in text and "ctx=a1" in text and not text.startswith("{")


@pytest.mark.parametrize("given,worker", [("2", 2), (" 0 ", 0), (None, None), ("", None),
                                          ("3f2a9c1e", None), ("-1", None), ("1.5", None)])
def test_lines_carry_the_worker_index_when_it_is_one(monkeypatch, given, worker):
    """A --workers process's index (or a Ray replica's) is an int on every line; anything
    else (a Ray replica id, say) is left off the line, never a crash."""
    if given is None:
        monkeypatch.delenv(WORKER_INDEX_ENV, raising=False)
    else:
        monkeypatch.setenv(WORKER_INDEX_ENV, given)
    record = logging.LogRecord("voxwire.x", logging.INFO, __file__, 1, "hello", (), None)
    line = orjson.loads(JsonFormatter().format(record))
    assert line.get("worker") == worker and isinstance(line.get("worker", 0), int)
    assert process_fields() == {"pid": os.getpid(), **({"worker": worker} if worker is not None else {})}
    text = TextFormatter().format(record)
    assert (f"[{worker}] INFO" in text) if worker is not None else (" INFO " in text and "[" not in text)


# Issue 29, case 4: no credential reaches a log line, whichever way it was sent, right or
# wrong, in either format, from uvicorn's loggers or Voxwire's own.

GOOD_KEY = "k1-Good-3f9a7c"
WRONG_KEY = "w9-Wrong-51be0d"
SPEECH = {"model": "tts-1", "voice": "alloy", "response_format": "pcm"}
# What the right key's requests speak (the wrong key's speak nothing); with --log-text
# each is in its utterance's event, as it was sent ("Bearer speech." is no header).
TEXTS = ("Sent with a query token.", "Sent with a bearer header.", "Sent as a subprotocol.",
         "Query token speech.", "Bearer speech.")


async def _ready_pids(http: httpx.AsyncClient, proc: subprocess.Popen[str], workers: int) -> None:
    """Until every worker has answered /readyz: a socket then finds an engine wherever the
    kernel hands it (each request a fresh connection, so the kernel spreads them)."""
    seen: set[int] = set()
    for _ in range(1200):
        assert proc.poll() is None, "the server exited"
        try:
            r = await http.get("/readyz", headers={"Connection": "close"})
            if r.status_code == 200:
                seen.add(r.json()["pid"])
                if len(seen) == workers:
                    return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("the server did not become ready")


async def _speak(url: str, text: str, **connect: Any) -> None:
    async with websockets.connect(url, **connect) as ws:
        assert orjson.loads(await ws.recv())["type"] == "ready"
        await ws.send(orjson.dumps({"type": "speak", "ctx": "u1", "text": text}).decode())
        while not isinstance(message := await ws.recv(), str) or orjson.loads(message)["type"] != "done":
            pass


async def _refused(url: str, **connect: Any) -> None:
    async with websockets.connect(url, **connect) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def _present_keys_every_way(port: int) -> None:
    ws = f"ws://127.0.0.1:{port}/v1/stream"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for key, good in ((GOOD_KEY, True), (WRONG_KEY, False)):
            bearer = {"Authorization": f"Bearer {key}"}
            subprotocols = ["voxwire.v1", f"voxwire.token.{key}"]
            if good:
                await _speak(f"{ws}?token={key}", "Sent with a query token.")
                await _speak(ws, "Sent with a bearer header.", additional_headers=bearer)
                await _speak(ws, "Sent as a subprotocol.", subprotocols=subprotocols)
            else:
                await _refused(f"{ws}?token={key}")
                await _refused(ws, additional_headers=bearer)
                await _refused(ws, subprotocols=subprotocols)
            status = 200 if good else 401
            r = await http.post(f"/v1/audio/speech?token={key}", json={**SPEECH, "input": "Query token speech."})
            assert r.status_code == status
            r = await http.post("/v1/audio/speech", json={**SPEECH, "input": "Bearer speech."}, headers=bearer)
            assert r.status_code == status
            assert (await http.get(f"/v1/voices?token={key}")).status_code == status
            # Starlette decodes parameter names: %74oken is `token`, and a key all the same.
            assert (await http.get(f"/v1/voices?voice=x&%74oken={key}")).status_code == status
            assert (await http.get("/v1/voices", headers=bearer)).status_code == status
            assert (await http.get(f"/?token={key}")).status_code == 307  # the demo page's redirect


@pytest.mark.slow  # spawned servers, one with --workers 2
@pytest.mark.parametrize("log_format,workers", [("json", 1), ("text", 2)])
async def test_no_key_reaches_any_log_line_however_it_was_sent(tmp_path, log_format, workers):
    """A real server process, so the lines are uvicorn's own access and error lines and
    Voxwire's, through the handler ``voxwire serve`` installs (each worker's, with 2)."""
    port = free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--log-format", log_format,
             "--api-key", GOOD_KEY, "--log-text", "--workers", str(workers), "--piper-backend", "onnx"],
            stdout=subprocess.DEVNULL, stderr=log_file, text=True,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await _ready_pids(http, proc, workers)
        await _present_keys_every_way(port)
        await asyncio.sleep(0.5)  # the last utterance's event follows its `done`
    finally:
        proc.terminate()
        proc.wait(60)
    logged = log_path.read_text()
    for key in (GOOD_KEY, WRONG_KEY):
        assert key.lower() not in logged.lower(), [line for line in logged.splitlines() if key in line]
        assert key.split("-")[-1] not in logged  # nor its tail, cut off at some separator
    lines = logged.splitlines()
    if log_format == "json":
        records = [orjson.loads(line) for line in lines]  # every line is JSON
        messages = [r["msg"] for r in records]
        utterances = [r for r in records if r["logger"] == "voxwire.utterance" and r["outcome"] == "done"]
        assert sorted(u["text"] for u in utterances) == sorted(TEXTS)  # log_text: the text, nothing else
    else:
        assert not any(line.startswith("{") for line in lines)
        messages = lines
        utterances = [line for line in lines if "voxwire.utterance: utterance done" in line]
        assert len(utterances) == len(TEXTS) and all(any(t in u for u in utterances) for t in TEXTS)

    def count(fragment: str) -> int:
        return sum(fragment in m for m in messages)

    # Each request's line is there, with the marker where its key was: two of each (the
    # right key's and the wrong one's), and the status tells them apart.
    assert count('"WebSocket /v1/stream?token=[redacted]" [accepted]') == 2
    assert count('"WebSocket /v1/stream" [accepted]') >= 4  # bearer and subprotocol (and no more key)
    requests = ("POST /v1/audio/speech?token=[redacted]", "POST /v1/audio/speech", "GET /v1/voices?token=[redacted]",
                "GET /v1/voices?voice=x&%74oken=[redacted]", "GET /v1/voices")
    for request in requests:
        assert count(f'"{request} HTTP/1.1" 200') == 1, request
        assert count(f'"{request} HTTP/1.1" 401') == 1, request
    assert count('"GET /?token=[redacted] HTTP/1.1" 307') == 2
    assert count("connection refused: unauthorized") == 3


def _through_filter(record: logging.LogRecord) -> tuple[str, str]:
    """``record`` as each format writes it, after the root handler's filter."""
    assert RedactCredentials().filter(record)
    return JsonFormatter().format(record), TextFormatter().format(record)


def test_uvicorn_access_and_error_records_are_redacted_in_their_arguments():
    access = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "POST", f"/v1/audio/speech?voice=joe&token={GOOD_KEY}&x=1", "1.1", 200), None,
    )
    access.color_message = '%s - "%s %s HTTP/%s" %d'  # as uvicorn's carry
    socket = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:5000", f"/v1/stream?api_key={GOOD_KEY}"), None,
    )
    for line in _through_filter(access):
        assert GOOD_KEY not in line
        assert '"POST /v1/audio/speech?voice=joe&token=[redacted]&x=1 HTTP/1.1" 200' in line.replace('\\"', '"')
    for line in _through_filter(socket):
        assert GOOD_KEY not in line
        assert '"WebSocket /v1/stream?api_key=[redacted]" [accepted]' in line.replace('\\"', '"')


def test_extra_fields_holding_urls_headers_or_keys_are_redacted():
    record = logging.LogRecord("voxwire.x", logging.INFO, __file__, 1, "request %s", ({"authorization": "a"},), None)
    record.path = f"/v1/voices?token={GOOD_KEY}"
    record.url = f"http://h/v1/stream?access_token={GOOD_KEY}#top"
    record.headers = {"Authorization": f"Bearer {GOOD_KEY}", "X-API-Key": GOOD_KEY, "host": "h"}
    record.asgi_headers = [(b"authorization", f"Bearer {GOOD_KEY}".encode()), (b"host", b"h")]
    record.subprotocols = ["voxwire.v1", f"voxwire.token.{GOOD_KEY}"]
    record.api_key = GOOD_KEY
    record.voice = "joe"  # not a credential: as it was
    json_line, text_line = _through_filter(record)
    assert GOOD_KEY not in json_line and GOOD_KEY not in text_line
    fields = orjson.loads(json_line)
    assert fields["path"] == "/v1/voices?token=[redacted]"
    assert fields["url"] == "http://h/v1/stream?access_token=[redacted]#top"
    assert fields["headers"] == {"Authorization": "[redacted]", "X-API-Key": "[redacted]", "host": "h"}
    assert fields["asgi_headers"] == [["authorization", "[redacted]"], ["host", "h"]]
    assert fields["subprotocols"] == ["voxwire.v1", "voxwire.token.[redacted]"]
    assert fields["api_key"] == "[redacted]" and fields["voice"] == "joe"
    assert fields["msg"] == "request {'authorization': '[redacted]'}"


def test_exception_text_is_redacted():
    try:
        raise ValueError(f"GET http://h/v1/voices?token={GOOD_KEY} failed: Authorization: Bearer {WRONG_KEY}")
    except ValueError:
        record = logging.LogRecord("voxwire.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    json_line, text_line = _through_filter(record)
    for line in (json_line, text_line):
        assert GOOD_KEY not in line and WRONG_KEY not in line and "Traceback" in line
    assert "?token=[redacted] failed: Authorization: [redacted]" in orjson.loads(json_line)["exc"]


def test_unlisted_names_and_plain_text_are_left_alone():
    assert redact_text("/v1/voices?voice=joe&keyboard=us&monkey=1") == "/v1/voices?voice=joe&keyboard=us&monkey=1"
    assert redact_text("utterance done in 120 ms") == "utterance done in 120 ms"
    # A value with a quote inside is redacted whole; a closing quote after it is kept.
    assert redact_text('"GET /?token=ab"cd HTTP/1.1"') == '"GET /?token=[redacted] HTTP/1.1"'
    assert redact_text('"WebSocket /?token=abc" [accepted]') == '"WebSocket /?token=[redacted]" [accepted]'
    once = redact_text(f"/v1?token={GOOD_KEY} Bearer {GOOD_KEY} voxwire.token.{GOOD_KEY}")
    assert redact_text(once) == once == "/v1?token=[redacted] Bearer [redacted] voxwire.token.[redacted]"


def test_the_utterance_text_asked_for_is_logged_verbatim():
    """--log-text logs what the user asked to be spoken as it was: no key travels in it,
    and the bearer of bad news is no header."""
    record = logging.LogRecord("voxwire.utterance", logging.INFO, __file__, 1, "utterance %s", ("done",), None)
    record.text = "Bearer of bad news, call ?token=now."
    assert orjson.loads(_through_filter(record)[0])["text"] == "Bearer of bad news, call ?token=now."


def test_an_argument_only_its_own_type_formats_still_formats():
    class Cores:
        def __index__(self) -> int:
            return 3

    args = (Cores(), GOOD_KEY)
    record = logging.LogRecord("voxwire.x", logging.INFO, __file__, 1, "%d cores for ?token=%s", args, None)
    json_line, _ = _through_filter(record)
    assert orjson.loads(json_line)["msg"] == "3 cores for ?token=[redacted]"


def test_configure_logging_puts_the_filter_on_the_handler_every_logger_reaches(capsys):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    loggers = [logging.getLogger(n) for n in names]
    # Servers started earlier in the run (uvicorn.Config(log_level=...)) set their levels.
    uvicorn_saved = [(lg.handlers[:], lg.propagate, lg.level, lg.disabled) for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.NOTSET)
            lg.disabled = False
        configure_logging("info", "json")
        path = f"/v1/voices?token={GOOD_KEY}"
        logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "c", "GET", path, "1.1", 200)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        for lg, (handlers, propagate, level, disabled) in zip(loggers, uvicorn_saved):
            lg.handlers[:], lg.propagate, lg.disabled = handlers, propagate, disabled
            lg.setLevel(level)
    err = capsys.readouterr().err
    assert GOOD_KEY not in err and "?token=[redacted] HTTP/1.1" in err


def test_configure_logging_says_once_that_a_worker_index_is_not_one(monkeypatch, capsys):
    monkeypatch.setenv(WORKER_INDEX_ENV, "replica-3f2a9c1e")
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    uvicorn_saved = [(lg.handlers[:], lg.propagate) for lg in loggers]
    try:
        configure_logging("info", "json")
        logging.getLogger("voxwire.x").info("after")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        for lg, (handlers, propagate) in zip(loggers, uvicorn_saved):
            lg.handlers[:], lg.propagate = handlers, propagate
    warning, after = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert warning["level"] == "warning" and "'replica-3f2a9c1e'" in warning["msg"] and "worker" not in warning
    assert after["msg"] == "after" and "worker" not in after


# A voice name a hostile client chose: long (once echoed whole into the error and its log
# line: 24 MB/s of log from one socket), with a forged line and a terminal escape in it.
FORGED = "\n12:00:00 INFO    voxwire.auth: admin logged in\x1b[2J"
HOSTILE_VOICE = "v" * 250_000 + FORGED


@pytest.mark.slow  # a spawned server
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_client_chosen_strings_neither_grow_the_log_nor_forge_its_lines(tmp_path, log_format):
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--log-format", log_format,
             "--wyoming-port", "0"],
            stdout=subprocess.DEVNULL, stderr=log_file, text=True,
        )
    try:
        url = f"ws://127.0.0.1:{port}/v1/stream"
        await _wait_listening(url, proc)
        async with websockets.connect(url, max_size=2**20) as ws:
            await ws.recv()  # ready
            for message in ({"type": "config", "voice": HOSTILE_VOICE},
                            {"type": "speak", "ctx": "u1", "text": "Hello.", "voice": HOSTILE_VOICE},
                            {"type": HOSTILE_VOICE}):
                await ws.send(orjson.dumps(message).decode())
                answer = orjson.loads(await ws.recv())
                assert answer["type"] == "error" and len(answer["message"]) < 300, answer["code"]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            voice = HOSTILE_VOICE[-30_000:]  # within the route's body bound
            r = await http.post("/v1/audio/speech", json={**SPEECH, "voice": voice, "input": "Hello."})
            assert r.status_code == 400 and len(r.content) < 1000
        await asyncio.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    logged = log_path.read_text()
    assert len(logged) < 50_000, f"{len(logged)} characters logged for 4 refusals"
    assert "\x1b" not in logged and "vvvv" in logged  # the voice is named, cut and escaped
    assert not any(line.startswith("12:00:00") for line in logged.splitlines())
    if log_format == "json":
        assert all(orjson.loads(line) for line in logged.splitlines() if line.strip())


def test_text_lines_escape_controls_and_every_line_is_bounded():
    record = logging.LogRecord("voxwire.x", logging.INFO, __file__, 1, "asked for %s", ("a" * 100 + FORGED,), None)
    record.voice = "\x1b[31m" + "b" * 10_000
    for f in (RedactCredentials(), BoundLines()):
        f.filter(record)
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\\n12:00:00" in line and "\\x1b[2J" in line
    assert len(line) < MAX_LOGGED_CHARS + 300 and "more characters]" in line
    assert len(orjson.loads(JsonFormatter().format(record))["voice"]) < MAX_LOGGED_CHARS + 50
