"""What users would run instead, measured the same way: Piper's own HTTP server
(``python -m piper.http_server`` from piper-tts, with the same voice file), which
synthesises the whole text and then sends one WAV."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.process import free_port, stop, wait_http


@dataclass(frozen=True)
class PeerResult:
    words: int
    ttfb_ms: float
    """Time to the first byte of the response body: the earliest a client could play."""
    total_ms: float
    audio_ms: float


def spawn_piper_http(model: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "piper.http_server", "-m", str(model), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/voices", proc)
    return proc, base


async def measure(base: str, texts: list[str], concurrency: int = 1) -> list[PeerResult]:
    async def one(client: httpx.AsyncClient, text: str) -> PeerResult:
        start = time.perf_counter()
        first = None
        size = 0
        async with client.stream("POST", f"{base}/synthesize", json={"text": text}) as r:
            r.raise_for_status()
            async for chunk in r.aiter_raw():
                if first is None and chunk:
                    first = time.perf_counter() - start
                size += len(chunk)
        total = time.perf_counter() - start
        # 16-bit mono WAV at the voice's 22050 Hz, after a 44-byte header.
        return PeerResult(len(text.split()), (first or total) * 1000, total * 1000, (size - 44) / 2 / 22050 * 1000)

    async with httpx.AsyncClient(timeout=120) as client:
        results: list[PeerResult] = []
        for i in range(0, len(texts), concurrency):
            batch = texts[i : i + concurrency]
            results += await asyncio.gather(*(one(client, t) for t in batch))
        return results


def run(model: Path, texts: list[str], concurrency: int = 1) -> list[PeerResult]:
    proc, base = spawn_piper_http(model)
    try:
        return asyncio.run(measure(base, texts, concurrency))
    finally:
        stop(proc)
