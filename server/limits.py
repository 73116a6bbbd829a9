"""Bounds on what one client, and all of them together, may ask of the server."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SHARED_ADMISSION_ENV = "VOXWIRE_SHARED_ADMISSION"
WORKER_INDEX_ENV = "VOXWIRE_WORKER_INDEX"
"""This process's worker index: 0 .. N-1 among ``--workers N`` (server/processes.py) or
a Ray deployment's replicas (server/ray_app.py). It names the process in log lines
(server/logs.py), its slot in the shared admission file, and its metrics' ``worker`` label."""


def parse_worker_index(value: str | None) -> int | None:
    """A worker index as written in ``WORKER_INDEX_ENV``: a whole number from 0, else None
    (unset, empty, or anything else, e.g. a Ray replica id: not an index)."""
    if value is None:
        return None
    value = value.strip()
    if not value.isascii() or not value.isdigit():
        return None
    return int(value)


def worker_index(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's worker index (``WORKER_INDEX_ENV``), or None where it has none or
    the value is not an index."""
    return parse_worker_index((os.environ if environ is None else environ).get(WORKER_INDEX_ENV))


MIN_CONNECTIONS_PER_CLIENT = 8
"""The least ``max_connections_per_client`` is by default (server/doors/base.py, ``Gate``), so
that a small server (two connections) does not hold a client to a fraction of one."""


def _limit(default: float, help: str, low: float = 1, high: float | None = None) -> Any:
    return field(default=default, metadata={"help": help, "range": (low, high)})


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = _limit(256 * 1024, "largest client message; larger ones close with 1009", low=1024)
    max_text_chars: int = _limit(20_000, "text per utterance, summed over its streamed pieces")
    max_utterances_per_socket: int = _limit(8, "utterances active at once on one connection")
    max_utterances_total: int = _limit(64, "utterances active at once server-wide; beyond: overloaded, 1013")
    max_connections: int = _limit(256, "open connections; beyond: close 1013")
    # Beyond a step's jitter (~0.1 s here): only a worker that cannot keep up refuses,
    # not one busy with a newcomer's first step.
    max_listener_lag_seconds: float = _limit(
        0.25, "refuse new utterances (overloaded) while a listener has been out of audio still to be "
        "computed for longer than this (the worker cannot keep up with the listeners it has); 0: never, "
        "count only max_utterances_total", low=0,
    )
    # Predicted, where max_listener_lag_seconds only reacts: a burst admitted before anyone
    # is behind would otherwise break every listener it joins. Below 1 for what the worker's
    # steps do not count, the event loop's framing and sending on the same cores: a flood
    # of 64 listeners on 2 cores underran at 0.9 and not at 0.8 (benchmarks/README.md).
    max_worker_load: float = _limit(
        0.8, "refuse new utterances (overloaded) when the listeners being served, with the newcomer, would "
        "need more than this share of the worker's time to be heard in real time, each by its measured "
        "compute per second of audio (engines whose wider steps take longer, as on a CPU); a newcomer alone is "
        "always served; 0: never", low=0,
    )
    # So that one client cannot hold every slot. Per server process; a client is its
    # address, or behind a trusted proxy the address it forwards (--forwarded-allow-ips).
    max_connections_per_client: int | None = field(default=None, metadata={
        "help": "open connections one client address may hold (the address a trusted proxy forwards, behind "
        "one); beyond: close 1013, or 429 on HTTP", "range": (1, None),
        "default_text": f"a quarter of max_connections, at least {MIN_CONNECTIONS_PER_CLIENT}",
    })
    # At least one whole chunk (250 ms) and a little: a smaller queue could never release one.
    max_queue_seconds: float = _limit(
        5.0, "audio computed ahead of a slow reader before its utterance is skipped", low=0.5
    )
    flow_window_seconds: float = _limit(
        3.0, "for a client that reports playback progress: audio computed beyond what it has played "
        "before its utterance is held", low=0.5,
    )
    max_utterance_seconds: float = _limit(
        600.0, "audio one utterance may produce; an utterance that would speak longer ends with "
        "utterance_too_long after this much", low=1,
    )
    max_session_chars: int = _limit(1_000_000, "text per connection over its whole life")
    messages_per_second: float = _limit(
        100.0, "client messages per second per connection (token bucket rate)", low=0.1
    )
    message_burst: int = _limit(200, "token bucket size: a burst of messages allowed at once")
    # Every dropped message is answered, so a client that keeps sending far over the rate
    # costs the server as much as one that is served; past this it is a flood and is cut.
    max_dropped_messages: int = _limit(
        1000, "messages a connection may have dropped by the rate limit within 10 s; one more closes it "
        "(1008 on the socket)",
    )
    idle_timeout_seconds: float = _limit(
        300.0, "close a connection with no message and nothing playing after this; end an open utterance "
        "that receives no text for as long", low=0.1,
    )
    # 30 s: far longer than a player's buffer or a network hiccup, short enough that a few
    # clients who stopped listening cannot hold the server's slots for long.
    stall_timeout_seconds: float = _limit(
        30.0, "end an utterance with listener_stalled when its listener takes no audio (the socket "
        "accepts nothing once all audio sent could have played) or, once it reports progress, reports none "
        "while its audio waits, for this long; longer than any playback buffer or network hiccup, short "
        "enough that stalled clients cannot hold slots for long", low=0.5,
    )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class Admission:
    """Counts what is active server-wide; refuses rather than queueing without bound.

    This one counts within its process. With ``--workers``, ``SharedAdmission`` counts
    across them: the limits are server-wide in fact, whichever worker a client reaches.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._connections = 0
        self._utterances = 0

    @property
    def connections(self) -> int:
        return self._connections

    @property
    def utterances(self) -> int:
        return self._utterances

    def try_connect(self) -> bool:
        # A connection arriving while every utterance slot is taken could not speak.
        if self._connections >= self.limits.max_connections or self._utterances >= self.limits.max_utterances_total:
            return False
        self._connections += 1
        return True

    def disconnect(self) -> None:
        self._connections -= 1

    def try_start_utterance(self) -> bool:
        if self._utterances >= self.limits.max_utterances_total:
            return False
        self._utterances += 1
        return True

    def end_utterance(self) -> None:
        self._utterances -= 1


class SharedAdmission(Admission):
    """Admission across worker processes: each process's counts sit in its own two slots
    of a small shared file, and a check-and-take holds an exclusive ``flock`` on it. The
    kernel drops a lock when its process dies, so a crashed worker cannot wedge the
    others; its slots are zeroed by the parent before a replacement starts."""

    SLOT = struct.Struct("<qq")  # connections, utterances

    def __init__(self, limits: Limits, path: Path, index: int) -> None:
        super().__init__(limits)
        self._file = open(path, "r+b")  # noqa: SIM115 - held for the process's life
        self._map = mmap.mmap(self._file.fileno(), 0)
        self._index = index
        self._workers = len(self._map) // self.SLOT.size

    @staticmethod
    def create(path: Path, workers: int) -> None:
        path.write_bytes(bytes(SharedAdmission.SLOT.size * workers))

    @staticmethod
    def clear_worker(path: Path, index: int) -> None:
        """Zero a dead worker's counts (the parent calls it before restarting it)."""
        with open(path, "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(index * SharedAdmission.SLOT.size)
            f.write(SharedAdmission.SLOT.pack(0, 0))

    def _totals(self) -> tuple[int, int]:
        connections = utterances = 0
        for i in range(self._workers):
            c, u = self.SLOT.unpack_from(self._map, i * self.SLOT.size)
            connections, utterances = connections + c, utterances + u
        return connections, utterances

    def _add(self, connections: int, utterances: int) -> None:
        offset = self._index * self.SLOT.size
        c, u = self.SLOT.unpack_from(self._map, offset)
        self.SLOT.pack_into(self._map, offset, c + connections, u + utterances)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._file, fcntl.LOCK_UN)

    @property
    def connections(self) -> int:
        return self._totals()[0]

    @property
    def utterances(self) -> int:
        return self._totals()[1]

    def try_connect(self) -> bool:
        with self._locked():
            connections, utterances = self._totals()
            if connections >= self.limits.max_connections or utterances >= self.limits.max_utterances_total:
                return False
            self._add(1, 0)
            return True

    def disconnect(self) -> None:
        with self._locked():
            self._add(-1, 0)

    def try_start_utterance(self) -> bool:
        with self._locked():
            if self._totals()[1] >= self.limits.max_utterances_total:
                return False
            self._add(0, 1)
            return True

    def end_utterance(self) -> None:
        with self._locked():
            self._add(0, -1)


def admission_for_process(limits: Limits) -> Admission:
    """Shared admission in a worker process of ``--workers`` (server/processes.py names the
    file in the environment), otherwise this process's own."""
    path = os.environ.get(SHARED_ADMISSION_ENV)
    if not path:
        return Admission(limits)
    given = os.environ.get(WORKER_INDEX_ENV, "0")
    index = parse_worker_index(given)
    if index is None:
        # No slot to count in: another worker's slot would mix two processes' counts.
        log.warning("%s is %r, not a worker index: this process's limits are its own, not server-wide",
                    WORKER_INDEX_ENV, given)
        return Admission(limits)
    return SharedAdmission(limits, Path(path), index)


class TokenBucket:
    """Messages per second with a burst allowance: an LLM's token stream is bursty."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
