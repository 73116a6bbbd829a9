"""The floor: the engine alone, in process, with no server in between."""

from __future__ import annotations

import time
from dataclasses import dataclass

from voxwire.engine.base import Engine, SynthesisParams
from voxwire.engine.text import segment


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


def measure(engine: Engine, text: str, voice: str, whole_text: bool = True) -> FloorResult:
    """The first piece's time and, with ``whole_text``, the whole text's; without it the
    stream is closed after the first piece (whole_ms and audio_ms then cover that much)."""
    params = SynthesisParams(voice=voice)
    samples = 0
    first = float("nan")
    start = time.perf_counter()
    for seg in segment(text):
        pieces = engine.synthesize(seg, params)
        for piece in pieces:
            if first != first and piece.size:  # nan: the first piece
                first = time.perf_counter() - start
            samples += piece.size
            if not whole_text and first == first:
                pieces.close()
                break
        if not whole_text and first == first:
            break
    whole = time.perf_counter() - start
    return FloorResult(
        words=len(text.split()), first_chunk_ms=first * 1000, whole_ms=whole * 1000,
        audio_ms=samples / engine.sample_rate * 1000,
    )


def repeated(
    engine: Engine, texts: list[str], voice: str, repeats: int, warmup: list[str], first_only: list[str] | None = None
) -> list[list[FloorResult]]:
    """Each text ``repeats`` times, after the same warm-up texts the servers get, with the
    texts interleaved within each repeat as the server's rows are: the floor is measured
    exactly as carefully as what it is compared with. One list of results per text, then
    per ``first_only`` text: those are measured to their first piece only, all that the
    rows they are compared with time."""
    first_only = first_only or []
    for text in warmup:
        measure(engine, text, voice)
    out: list[list[FloorResult]] = [[] for _ in [*texts, *first_only]]
    for _ in range(repeats):
        for i, text in enumerate(texts):
            out[i].append(measure(engine, text, voice))
        for i, text in enumerate(first_only, len(texts)):
            out[i].append(measure(engine, text, voice, whole_text=False))
    return out
