"""Request bodies read no further than a bound, declared (Content-Length) or chunked.

A route that takes a body names its bound and reads through :class:`Body`: a declared
length over the bound is refused before a byte is read, and a chunked body is counted as
it arrives and refused once it passes the bound, so no more than the bound (and uvicorn's
64 KiB read buffer) is ever held. The HTTP doors use it for ``POST /v1/audio/speech`` and
``POST /v1/voices``.

A route that answers before the body has ended must not leave the rest to uvicorn: it
would read and drop whatever the client goes on sending, without limit, to keep the
connection for a next request. :meth:`Body.settle` reads what is left within a small
bound, so an answer to an ordinary request keeps its connection, and past it marks the
answer ``Connection: close``: uvicorn then closes the connection once the answer is sent,
and the client's next send fails, which HTTP clients (httpx, curl, browsers) take as the
cue to read the answer already there.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message


class TooLarge(Exception):
    """The body is, or has been declared, larger than its bound."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit} bytes")
        self.limit = limit


def declared_length(request: Request) -> int | None:
    """The body's Content-Length, or None for a chunked body (uvicorn refuses a request
    whose Content-Length is not a number before any route sees it)."""
    value = request.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


def declared_media_type(request: Request) -> str:
    """The Content-Type without its parameters (``; charset=utf-8``), lower-cased: "" if none."""
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


class Body:
    """One request's body, counted as it is received and refused past ``limit`` bytes.

    Read it with :meth:`read`, or hand :attr:`request` (the same request, its stream
    counted) to a parser such as Starlette's ``form()``; either raises :class:`TooLarge`
    once the body passes the bound, and ``ClientDisconnect`` if the client hangs up."""

    def __init__(self, request: Request, limit: int) -> None:
        self.limit = limit
        self.declared = declared_length(request)
        self.received = 0
        self.complete = False
        self._receive = request.receive
        self.request = Request(request.scope, self._counted)

    @property
    def declared_too_large(self) -> bool:
        return self.declared is not None and self.declared > self.limit

    async def _counted(self) -> Message:
        if self.declared_too_large:
            raise TooLarge(self.limit)  # before reading any of it
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.received > self.limit:
                raise TooLarge(self.limit)
        return message

    async def read(self) -> bytes:
        """All of the body: at most ``limit`` bytes."""
        chunks: list[bytes] = []
        async for chunk in self.request.stream():
            chunks.append(chunk)
        return b"".join(chunks)

    async def drain(self, budget: int) -> bool:
        """Read and drop the rest of the body, if it ends within ``budget`` more bytes
        (a declared length that would not is not read at all). True when it has ended."""
        if self.complete:
            return True
        if self.declared is not None and self.declared - self.received > budget:
            return False
        stop = self.received + budget
        while not self.complete and self.received < stop:
            message = await self._receive()
            if message["type"] != "http.request":
                return False  # the client hung up: nobody is left to keep a connection for
            self.received += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
        return self.complete

    async def settle(self, response: Response, budget: int) -> Response:
        """``response``, once the body is read to its end within ``budget`` more bytes;
        past that (or for a body refused as too large), marked to close the connection."""
        if not await self.drain(budget):
            response.headers["connection"] = "close"
        return response
