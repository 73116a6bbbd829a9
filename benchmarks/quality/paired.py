"""Every format judged on the same audio: ``python -m voxwire.benchmarks.quality.paired``.

Piper samples its speech afresh each time it speaks (its noise scales), and Whisper
hears a sentence read one way right and read another way wrong, so two rows of the
server run differ by a point of WER or so with nothing between them but chance. Here
Voxwire's engine (torch, chunked, in this process) speaks each corpus sentence once, in
200 ms pieces as the worker hands them on; the server's own output path
(``server.framing.Framer``: resampler, framer, encoder) turns that one audio into
every format and rate, the client's decoder turns it back, and Whisper and DNSMOS hear
each. What differs between two rows is then the format's doing alone.

    python -m voxwire.benchmarks.quality.paired --out benchmarks/results/quality
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from voxwire_client.formats import to_float32

from voxwire.benchmarks import corpus, machine
from voxwire.benchmarks.loadgen import Heard
from voxwire.benchmarks.quality import rows as R
from voxwire.benchmarks.quality.asr import Transcriber
from voxwire.benchmarks.quality.score import heard_sample, score
from voxwire.benchmarks.quality.targets import COMPRESSED_AGAINST
from voxwire.engine.audio_queue import Done
from voxwire.server.audio import stream_rate
from voxwire.server.framing import AudioFrame, Framer
from voxwire.server.protocol import StreamSettings

STEP_MS = 200
# The socket's rows (benchmarks/quality/rows.py), and 16-bit PCM at Opus's 48 kHz, the
# row that Opus is held against.
PCM_48K = "Voxwire socket, pcm_s16le 48 kHz"
SETTINGS = {R.SOCKET: {}, **R.SOCKET_FORMATS, PCM_48K: {"format": "pcm_s16le", "sample_rate": 48000}}
# Each lossy row, and 16-bit PCM at its rate (as the targets hold them, with Opus against
# 16-bit rather than float PCM, which only this run has).
AGAINST = {**COMPRESSED_AGAINST, "Voxwire socket, opus 48 kHz": PCM_48K,
           "Voxwire socket, mulaw 8 kHz": "Voxwire socket, pcm_s16le 16 kHz"}


def through(audio: np.ndarray, engine_rate: int, settings: dict[str, Any]) -> Heard:
    """``audio`` as a socket stream with these settings would carry it, decoded."""
    fmt = settings.get("format", "pcm_s16le")
    rate = stream_rate(fmt, settings.get("sample_rate", engine_rate))
    stream = Framer(engine_rate, StreamSettings(voice="v", format=fmt, sample_rate=rate, chunk_ms=200))
    step = engine_rate * STEP_MS // 1000
    events = [e for i in range(0, audio.size, step) for e in stream.receive(audio[i : i + step])]
    events += stream.receive(Done())
    frames = [e for e in events if isinstance(e, AudioFrame)]
    return Heard(to_float32(b"".join(f.data for f in frames), fmt), rate)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.quality.paired", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write paired.json there")
    p.add_argument("--sentences", type=int, help="only the corpus's first N sentences (default: all)")
    args = p.parse_args(argv)
    started = time.monotonic()
    texts = corpus.quality()[: args.sentences]
    engine = R.EngineSession()
    spoken = [engine.speak_sync(t).heard for t in texts]
    asyncio.run(engine.close())
    transcriber = Transcriber()
    rows = {}
    for name, settings in SETTINGS.items():
        samples = [heard_sample(t, through(h.audio, h.rate, settings), float("nan"), chunked=False)
                   for t, h in zip(texts, spoken)]
        row = score(samples, transcriber)
        rows[name] = {k: row[k] for k in ("sentences", "words", "errors", "wer", "dnsmos", "worst_sentences")}
        print(f"{name}: WER {row['wer']:.2f}%, DNSMOS {row['dnsmos']}", file=sys.stderr, flush=True)
    for name, against in AGAINST.items():
        rows[name]["against"] = against
        rows[name]["wer_over_against"] = round(rows[name]["wer"] - rows[against]["wer"], 2)
    results = {"machine": machine.facts("cpu"), "config": {"sentences": len(texts), "asr": transcriber.name},
               "rows": rows, "elapsed_s": round(time.monotonic() - started, 1)}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "paired.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
