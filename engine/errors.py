"""The one base of every error a client is told about."""

from __future__ import annotations

from typing import Any


class CodedError(Exception):
    """A failure with a stable machine-readable ``code`` and a human ``message``.

    Each layer extends it with the fields its own errors carry: the engine's
    ``EngineError`` adds nothing; the server's protocol errors add the utterance id they
    concern. Whoever reports one sends ``code`` and ``message`` as they are.

    Every one pickles whole, its own fields included: Ray carries an exception from a
    replica to the process that called it that way (server/ray_app.py)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own reduce calls ``cls(*self.args)``, and args holds the message
        # alone: ``EngineError(message)`` fails (no code) and a subclass whose arguments
        # come in another order (``Invalid(message, code, param)``) would mix them up. So
        # no constructor runs: the instance is rebuilt from its args and its fields as
        # they are, whatever the subclass's signature.
        return (_rebuilt, (type(self), self.args), self.__dict__)


def _rebuilt(cls: type[CodedError], args: tuple[Any, ...]) -> CodedError:
    """An instance of ``cls`` with ``args``, its fields still to come (pickle sets them)."""
    return cls.__new__(cls, *args)


QUOTED_CHARS = 64


def quoted(value: str, limit: int = QUOTED_CHARS) -> str:
    """A client's string as an error message names it: quoted, and cut at ``limit``
    characters. Echoed whole, a 250 KB voice name made each error (and log line) as long."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"
