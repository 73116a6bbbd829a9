"""First audio beside busy neighbours: Voxwire and wyoming-piper, quiet and under load.

A voice-assistant backend shares its machine with ASR, an LLM client and other services.
This bench runs both servers (the same "joe" voice, each through its Wyoming door, read
by the same client) for a sweep of fresh sentences of 5 to 70 words, three times over:

- quiet: nothing else runs;
- busy: two processes that spin on a core each (``while True: pass``);
- torch: one process doing matrix multiplies on 2 torch threads (another model's server).

For each server and load: first-chunk p50, p95 and max, and the p95 over the same
server's quiet p95. The targets (issue 28): with two busy neighbours on this 2-core
machine, Voxwire's p95 within 2.5× its quiet p95, and at most wyoming-piper's.

    python -m voxwire.benchmarks.studies.contention --rounds 2 --out benchmarks/studies/results/contention

``--engine-only`` measures the floor under it: the engine alone in this process, no
server and no client, its first step for the same sentences, on one thread, on two, and
adapting (the server's default), each after the same pause.

Every loop is bounded (rounds × lengths × servers × loads), traffic stays on 127.0.0.1,
and the neighbours are killed when the bench ends, however it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voxwire.benchmarks.corpus import WARMUP
from voxwire.benchmarks.peers import SETTLE_S
from voxwire.benchmarks.report import save_results
from voxwire.benchmarks.wyoming import p95, synthesize, voxwire, wyoming_piper

LENGTHS = (5, 10, 20, 30, 40, 50, 60, 70)
"""Words per sentence: one sentence each, so first audio waits for the whole of it at
wyoming-piper (it sends each sentence whole) and for its first piece at Voxwire."""

_SPIN = "while True: pass"
_TORCH = (
    "import torch\n"
    "torch.set_num_threads(2)\n"
    "a = torch.randn(512, 512)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)
LOADS: dict[str, list[str]] = {"quiet": [], "busy": [_SPIN, _SPIN], "torch": [_TORCH]}
"""Each load: the Python programs its neighbour processes run."""

_WORDS = (
    "the morning train left the station late because a signal near the river had failed again "
    "so every passenger waited patiently while the driver explained what had happened and when "
    "they might arrive at the city where friends and families stood on the platform holding "
    "coffee umbrellas bags and small presents for the holidays that would begin next week after "
    "school closed and offices emptied across the quiet northern valley towns"
).split()


def sentence(words: int, rng: random.Random) -> str:
    """A fresh sentence of ``words`` words: no server has seen it, so nothing is cached."""
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return body[0].upper() + body[1:] + "."


@contextlib.contextmanager
def neighbours(programs: list[str]) -> Iterator[None]:
    """Processes that run ``programs`` beside the servers until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", p], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in programs]
    try:
        if procs:
            time.sleep(1.0)  # let them reach their steady state (torch's import, its threads)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def measure(servers: dict[str, tuple[int, str | None]], loads: list[str], rounds: int,
                  lengths: tuple[int, ...], seed: int) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Per load and server, one reading per sentence: its words and first-chunk ms."""
    rng = random.Random(seed)
    for port, voice in servers.values():
        for text in WARMUP:
            await synthesize("127.0.0.1", port, text, voice)
    out: dict[str, dict[str, list[dict[str, float]]]] = {load: {name: [] for name in servers} for load in loads}
    for load in loads:
        with neighbours(LOADS[load]):
            for _ in range(rounds):
                for words in lengths:
                    text = sentence(words, rng)  # the same fresh text for both servers
                    order = list(servers.items())
                    rng.shuffle(order)
                    for name, (port, voice) in order:
                        await asyncio.sleep(SETTLE_S)
                        r = await synthesize("127.0.0.1", port, text, voice)
                        out[load][name].append({"words": words, "first_chunk_ms": r.first_chunk_ms})
    return out


ENGINE_THREADS: dict[str, int | None] = {"adaptive": None, "1 thread": 1, "2 threads": 2}
"""The engine-only policies: the server's default, and each count pinned."""


def engine_floor(loads: list[str], rounds: int, lengths: tuple[int, ...], seed: int,
                 pause_s: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per load and thread policy, the p50, p95 and max ms of Piper's first step (open, then
    one step, as the worker runs them) of fresh sentences, each after ``pause_s`` idle."""
    from voxwire.engine.base import SynthesisParams
    from voxwire.engine.piper.engine import PiperEngine
    from voxwire.engine.threads import adapt_cpu_threads

    rng = random.Random(seed)
    out: dict[str, dict[str, dict[str, float]]] = {load: {} for load in loads}
    for policy, threads in ENGINE_THREADS.items():
        engine = PiperEngine(threads=threads)  # sets the process's pool: one policy at a time
        params = SynthesisParams(voice=engine.voices()[0].id)
        for text in WARMUP:
            engine.step([engine.open(text, params)])
        for load in loads:
            with neighbours(LOADS[load]):
                ms = []
                for _ in range(rounds):
                    for words in lengths:
                        time.sleep(pause_s)
                        start = time.perf_counter()
                        stream = engine.open(sentence(words, rng), params)
                        adapt_cpu_threads()
                        engine.step([stream])
                        ms.append((time.perf_counter() - start) * 1000)
                out[load][policy] = {"p50_ms": round(statistics.median(ms), 1), "p95_ms": round(p95(ms), 1),
                                     "max_ms": round(max(ms), 1)}
        engine.close()
    if "quiet" in out:
        for by_policy in out.values():
            for row in by_policy.values():
                row["p95_over_quiet_adaptive"] = round(row["p95_ms"] / out["quiet"]["adaptive"]["p95_ms"], 2)
    return out


def summarise(raw: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for load, by_server in raw.items():
        rows[load] = {}
        for name, readings in by_server.items():
            ms = [r["first_chunk_ms"] for r in readings]
            rows[load][name] = {
                "p50_ms": round(statistics.median(ms), 1),
                "p95_ms": round(p95(ms), 1),
                "max_ms": round(max(ms), 1),
                "readings": readings,
            }
    if "quiet" in rows:
        for load, by_server in rows.items():
            for name, row in by_server.items():
                row["p95_over_quiet_p95"] = round(row["p95_ms"] / rows["quiet"][name]["p95_ms"], 2)
    for by_server in rows.values():
        if {"voxwire", "wyoming-piper"} <= set(by_server):
            by_server["voxwire"]["p95_over_wyoming_piper_p95"] = round(
                by_server["voxwire"]["p95_ms"] / by_server["wyoming-piper"]["p95_ms"], 2
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.studies.contention", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="sweeps of the sentence lengths per load")
    p.add_argument("--loads", nargs="+", choices=list(LOADS), default=list(LOADS))
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="words per sentence")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--piper-backend", default="torch", choices=["torch", "onnx"])
    p.add_argument("--servers", nargs="+", choices=["voxwire", "wyoming-piper"], default=["voxwire", "wyoming-piper"])
    p.add_argument("--voxwire-nice", type=int, default=0, metavar="N",
                   help="run Voxwire as `nice -n N` would: below 0 (root or CAP_SYS_NICE) measures the "
                        "share a deployment can give it (README, Beside busy neighbours)")
    p.add_argument("--engine-only", action="store_true",
                   help="the engine's first step alone, in this process, per thread policy (no servers)")
    p.add_argument("--out", type=Path, help="a folder for results.json")
    args = p.parse_args(argv)
    if args.engine_only:
        floor = engine_floor(args.loads, args.rounds, tuple(args.lengths), args.seed, SETTLE_S)
        for load, by_policy in floor.items():
            for policy, row in by_policy.items():
                ratio = row.get("p95_over_quiet_adaptive")
                print(f"{load:6} {policy:10} first step p50 {row['p50_ms']:7.1f}  p95 {row['p95_ms']:7.1f}  "
                      f"max {row['max_ms']:7.1f}" + (f"  p95 / quiet adaptive p95 {ratio}" if ratio else ""))
        if args.out:
            save_results(args.out / "results.json", args, engine_floor=floor)
        return 0
    with contextlib.ExitStack() as stack:
        servers = {}
        if "voxwire" in args.servers:
            servers["voxwire"] = stack.enter_context(voxwire(args.piper_backend, args.voxwire_nice))
        if "wyoming-piper" in args.servers:
            servers["wyoming-piper"] = stack.enter_context(wyoming_piper())
        raw = asyncio.run(measure(servers, args.loads, args.rounds, tuple(args.lengths), args.seed))
    rows = summarise(raw)
    for load, by_server in rows.items():
        for name, row in by_server.items():
            extra = "".join(f"  {k} {v}" for k, v in row.items() if k.startswith("p95_over"))
            print(f"{load:6} {name:14} p50 {row['p50_ms']:7.1f}  p95 {row['p95_ms']:7.1f}  max {row['max_ms']:7.1f}{extra}")
    if args.out:
        save_results(args.out / "results.json", args, loads=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
