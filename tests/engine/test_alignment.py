"""The aligner alone (engine/alignment.py), on made-up phonemes: written words to the
spoken phonemes of a segment, and so to samples. Piper's and Kokoro's own timings through
their engines are tests/engine/piper/test_word_timings.py's and tests/engine/kokoro's."""

from __future__ import annotations

from voxwire.engine.alignment import Aligner
from voxwire.engine.base import WordTiming

# The Aligner alone, on made-up phonemes: one id per phoneme, one frame per id, hop 1
# unless given.
# Ids: ^ _ p1 _ p2 _ ... $, so phoneme i is id 2 + 2i and its pad is id 3 + 2i.


def _align(words, sentences, hop=1):
    aligner = Aligner(words, sentences, lambda p: 1, hop=hop)
    out, offset = [], 0
    for s in sentences:
        n_ids = 3 + 2 * len(s)
        out.append(aligner.sentence(s, [1] * n_ids, offset))
        offset += n_ids * hop
    return out


def test_aligner_splits_a_joined_phoneme_word():
    words = [("for", list("fɔɹ")), ("the", list("ðə")), ("end", list("ɛnd"))]
    [got] = _align(words, [list("fɚðə ɛnd.")])
    # f ɚ | ð ə | ɛ n d: phonemes 0-1, 2-3, 5-7 (4 is the space).
    assert got == [WordTiming("for", 2, 6), WordTiming("the", 6, 10), WordTiming("end", 12, 18)]


def test_aligner_gives_one_word_several_phoneme_words():
    words = [("12", list("twɛlv")), ("$3", list("θɹidɑlɚz"))]
    [got] = _align(words, [list("twɛlv θɹi dɑlɚz")])
    assert [w.word for w in got] == ["12", "$3"]
    assert got[1].start == 2 + 2 * 6 and got[1].end == 3 + 2 * 14 + 1


def test_aligner_places_words_in_their_sentences():
    words = [("Hi", list("haɪ")), ("there", list("ðɛɹ")), ("Yes", list("jɛs"))]
    got = _align(words, [list("haɪ ðɛɹ."), list("jɛs.")])
    assert [[w.word for w in s] for s in got] == [["Hi", "there"], ["Yes"]]
    assert got[1][0].start >= 3 + 2 * 8


def test_aligner_times_a_word_espeak_did_not_say_alone():
    words = [("a", list("ɐ")), ("x", []), ("b", list("b"))]
    [got] = _align(words, [list("ɐ ɛks b")])
    assert [w.word for w in got] == ["a", "x", "b"]
    assert all(w.start < w.end for w in got)
    assert got[0].end <= got[1].start and got[1].end <= got[2].start


def test_aligner_shares_phonemes_when_words_outnumber_them():
    words = [("one", list("a")), ("two", list("b")), ("three", list("c"))]
    [got] = _align(words, [list("a.")], hop=256)
    assert [w.word for w in got] == ["one", "two", "three"]
    assert got[0].start == 2 * 256 and got[-1].end == 4 * 256
    assert all(w.start < w.end for w in got)
    assert got[0].end <= got[1].start and got[1].end <= got[2].start
