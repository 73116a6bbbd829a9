"""Property tests: the segmenter never loses, adds or reorders text, for any Unicode,
whether the text comes whole or in pieces."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.text import Segmenter, normalize, segment
from engine.text.segment import SegmenterLimits

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
)


@settings(max_examples=500, deadline=None)
@given(texts, limits)
def test_segments_join_to_the_normalised_text(text, lim):
    segs = segment(text, lim)
    assert "".join(segs) == normalize(text)
    assert all(s.strip() for s in segs)


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
    assert "".join(out) == normalize(text)


@settings(max_examples=300, deadline=None)
@given(texts, limits)
def test_no_segment_exceeds_the_bound(text, lim):
    # A forced split may only go past the bound to keep a character and its marks together.
    for seg in segment(text, lim):
        assert len(seg.lstrip()) <= lim.max_chars + 4
