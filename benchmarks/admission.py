"""Admission past capacity: more real-time listeners than the cores can serve, against a
server that predicts its capacity and one that only reacts, side by side in one run.

- **predicted** (the default): a newcomer is refused while the listeners being served,
  with it, would need more than ``--max-worker-load`` of the worker's time, each by its
  measured compute per second of audio; and, as below, while a listener is behind.
- **reactive** (``--max-worker-load 0``): a newcomer is refused only once a listener has
  been out of audio for ``--max-listener-lag-seconds``.

Listeners arrive ``--gap`` seconds apart, each on its own session. Each speaks
``--per-listener`` answers and hears each out in real time behind a 100 ms jitter buffer;
one refused goes on to its next answer. Rounds alternate between the servers. For each:
the answers served and refused, how many of those served underran and for how long,
against the audio served, and the p95 first audio of those served.

    python -m voxwire.benchmarks.admission --out benchmarks/results/admission
    python -m voxwire.benchmarks.admission --door openai
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.corpus import REPLIES
from voxwire.benchmarks.process import free_port, spawn_voxwire, stop
from voxwire.benchmarks.protocols import REFUSALS, Opener, Target
from voxwire.benchmarks.report import save_results
from voxwire.benchmarks.stats import percentiles

VARIANTS: dict[str, list[str]] = {"predicted": [], "reactive": ["--max-worker-load", "0"]}


def url(port: int, door: str) -> str:
    return f"ws://127.0.0.1:{port}/v1/stream" if door == "ws" else f"http://127.0.0.1:{port}/v1/audio/speech"


def outcome(results: list[loadgen.UtteranceResult]) -> dict[str, Any]:
    served = [r for r in results if r.error is None]
    refused = sum(r.error in REFUSALS for r in results)
    audio_s = sum(r.audio_ms for r in served) / 1000
    stall_s = sum(r.stall_ms for r in served) / 1000
    return {
        "answers": len(results),
        "served": len(served),
        "refused": refused,
        "errors": len(results) - len(served) - refused,
        "underran": sum(r.underruns > 0 for r in served),
        "stall_s": round(stall_s, 1),
        "audio_s": round(audio_s, 1),
        "stall_per_audio_s": round(stall_s / audio_s, 3) if audio_s else None,
        "ttfa_p95_ms": round(percentiles([r.ttfa_ms for r in served])["p95"], 1) if served else None,
    }


def total(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one server summed; p95 first audio is the worst round's."""
    keys = ("answers", "served", "refused", "errors", "underran", "stall_s", "audio_s")
    out: dict[str, Any] = {k: round(sum(r[k] for r in rounds), 1) for k in keys}
    out["stall_per_audio_s"] = round(out["stall_s"] / out["audio_s"], 3) if out["audio_s"] else None
    p95 = [r["ttfa_p95_ms"] for r in rounds if r["ttfa_p95_ms"] is not None]
    out["ttfa_p95_ms"] = max(p95, default=None)
    return out


async def measure(openers: dict[str, Opener], args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    for opener in openers.values():  # warm-up, which also gives the worker its first figures
        await opener.prepare()
        await loadgen.staggered(opener, 2, 4, REPLIES, 0.5)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in openers}
    for i in range(args.rounds):  # interleaved: both servers see the same moments of the machine
        for name, opener in openers.items():
            texts = REPLIES[i % len(REPLIES):] + REPLIES[:i % len(REPLIES)]
            results = await loadgen.staggered(
                opener, args.listeners, args.listeners * args.per_listener, texts, args.gap * args.listeners,
            )
            out[name].append(outcome(results))
            r = out[name][-1]
            print(f"round {i + 1} {name:>9}: served {r['served']}, refused {r['refused']}, errors {r['errors']}; "
                  f"{r['underran']} underran, {r['stall_s']} s stall over {r['audio_s']} s; "
                  f"p95 first audio {r['ttfa_p95_ms']} ms", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.admission", description=__doc__.split("\n\n")[0])
    p.add_argument("--listeners", type=int, default=32, help="listeners in each round")
    p.add_argument("--gap", type=float, default=0.3, help="seconds between two listeners' arrivals")
    p.add_argument("--per-listener", type=int, default=2, help="answers each listener speaks")
    p.add_argument("--rounds", type=int, default=2, help="rounds per server, interleaved")
    p.add_argument("--max-worker-load", type=float, help="the predicting server's limit (default: the server's)")
    p.add_argument("--door", choices=("ws", "openai"), default="ws", help="protocol v1, or the OpenAI route")
    p.add_argument("--out", type=Path, help="write DOOR-LISTENERS.json there (ws-32.json)")
    args = p.parse_args(argv)
    variants = dict(VARIANTS)
    if args.max_worker_load is not None:
        variants["predicted"] = ["--max-worker-load", str(args.max_worker_load)]
    ports = {name: free_port() for name in variants}
    procs = [spawn_voxwire(ports[name], "--cache-mb", "0", *flags) for name, flags in variants.items()]
    try:
        openers = {name: Opener(Target(name, url(port, args.door))) for name, port in ports.items()}
        rounds = asyncio.run(measure(openers, args))
    finally:
        for proc in procs:
            stop(proc)
    servers = {name: {**total(r), "rounds": r} for name, r in rounds.items()}
    for name, r in servers.items():
        print(f"{name:>9}: served {r['served']} of {r['answers']}, refused {r['refused']}; {r['underran']} underran, "
              f"{r['stall_s']} s stall over {r['audio_s']} s of audio ({r['stall_per_audio_s']} s a second)")
    if args.out:
        save_results(args.out / f"{args.door}-{args.listeners}.json", args, servers=servers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
