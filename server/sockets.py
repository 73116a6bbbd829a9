"""Listening sockets, as every door's listener makes them (HTTP and WebSocket, Wyoming)."""

from __future__ import annotations

import resource
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
    if reuse_port:  # the Wyoming port under --workers: each worker binds it (server/doors/wyoming/)
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
    return _listen(listening_socket(host, port, stall_timeout_seconds=stall_timeout_seconds))


def _listen(sock: socket.socket) -> socket.socket:
    try:
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def port_group(host: str, port: int, count: int, stall_timeout_seconds: float | None = None) -> list[socket.socket]:
    """``count`` sockets listening together on ``host:port`` with SO_REUSEPORT, one for each
    ``--workers`` process. The kernel hands each new connection to one of them by a hash of
    its addresses, so every worker gets its share; one socket shared by every worker went
    to whichever process woke first, 11 to all 16 of 16 connections to the same one.

    Another server is refused the port, as ``held_socket`` refuses it: the port is first
    claimed without SO_REUSEPORT, which fails while anything listens there, and a group
    already listening takes no socket that does not ask to share. (One that asks, of the
    same user, could join it: only another ``--workers`` Voxwire asks, and it makes this
    same claim first.) Raises OSError."""
    probe = held_socket(host, port)
    port = probe.getsockname()[1]
    group: list[socket.socket] = []
    try:
        probe.close()  # free the port for the group, a moment later
        for _ in range(count):
            sock = listening_socket(host, port, reuse_port=True, stall_timeout_seconds=stall_timeout_seconds)
            group.append(sock)
            sock.listen()
    except OSError:
        for sock in group:
            sock.close()
        raise
    return group


def joined_group(host: str, port: int, stall_timeout_seconds: float | None = None) -> socket.socket:
    """A socket of its own for a worker that replaces a dead one, joining the port's group
    (``port_group``) once it can serve, so that no connection waits for its engine to load:
    the dead worker's socket went with it, and its siblings take the connections meanwhile.
    Raises OSError."""
    return _listen(listening_socket(host, port, reuse_port=True, stall_timeout_seconds=stall_timeout_seconds))


_handed: dict[int, socket.socket] = {}


def hand_over(sock: socket.socket) -> None:
    """Keep a listening socket that the parent process made for this one (server/processes.py)
    for the door that listens on its port (``handed``)."""
    _handed[sock.getsockname()[1]] = sock


def handed(port: int) -> socket.socket | None:
    """The socket handed over for ``port``, taken once; None: the door binds its own."""
    return _handed.pop(port, None)


MIN_HTTP_CONNECTIONS = 16
"""The least the HTTP connections' bound is lowered to, however tight the descriptor limit:
enough for the probes and the API to get in."""
DESCRIPTORS_KEPT = 128
"""File descriptors kept back from the HTTP connections' bound (``fit_descriptors``) for
everything else a process opens: the engine's files, logs, pipes, the metrics' files."""


def fit_descriptors(connections: int, reserved: int) -> int:
    """How many HTTP connections this process can hold open, at most ``connections``: past
    its descriptor limit (RLIMIT_NOFILE) accept() fails, and every port stops answering,
    probes included. The soft limit is raised as far as needed, up to the hard one (as Go's
    runtime does); what still does not fit, beside ``reserved`` descriptors (the other
    doors' connections) and ``DESCRIPTORS_KEPT``, is left out of the bound."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + reserved + DESCRIPTORS_KEPT
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return connections
    return min(connections, max(MIN_HTTP_CONNECTIONS, soft - reserved - DESCRIPTORS_KEPT))
