"""Logging: one JSON object per line for machines, or plain lines in a terminal.

Every finished utterance is logged once, as the ``voxwire.utterance`` event, with its ids,
figures and outcome. Its text is not logged unless ``log_text`` is set: what users say to
a voice assistant is theirs.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from typing import Any

import orjson

UTTERANCES = logging.getLogger("voxwire.utterance")
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{when} {record.levelname:<7} {record.name}: {record.getMessage()}" + (f"  {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's loggers go through the same handler, in the same format.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def log_utterance(fields: dict[str, Any], text: str, include_text: bool) -> None:
    """The one line per utterance. Without ``include_text`` the text appears only as its
    length and a short digest, enough to tell two utterances apart, not to read them."""
    fields = dict(fields)
    fields["text_chars"] = len(text)
    if include_text:
        fields["text"] = text
    else:
        fields["text_sha256"] = hashlib.sha256(text.encode()).hexdigest()[:12]
    UTTERANCES.info("utterance %s", fields.get("outcome"), extra=fields)
