"""Word timestamps from the Piper engine: every written word gets exactly one timing.

"Written words" are defined in engine/alignment.py (``written_words``): the
whitespace-separated tokens of a segment, stripped of surrounding punctuation, that hold a
letter or digit. A number is one written word however many words espeak-ng speaks for it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxwire.engine.base import SynthesisParams, WordTiming, WordTimings
from voxwire.engine.alignment import written_words
from voxwire.engine.text import normalize, segment


@pytest.fixture(scope="module")
def engine():
    import torch

    from voxwire.engine.piper.engine import PiperEngine

    e = PiperEngine(backend="torch", device="cpu")
    torch.set_num_threads(1)  # PiperEngine sets its own count; see conftest for why 1
    return e


def timed(engine, text: str) -> tuple[list[WordTiming], int]:
    """The word timings of one segment, and its length in samples."""
    words, samples = [], 0
    for item in engine.synthesize(text, SynthesisParams(voice="joe", timestamps=True)):
        if isinstance(item, WordTimings):
            words += item.words
        else:
            samples += item.size
    return words, samples


def assert_every_word_timed(engine, text: str) -> None:
    words, samples = timed(engine, text)
    assert [w.word for w in words] == written_words(text), text
    end = 0
    for w in words:
        assert end <= w.start < w.end <= samples, (text, w, end, samples)
        end = w.end


def test_no_word_lost_where_espeak_joins_two_words(engine):
    # espeak-ng speaks "for the" as one phoneme word, "fɚðə": counting phoneme words
    # against written words came up one short, and "clauses" was never timed.
    text = "A fresh sentence for the rate check, with clauses."
    assert segment(text) == [text]
    assert_every_word_timed(engine, text)


def test_joined_words_each_get_their_part(engine):
    words, _ = timed(engine, "A fresh sentence for the rate check, with clauses.")
    assert [t.word for t in words] == written_words("A fresh sentence for the rate check, with clauses.")
    # "for" and "the" share one phoneme word; each takes its own part of it, and the
    # words after them are not shifted onto their neighbours' sounds: the comma's pause
    # is the longest silence between two words, and it follows "check".
    gaps = {a.word: b.start - a.end for a, b in zip(words, words[1:])}
    assert max(gaps, key=gaps.get) == "check", gaps


def test_several_sentences_in_one_segment(engine):
    assert_every_word_timed(engine, "Dr. Smith paid $3.50 for 12 apples; it was 1,000 times better - really? Yes.")


WORDS = (
    "a an the of for to in on at by with from and or but as is was it its that this "
    "what which who we you they he she I'd don't can't sentence fresh rate check clause "
    "quick brown fox jumps over lazy dog streaming voice audio listener hear first words "
    "while rest computed timing segment espeak phoneme model sample window river mountain "
    "beautiful unusual yesterday tomorrow Monday London Smith doctor well-known e-mail "
    "everyone cheers loudly really yes no okay hello world"
).split()
PUNCT = ("", "", "", ",", ".", "?", ";")
# Pairs espeak-ng speaks as one phoneme word ("fɚðə"), which random words rarely make.
JOINED = ("for the", "of the", "of a", "in the", "with the", "from the", "that the", "was a", "at it")

word = st.one_of(
    st.sampled_from(WORDS),
    st.sampled_from(WORDS).map(str.capitalize),
    st.sampled_from(JOINED),
    st.integers(0, 10**6).map(str),
    st.integers(0, 10**4).map(lambda n: f"{n:,}"),
    st.tuples(st.integers(0, 99), st.integers(0, 99)).map(lambda t: f"{t[0]}.{t[1]}"),
)
token = st.one_of(
    st.tuples(word, st.sampled_from(PUNCT)).map("".join),
    st.sampled_from(["-", "--", "\u2014"]),
)
sentences = st.lists(token, min_size=1, max_size=12).map(" ".join)


@settings(max_examples=25, deadline=None)
@given(sentences)
def test_every_written_word_gets_one_timing(engine, text):
    # As the server does: normalised, segmented, each segment synthesised alone.
    segments = segment(text)
    assert "".join(segments) == normalize(text)
    for seg in segments:
        assert_every_word_timed(engine, seg.strip())
