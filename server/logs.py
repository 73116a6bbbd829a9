"""Logging: one JSON object per line for machines, or plain lines in a terminal.

Every utterance is logged once, as the ``voxwire.utterance`` event (server/accounting.py),
with its ids, figures and outcome. Its text is not logged unless ``log_text`` is set: what
users say to a voice assistant is theirs. Every line carries the process id and, with
``--workers``, the worker's index, so lines from several workers can be told apart.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import orjson

from server.limits import WORKER_INDEX_ENV

# uvicorn's color_message is its message with ANSI colours, for its own terminal handler.
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}
_WORKER = os.environ.get(WORKER_INDEX_ENV)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED}


def _process() -> dict[str, Any]:
    return {"pid": os.getpid(), **({"worker": int(_WORKER)} if _WORKER is not None else {})}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_process(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        who = f"[{_WORKER}] " if _WORKER is not None else ""
        line = f"{when} {who}{record.levelname:<7} {record.name}: {record.getMessage()}" + (f"  {extra}" if extra else "")
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
