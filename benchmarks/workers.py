"""``--workers 1`` against ``--workers N`` on this machine, in one run.

Each round starts one server of each kind in turn (alternating, so both see the same
machine), waits until every worker's engine is loaded, and runs the same closed-loop load:
``clients`` sockets each speaking ``per_client`` utterances back to back, as fast as the
server answers (no simulated listening: this measures throughput). It reports the wall
time, utterances and audio seconds per second of wall time, and TTFA p50/p95/max.

    python -m voxwire.benchmarks.workers --workers 2 --rounds 3 --out benchmarks/results/workers
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.corpus import first_sentence
from voxwire.benchmarks.report import save_results
from voxwire.benchmarks.process import free_port, spawn_voxwire, stop
from voxwire.benchmarks.stats import percentiles


def ready_workers(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "voxwire_ready_workers":
                return sample.value
    return 0.0


async def one_server(workers: int, clients: int, per_client: int, texts: list[str], extra: list[str]) -> dict[str, Any]:
    port = free_port()
    proc = spawn_voxwire(port, "--workers", str(workers), "--cache-mb", "0", *extra)
    try:
        end = time.monotonic() + 180
        while ready_workers(port) < workers and time.monotonic() < end:
            await asyncio.sleep(0.2)
        url = f"ws://127.0.0.1:{port}/v1/stream"
        await loadgen.closed_loop(url, 1, 2, texts, listen=False)  # warm each path once
        start = time.monotonic()
        results = await loadgen.closed_loop(url, clients, per_client, texts, listen=False)
        wall = time.monotonic() - start
    finally:
        stop(proc)
    ok = [r for r in results if r.error is None]
    ttfa = [r.ttfa_ms for r in ok]
    return {
        "workers": workers,
        "wall_s": round(wall, 2),
        "utterances": len(ok),
        "errors": len(results) - len(ok),
        "utterances_per_s": round(len(ok) / wall, 3),
        "audio_s_per_s": round(sum(r.audio_ms for r in ok) / 1000 / wall, 2),
        "ttfa_ms": {k: round(v, 1) for k, v in percentiles(ttfa, (50, 95)).items()} | {"max": round(max(ttfa), 1)},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.workers", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="the N compared with one worker")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--per-client", type=int, default=2)
    p.add_argument("--piper-backend", default="torch", choices=("onnx", "torch"))
    p.add_argument("--out", type=Path, help="write workers.json there")
    args = p.parse_args(argv)
    texts = [first_sentence(n) for n in (12, 20, 28)]
    extra = ["--piper-backend", args.piper_backend]
    rounds = []
    for _ in range(args.rounds):
        rounds.append([asyncio.run(one_server(n, args.clients, args.per_client, texts, extra)) for n in (1, args.workers)])
    for one, many in rounds:
        print(
            f"workers 1: {one['wall_s']:6.2f} s, {one['audio_s_per_s']:5.2f} audio s/s, p95 TTFA {one['ttfa_ms']['p95']:7.1f} ms"
            f"  | workers {args.workers}: {many['wall_s']:6.2f} s, {many['audio_s_per_s']:5.2f} audio s/s, "
            f"p95 TTFA {many['ttfa_ms']['p95']:7.1f} ms  | throughput ratio {many['audio_s_per_s'] / one['audio_s_per_s']:.2f}"
        )
    if args.out:
        save_results(args.out / "workers.json", args, rounds=rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
