"""Listening sockets, as every door's listener makes them (HTTP and WebSocket, Wyoming)."""

from __future__ import annotations

import socket


SEND_BUFFER_BYTES = 64 * 1024
"""The kernel send buffer of each client connection (Linux doubles it for bookkeeping).
Without a cap the kernel grows it to megabytes for a client that stops reading, which is
then audio computed far ahead of what anyone hears: 93 s of it was measured before this.
Set on the listening socket, it is inherited by every connection accepted from it."""


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening. Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # the Wyoming port under --workers: each worker binds it (server/wyoming.py)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def held_socket(host: str, port: int) -> socket.socket:
    """The HTTP port's socket, bound and listening before anything else starts, so a port
    in use ends start-up at once, and handed to every ``--workers`` process. Without
    SO_REUSEPORT: only this process and those it hands the socket to accept on the port,
    and another server refuses it. Listening at once is what holds it: Linux lets a
    second SO_REUSEADDR socket bind the same port until one of them listens.
    Raises OSError."""
    sock = listening_socket(host, port)
    try:
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock
