"""Starting streamed text at a clause: ``python -m voxwire.benchmarks.quality.clauses``.

An LLM writes its answer at a few words a second. Voxwire waits for the first sentence's
end before it speaks, and at that pace the wait is most of the time to first audio. With
``first_clause_words`` N (protocol v1, docs/protocol.md), the first segment may end at a
clause boundary once N words precede it. Each policy (N, and 0: wait for the sentence) is
measured on the quality corpus, two ways, and the default is chosen from both:

1. **When it starts.** A Voxwire server (its own process) hears every reply streamed as an
   LLM sends it: a token at a time (words and punctuation, as a BPE tokenizer splits
   them) at ``--tokens-per-second``, on a connection configured with the policy. First
   audio is timed from sending the first token. The utterance is cancelled once its first
   audio arrives: the rest says nothing about the start.
2. **What is heard.** The same tokens go through the same segmenter, and each segment is
   synthesised by the engine in this process, as the server's worker does, seeded by the
   reply's text. Whisper and DNSMOS hear the whole answers (``score``), and the seam ratio
   is measured at every join and at the segment joins alone, where a clause was cut off
   from the rest of its sentence.

    python -m voxwire.benchmarks.quality.clauses --out benchmarks/results/quality

Writes clauses.json to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from voxwire.benchmarks import corpus, machine
from voxwire.benchmarks.loadgen import Heard, joins
from voxwire.benchmarks.peers import SETTLE_S
from voxwire.benchmarks.process import free_port, spawn_voxwire, stop
from voxwire.benchmarks.quality.asr import Transcriber
from voxwire.benchmarks.quality.score import Sample, heard_sample, score
from voxwire.benchmarks.quality.seams import seam_ratios
from voxwire.benchmarks.stats import summary
from voxwire.engine.text.segment import Segmenter, SegmenterLimits

POLICIES = (0, 2, 3, 4, 5, 6)
TOKENS_PER_SECOND = 20.0
SEED = 1234

_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[clauses {time.monotonic() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


def segments(text: str, words: int) -> list[str]:
    """What the server's segmenter makes of ``text`` streamed a token at a time."""
    s = Segmenter(SegmenterLimits(first_clause_words=words))
    pieces = corpus.llm_tokens(text)
    out = [seg for token in pieces[:-1] for seg in s.push(token)]
    return out + s.push(pieces[-1], final=True) + s.flush()


# -- 1. when the first audio starts -------------------------------------------------------


async def first_audio_ms(client: Any, text: str, ctx: str, pace_s: float) -> float:
    """Stream ``text``'s tokens at ``pace_s`` apart; the time from the first to the first audio."""
    from voxwire_client import Audio

    tokens = corpus.llm_tokens(text)
    start = time.perf_counter()
    utterance = await client.speak(tokens[0], ctx=ctx, final=len(tokens) == 1)

    async def write() -> None:
        for i, token in enumerate(tokens[1:], 1):
            await asyncio.sleep(max(0.0, start + i * pace_s - time.perf_counter()))
            await utterance.send(token, final=i == len(tokens) - 1)

    writer = asyncio.create_task(write())
    first = float("nan")
    try:
        async for item in utterance:
            if isinstance(item, Audio):
                first = (item.received_at - start) * 1000
                break
            if item.type in ("done", "error", "cancelled"):
                raise RuntimeError(f"{ctx}: {item.data}")
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await utterance.close()
    return first


async def time_policies(url: str, texts: list[str], policies: tuple[int, ...], pace_s: float) -> dict[int, list[float]]:
    """Every policy hears every text; the policies in a shuffled order for each text, each
    after a pause, so that background load falls on them alike."""
    from voxwire_client import Client

    clients = {}
    for words in policies:
        clients[words] = await Client.connect(url, report_progress=False)
        await clients[words].configure(first_clause_words=words)
    out: dict[int, list[float]] = {w: [] for w in policies}
    try:
        for words, client in clients.items():  # warm-up, unkept
            for j, text in enumerate(corpus.WARMUP):
                await first_audio_ms(client, text, f"w{words}-{j}", pace_s)
        for i, text in enumerate(texts):
            if i % 20 == 0:
                log(f"timing reply {i + 1} of {len(texts)}")
            for words in random.Random(i).sample(policies, len(policies)):
                await asyncio.sleep(SETTLE_S)
                out[words].append(await first_audio_ms(clients[words], text, f"t{i}-{words}", pace_s))
    finally:
        for client in clients.values():
            await client.close()
    return out


# -- 2. what is heard ---------------------------------------------------------------------


def started_early(texts: list[str], words: int) -> list[int]:
    """The replies whose first segment this policy ends at a clause, before its sentence's end."""
    return [i for i, text in enumerate(texts) if segments(text, words)[0] != segments(text, 0)[0]]


def hear_policies(
    texts: list[str], policies: tuple[int, ...]
) -> tuple[dict[int, list[Sample]], dict[int, list[float]], dict[int, list[float]]]:
    """Each policy's answers as the listener hears them, its seam ratios at every segment
    join, and at the joins it made early (where a clause was cut off from its sentence)."""
    import torch

    from voxwire.engine.base import SynthesisParams
    from voxwire.engine.registry import EngineOptions, engine_factory

    engine = engine_factory(EngineOptions(name="piper"))()
    params = SynthesisParams(voice=engine.default_voice() or "")
    heard: dict[int, list[Sample]] = {w: [] for w in policies}
    segment_seams: dict[int, list[float]] = {w: [] for w in policies}
    clause_seams: dict[int, list[float]] = {w: [] for w in policies}
    try:
        for i, text in enumerate(texts):
            if i % 20 == 0:
                log(f"synthesising reply {i + 1} of {len(texts)}")
            waiting = segments(text, 0)
            spoken: dict[tuple[str, ...], tuple[Sample, np.ndarray, list[int]]] = {}
            for words in policies:
                segs = tuple(segments(text, words))
                early = segs[0] != waiting[0]
                if segs not in spoken:  # most policies segment a reply alike: the same seed, the same audio
                    torch.manual_seed(zlib.crc32(text.encode("utf-8")) + SEED)
                    pieces, starts, total = [], [], 0
                    for seg in segs:
                        starts.append(total)
                        pieces += [p for p in engine.synthesize(seg, params) if isinstance(p, np.ndarray) and p.size]
                        total = sum(p.size for p in pieces)
                    audio = np.concatenate(pieces).astype(np.float32)
                    sample = heard_sample(text, Heard(audio, engine.sample_rate, joins([p.size for p in pieces])),
                                          float("nan"), chunked=True)
                    spoken[segs] = sample, audio, starts
                sample, audio, starts = spoken[segs]
                heard[words].append(sample)
                try:
                    segment_seams[words] += seam_ratios(audio, engine.sample_rate, starts[1:])
                    if early:  # the first join is the clause's
                        clause_seams[words] += seam_ratios(audio, engine.sample_rate, starts[1:2])
                except ValueError:  # joins too close together to compare with anything
                    pass
    finally:
        engine.close()
    return heard, segment_seams, clause_seams


def _seams(values: list[float]) -> dict[str, float]:
    return {"joins": len(values), "median": round(float(np.median(values)), 3) if values else float("nan"),
            "p90": round(float(np.percentile(values, 90)), 3) if values else float("nan"),
            "worst": round(max(values), 3) if values else float("nan")}


def run(texts: list[str], policies: tuple[int, ...], tokens_per_second: float) -> dict[str, Any]:
    port = free_port()
    log(f"a Voxwire server on port {port}; {len(policies)} policies time {len(texts)} replies")
    server = spawn_voxwire(port)
    try:
        times = asyncio.run(time_policies(f"ws://127.0.0.1:{port}/v1/stream", texts, policies, 1 / tokens_per_second))
    finally:
        stop(server)
    heard, segment_seams, clause_seams = hear_policies(texts, policies)
    log("listening: Whisper and DNSMOS")
    transcriber = Transcriber()
    rows = {}
    for words in policies:
        figures = score(heard[words], transcriber)
        figures.pop("ttfa_ms")  # timed over the socket instead
        # Most replies have no clause early in their first sentence, and every policy
        # speaks them alike: the replies this one started early show what it changes.
        early = started_early(texts, words)
        subset = score([heard[words][i] for i in early], transcriber) if early else {}
        waiting = score([heard[0][i] for i in early], transcriber) if early and 0 in heard else {}
        rows[str(words)] = {
            "first_clause_words": words,
            "first_audio_ms": summary(times[words]),
            **figures,
            "segment_seams": _seams(segment_seams[words]),
            "started_early": {
                "replies": len(early),
                "first_audio_ms": summary([times[words][i] for i in early]),
                "waiting_first_audio_ms": summary([times[0][i] for i in early]) if 0 in times else None,
                "wer": subset.get("wer", float("nan")),
                "waiting_wer": waiting.get("wer", float("nan")),
                "dnsmos_ovrl": subset["dnsmos"]["ovrl"] if subset else float("nan"),
                "waiting_dnsmos_ovrl": waiting["dnsmos"]["ovrl"] if waiting else float("nan"),
                "clause_seams": _seams(clause_seams[words]),
            },
        }
        log(f"N={words}: first audio p50 {rows[str(words)]['first_audio_ms']['p50']:.0f} ms, "
            f"WER {figures['wer']:.2f}%, DNSMOS {figures['dnsmos']['ovrl']:.2f}, "
            f"segment seams {rows[str(words)]['segment_seams']}")
    return {
        "machine": machine.facts("cpu"),
        "config": {"sentences": len(texts), "corpus": "benchmarks/corpus/quality.txt", "policies": list(policies),
                   "tokens_per_second": tokens_per_second, "tokens": "words and punctuation runs (corpus.llm_tokens)",
                   "asr": transcriber.name, "seed": SEED, "settle_s": SETTLE_S,
                   "default": SegmenterLimits.first_clause_words},
        "rows": rows,
        "elapsed_s": round(time.monotonic() - _T0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.quality.clauses", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write clauses.json there")
    p.add_argument("--sentences", type=int, help="only the corpus's first N replies (default: all)")
    p.add_argument("--policies", default=",".join(map(str, POLICIES)),
                   help=f"first_clause_words values to compare, 0 = wait for the sentence (default: {POLICIES})")
    p.add_argument("--tokens-per-second", type=float, default=TOKENS_PER_SECOND)
    args = p.parse_args(argv)
    policies = tuple(int(w) for w in args.policies.split(","))
    results = run(corpus.quality()[: args.sentences], policies, args.tokens_per_second)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "clauses.json").write_text(json.dumps(results, indent=2, allow_nan=True))
    print(json.dumps({k: {"first_audio_p50": v["first_audio_ms"]["p50"], "wer": v["wer"],
                          "dnsmos": v["dnsmos"]["ovrl"], "segment_seams": v["segment_seams"]["median"]}
                      for k, v in results["rows"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
