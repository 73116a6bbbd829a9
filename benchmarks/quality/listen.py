"""Rows speak, then listeners listen: the harness's two phases, shared by
``python -m voxwire.benchmarks.quality`` and ``voxwire bench``.

Speaking comes first, for every row, and listening (Whisper, DNSMOS) only after it, so
that no transcription competes with a server for the CPU while its TTFA is measured.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from voxwire.benchmarks import corpus
from voxwire.benchmarks.peers import SETTLE_S
from voxwire.benchmarks.quality.asr import Transcriber
from voxwire.benchmarks.quality.rows import Row
from voxwire.benchmarks.quality.score import Sample, sample, score


def _quiet(message: str) -> None:
    pass


async def hear(rows: list[Row], texts: list[str], log: Callable[[str], None] = _quiet,
               warm_up: bool = True, settle_s: float = SETTLE_S) -> dict[str, list[Sample]]:
    """Every row speaks every text, sentence by sentence, the rows in a shuffled order
    each time and each after a pause, so that background load and a neighbour's busy
    threads hit them alike. ``warm_up``: each row first speaks the warm-up texts, unkept."""
    sessions = {row.name: await row.open() for row in rows}
    out: dict[str, list[Sample]] = {row.name: [] for row in rows}
    try:
        for s in sessions.values():
            for text in corpus.WARMUP if warm_up else ():
                await s.speak(text)
        for i, text in enumerate(texts):
            if i % 10 == 0:
                log(f"sentence {i + 1} of {len(texts)}")
            for row in random.Random(i).sample(rows, len(rows)):
                await asyncio.sleep(settle_s)
                out[row.name].append(sample(text, await sessions[row.name].speak(text), row.chunked))
    finally:
        for s in sessions.values():
            await s.close()
    return out


def listen(rows: list[Row], heard: dict[str, list[Sample]], transcriber: Transcriber,
           log: Callable[[str], None] = _quiet) -> dict[str, dict[str, Any]]:
    figures = {}
    for row in rows:
        f = figures[row.name] = {"chunked": row.chunked, **score(heard[row.name], transcriber)}
        log(f"{row.name}: WER {f['wer']:.2f}%, DNSMOS OVRL {f['dnsmos']['ovrl']:.2f}, seams {f['seams']}")
    return figures


def judged(rows: list[Row], heard: dict[str, list[Sample]], sentences: int,
           log: Callable[[str], None] = _quiet) -> dict[str, Any]:
    """A stored run's body: this machine, what listened, and every row's figures."""
    from voxwire.benchmarks import machine

    log("listening: Whisper and DNSMOS")
    transcriber = Transcriber()
    return {
        "machine": machine.facts("cpu"),
        "config": {"sentences": sentences, "corpus": "benchmarks/corpus/quality.txt", "asr": transcriber.name,
                   "dnsmos": "speechmos DNSMOS P.835 (sig_bak_ovr.onnx)", "settle_s": SETTLE_S},
        "rows": listen(rows, heard, transcriber, log),
    }
