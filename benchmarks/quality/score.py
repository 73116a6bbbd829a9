"""One row's figures from what its listener heard: intelligibility (ASR word error
rate), DNSMOS, seams, and the time to first audio of the same utterances."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr

from voxwire.benchmarks.loadgen import Heard, UtteranceResult
from voxwire.benchmarks.quality.asr import ASR_RATE, Transcriber
from voxwire.benchmarks.quality.dnsmos import DNSMOS_RATE, dnsmos
from voxwire.benchmarks.quality.normalise import normalise, sentence_errors, wer
from voxwire.benchmarks.quality.seams import seam_ratios
from voxwire.benchmarks.stats import summary

assert ASR_RATE == DNSMOS_RATE  # both listeners hear the same 16 kHz audio

WORST_SHOWN = 5
"""Sentences with the most word errors kept in a row's results, to read what went wrong."""


@dataclass
class Sample:
    """One utterance as a row heard it: at 16 kHz for the listeners, with its seams
    measured at the stream's own rate, where its pieces joined."""

    text: str
    ttfa_ms: float = float("nan")
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    seconds: float = 0.0
    seams: list[float] = field(default_factory=list)
    error: str | None = None


def sample(text: str, result: UtteranceResult, chunked: bool) -> Sample:
    """``chunked``: measure the seams at the joins the stream delivered its pieces at."""
    if result.error is not None or result.heard is None or result.heard.audio.size == 0:
        return Sample(text, error=result.error or "no_audio")
    return heard_sample(text, result.heard, result.ttfa_ms, chunked)


def heard_sample(text: str, heard: Heard, ttfa_ms: float, chunked: bool) -> Sample:
    audio = heard.audio.astype(np.float32, copy=False)
    try:
        seams = seam_ratios(audio, heard.rate, heard.joins) if chunked else []
    except ValueError:  # joins so close together that nothing lies between them to compare with
        seams = []
    at_16k = audio if heard.rate == ASR_RATE else soxr.resample(audio, heard.rate, ASR_RATE, quality="HQ")
    return Sample(text, ttfa_ms, np.asarray(at_16k, np.float32), audio.size / heard.rate, seams)


def _mean(values: Sequence[float]) -> float:
    return round(statistics.fmean(values), 3) if values else float("nan")


def score(samples: Sequence[Sample], transcriber: Transcriber) -> dict[str, Any]:
    """A row's figures. An utterance that failed counts as heard as nothing: every word
    of it is an error, and it has no DNSMOS."""
    heard = [transcriber.transcribe(s.audio) if s.error is None else "" for s in samples]
    texts = [s.text for s in samples]
    moses = [dnsmos(s.audio) for s in samples if s.error is None]
    seams = [r for s in samples for r in s.seams]
    errors = [sentence_errors(t, h) for t, h in zip(texts, heard)]
    worst = sorted(range(len(samples)), key=lambda i: -errors[i])[:WORST_SHOWN]
    return {
        "sentences": len(samples),
        "words": sum(len(normalise(t).split()) for t in texts),
        "errors": sum(s.error is not None for s in samples),
        "error_codes": sorted({s.error for s in samples if s.error is not None}),
        "wer": round(wer(texts, heard), 2),
        "dnsmos": {
            "sig": _mean([m.sig for m in moses]),
            "bak": _mean([m.bak for m in moses]),
            "ovrl": _mean([m.ovrl for m in moses]),
        },
        "seams": {
            "joins": len(seams),
            "median": round(float(np.median(seams)), 3) if seams else float("nan"),
            "worst": round(max(seams), 3) if seams else float("nan"),
        },
        "ttfa_ms": summary([s.ttfa_ms for s in samples if s.error is None]),
        "audio_s": round(sum(s.seconds for s in samples), 2),
        "worst_sentences": [
            {"text": texts[i], "heard": heard[i], "word_errors": errors[i]} for i in worst if errors[i] > 0
        ],
    }
