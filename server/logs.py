"""Logging: one JSON object per line for machines, or plain lines in a terminal.

Every utterance is logged once, as the ``voxwire.utterance`` event (server/accounting.py),
with its ids, figures and outcome. Its text is not logged unless ``log_text`` is set: what
users say to a voice assistant is theirs. Every line carries the process id and, with
``--workers`` or in a Ray replica, the worker's index (an int, 0 .. N-1), so lines from
several workers can be told apart.

No credential reaches a line: every record that reaches the handler (Voxwire's own,
uvicorn's access lines and uvicorn.error's ``"WebSocket /v1/stream?token=…"``) passes
through ``RedactCredentials`` first, which rewrites its message, arguments, extra fields
and traceback. A key sent as ``?token=`` is in the request line that uvicorn logs, and a
wrong key is as secret as a right one (often a key of another service, or one typo away).
"""

from __future__ import annotations

import logging
import numbers
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

import orjson

from voxwire.server.limits import WORKER_INDEX_ENV, worker_index

# uvicorn's color_message is its message with ANSI colours, for its own terminal handler.
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}

REDACTED = "[redacted]"

# Names whose value is a credential, as query parameters, extra fields, mapping keys or
# header names; compared lower-case without "-" and "_" (api_key = api-key = apikey).
# `token` is the one Voxwire reads (server/auth.py). The others are the names other
# services take a key under (OAuth's access_token, Google's key, api_key in many SDKs,
# signed URLs' signature), which a client may send here out of habit: a key is secret
# whichever name carried it. A plain `key` is on the list for that reason; no Voxwire
# route takes a parameter or logs a field of that name.
CREDENTIAL_NAMES = frozenset({
    "token", "accesstoken", "refreshtoken", "idtoken", "authtoken", "apitoken",
    "apikey", "key", "xapikey", "secret", "clientsecret", "password", "passwd", "pwd",
    "auth", "authorization", "proxyauthorization", "cookie", "setcookie", "jwt", "signature", "sig",
})

# Where a value ends: before any closing quotes or brackets that are followed by a
# separator, so `"WebSocket /v1/stream?token=K" [accepted]` keeps its closing quote while
# a key that itself holds a quote is redacted whole. A value already redacted is matched
# whole first, so that a second pass leaves it as it is.
_CLOSERS = r"""["'\])},]*"""
_DONE = re.escape(REDACTED)
# A query parameter: `?name=value` or `&name=value` (`;` too: some servers split on it).
_QUERY_PARAM = re.compile(
    rf"(?P<lead>[?&;])(?P<name>[^=&;#?\s]+)=(?P<value>{_DONE}|[^&#\s]*?)(?={_CLOSERS}(?:[&#\s]|$))"
)
# A header as written in text or a repr: `Authorization: Bearer K`, `'x-api-key': 'K'`.
# Its value runs to the end of the line: a scheme and its credentials are two words.
_HEADER = re.compile(
    r"""(?P<name>\b(?:proxy-)?authorization|\bx-api-key|\bapi-key|\b(?:set-)?cookie)(?P<sep>["']?\s*:\s*["']?)"""
    rf"""(?P<value>{_DONE}|[^\r\n]*?)(?={_CLOSERS}(?:[\r\n]|$))""",
    re.IGNORECASE,
)
# `Bearer K` wherever it stands (a header's value logged without its name).
_BEARER = re.compile(rf"(?P<lead>\bbearer\s+)(?P<value>{_DONE}|\S+?)(?={_CLOSERS}(?:\s|$))", re.IGNORECASE)
# The subprotocol a browser offers its key in (server/auth.py), as in Sec-WebSocket-Protocol.
_SUBPROTOCOL = re.compile(rf"(?P<lead>voxwire\.token\.)(?P<value>{_DONE}|[^\s,]*?)(?={_CLOSERS}(?:[\s,]|$))")


def is_credential_name(name: str) -> bool:
    return unquote_plus(name).strip().lower().replace("-", "").replace("_", "") in CREDENTIAL_NAMES


def _query_param(m: re.Match[str]) -> str:
    if m["value"] in ("", REDACTED) or not is_credential_name(m["name"]):
        return m[0]
    return f"{m['lead']}{m['name']}={REDACTED}"


def _header(m: re.Match[str]) -> str:
    return m[0] if m["value"] in ("", REDACTED) else f"{m['name']}{m['sep']}{REDACTED}"


def _after_lead(m: re.Match[str]) -> str:
    return m[0] if m["value"] in ("", REDACTED) else f"{m['lead']}{REDACTED}"


def redact_text(text: str) -> str:
    """``text`` with every credential it carries replaced by ``[redacted]``."""
    if not text:
        return text
    text = _QUERY_PARAM.sub(_query_param, text)
    text = _HEADER.sub(_header, text)
    text = _BEARER.sub(_after_lead, text)
    return _SUBPROTOCOL.sub(_after_lead, text)


def redact_value(value: Any) -> Any:
    """A logged value with its credentials redacted: mappings and (name, value) pairs by
    name (headers as a dict, or ASGI's list of pairs), text by its content."""
    if value is None or isinstance(value, numbers.Number):  # numpy's too: `%d` still takes them
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, bytes | bytearray):
        return redact_text(bytes(value).decode("latin-1"))
    if isinstance(value, Mapping):
        return {k: REDACTED if _named_credential(k) else redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        if len(value) == 2 and isinstance(value, tuple) and _named_credential(value[0]):
            return (redact_value(value[0]), REDACTED)
        items = [redact_value(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return redact_text(str(value))  # a URL, a Headers object, an exception: as it would print


def _named_credential(name: Any) -> bool:
    if isinstance(name, bytes | bytearray):
        name = bytes(name).decode("latin-1")
    return isinstance(name, str) and is_credential_name(name)


# What a user asked to be spoken, logged only when the operator sets log_text: verbatim,
# since keys never travel in it and "Bearer of bad news" is no header.
_VERBATIM = {("voxwire.utterance", "text"), ("voxwire.utterance", "text_sent"), ("voxwire.utterance", "text_played")}


class RedactCredentials(logging.Filter):
    """Rewrites a record in place, before any formatter sees it, so that every format
    (and any other handler the record reaches after ours) gets the redacted line."""

    def filter(self, record: logging.LogRecord) -> bool:
        # The arguments one by one, so each path keeps its own end (a key is not run into
        # the next argument), then the whole line for what the format string joined.
        given = record.args
        if isinstance(given, Mapping):
            record.args = {k: REDACTED if _named_credential(k) else redact_value(v) for k, v in given.items()}
        elif given:
            record.args = tuple(redact_value(a) for a in given)
        message: str | None
        try:
            message = record.getMessage()
        except Exception:
            # An argument that only its own type formats (`%d` of an object with __index__):
            # the line as given, redacted whole.
            record.args = given
            try:
                message = record.getMessage()
            except Exception:  # a format that does not fit its arguments: logging reports both
                record.msg = redact_text(str(record.msg))
                record.args = redact_value(given) if given else given
                message = None
        if message is not None:
            record.msg, record.args = redact_text(message), ()
        for name, value in _fields(record).items():
            if (record.name, name) not in _VERBATIM:
                setattr(record, name, REDACTED if is_credential_name(name) else redact_value(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = _PLAIN.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


_PLAIN = logging.Formatter()

MAX_LOGGED_CHARS = 2048
"""The most of a line's message, or of one of its fields, that is written. Lines carry
what clients chose (a voice name, a message type): unbounded, one socket grew the log by
24 MB/s. What a user asked to be spoken (``log_text``) is bounded by ``max_text_chars``."""


def bounded(value: str, limit: int = MAX_LOGGED_CHARS) -> str:
    if len(value) <= limit:
        return value
    return f"{value[:limit]}… [{len(value) - limit} more characters]"


class BoundLines(logging.Filter):
    """Cuts a record's message and string fields at ``MAX_LOGGED_CHARS``. After
    ``RedactCredentials``: a key cut in two would no longer be recognised as one."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.msg, record.args = bounded(record.getMessage()), ()
        except Exception:  # a format that does not fit its arguments: logging reports both
            record.msg = bounded(str(record.msg))
        for name, value in _fields(record).items():
            if isinstance(value, str) and (record.name, name) not in _VERBATIM:
                setattr(record, name, bounded(value))
        return True


# C0 and C1 controls (ESC starts a terminal's escape sequences), and the Unicode line
# and paragraph separators that some viewers break lines at.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """A plain line that cannot be made into two, or recolour a terminal: each control
    character written as its escape (``\\n``, ``\\x1b``). JSON lines escape them already."""
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED}


def process_fields() -> dict[str, Any]:
    """What every line says of the process that wrote it: its pid and, where it has one,
    its worker index (an int). Read at each line, not at import: a Ray replica learns its
    index after this module may have been imported (server/ray_app.py). A value that is
    not an index is left out (``configure_logging`` says so once), never a crash."""
    index = worker_index()
    return {"pid": os.getpid(), **({"worker": index} if index is not None else {})}


def _exception(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    # exc_text first: RedactCredentials leaves the redacted traceback there.
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    return record.exc_text or None


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **process_fields(),
            **_fields(record),
        }
        if (exc := _exception(self, record)) is not None:
            out["exc"] = exc
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={escape_controls(str(v))}" for k, v in _fields(record).items())
        index = worker_index()
        who = f"[{index}] " if index is not None else ""
        message = escape_controls(record.getMessage())
        line = f"{when} {who}{record.levelname:<7} {record.name}: {message}" + (f"  {extra}" if extra else "")
        if (exc := _exception(self, record)) is not None:
            line += "\n" + exc
        return line


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """The root handler every logger reaches (``voxwire serve`` and each ``--workers``
    process call this): uvicorn's too, since server/run.py passes ``log_config=None``."""
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    # On the handler, not a logger: a logger's filter never sees its children's records.
    handler.addFilter(RedactCredentials())
    handler.addFilter(BoundLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's loggers go through the same handler, in the same format.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    given = os.environ.get(WORKER_INDEX_ENV)
    if given is not None and worker_index() is None:
        logging.getLogger(__name__).warning(
            "%s is %r, not a worker index (0, 1, ...): log lines carry no worker", WORKER_INDEX_ENV, given
        )
