import pytest
import regex

from voxwire.engine.text import Segmenter, normalize, segment
from voxwire.engine.text.segment import SegmenterLimits

# The tests' own oracle: a mark extends the cluster of the character before it (UAX #29),
# and no more than 30 follow one base (the Stream-Safe Text Format's bound, UAX #15).
MARK = r"\p{M}\p{Grapheme_Cluster_Break=Extend}\p{Grapheme_Cluster_Break=SpacingMark}"
MAX_MARKS = 30
_CLUSTER = regex.compile(r"\X")
_MARK = regex.compile(rf"[{MARK}]")


def cluster_starts(text: str) -> set[int]:
    return {m.start() for m in _CLUSTER.finditer(text)} | {len(text)}


def boundaries(segments: list[str]) -> list[int]:
    out, at = [], 0
    for s in segments[:-1]:
        at += len(s)
        out.append(at)
    return out


def test_sentences_split_with_separators_kept():
    text = "Hello world. How are you? I am fine!"
    assert segment(text) == ["Hello world.", " How are you?", " I am fine!"]


def test_abbreviations_initials_and_decimals_do_not_end_sentences():
    assert segment("Dr. Smith paid $3.50 for it. Then J. R. Tolkien left.") == [
        "Dr. Smith paid $3.50 for it.",
        " Then J. R. Tolkien left.",
    ]


def test_long_first_sentence_splits_at_a_clause_but_later_ones_do_not():
    first = "In the beginning of the long and winding story, there was a small village by the sea."
    later = " Later on, after many years of quiet and patient waiting, the village grew into a town."
    segs = segment(first + later)
    assert segs[0] == "In the beginning of the long and winding story,"
    assert segs[1:] == [" there was a small village by the sea.", later]


def test_short_first_sentence_is_not_split():
    assert segment("Well, I think so. Yes.") == ["Well, I think so.", " Yes."]


def test_cjk_sentences_split_without_spaces():
    assert segment("你好。今天天气很好！我们走吧？") == ["你好。", "今天天气很好!", "我们走吧?"]


def test_run_without_punctuation_is_split_at_a_space_before_the_bound():
    words = " ".join(["word"] * 200)
    segs = segment(words, SegmenterLimits(max_chars=100))
    assert all(len(s) <= 100 for s in segs)
    assert "".join(segs) == words
    assert all(not s.endswith(" ") for s in segs)


def test_streamed_pieces_give_the_same_segments_as_whole_text():
    text = ("Dr. Jones arrived at 3.30 p.m. on Monday, carrying an umbrella that nobody had seen before. "
            "She said: \"Hello!\" Everyone laughed.  Then   silence.")
    s = Segmenter(SegmenterLimits(first_clause_words=0))  # no early clause: streamed is whole
    streamed = []
    for i in range(0, len(text), 3):
        streamed += s.push(text[i : i + 3])
    streamed += s.flush()
    assert streamed == segment(text)
    assert "".join(streamed) == normalize(text)


def test_a_sentence_end_waits_for_the_next_character():
    s = Segmenter()
    assert s.push("Hello Mr.") == []
    assert s.push(" Smith. And") == ["Hello Mr. Smith."]
    assert s.flush() == [" And"]


def test_flush_emits_pending_text_and_keeps_the_separator():
    s = Segmenter()
    assert s.push("one two ") == []
    assert s.flush() == ["one two"]
    assert s.push("three.") == []
    assert s.flush() == [" three."]


def test_empty_and_whitespace_only_text_gives_no_segments():
    assert segment("") == []
    assert segment("   \n\t ") == []


@pytest.mark.parametrize("n", [400, 450, 800, 4000])
def test_marks_piled_on_one_base_are_one_bounded_segment(n):
    # Once 401 segments, one per mark after the first 400 characters, and minutes of audio.
    text = "a" + "\u0301" * n
    segs = segment(text)
    assert segs == [normalize(text)]
    assert len(segs[0]) == MAX_MARKS
    assert _MARK.match(segs[0]) is None


def test_twenty_thousand_marks_are_one_short_segment():
    assert segment("x" + "\u0301" * 19999) == ["x" + "\u0301" * MAX_MARKS]


def test_no_segment_starts_with_a_mark_or_is_made_of_marks():
    for text in ["\u0301" * 500 + "abc", "Hi. \u0301\u0301 there.", "x " + "\u0301" * 450, "\u00b4" * 900]:
        for seg in segment(text):
            assert _MARK.match(seg) is None and _MARK.match(seg.lstrip()) is None, ascii(seg)


def test_indic_spacing_marks_stay_with_their_consonants_across_a_forced_split():
    # The 400th character falls inside "\u0915\u094d\u0937\u093f": the old split, which
    # only stepped back over unicodedata.combining() marks (the virama has class 9, the
    # vowel sign U+093F class 0), cut "\u0915\u094d|\u0937\u093f".
    text = "xx" + "\u0915\u094d\u0937\u093f" * 250
    segs = segment(text)
    assert "".join(segs) == text and len(segs) > 1
    assert all(len(s) <= 400 for s in segs)
    assert set(boundaries(segs)) <= cluster_starts(text)
    assert all(s.endswith("\u093f") for s in segs) and all(s.startswith("\u0915") for s in segs[1:])


def test_emoji_keep_their_skin_tones():
    text = "\U0001f44d\U0001f3fd" * 300
    segs = segment(text)
    assert "".join(segs) == text and len(segs) > 1
    assert all(s.startswith("\U0001f44d") and s.endswith("\U0001f3fd") for s in segs)
    assert segment("\U0001f44d" + "\U0001f3fd" * 100) == ["\U0001f44d" + "\U0001f3fd" * MAX_MARKS]


def test_cjk_without_spaces_is_split_between_characters():
    text = "\u4f60\u597d\u4e16\u754c" * 200
    segs = segment(text)
    assert [len(s) for s in segs] == [400, 400]
    assert segment("\u4f60\u597d\u4e16\u754c\u3002" * 3) == ["\u4f60\u597d\u4e16\u754c\u3002"] * 3


@pytest.mark.parametrize("text", ["x" * 20000, "." * 20000, "ab." * 6666, "U.S." * 5000])
def test_long_runs_without_spaces_are_split_at_the_bound(text):
    segs = segment(text)
    assert "".join(segs) == text
    assert [len(s) for s in segs[:-1]] == [400] * (len(segs) - 1)
    assert 0 < len(segs[-1]) <= 400


def test_abbreviations_without_end_are_split_at_the_bound():
    segs = segment("Dr. " * 5000)
    assert "".join(segs) == normalize("Dr. " * 5000)
    assert len(segs) == 50 and all(len(s) <= 400 for s in segs)


def test_a_cluster_longer_than_a_segment_is_split_inside_before_no_mark():
    # Hangul conjoining jamo: one extended grapheme cluster of 1,000 leading consonants.
    text = "\u1100" * 999 + "\uac00"
    segs = segment(text)
    assert "".join(segs) == text
    assert all(len(s) <= 400 for s in segs)
    # An Indic conjunct chain is one cluster too (UAX #29, GB9c); it is split before a
    # consonant, never before a virama.
    chain = "\u0915\u094d" * 300 + "\u0915"
    segs = segment(chain)
    assert "".join(segs) == chain and len(segs) > 1
    assert all(s.startswith("\u0915") for s in segs)


def test_a_cluster_no_longer_than_the_bound_is_kept_whole():
    # Six characters, one cluster: with the space before it, one over the bound.
    cluster = "\u0915\u094d\u0937\u093f\ufe0f\ufe0f"
    segs = segment("x " + cluster * 3, SegmenterLimits(max_chars=6))
    assert segs == ["x", " " + cluster, cluster, cluster]


def test_no_sentence_end_before_a_mark():
    # "\u3002" ends a sentence at once, but not before a mark that belongs to it.
    s = Segmenter()
    assert s.push("\u4f60\u597d\u3002") == []
    assert s.push("\u3099\u4e16\u754c\u3002\u518d") == ["\u4f60\u597d\u3002\u3099\u4e16\u754c\u3002"]


def test_streamed_adversarial_text_segments_as_whole():
    for text in ["Dr. " * 600, "a" + "\u0301" * 900 + " ok. " * 100, "\u0915\u094d\u0937\u093f" * 300, "A.\u4f60" * 500]:
        s, out = Segmenter(), []
        for i in range(0, len(text), 7):
            out += s.push(text[i : i + 7])
        out += s.flush()
        assert out == segment(text)


def tokens(text: str) -> list[str]:
    """As an LLM streams it: words with their leading space."""
    return regex.findall(r"\s*\S+", text)


def stream(text: str, limits: SegmenterLimits) -> list[tuple[int, list[str]]]:
    """(tokens pushed so far, segments) for each push that completed any, then the flush."""
    s, out = Segmenter(limits), []
    for i, token in enumerate(tokens(text), 1):
        if segs := s.push(token):
            out.append((i, segs))
    return out + [(-1, s.flush())]


SAYS = "Sure, the museum opens at nine, and tours start at ten. Want a ticket?"


def test_streamed_text_may_start_at_a_clause_once_enough_words_precede_it():
    # "Sure," has one word: too few. "the museum opens at nine," has six: taken as soon as
    # the token after the comma arrives, while the sentence is still being written.
    [(at, [first]), *rest] = stream(SAYS, SegmenterLimits(first_clause_words=3))
    assert first == "Sure, the museum opens at nine,"
    assert at == len(tokens(first)) + 1
    assert [seg for _, segs in rest for seg in segs] == [" and tours start at ten.", " Want a ticket?"]


def test_without_early_clauses_streamed_text_waits_for_the_sentence_end():
    [(at, [first]), *_] = stream(SAYS, SegmenterLimits(first_clause_words=0))
    assert first == "Sure, the museum opens at nine, and tours start at ten."
    assert at == len(tokens(first)) + 1


def test_the_word_count_is_of_the_whole_text_before_the_boundary():
    # Two words, then one: the second comma has three words before it.
    [(_, [first]), *_] = stream("Well then, yes, it opens at nine.", SegmenterLimits(first_clause_words=3))
    assert first == "Well then, yes,"


def test_early_clauses_are_only_for_the_first_segment_of_text_still_arriving():
    limits = SegmenterLimits(first_clause_words=2)
    # The whole text at once, or its sentence end already in: the sentence is spoken whole.
    s = Segmenter(limits)
    assert s.push(SAYS, final=True) + s.flush() == ["Sure, the museum opens at nine, and tours start at ten.", " Want a ticket?"]
    s = Segmenter(limits)
    assert s.push("Sure, the museum opens at nine, and then", final=True) == []
    assert s.flush() == ["Sure, the museum opens at nine, and then"]
    s = Segmenter(limits)
    assert s.push("Sure, the museum opens at nine, and tours start at ten. Want")[0] == (
        "Sure, the museum opens at nine, and tours start at ten."
    )
    # Once audio has started, later sentences are spoken whole.
    later = [seg for _, segs in stream("Hello there. Then, after a while, it rained.", limits) for seg in segs]
    assert later == ["Hello there.", " Then, after a while, it rained."]


@pytest.mark.parametrize(
    "text, first",
    [
        ("The museum \u2014 the old one \u2014 opens at nine.", "The museum -"),  # an em dash is " - "
        ("The museum - the old one - opens at nine.", "The museum -"),
        ("The well-known museum opens at nine.", "The well-known museum opens at nine."),
        ("It opens from 9\u201310 and 11-12 daily.", "It opens from 9-10 and 11-12 daily."),
    ],
)
def test_a_dash_between_spaces_ends_a_clause_a_hyphen_does_not(text, first):
    [(_, segs), *_] = stream(text, SegmenterLimits(first_clause_words=2))
    assert segs[0] == first
