"""One JSON line per utterance; its text redacted unless asked for."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import orjson

from server.logs import JsonFormatter, TextFormatter
from tests.conftest import free_port
from tests.server.test_faults import _wait_listening
from voxwire_client.sync import synthesize_async

SECRET = "My account number is four four two."


async def _utterance_lines(*flags: str) -> list[dict]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "serve", "--port", str(port), "--log-format", "json", *flags],
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


async def test_one_json_line_per_utterance_with_text_redacted():
    (line,) = await _utterance_lines()
    assert line["outcome"] == "done" and line["ctx"] and line["session"] and line["voice"] == "joe"
    for figure in ("ttfa_ms", "audio_ms", "compute_ms", "rtf", "chunks", "segments"):
        assert figure in line
    assert line["text_chars"] == len(SECRET) and len(line["text_digest"]) == 12
    assert "text" not in line and "four four" not in orjson.dumps(line).decode()


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
