"""A bounded soak: many clients that listen, cancel and vanish, then a leak check.

    python -m voxwire.benchmarks.soak --clients 32 --duration 60 [--json out.json]

It starts a server of its own on 127.0.0.1 (or uses --url, with --pid for the readings),
warms it up (every batch width, then the soak's own load), takes a baseline of the
server's RSS, threads, open file descriptors and event-loop tasks, runs the clients for a
fixed time, lets the server settle, and checks that every reading returned to its
baseline. Traffic goes to loopback only, and every loop is bounded in count and time.
Exit status 1 means a leak or a lost utterance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
import websockets

from voxwire.benchmarks.report import save_results
from voxwire.benchmarks.process import fds, free_port, gauges, rss_mb, spawn_voxwire, stop, threads
from voxwire.engine.errors import ErrorCode

CORPUS = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "Your order has shipped, and it should arrive on Tuesday.",
    "I'm sorry, I didn't catch that. Could you say it again?",
    "Turn left in two hundred meters, then continue straight.",
    "Streaming speech starts at once. The rest follows while the listener hears the first words.",
]
BATCH_WIDTH = 8
"""The most utterances one engine step advances: Piper's batch size on a CPU (its
``CPU_MAX_BATCH``; tests/benchmarks/test_soak.py checks that they agree)."""
PREWARM_TEXT = CORPUS[-1]
"""What each pre-warm burst speaks: the longest entry, two sentences, so every kind of
window (a first piece, the steady ones, a sentence's last, a second segment's start)."""


@dataclass
class Readings:
    rss_mb: float
    threads: int
    fds: int
    tasks: int
    cache_mb: float = 0.0
    """Audio the result cache holds: memory the server means to keep, not a leak."""


@dataclass
class SoakResult:
    clients: int
    duration_s: float
    started: int = 0
    served: int = 0
    cancels: int = 0
    disconnects: int = 0
    refused: int = 0
    """Utterances refused ``overloaded`` (the worker could not keep up): the server's
    answer under a load past its cores, which the client waits out (``retry_after_ms``)."""
    unexpected: list[str] = field(default_factory=list)
    baseline: Readings | None = None
    peak_rss_mb: float = 0.0
    rss_timeline: list[tuple[float, float]] = field(default_factory=list)
    """(seconds into the soak, RSS MB), every few seconds: a leak climbs, a cache levels off."""
    final: Readings | None = None
    leaks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        ended = self.served + self.cancels + self.disconnects + self.refused
        return not self.leaks and not self.unexpected and self.started == ended


async def read_process(pid: int, http: str) -> Readings:
    """The least of a few readings: a socket the server is just closing (this reading's own
    HTTP request, say) is not a leak."""
    readings = []
    for _ in range(3):
        tasks, cache = await gauges(http, "voxwire_asyncio_tasks", "voxwire_cache_bytes")
        await asyncio.sleep(0.3)
        readings.append(Readings(rss_mb=rss_mb(pid), threads=threads(pid), fds=fds(pid), tasks=int(tasks),
                                 cache_mb=cache / 2**20))
    return Readings(*(min(getattr(r, f) for r in readings) for f in ("rss_mb", "threads", "fds", "tasks", "cache_mb")))


async def _client(url: str, deadline: float, rng: random.Random, result: SoakResult) -> None:
    n = 0
    while time.monotonic() < deadline:
        n += 1
        action = rng.choices(["listen", "cancel", "disconnect"], weights=[2, 1, 1])[0]
        stop_after = rng.randint(1, 6)
        ws = await websockets.connect(url, open_timeout=30)
        try:
            await asyncio.wait_for(ws.recv(), 30)
            ctx = f"s{n}"
            text = " ".join(rng.sample(CORPUS, rng.randint(1, 3)))
            await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": text}).decode())
            result.started += 1
            frames = 0
            while True:
                m = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(m, bytes):
                    frames += 1
                    if frames == stop_after and action == "disconnect":
                        ws.transport.abort()  # the client just vanishes, no close handshake
                        result.disconnects += 1
                        break
                    if frames == stop_after and action == "cancel":
                        await ws.send(orjson.dumps({"type": "cancel", "ctx": ctx}).decode())
                    continue
                event = orjson.loads(m)
                if event["type"] == "done":
                    result.served += 1
                    break
                if event["type"] == "cancelled":
                    result.cancels += 1
                    break
                if event["type"] == "error" and event["code"] == ErrorCode.OVERLOADED:
                    result.refused += 1
                    await asyncio.sleep(event["retry_after_ms"] / 1000)
                    break
                if event["type"] == "error":
                    result.unexpected.append(f"{event['code']}: {event['message']}")
                    break
        except Exception as e:  # noqa: BLE001 - every surprise is recorded, none is fatal
            result.unexpected.append(f"{type(e).__name__}: {e}")
        finally:
            if not ws.transport.is_closing():
                await ws.close()


async def prewarm(url: str, widths: int = BATCH_WIDTH, text: str = PREWARM_TEXT) -> None:
    """Bursts of 1, 2, ... ``widths`` utterances of ``text`` that start together, so that
    each burst is one batch of that width from its first step to its last."""
    for width in range(1, widths + 1):
        sockets = [await websockets.connect(url, open_timeout=30) for _ in range(width)]
        try:
            for ws in sockets:
                await asyncio.wait_for(ws.recv(), 30)  # ready
            # Sent together, after every socket is ready: the worker gathers a burst into one step.
            await asyncio.gather(*(_computed(ws, f"warm-{width}", text) for ws in sockets))
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))


async def _computed(ws: websockets.ClientConnection, ctx: str, text: str) -> None:
    """Speak ``text`` and read to its end, computed even if the result cache holds it: a
    streamed utterance (``final: false``, then its end) is never replayed from the cache,
    and ``first_clause_words: 0`` cuts it into the same segments as a whole text."""
    await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": text, "final": False,
                                "first_clause_words": 0}).decode())
    await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": "", "final": True}).decode())
    while True:
        m = await asyncio.wait_for(ws.recv(), 120)
        if isinstance(m, str) and (event := orjson.loads(m))["type"] in ("done", "error"):
            if event["type"] == "error":
                raise RuntimeError(f"pre-warm: {event['code']}: {event['message']}")
            return


async def soak(
    url: str, http: str, pid: int, clients: int, duration: float, warmup: float, seed: int, rss_tolerance_mb: float,
    prewarm_widths: int = BATCH_WIDTH,
) -> SoakResult:
    rng = random.Random(seed)
    # Which of oneDNN's kernels (each with its scratchpad, kept in its primitive cache) and
    # how much of the allocator's arenas exist at the baseline must not depend on chance:
    # whatever the measured window meets first reads as growth, and a run whose traffic
    # happened to meet new shapes late once failed CI's RSS bound. Random traffic cannot
    # cover them: which utterances share a step, and so the batch widths, are the timing's
    # choice. So first a pre-warm, each batch width in turn, 1 to the engine's batch size,
    # in lock step from first window to last: every width's kernels, for first pieces of
    # both lengths (a step starting enough newcomers makes longer ones), the steady windows
    # and a sentence's end, and the widest step's memory. A longer warm-up would only
    # make meeting them likelier, at the cost of its length on every run.
    if prewarm_widths:
        await prewarm(url, prewarm_widths)
        await _settle(http)
    # Then the soak's own load: the rest of what it meets (segments' ends, whose widths
    # vary with each utterance's durations, and mixed batches), and the allocator's arenas
    # at their working size. A lighter warm-up (4 clients) left the wider batches' first
    # use inside the measured window, where it read as a leak.
    warm = SoakResult(clients=clients, duration_s=warmup)
    end = time.monotonic() + warmup
    await asyncio.gather(*(_client(url, end, random.Random(rng.random()), warm) for _ in range(clients)))
    await _settle(http)
    result = SoakResult(clients=clients, duration_s=duration)
    result.baseline = await read_process(pid, http)
    end = time.monotonic() + duration

    async def sample_rss() -> None:
        start, last = time.monotonic(), -5.0
        while time.monotonic() < end:
            now, rss = time.monotonic() - start, rss_mb(pid)
            result.peak_rss_mb = max(result.peak_rss_mb, rss)
            if now - last >= 5.0:
                result.rss_timeline.append((round(now, 1), round(rss, 1)))
                last = now
            await asyncio.sleep(0.5)

    await asyncio.gather(
        sample_rss(), *(_client(url, end, random.Random(rng.random()), result) for _ in range(clients))
    )
    await _settle(http)
    result.final = final = await read_process(pid, http)
    base = result.baseline
    if final.tasks > base.tasks:
        result.leaks.append(f"event-loop tasks {base.tasks} -> {final.tasks}")
    if final.threads > base.threads:
        result.leaks.append(f"threads {base.threads} -> {final.threads}")
    if final.fds > base.fds:
        result.leaks.append(f"file descriptors {base.fds} -> {final.fds}")
    growth = (final.rss_mb - base.rss_mb) - (final.cache_mb - base.cache_mb)
    if growth > rss_tolerance_mb:
        result.leaks.append(f"RSS {base.rss_mb:.0f} -> {final.rss_mb:.0f} MB, {growth:.0f} MB of it not the result cache")
    return result


async def _settle(http: str, timeout: float = 20.0) -> None:
    """Wait until the server holds no connection and no utterance (it may take a moment
    to notice sockets that vanished)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await gauges(http, "voxwire_connections", "voxwire_worker_utterances") == (0, 0):
            await asyncio.sleep(0.5)  # let closing handshakes and task teardown finish
            return
        await asyncio.sleep(0.2)


def run(clients: int = 32, duration: float = 60, warmup: float = 5, seed: int = 1, port: int = 0,
        rss_tolerance_mb: float = 48.0) -> SoakResult:
    port = port or free_port()
    proc = spawn_voxwire(port)
    try:
        return asyncio.run(
            soak(f"ws://127.0.0.1:{port}/v1/stream", f"http://127.0.0.1:{port}", proc.pid, clients, duration, warmup,
                 seed, rss_tolerance_mb)
        )
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of traffic after the warm-up")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rss-tolerance-mb", type=float, default=48.0)
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args(argv)
    result = run(args.clients, args.duration, args.warmup, args.seed, rss_tolerance_mb=args.rss_tolerance_mb)
    summary = {**asdict(result), "ok": result.ok}
    if args.json:
        save_results(args.json, args, **summary)  # with the machine's facts: README's table comes from it
    print(json.dumps(summary, indent=2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
