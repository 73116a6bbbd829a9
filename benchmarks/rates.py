"""Time to first audio at every output rate and through both doors, in one run.

One server, one connection per door. Each round speaks a reply from the corpus at the
engine's native rate, at 8 kHz µ-law, 16, 24 and 48 kHz on the socket, and through
``POST /v1/audio/speech`` (24 kHz pcm: the time to the first audio byte). Rounds rotate
the replies, and the result cache is off, so no answer is served from memory. The figure
to read is each TTFA's median over the native rate's, measured in the same rounds.

    python -m voxwire.benchmarks.rates --rounds 8 --out benchmarks/results/rates
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.corpus import REPLIES
from voxwire.benchmarks.report import save_results
from voxwire.benchmarks.process import free_port, spawn_voxwire, stop

SOCKET = {
    "native": {},
    "8k mulaw": {"sample_rate": 8000, "format": "mulaw"},
    "16k": {"sample_rate": 16000},
    "24k": {"sample_rate": 24000},
    "48k": {"sample_rate": 48000},
}


async def openai_ttfa(http: httpx.AsyncClient, text: str) -> float:
    """Milliseconds from sending the request to the first byte of audio in the body."""
    body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm"}
    sent = time.perf_counter()
    first = float("nan")
    async with http.stream("POST", "/v1/audio/speech", json=body) as r:
        async for chunk in r.aiter_raw():  # read to the end: the next request starts clean
            if chunk and first != first:
                first = (time.perf_counter() - sent) * 1000
    return first


async def measure(port: int, rounds: int) -> dict[str, list[float]]:
    url = f"ws://127.0.0.1:{port}/v1/stream"
    out: dict[str, list[float]] = {name: [] for name in [*SOCKET, "openai 24k"]}
    ws = await loadgen.connect(url, None)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        await loadgen.speak(ws, "Warming up.", {})
        for i in range(rounds):
            for k, (name, settings) in enumerate(SOCKET.items()):
                r = await loadgen.speak(ws, REPLIES[(i + k) % len(REPLIES)], settings)
                out[name].append(r.ttfa_ms)
            out["openai 24k"].append(await openai_ttfa(http, REPLIES[(i + len(SOCKET)) % len(REPLIES)]))
    await ws.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.rates", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--piper-backend", default="torch", choices=("onnx", "torch"))
    p.add_argument("--out", type=Path, help="write rates.json there")
    args = p.parse_args(argv)
    port = free_port()
    proc = spawn_voxwire(port, "--cache-mb", "0", "--piper-backend", args.piper_backend)
    try:
        ttfa = asyncio.run(measure(port, args.rounds))
    finally:
        stop(proc)
    native = statistics.median(ttfa["native"])
    rows: dict[str, Any] = {}
    for name, values in ttfa.items():
        median = statistics.median(values)
        rows[name] = {"median_ms": round(median, 1), "ratio_to_native": round(median / native, 2), "ms": values}
        print(f"{name:>11}: TTFA median {median:6.1f} ms, {median / native:4.2f}x native")
    if args.out:
        save_results(args.out / "rates.json", args, ttfa=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
