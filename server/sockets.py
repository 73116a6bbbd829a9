"""Listening sockets, as every door's listener makes them (HTTP and WebSocket, Wyoming)."""

from __future__ import annotations

import socket


SEND_BUFFER_BYTES = 64 * 1024
"""The kernel send buffer of each client connection (Linux doubles it for bookkeeping).
Without a cap the kernel grows it to megabytes for a client that stops reading, which is
then audio computed far ahead of what anyone hears: 93 s of it was measured before this.
Set on the listening socket, it is inherited by every connection accepted from it."""
MIN_USER_TIMEOUT_SECONDS = 60.0
GOODBYE_SECONDS = 5.0
"""How long a door's last words (an error, a close frame) may wait for the client to take
them: one that reads nothing must not hold a drain, or the task saying them."""


def user_timeout_seconds(stall_timeout_seconds: float) -> float:
    """How long the kernel keeps a connection whose sent data goes unacknowledged, or
    whose peer's receive window stays shut (TCP_USER_TIMEOUT). A listener that takes
    nothing is found stalled by the doors after ``stall_timeout_seconds`` and its
    utterances end, but a graceful close then waits for it to read; this drops the
    connection (its descriptor and buffers) in the end. Twice the stall timeout, and at
    least a minute: a peer that has merely paused is the doors' business, not the kernel's."""
    return max(2 * stall_timeout_seconds, MIN_USER_TIMEOUT_SECONDS)


def listening_socket(
    host: str, port: int, reuse_port: bool = False, stall_timeout_seconds: float | None = None
) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening; with ``stall_timeout_seconds``,
    its connections are dropped by the kernel as ``user_timeout_seconds`` says. Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # the Wyoming port under --workers: each worker binds it (server/doors/wyoming.py)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    if stall_timeout_seconds is not None and hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux
        milliseconds = round(user_timeout_seconds(stall_timeout_seconds) * 1000)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, milliseconds)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def held_socket(host: str, port: int, stall_timeout_seconds: float | None = None) -> socket.socket:
    """The HTTP port's socket, bound and listening before anything else starts, so a port
    in use ends start-up at once, and handed to every ``--workers`` process. Without
    SO_REUSEPORT: only this process and those it hands the socket to accept on the port,
    and another server refuses it. Listening at once is what holds it: Linux lets a
    second SO_REUSEADDR socket bind the same port until one of them listens.
    Raises OSError."""
    sock = listening_socket(host, port, stall_timeout_seconds=stall_timeout_seconds)
    try:
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock
