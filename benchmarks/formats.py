"""What the compressed formats cost and save, in one run: bytes, TTFA and encoding time.

One server (Piper, no result cache), one connection, concurrency 1. Each round speaks a
reply from the corpus in every format (the replies rotate through the formats, so each
format hears every reply), all at the engine's 22.05 kHz but Opus, which is 48 kHz.

- bytes: each utterance's ``done.bytes`` over what pcm_s16le at 22.05 kHz takes for the
  same audio (44 100 bytes a second, from ``done.audio_ms``); the pcm_s16le rows check it.
- TTFA: client-observed, median and p95 per format, and each median less pcm_s16le's,
  measured in the same rounds. And what the format adds to it, without the noise of a
  busy machine: the CPU time from opening an utterance's frame stream to its first frame,
  given the engine's first step, less pcm_s16le's (in this process).
- encoding cost: in this process, in CPU time (``time.process_time``: what a busy machine
  does to wall clocks does not enter it). The engine (Piper, loaded here) speaks every
  reply, timed; its audio is cut into 200 ms engine steps and put through the server's
  own Framer (resampler, framer, encoder) in every format, timed. Both per second
  of audio; the fraction is the encoder's over the engine's. The engine's CPU time sums
  all its threads, the encoder runs on one.

    python -m voxwire.benchmarks.formats --rounds 6 --out benchmarks/results/formats
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.corpus import REPLIES, WARMUP
from voxwire.benchmarks.process import free_port, launch_voxwire, stop, wait_http
from voxwire.benchmarks.report import save_results
from voxwire.engine.audio_queue import Done
from voxwire.engine.base import SynthesisParams
from voxwire.engine.registry import EngineOptions, engine_factory
from voxwire.server.audio import stream_rate
from voxwire.server.framing import Framer
from voxwire.server.protocol import StreamSettings

RATE = 22050
FORMATS = ("pcm_s16le", "opus", "mp3", "aac", "flac")
PCM_BYTES_PER_SECOND = 2 * RATE


def engine_audio(repeats: int) -> tuple[list[np.ndarray], float]:
    """Every reply spoken by the engine in this process, and its CPU milliseconds per
    second of audio (best of ``repeats``)."""
    engine = engine_factory(EngineOptions(name="piper"))()
    params = SynthesisParams(voice=engine.default_voice() or "")
    assert engine.sample_rate == RATE
    list(engine.synthesize(WARMUP[1], params))
    best, audio = float("inf"), []
    for _ in range(repeats):
        start = time.process_time()
        audio = [np.concatenate([x for x in engine.synthesize(text, params) if isinstance(x, np.ndarray)]) for text in REPLIES]
        best = min(best, time.process_time() - start)
    return audio, best * 1000 / (sum(a.size for a in audio) / RATE)


async def measure(port: int, rounds: int) -> dict[str, list[loadgen.UtteranceResult]]:
    ws = await loadgen.connect(f"ws://127.0.0.1:{port}/v1/stream", None)
    out: dict[str, list[loadgen.UtteranceResult]] = {fmt: [] for fmt in FORMATS}
    await loadgen.speak(ws, "Warming up.", {})
    for i in range(rounds):
        for k, fmt in enumerate(FORMATS):
            r = await loadgen.speak(ws, REPLIES[(i + k) % len(REPLIES)], {"format": fmt, "sample_rate": RATE})
            if r.error:
                raise RuntimeError(f"{fmt}: {r.error}")
            out[fmt].append(r)
    await ws.close()
    return out


def encoding_ms_per_second(audio: list[np.ndarray], fmt: str, repeats: int) -> float:
    """Milliseconds of this process's time to resample, frame and encode one second of
    engine audio in ``fmt`` (best of ``repeats``: the least disturbed by other work)."""
    settings = StreamSettings(voice="v", format=fmt, sample_rate=stream_rate(fmt, RATE), chunk_ms=200)
    seconds = sum(a.size for a in audio) / RATE
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for a in audio:
            stream = Framer(RATE, settings)
            for i in range(0, a.size, RATE // 5):
                stream.receive(a[i : i + RATE // 5])
            stream.receive(Done())
        best = min(best, time.process_time() - start)
    return best * 1000 / seconds


def first_frame_ms(audio: list[np.ndarray], fmt: str, repeats: int) -> float:
    """CPU milliseconds from opening an utterance's Framer to its first frame out,
    fed the engine's first 200 ms step: what the format adds to the time to first audio
    (the engine and the network are the same for every format). Median over the replies,
    best of ``repeats`` each."""
    settings = StreamSettings(voice="v", format=fmt, sample_rate=stream_rate(fmt, RATE), chunk_ms=200)
    times = []
    for a in audio:
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            Framer(RATE, settings).receive(a[: RATE // 5])
            best = min(best, time.process_time() - start)
        times.append(best * 1000)
    return statistics.median(times)


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.formats", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=5, help="timings of the encoders, the best kept")
    p.add_argument("--out", type=Path, help="write formats.json there")
    args = p.parse_args(argv)
    port = free_port()
    proc = launch_voxwire(port, "--cache-mb", "0")
    wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=600)  # a busy machine loads slowly
    try:
        results = asyncio.run(measure(port, args.rounds))
    finally:
        stop(proc)
    audio, compute_ms_per_s = engine_audio(args.repeats)
    pcm_ttfa = statistics.median(r.ttfa_ms for r in results["pcm_s16le"])
    pcm_encode = encoding_ms_per_second(audio, "pcm_s16le", args.repeats)
    pcm_first = first_frame_ms(audio, "pcm_s16le", args.repeats)
    rows: dict[str, Any] = {}
    print(f"engine compute: {compute_ms_per_s:.1f} ms of CPU per second of audio (in this process)")
    for fmt in FORMATS:
        rs = results[fmt]
        audio_s = sum(r.server["audio_ms"] for r in rs) / 1000
        sent = sum(r.server["bytes"] for r in rs)
        ttfa = [r.ttfa_ms for r in rs]
        encode = encoding_ms_per_second(audio, fmt, args.repeats)
        first = first_frame_ms(audio, fmt, args.repeats)
        row = {
            "bytes": sent,
            "audio_s": round(audio_s, 2),
            "kbit_per_s": round(8 * sent / audio_s / 1000, 1),
            "fewer_bytes_than_pcm_s16le_22k": round(PCM_BYTES_PER_SECOND * audio_s / sent, 2),
            "ttfa_median_ms": round(statistics.median(ttfa), 1),
            "ttfa_p95_ms": round(p95(ttfa), 1),
            "ttfa_median_minus_pcm_ms": round(statistics.median(ttfa) - pcm_ttfa, 1),
            "first_frame_cpu_ms": round(first, 2),
            "first_frame_cpu_minus_pcm_ms": round(first - pcm_first, 2),
            "encode_ms_per_s": round(encode, 2),
            "encode_over_pcm_ms_per_s": round(encode - pcm_encode, 2),
            "encode_fraction_of_engine_compute": round(encode / compute_ms_per_s, 4),
            "ttfa_ms": ttfa,
        }
        rows[fmt] = row
        print(
            f"{fmt:>9}: {row['kbit_per_s']:6.1f} kbit/s, {row['fewer_bytes_than_pcm_s16le_22k']:5.2f}x fewer bytes; "
            f"TTFA median {row['ttfa_median_ms']:6.1f} ms (pcm {row['ttfa_median_minus_pcm_ms']:+.1f}), "
            f"p95 {row['ttfa_p95_ms']:6.1f}; first frame +{row['first_frame_cpu_minus_pcm_ms']:.2f} ms CPU; encode {encode:5.2f} ms/s = {100 * row['encode_fraction_of_engine_compute']:.2f}% of compute"
        )
    if args.out:
        save_results(args.out / "formats.json", args, engine_compute_ms_per_s=round(compute_ms_per_s, 1), formats=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
