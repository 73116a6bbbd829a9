"""Listening sockets, as every door's listener makes them (HTTP and WebSocket, Wyoming)."""

from __future__ import annotations

import socket


SEND_BUFFER_BYTES = 64 * 1024
"""The kernel send buffer of each client connection (Linux doubles it for bookkeeping).
Without a cap the kernel grows it to megabytes for a client that stops reading, which is
then audio computed far ahead of what anyone hears: 93 s of it was measured before this.
Set on the listening socket, it is inherited by every connection accepted from it."""


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # --workers: every process binds the same port; the kernel spreads connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    sock.bind((host, port))
    return sock
