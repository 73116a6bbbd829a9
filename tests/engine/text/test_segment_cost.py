"""Segmentation costs time linear in the text's length, for any text, whole or streamed.

No wall-clock constant is asserted: each adversarial text is timed against ordinary prose
of the same length, segmented the same way in the same test, and the ratio is bounded
generously. A quadratic segmenter misses the bound by orders of magnitude (on 20,000
characters, "Dr. " * 5000 took 21 s against 3 ms of prose).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from voxwire.engine.text import Segmenter, normalize, segment

MAX_TEXT = 20_000  # the server's max_text_chars
RATIO = 25
PROSE = (
    "The quick brown fox jumps over the lazy dog, and then it runs away to the river. "
    "Dr. Smith said it was the fastest fox he had seen in years; nobody believed him. "
)


def prose(n: int) -> str:
    return (PROSE * (n // len(PROSE) + 1))[:n]


def streamed(text: str) -> list[str]:
    """Push ``text`` in pieces of 1-20 characters, the same pieces for any text of its length."""
    rng = random.Random(len(text))
    s, out, i = Segmenter(), [], 0
    while i < len(text):
        n = rng.randint(1, 20)
        out += s.push(text[i : i + n])
        i += n
    return out + s.flush()


def _seconds(run: Callable[[str], object], text: str) -> float:
    t = time.perf_counter()
    run(text)
    return time.perf_counter() - t


def cost_ratio(run: Callable[[str], object], text: str) -> float:
    """``run``'s time on ``text`` over its time on prose of the same length, each the
    best of three; a text already clearly inside or outside the bound is timed once (a
    quadratic case can take seconds a run)."""
    reference = min(_seconds(run, prose(len(text))) for _ in range(3))
    best = float("inf")
    for _ in range(3):
        best = min(best, _seconds(run, text))
        if best < RATIO * reference or best > 1.0:
            break
    return best / reference


ADVERSARIAL = {
    "abbreviations": "Dr. " * 5000,
    "initials": "A. " * 6600,
    "one base, marks": "x" + "\u0301" * 19999,
    "alternating marks": "x" + "\u0301\u0316" * 9999,  # CPython's NFKC reorders these in n^2
    "no spaces": "x" * MAX_TEXT,
    "dots": "." * MAX_TEXT,
    "dotted words": "ab." * 6666,
    "dots and spaces": ". " * 10000,
    "initials without spaces": "U.S." * 5000,
    "CJK after dots": "A.\u4f60" * 6666,
    "CJK without spaces": "\u4f60\u597d\u4e16\u754c" * 5000,
    "CJK sentences": "\u4f60\u597d\u3002" * 6666,
    "Indic conjuncts": "\u0915\u094d\u0937\u093f" * 5000,
    "conjunct chain": "\u0915\u094d" * 10000,
    "leading jamo": "\u1100" * MAX_TEXT,
    "trailing jamo": "\uac00" + "\u11a8" * 19999,
    "emoji with skin tone": "\U0001f44d\U0001f3fd" * 5000,
    "regional indicators": "\U0001f1fa\U0001f1f8" * 5000,
    "spaced marks": " \u0301" * 10000,
    "closers": "Hi.\u300d" * 5000,
    "clauses": "a, " * 6666,
    "dashes": "a - " * 5000,
}


@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_whole_text_costs_linear_time(text: str) -> None:
    assert cost_ratio(segment, text) < RATIO


@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_streamed_text_costs_linear_time(text: str) -> None:
    assert cost_ratio(streamed, text) < RATIO


def test_normalisation_costs_linear_time() -> None:
    # CPython's canonical reordering is quadratic in a run of marks of alternating
    # classes; the run is bounded before it gets there.
    assert cost_ratio(normalize, "x" + "\u0301\u0316" * 9999) < RATIO
