"""The one base of every error a client is told about."""

from __future__ import annotations


class CodedError(Exception):
    """A failure with a stable machine-readable ``code`` and a human ``message``.

    Each layer extends it with the fields its own errors carry: the engine's
    ``EngineError`` adds nothing; the server's protocol errors add the utterance id they
    concern. Whoever reports one sends ``code`` and ``message`` as they are."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
