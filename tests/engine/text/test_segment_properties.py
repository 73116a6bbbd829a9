"""Property tests: the segmenter never loses, adds or reorders text, for any Unicode,
whether the text comes whole or in pieces; it never splits a grapheme cluster nor leaves a
mark without its base; and its cost stays linear on adversarial text."""

from __future__ import annotations

import random
from datetime import timedelta

import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from voxwire.engine.text import Segmenter, normalize, segment
from voxwire.engine.text.segment import SegmenterLimits
from tests.engine.text.test_segment import MARK, MAX_MARKS
from tests.engine.text.test_segment_cost import MAX_TEXT, RATIO, cost_ratio, streamed

# Text biased towards what segmentation cares about, plus arbitrary Unicode.
alphabet = st.one_of(
    st.characters(),
    st.sampled_from(list(" .!?,;:\u3002\uff01\uff1f\uff0c\u3001\"')\n\t\u2026\u00a0\u200b")),
    st.sampled_from(list("abcXYZ019")),
    st.sampled_from(list("你好世界中文句子")),
    st.sampled_from(["\U0001f600", "\U0001f469\u200d\U0001f4bb", "e\u0301", "\ufe0f", "Dr.", "3.14", "e.g."]),
)
texts = st.lists(alphabet, max_size=120).map("".join)
limits = st.builds(
    SegmenterLimits,
    first_split_chars=st.integers(5, 80),
    first_clause_min_chars=st.integers(1, 30),
    max_chars=st.integers(5, 200),
    first_clause_words=st.integers(0, 4),
)

# Adversarial text: runs of building blocks that defeat a naive segmenter (abbreviations
# and initials without end, dot runs, marks piled on one base, runs with no space or
# punctuation, CJK, emoji, clusters longer than a segment), up to the server's limit.
BLOCKS = [
    "Dr. ", "A. ", "e.g. ", "U.S.", ".", "...", " ", '"', ")", "\u300d", ", ", " - ", "Hi. ", "word ",
    "x", "ab.", "A.\u4f60",
    "\u0301", "\u0316", "\u093f", "\ufe0f", "\U0001f3fd",
    "\u4f60\u597d", "\u4e16\u754c\u3002", "\u3001",
    "\U0001f44d\U0001f3fd", "\U0001f600", "\U0001f1fa\U0001f1f8",
    "\u0915\u094d\u0937\u093f", "\u0915\u094d", "\u1100", "\u11a8", "\u0d4e",
]  # fmt: skip
runs = st.tuples(st.sampled_from(BLOCKS), st.integers(1, 5000)).map(lambda r: r[0] * r[1])
adversarial = st.lists(runs, min_size=1, max_size=10).map(lambda rs: "".join(rs)[:MAX_TEXT])
# For timing, shorter runs repeat up to a length that a quadratic cost cannot hide in.
short_runs = st.tuples(st.sampled_from(BLOCKS), st.integers(1, 60)).map(lambda r: r[0] * r[1])
long_adversarial = st.tuples(
    st.lists(short_runs, min_size=1, max_size=6).map("".join),
    st.sampled_from([2_000, 5_000, 10_000, MAX_TEXT]),
).map(lambda t: (t[0] * (t[1] // len(t[0]) + 1))[: t[1]])
server_limits = st.sampled_from(
    [SegmenterLimits(), SegmenterLimits(60, 20, 100), SegmenterLimits(20, 10, 40), SegmenterLimits(first_clause_words=1)]
)

_CLUSTER = regex.compile(r"\X")
_MARK = regex.compile(rf"[{MARK}]")
_MARK_RUN = regex.compile(rf"[{MARK}]+")
_BLANK = regex.compile(rf"[\s{MARK}]*")


def check(text: str, segments: list[str], lim: SegmenterLimits) -> None:
    """The guarantees every segmentation keeps, checked against the normalised text."""
    norm = normalize(text)
    assert "".join(segments) == norm
    assert all(not _BLANK.fullmatch(s) for s in segments), "a segment of only spaces and marks"
    assert max(map(len, _MARK_RUN.findall(norm)), default=0) <= MAX_MARKS
    clusters = [m.span() for m in _CLUSTER.finditer(norm)]
    starts = {a for a, _ in clusters}
    # A cluster longer than a segment may be split, before any character but a mark.
    inside_long = {i for a, b in clusters if b - a > lim.max_chars for i in range(a + 1, b)}
    at = 0
    for s in segments[:-1]:
        at += len(s)
        assert at in starts or at in inside_long, f"cluster split at {at}: {norm[at - 5 : at + 5]!r}"
        assert _MARK.match(norm, at) is None, f"mark split from its base at {at}"


def pushed(text: str, lim: SegmenterLimits, rng: random.Random, longest: int) -> list[str]:
    s, out, i = Segmenter(lim), [], 0
    while i < len(text):
        n = rng.randint(1, longest)
        out += s.push(text[i : i + n])
        i += n
    return out + s.flush()


@settings(max_examples=500, deadline=None)
@given(texts, limits)
def test_segments_join_to_the_normalised_text(text, lim):
    segs = segment(text, lim)
    assert all(s.strip() for s in segs)
    check(text, segs, lim)


@settings(max_examples=500, deadline=None)
@given(texts, st.lists(st.integers(1, 12), min_size=1, max_size=40), limits)
def test_streamed_in_pieces_joins_to_the_normalised_text(text, cuts, lim):
    s = Segmenter(lim)
    out, i, k = [], 0, 0
    while i < len(text):
        n = cuts[k % len(cuts)]
        out += s.push(text[i : i + n])
        i, k = i + n, k + 1
    out += s.flush()
    check(text, out, lim)


@settings(max_examples=300, deadline=None)
@given(texts, limits)
def test_no_segment_exceeds_the_bound(text, lim):
    # A segment may only go past the bound to keep a character and its marks together.
    for seg in segment(text, lim):
        assert len(seg.lstrip()) <= lim.max_chars + MAX_MARKS


# A quadratic example fails its deadline (after it returns: each still finishes), and
# pytest's timeout bounds the whole search.
@settings(max_examples=40, deadline=timedelta(seconds=5))
@given(adversarial, server_limits, st.randoms(use_true_random=False))
def test_adversarial_text_whole_and_in_pieces(text, lim, rng):
    check(text, segment(text, lim), lim)
    check(text, pushed(text, lim, rng, 20), lim)


@settings(max_examples=25, deadline=timedelta(seconds=10))
@given(long_adversarial)
def test_adversarial_text_costs_linear_time(text):
    assert cost_ratio(segment, text) < RATIO


@settings(max_examples=25, deadline=timedelta(seconds=10))
@given(long_adversarial)
def test_adversarial_text_streamed_costs_linear_time(text):
    assert cost_ratio(streamed, text) < RATIO
