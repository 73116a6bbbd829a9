"""engine/text/inline.py: inline phonemes read from streamed text, kept whole through
normalisation and the segmenter, and given back segment by segment."""

from __future__ import annotations

import pytest

from voxwire.engine.text.inline import CLOSE, OPEN, InlineError, InlineReader
from voxwire.engine.text.segment import Segmenter, SegmenterLimits

TEXT = "Say [Voxwire](/vˈɑkswaɪɚ/) twice. Then [New York](/nuː jˈɔːɹk/), and [x](/ɛks/)."


def spoken(pieces: list[str], limits: SegmenterLimits = SegmenterLimits()) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each segment as written, with its entries, the text arriving in these pieces."""
    reader, segmenter = InlineReader(), Segmenter(limits)
    segments: list[str] = []
    for i, piece in enumerate(pieces):
        final = i == len(pieces) - 1
        segments += segmenter.push(reader.push(piece, final=final), final=final)
    segments += segmenter.flush()
    out = []
    for segment in segments:
        text, lexicon = reader.resolve(segment)
        out.append((text, [(e.key, e.phonemes or "") for e in lexicon]))
    return out


def test_a_markup_is_its_words_with_its_phonemes_as_an_entry():
    assert spoken([TEXT]) == [
        ("Say Voxwire twice.", [("Voxwire", "vˈɑkswaɪɚ")]),
        (" Then New York, and x.", [("New York", "nuː jˈɔːɹk"), ("x", "ɛks")]),
    ]


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_text_in_any_pieces_reads_as_it_does_whole(size):
    pieces = [TEXT[i:i + size] for i in range(0, len(TEXT), size)]
    assert spoken(pieces) == spoken([TEXT])


def test_phonemes_that_normalisation_would_change_arrive_as_written():
    # NFKC makes Kokoro's ᵊ an ə, and espeak-ng's ʰ an h.
    [(text, entries)] = spoken(["I said [Kokoro](/kˈOkəɹO/) and [tea](/tʰiː/) and [ok](/ᵊk/)."])
    assert text == "I said Kokoro and tea and ok."
    assert entries == [("Kokoro", "kˈOkəɹO"), ("tea", "tʰiː"), ("ok", "ᵊk")]


def test_the_words_are_normalised_as_the_text_around_them_is():
    [(text, entries)] = spoken(["A [ﬁne](/fˈaɪn/) day."])
    assert text == "A fine day." and entries == [("fine", "fˈaɪn")]


@pytest.mark.parametrize("text", [
    "See [the docs](/docs/intro/) now.",  # a Markdown link to a path: a slash inside
    "See [the docs](https://example.com) now.",
    "An [aside] (/ə/) and [brackets] alone.",
    "Empty [](/ə/) and [x](//) here.",
])
def test_anything_else_in_brackets_is_text(text):
    assert spoken([text]) == [(text, [])]


def test_a_markup_still_open_when_the_text_ends_is_text():
    assert spoken(["Say [Vox", "wire](/vˈɑks"]) == [("Say [Voxwire](/vˈɑks", [])]


def test_a_clients_own_marks_are_brackets_and_take_no_entry():
    assert spoken([f"A {OPEN}b{CLOSE} and [c](/siː/)."]) == [("A [b] and c.", [("c", "siː")])]


def test_a_markup_whose_words_are_no_key_is_refused_naming_it():
    reader = InlineReader()
    segment = reader.push("Use [C++](/siː/) here.", final=True)
    with pytest.raises(InlineError, match=r"inline phonemes '\[C\+\+\]\(/siː/\)': a key is one or more words"):
        reader.resolve(segment)


def test_a_markup_a_forced_split_cuts_in_two_is_spoken_as_text_and_the_next_keeps_its_own():
    limits = SegmenterLimits(max_chars=40, first_split_chars=40)
    words = " ".join(["word"] * 7)  # no punctuation: the run is split at a space
    out = spoken([f"{words} [New York](/nuː jˈɔːɹk/) {words} [x](/ɛks/)."], limits)
    assert "".join(text for text, _ in out) == f"{words} New York {words} x."
    assert [e for _, entries in out for e in entries] == [("x", "ɛks")]
