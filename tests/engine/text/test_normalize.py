import unicodedata

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from voxwire.engine.text import expanded_length, normalize
from voxwire.engine.text.normalize import normalize_piece

# The tests' own oracle: a mark extends the cluster of the character before it (UAX #29),
# and no more than 30 follow one base (the Stream-Safe Text Format's bound, UAX #15).
MARK = r"\p{M}\p{Grapheme_Cluster_Break=Extend}\p{Grapheme_Cluster_Break=SpacingMark}"
MAX_MARKS = 30
_MARK = regex.compile(rf"[{MARK}]")


def test_whitespace_controls_and_typography():
    assert normalize("  It\u2019s\u00a0a  \u201ctest\u201d\u200b\x07\n\n") == "It's a \"test\""


def test_nfkc_folds_compatibility_forms():
    assert normalize("ｆｕｌｌ　ｗｉｄｔｈ！") == "full width!"


def test_pieces_join_like_the_whole():
    pieces = ["Hello  ", " wor", "ld.\u200b", "e", "\u0301"]
    assert normalize(normalize_piece("".join(pieces))) == normalize("".join(pieces))


@pytest.mark.parametrize("n", [31, 400, 800, 4000, 19999])
def test_a_run_of_marks_after_one_base_keeps_thirty(n):
    # NFKC composes the first mark into the base: 30 marks, counted decomposed.
    assert normalize("a" + "\u0301" * n) == "\u00e1" + "\u0301" * (MAX_MARKS - 1)


def test_marks_of_class_zero_are_bounded_too():
    # Indic vowel signs, emoji modifiers and variation selectors have combining class 0,
    # which unicodedata.combining() would miss.
    assert normalize("\u0915" + "\u093f" * 100) == "\u0915" + "\u093f" * MAX_MARKS
    assert normalize("\U0001f44d" + "\U0001f3fd" * 100) == "\U0001f44d" + "\U0001f3fd" * MAX_MARKS
    assert normalize("x" + "\ufe0f" * 100) == "x" + "\ufe0f" * MAX_MARKS


def test_short_runs_are_plain_nfkc():
    text = "Cafe\u0301 \u1e9b\u0323 o\u0316\u0301\u031b n\u0303\u093f \u0915\u094d\u0937\u093f \U0001f44d\U0001f3fd"
    assert normalize(text) == unicodedata.normalize("NFKC", text)


def test_a_cut_run_is_sealed_by_its_next_starter_mark():
    # The cap falls inside the acute accents (class 230); the vowel sign (class 0) that
    # follows takes the 30th place, so that a mark of a lower class arriving later (the
    # grave below, class 220) cannot sort in before the cut.
    head = "a" + "\u0301" * 35 + "\u093f" + "\u0316" * 3
    assert normalize(head) == "\u00e1" + "\u0301" * 28 + "\u093f"
    assert normalize(normalize_piece(head) + "\u0316") == normalize(head + "\u0316")


def test_marks_without_a_base_are_dropped():
    assert normalize("\u0301\u0316abc") == "abc"
    assert normalize("x \u0301\u0301y") == "x y"
    assert normalize("x\u3000\u0301 y") == "x y"
    # NFKC turns a spacing diaeresis into a space and a combining one.
    assert normalize("a\u00a8b") == "a b"


marks_alphabet = st.sampled_from(
    ["a", "o", "e", "x", " ", "\u1100", "\uac00", "\u11a8", "\u0915", "\u00b4",
     "\u0301", "\u0316", "\u031b", "\u0334", "\u05b0", "\u0308", "\u0327", "\u3099",
     "\u093f", "\ufe0f", "\u20dd", "\u0e33", "\u0344", "\u0f73", "\u0f77", "\U0001f3fd"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(marks_alphabet, max_size=90).map("".join), min_size=1, max_size=5))
def test_pieces_renormalised_one_after_another_give_the_whole_text(pieces):
    # What the segmenter does with streamed text: each piece is normalised with the
    # pending (already normalised) text before it.
    pending = ""
    for piece in pieces:
        pending = normalize_piece(pending + piece)
    whole = normalize_piece("".join(pieces))
    assert pending == whole
    assert normalize_piece(whole) == whole
    assert max(map(len, regex.findall(rf"[{MARK}]+", whole)), default=0) <= MAX_MARKS


def test_dropped_characters_are_those_of_pythons_unicode_database():
    # Cc, Cf, Cs, Co and Cn, as unicodedata (which NFKC uses) classes them, whitespace
    # controls kept: a character class from regex's newer Unicode would keep ~28,000
    # characters that Python does not know.
    from voxwire.engine.text.normalize import _drop

    everything = "".join(map(chr, range(0x110000)))
    kept = "".join(
        ch for ch in everything
        if ch in "\t\n\r\v\f" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn")
    )  # fmt: skip
    assert _drop(everything) == kept


def test_unicode_facts_the_segmenter_relies_on():
    # Renormalising streamed text from a character that is no mark nor Hangul vowel or
    # final jamo is safe only because: every character of combining class > 0 is a MARK,
    # every second character of a canonical composition is a MARK, and no character
    # but a MARK decomposes to something that starts with one.
    second = set()
    for cp in range(0x110000):
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            continue
        is_mark = _MARK.match(ch) is not None
        if unicodedata.combining(ch):
            assert is_mark, hex(cp)
        if not is_mark:
            assert _MARK.match(unicodedata.normalize("NFKD", ch)) is None, hex(cp)
        decomposition = unicodedata.decomposition(ch).split()
        if len(decomposition) == 2 and not decomposition[0].startswith("<"):
            second.add(chr(int(decomposition[1], 16)))
    assert all(_MARK.match(ch) for ch in second)


def test_an_acute_accent_typed_for_an_apostrophe_is_one():
    assert normalize("don\u00b4t") == "don't"
    assert normalize("caf\u00e9 \u00b4") == "caf\u00e9 '"


@pytest.mark.parametrize("text,length", [
    ("plain ASCII", 11), ("\ufdfa", 18), ("\ufb01ne", 4), ("caf\u00e9", 4), ("\u00bd", 3), ("\u4e2d\u6587", 2),
])
def test_expanded_length_counts_what_normalisation_makes_of_each_character(text, length):
    assert expanded_length(text) == length


def test_expanded_length_is_nfkcs_for_texts_that_compose_nothing():
    text = "\ufdfa\u2474 \ufb03x \u3392 plain"
    assert expanded_length(text) == len(unicodedata.normalize("NFKC", text))
