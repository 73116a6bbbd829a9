"""Who may connect: API keys and browser origins.

Browsers cannot set headers on a WebSocket, so a key is also accepted as a ``token``
query parameter or as a ``voxwire.token.<key>`` subprotocol beside ``voxwire.v1``.
Keys are compared in constant time, each against every configured key, so the time
taken says nothing about how much of a key was right, or which key it was.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

from voxwire.server.config import AuthConfig

SUBPROTOCOL = "voxwire.v1"
TOKEN_SUBPROTOCOL_PREFIX = "voxwire.token."

# Close reasons (1008). A refused key is told how to send one: the socket was accepted
# before the key was checked, so this reason is all that reaches the user, and it must
# fit a WebSocket close frame (123 bytes).
KEY_REFUSED = "a valid API key is required: send Authorization: Bearer KEY, ?token=KEY or subprotocol voxwire.token.KEY"
ORIGIN_REFUSED = "origin not allowed"
# The 401's message on the HTTP routes (/v1/voices, /v1/audio/speech), which read the
# key from the header or the query: the one line a refused client sees, so it says how.
HTTP_KEY_REFUSED = "a valid API key is required: send Authorization: Bearer KEY (or ?token=KEY)"


def presented_key(headers: Mapping[str, str], query: Mapping[str, str], subprotocols: Sequence[str]) -> str | None:
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if query.get("token"):
        return query["token"]
    for p in subprotocols:
        if p.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return p[len(TOKEN_SUBPROTOCOL_PREFIX) :]
    return None


def key_is_valid(config: AuthConfig, key: str | None) -> bool:
    if not config.required:
        return True
    candidate = (key or "").encode()
    ok = False
    for k in config.api_keys:
        ok |= hmac.compare_digest(candidate, k.encode())
    return ok and key is not None


def presents_valid_key(
    config: AuthConfig, headers: Mapping[str, str], query: Mapping[str, str], subprotocols: Sequence[str] = (),
) -> bool:
    """Whether a request (or a WebSocket handshake) may pass: no key is required, or it
    presents a valid one, wherever it put it."""
    return key_is_valid(config, presented_key(headers, query, subprotocols))


def origin_is_allowed(config: AuthConfig, origin: str | None) -> bool:
    if not config.allowed_origins or origin is None:
        return True
    return origin.rstrip("/") in {o.rstrip("/") for o in config.allowed_origins}


def chosen_subprotocol(subprotocols: Sequence[str]) -> str | None:
    """Answer with the protocol name, never with the token a browser offered."""
    return SUBPROTOCOL if SUBPROTOCOL in subprotocols else None
