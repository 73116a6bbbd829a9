"""What the quality figures must show, in one place: the targets of a full run
(``checks``), and the bounds of the small test that ``make test`` runs
(tests/benchmarks/quality/test_quality.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.quality import rows as R

DEFAULT_WER_POINTS = 0.5
"""Voxwire's default path against the reference, on the whole corpus."""
DEFAULT_OVRL = 0.05
COMPRESSED_WER_POINTS = 1.0
"""A compressed format at its default bitrate against PCM at the same rate."""
TELEPHONY_WER_POINTS = 3.0
"""mu-law at 8 kHz against 16-bit PCM at 16 kHz: a telephone line loses some."""
SEAM_MEDIAN = 1.5
SEAM_WORST = 3.0

TEST_WER_POINTS = 2.0
"""``make test``: on ten sentences, the chunked path's WER over the reference's."""
TEST_SEAM_BOUND = 3.3
"""``make test``: no seam ratio above it. Measured on 55 sentences of Piper (torch,
chunked) at 22.05, 16 and 48 kHz: clean joins 2.82 at worst (median 0.77-0.79); with a
10 ms gap at each 200 ms frame join every utterance's worst was over 7.1, with every
other frame's sign flipped over 3.61 (benchmarks/README.md, "What a listener hears")."""

# Each compressed row, and the PCM row at its rate. Opus is always 48 kHz, where the
# socket's PCM row is float (pcm_f32le); the others are at the engine's 22.05 kHz.
COMPRESSED_AGAINST = {
    "Voxwire socket, opus 48 kHz": "Voxwire socket, pcm_f32le 48 kHz",
    "Voxwire socket, mp3 22.05 kHz": R.SOCKET,
    "Voxwire socket, aac 22.05 kHz": R.SOCKET,
    "Voxwire socket, flac 22.05 kHz": R.SOCKET,
}


def small_run_failures(reference_wer: float, path_wer: float, seams: Sequence[float]) -> list[str]:
    """What the small run in ``make test`` finds wrong with a chunked path, against the
    reference heard on the same sentences: nothing, when it passes."""
    failures = []
    if not path_wer - reference_wer <= TEST_WER_POINTS:
        failures.append(f"WER {path_wer:.2f}% is more than {TEST_WER_POINTS:g} points over the reference's "
                        f"{reference_wer:.2f}%")
    if not seams:
        failures.append("no seams to measure")
    elif max(seams) > TEST_SEAM_BOUND:
        over = sum(r > TEST_SEAM_BOUND for r in seams)
        failures.append(f"{over} of {len(seams)} seams over the bound {TEST_SEAM_BOUND:g} (worst {max(seams):.2f})")
    return failures


def _check(what: str, row: str, measured: float, limit: float) -> dict[str, Any]:
    measured = float(measured)
    return {"target": what, "row": row, "measured": round(measured, 3), "limit": limit,
            "met": measured == measured and measured <= limit}


def checks(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target that the rows present can be checked against."""
    out = []
    ref, default = rows.get(R.REFERENCE), rows.get(R.SOCKET)
    if ref and default:
        out.append(_check("default path: WER over the reference's (points)", R.SOCKET,
                          default["wer"] - ref["wer"], DEFAULT_WER_POINTS))
        out.append(_check("default path: DNSMOS OVRL below the reference's", R.SOCKET,
                          ref["dnsmos"]["ovrl"] - default["dnsmos"]["ovrl"], DEFAULT_OVRL))
    for name, against in COMPRESSED_AGAINST.items():
        if name in rows and against in rows:
            out.append(_check(f"WER over {against} (points)", name, rows[name]["wer"] - rows[against]["wer"],
                              COMPRESSED_WER_POINTS))
    mulaw, pcm16 = rows.get("Voxwire socket, mulaw 8 kHz"), rows.get("Voxwire socket, pcm_s16le 16 kHz")
    if mulaw and pcm16:
        out.append(_check("WER over pcm_s16le 16 kHz (points)", "Voxwire socket, mulaw 8 kHz",
                          mulaw["wer"] - pcm16["wer"], TELEPHONY_WER_POINTS))
    for name, row in rows.items():
        if name.startswith("Voxwire") and row["seams"]["joins"]:
            out.append(_check("seam ratio, median", name, row["seams"]["median"], SEAM_MEDIAN))
            out.append(_check("seam ratio, worst", name, row["seams"]["worst"], SEAM_WORST))
    return out
