from engine.text import Segmenter, normalize, segment
from engine.text.segment import SegmenterLimits


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
    s = Segmenter()
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
