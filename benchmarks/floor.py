"""The floor: the engine alone, in process, with no server in between."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.base import Engine, SynthesisParams
from engine.text import segment


@dataclass(frozen=True)
class FloorResult:
    words: int
    first_chunk_ms: float
    """From the call to the engine's first audio piece."""
    whole_ms: float
    """Compute for the whole text: what a whole-then-send server makes a client wait."""
    audio_ms: float

    @property
    def rtf(self) -> float:
        return self.whole_ms / self.audio_ms


def measure(engine: Engine, text: str, voice: str) -> FloorResult:
    params = SynthesisParams(voice=voice)
    samples = 0
    first = float("nan")
    start = time.perf_counter()
    for seg in segment(text):
        for piece in engine.synthesize(seg, params):
            if first != first and piece.size:  # nan: the first piece
                first = time.perf_counter() - start
            samples += piece.size
    whole = time.perf_counter() - start
    return FloorResult(
        words=len(text.split()), first_chunk_ms=first * 1000, whole_ms=whole * 1000,
        audio_ms=samples / engine.sample_rate * 1000,
    )


def repeated(engine: Engine, texts: list[str], voice: str, repeats: int, warmup: list[str]) -> list[list[FloorResult]]:
    """Each text ``repeats`` times, after the same warm-up texts the servers get, with the
    texts interleaved within each repeat as the server's rows are: the floor is measured
    exactly as carefully as what it is compared with. One list of results per text."""
    for text in warmup:
        measure(engine, text, voice)
    out: list[list[FloorResult]] = [[] for _ in texts]
    for _ in range(repeats):
        for i, text in enumerate(texts):
            out[i].append(measure(engine, text, voice))
    return out
