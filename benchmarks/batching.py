"""Continuous batching against one utterance per step, side by side in one run.

Two servers on 127.0.0.1, the same engine: one batched (the engine's own batch size) and
one with ``--max-batch 1``. Rounds alternate between them. For each it measures:

- **single**: TTFA of one listener alone (the replies, the result cache off);
- **burst**: N newcomers on fresh connections speak at the same instant, for several
  rounds; p50/p95 TTFA, p95 over the single-stream TTFA, and the underruns their
  listeners would hear (a 100 ms jitter buffer each);
- **held**: real-time listeners with staggered arrivals who speak again after listening
  (a 100 ms jitter buffer each); a level holds when no listener underran and p95 TTFA is
  at most 300 ms, and counts only if every lower level held too. It is read against the
  compute limit, 1 / single-stream RTF;
- **batch sizes**: how many utterances each engine step advanced (from /metrics).

And in this process, the **floor**: the time one batched engine step takes to compute
the burst's N first chunks, against the same N first steps one after another. On a CPU,
batching saves little arithmetic; the burst's p95 is then read against that floor.

``--voices N`` compares instead one voice against N voices in use at once, both batched:
the second server loads N copies of the default voice as N voices (the same cost per
stream as any voice of its quality), and listener or newcomer i speaks voice i mod N. A
step batches each voice's streams apart, so this is what a mix of voices costs.

    python -m voxwire.benchmarks.batching --out benchmarks/results/batching
    python -m voxwire.benchmarks.batching --voices 3
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.corpus import REPLIES
from voxwire.benchmarks.process import free_port, spawn_voxwire, stop
from voxwire.benchmarks.report import save_results
from voxwire.benchmarks.stats import percentiles

P95_TTFA_LIMIT_MS = 300.0


def voice_of(voices: Sequence[str], i: int) -> dict[str, str]:
    """Client i's voice setting: the i-th of ``voices`` in turn, or the server's default."""
    return {"voice": voices[i % len(voices)]} if voices else {}


async def single(url: str, rounds: int, voices: Sequence[str] = ()) -> list[loadgen.UtteranceResult]:
    ws = await loadgen.connect(url, None)
    try:
        return [await loadgen.speak(ws, REPLIES[i % len(REPLIES)], voice_of(voices, i)) for i in range(rounds)]
    finally:
        await ws.close()


async def burst(url: str, newcomers: int, round_no: int, voices: Sequence[str] = ()) -> list[loadgen.UtteranceResult]:
    """Connections open first, then all speak at once: TTFA excludes the handshakes."""
    sockets = await asyncio.gather(*(loadgen.connect(url, None) for _ in range(newcomers)))
    try:
        texts = [REPLIES[(round_no * newcomers + i) % len(REPLIES)] for i in range(newcomers)]
        return list(await asyncio.gather(*(
            loadgen.speak(ws, t, voice_of(voices, i)) for i, (ws, t) in enumerate(zip(sockets, texts))
        )))
    finally:
        for ws in sockets:
            await ws.close()


async def staggered(
    url: str, listeners: int, per_listener: int, spread_s: float, voices: Sequence[str] = (),
) -> list[loadgen.UtteranceResult]:
    async def listener(i: int) -> list[loadgen.UtteranceResult]:
        await asyncio.sleep(spread_s * i / listeners)
        ws = await loadgen.connect(url, None)
        out = []
        try:
            for k in range(per_listener):
                r = await loadgen.speak(ws, REPLIES[(i + k) % len(REPLIES)], voice_of(voices, i))
                out.append(r)
                await asyncio.sleep(loadgen.listening_s(r))
        finally:
            await ws.close()
        return out

    results = await asyncio.gather(*(listener(i) for i in range(listeners)))
    return [r for rs in results for r in rs]


def held_level(results: list[loadgen.UtteranceResult]) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    p95 = percentiles([r.ttfa_ms for r in ok])["p95"] if ok else float("nan")
    underruns = sum(r.underruns for r in ok)
    errors = len(results) - len(ok)
    return {"utterances": len(results), "p95_ttfa_ms": round(p95, 1), "underruns": underruns, "errors": errors,
            "held": errors == 0 and underruns == 0 and p95 <= P95_TTFA_LIMIT_MS}


async def batch_sizes(http: str) -> dict[str, float]:
    """Steps by batch size, from the cumulative histogram on /metrics."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{http}/metrics")).text
    buckets = {}
    for m in re.finditer(r'voxwire_batch_size_bucket\{[^}]*le="([^"]+)"[^}]*\} ([0-9.e+]+)', text):
        buckets[m.group(1)] = float(m.group(2))
    out, below = {}, 0.0
    for le, count in sorted(buckets.items(), key=lambda kv: float(kv[0])):
        out[f"<={le}"] = count - below
        below = count
    return out


def floor(newcomers: int, threads: int | None, precision: str = "auto") -> dict[str, float]:
    """In-process: N first chunks in one batched step, and N first steps one by one."""
    from voxwire.engine.base import SynthesisParams
    from voxwire.engine.piper.engine import PiperEngine

    engine = PiperEngine(threads=threads, precision=precision)
    engine.warmup()
    params = SynthesisParams(voice=engine.default_voice() or "joe")
    texts = [REPLIES[i % len(REPLIES)] for i in range(newcomers)]
    batched, alone = [], []
    for _ in range(5):
        streams = [engine.open(t, params) for t in texts]
        t0 = time.perf_counter()
        engine.step(streams)
        batched.append((time.perf_counter() - t0) * 1000)
        streams = [engine.open(t, params) for t in texts]
        t0 = time.perf_counter()
        for s in streams:
            engine.step([s])
        alone.append((time.perf_counter() - t0) * 1000)
    return {"batched_step_ms": round(statistics.median(batched), 1),
            "one_by_one_ms": round(statistics.median(alone), 1)}


async def measure(
    servers: dict[str, int], args: argparse.Namespace, voices: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """``voices``: each server's voices its clients take in turn (none: the default)."""
    urls = {name: f"ws://127.0.0.1:{port}/v1/stream" for name, port in servers.items()}
    chosen = {name: (voices or {}).get(name, []) for name in servers}
    out: dict[str, Any] = {name: {"single": [], "burst": [], "burst_underruns": 0, "burst_stall_ms": 0.0, "held": {}}
                           for name in servers}
    for name, url in urls.items():  # warm-up, including a burst's shapes
        await single(url, max(2, len(chosen[name])), chosen[name])
        await burst(url, args.newcomers, 0, chosen[name])
    for i in range(args.rounds):  # interleaved: both servers see the same moments of the machine
        for name, url in urls.items():
            out[name]["single"] += [r.ttfa_ms for r in await single(url, 2, chosen[name]) if r.error is None]
            ok = [r for r in await burst(url, args.newcomers, i + 1, chosen[name]) if r.error is None]
            out[name]["burst"] += [r.ttfa_ms for r in ok]
            out[name]["burst_underruns"] += sum(r.underruns for r in ok)
            out[name]["burst_stall_ms"] += sum(r.stall_ms for r in ok)
    for name, url in urls.items():
        rtf = [r.server.get("rtf", float("nan")) for r in await single(url, 4, chosen[name])]
        out[name]["rtf"] = statistics.median(rtf)
        passed = True
        for level in args.levels:
            if not passed:
                break
            result = held_level(await staggered(url, level, args.per_listener, args.spread, chosen[name]))
            out[name]["held"][level] = result
            passed = result["held"]
            print(f"{name:>9}: {level:2d} listeners: p95 TTFA {result['p95_ttfa_ms']:6.1f} ms, "
                  f"underruns {result['underruns']}, held {result['held']}")
        out[name]["batch_sizes"] = await batch_sizes(url.replace("ws://", "http://").replace("/v1/stream", ""))
    return out


def summarise(raw: dict[str, Any], floors: dict[str, dict[str, float]]) -> dict[str, Any]:
    rows = {}
    for name, r in raw.items():
        floor_ms = floors[name]
        single_p50 = statistics.median(r["single"])
        b = percentiles(r["burst"])
        held = [lvl for lvl, x in r["held"].items() if x["held"]]
        rows[name] = {
            "single_ttfa_p50_ms": round(single_p50, 1),
            "burst_ttfa_p50_ms": round(b["p50"], 1),
            "burst_ttfa_p95_ms": round(b["p95"], 1),
            "burst_p95_over_single": round(b["p95"] / single_p50, 2),
            "burst_p95_over_floor": round(b["p95"] / floor_ms["batched_step_ms"], 2),
            "floor_ms": floor_ms["batched_step_ms"],
            "burst_underruns": r["burst_underruns"],
            "burst_stall_ms": round(r["burst_stall_ms"]),
            "compute_limit": round(1 / r["rtf"], 1) if r["rtf"] else None,
            "held": max(held, default=0),
            "held_over_limit": round(max(held, default=0) * r["rtf"], 2) if r["rtf"] else None,
            "levels": r["held"],
            "batch_sizes": r.get("batch_sizes", {}),
            "single_ms": r["single"],
            "burst_ms": r["burst"],
        }
    return rows


def voice_copies(folder: Path, n: int) -> list[Path]:
    """``n`` voices that are the default voice's files under other names (links)."""
    from voxwire.engine.piper.engine import default_voices

    (joe,) = default_voices()
    paths = []
    for i in range(1, n + 1):
        model = folder / f"{joe.id}{i}.onnx"
        model.symlink_to(joe.model)
        Path(f"{model}.json").symlink_to(joe.config)
        paths.append(model)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--newcomers", type=int, default=8, help="newcomers in each burst")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of single and burst")
    p.add_argument("--levels", type=int, nargs="+", default=[4, 8, 12, 16], help="staggered listener counts")
    p.add_argument("--per-listener", type=int, default=5, help="utterances each staggered listener speaks")
    p.add_argument("--spread", type=float, default=0.7 * 8, help="seconds over which staggered listeners arrive")
    p.add_argument("--threads", type=int, default=None, help="engine threads (default: the server's default)")
    p.add_argument("--precisions", action="store_true",
                   help="compare two batched servers, --precision bf16 and --precision fp32, instead")
    p.add_argument("--voices", type=int, default=None,
                   help="compare one voice with this many voices in use at once (copies of the default voice)")
    p.add_argument("--out", type=Path, help="write batching.json (precision.json with --precisions) there")
    args = p.parse_args(argv)
    threads = ["--threads", str(args.threads)] if args.threads else []
    voices: dict[str, list[str]] = {}
    copies = tempfile.TemporaryDirectory(prefix="voxwire-voices-")
    if args.precisions:
        variants = {"bf16": ["--precision", "bf16"], "fp32": ["--precision", "fp32"]}
    elif args.voices:
        many = f"{args.voices} voices"
        paths = voice_copies(Path(copies.name), args.voices)
        variants = {"1 voice": [], many: [flag for path in paths for flag in ("--piper-voice", str(path))]}
        voices = {many: [path.name.removesuffix(".onnx") for path in paths]}
    else:
        variants = {"batched": [], "unbatched": ["--max-batch", "1"]}
    ports = {name: free_port() for name in variants}
    procs = [spawn_voxwire(ports[name], "--cache-mb", "0", *flags, *threads) for name, flags in variants.items()]
    try:
        raw = asyncio.run(measure(ports, args, voices))
    finally:
        for proc in procs:
            stop(proc)
        copies.cleanup()
    # The floor is a batched step: each precision's own where precisions are compared.
    if args.precisions:
        floors = {name: floor(args.newcomers, args.threads, name) for name in variants}
    else:
        shared = floor(args.newcomers, args.threads)
        floors = {name: shared for name in variants}
    rows = summarise(raw, floors)
    for name, f in floors.items():
        print(f"{name:>9} floor: {args.newcomers} first chunks in one batched step {f['batched_step_ms']} ms, "
              f"one by one {f['one_by_one_ms']} ms")
    for name, r in rows.items():
        print(f"{name:>9}: single {r['single_ttfa_p50_ms']} ms; burst of {args.newcomers} p50 "
              f"{r['burst_ttfa_p50_ms']} p95 {r['burst_ttfa_p95_ms']} ms = {r['burst_p95_over_single']}x single, "
              f"{r['burst_p95_over_floor']}x floor; held {r['held']} of limit {r['compute_limit']} "
              f"({r['held_over_limit']}x); batch sizes {r['batch_sizes']}")
    if args.out:
        name = "precision.json" if args.precisions else "voices.json" if args.voices else "batching.json"
        save_results(args.out / name, args, floor=next(iter(floors.values())), floors=floors, servers=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
