"""engine/text/lexicon.py: entries, whole-word case-aware matching, files."""

from __future__ import annotations

import pytest

from voxwire.engine.text.lexicon import MAX_KEY_WORDS, Lexicon, LexiconError, Phonemes, entry, from_mapping, load

LEXICON = Lexicon([
    entry("nginx", "engine x"),
    entry("Voxwire", "/vˈɑkswaɪɚ/"),
    entry("New York", "/nuː jˈɔːɹk/"),
    entry("US", "you ess"),
    entry("new", "knew"),
])


def test_a_value_between_slashes_is_phonemes_and_any_other_a_respelling():
    assert entry("Voxwire", " /vˈɑks   waɪɚ/ ").phonemes == "vˈɑks waɪɚ"
    assert entry("nginx", "engine x").respelling == "engine x"


def test_a_lower_case_key_matches_any_case_and_a_capitalised_one_only_itself():
    assert LEXICON.pieces("nginx, Nginx and NGINX") == ["engine x, engine x and engine x"]
    assert LEXICON.pieces("the US and us") == ["the you ess and us"]
    assert LEXICON.pieces("Voxwire and voxwire") == [Phonemes("vˈɑkswaɪɚ"), " and voxwire"]


def test_matching_is_whole_word():
    assert LEXICON.pieces("nginxes USB renew newer") == ["nginxes USB renew newer"]
    assert LEXICON.pieces("e-new new's") == ["e-new new's"]


def test_the_longest_phrase_wins_and_its_words_are_separated_by_whitespace_alone():
    pieces = LEXICON.pieces("In New York, new York and New, York.")
    assert pieces == ["In ", Phonemes("nuː jˈɔːɹk,"), " knew York and knew, York."]
    assert isinstance(pieces[1], Phonemes) and not isinstance(pieces[0], Phonemes)
    assert LEXICON.pieces("New\n  York") == [Phonemes("nuː jˈɔːɹk")]


def test_respelled_keeps_the_written_words_of_phoneme_entries():
    assert LEXICON.respelled("Voxwire runs nginx in the US.") == "Voxwire runs engine x in the you ess."


def test_the_right_side_of_a_merge_wins_and_the_fingerprint_follows_the_entries():
    mine = Lexicon([entry("nginx", "N G I N X")])
    merged = LEXICON | mine
    assert merged.pieces("nginx") == ["N G I N X"] and len(merged) == len(LEXICON)
    assert merged.fingerprint != LEXICON.fingerprint
    assert Lexicon(reversed(list(LEXICON))).fingerprint == LEXICON.fingerprint
    assert (LEXICON | Lexicon()) is LEXICON and (Lexicon() | mine) is mine


@pytest.mark.parametrize("key, value, why", [
    ("", "x", "a key is one or more words"),
    ("Vox wire!", "x", "a key is one or more words"),
    ("two  spaces", "x", "a key is one or more words"),
    (" ".join(["w"] * (MAX_KEY_WORDS + 1)), "x", "at most"),
    ("word", "", "1 to 400 printable characters"),
    ("word", "x" * 401, "1 to 400 printable characters"),
    ("word", "tab\there", "printable"),
    ("word", "//", "between two slashes"),
    ("word", "/a/b/", "between two slashes"),
    ("word", "half/way", "without slashes"),
    ("word", "...", "at least one word"),
    ("word", 3, "must be strings"),
])
def test_a_bad_entry_is_refused_naming_it(key, value, why):
    with pytest.raises(LexiconError, match=why) as e:
        entry(key, value)
    assert e.value.key == str(key)


def test_a_mapping_is_bounded():
    with pytest.raises(LexiconError, match="at most 2 entries"):
        from_mapping({"a": "b", "c": "d", "e": "f"}, limit=2)
    assert len(from_mapping({"a": "b"}, limit=2)) == 1


def test_a_file_has_one_entry_a_line_with_comments(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("# how we say our names\n\nVoxwire = /vˈɑkswaɪɚ/\nnginx=engine x\n", encoding="utf-8")
    lexicon = load(path)
    assert LEXICON.pieces("nginx") == lexicon.pieces("nginx") and len(lexicon) == 2


@pytest.mark.parametrize("text, why", [
    ("Voxwire /v/\n", ":1: write KEY = VALUE"),
    ("a = b\nVox wire! = x\n", ":2: a key is one or more words"),
    ("a = b\n# c\na = c\n", ":3: given twice"),
])
def test_a_bad_line_is_refused_with_its_file_and_line(tmp_path, text, why):
    path = tmp_path / "names.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LexiconError, match=why) as e:
        load(path)
    assert str(path) in str(e.value)


def test_layers_count_each_key_once_and_the_top_layer_is_in_force():
    base = Lexicon([entry("nginx", "engine x"), entry("Voxwire", "/vˈɑks/")])
    top = Lexicon([entry("nginx", "N G I N X"), entry("SQL", "sequel")])
    both = base | top
    assert len(both) == 3 and {e.key: e for e in both}["nginx"].respelling == "N G I N X"
    assert both.pieces("nginx SQL Voxwire") == ["N G I N X sequel ", Phonemes("vˈɑks")]
    assert len(both | top) == 3 and (both | top).fingerprint != both.fingerprint


def test_the_punctuation_after_a_phoneme_entry_goes_with_its_phonemes():
    # A phonemizer drops the punctuation a text starts with: the sentence's end would be lost.
    assert LEXICON.pieces("Voxwire. Hi, Voxwire !? and Voxwire") == [
        Phonemes("vˈɑkswaɪɚ."), " Hi, ", Phonemes("vˈɑkswaɪɚ!?"), " and ", Phonemes("vˈɑkswaɪɚ")]


def test_a_long_text_is_matched_word_by_word_as_far_as_a_key_goes_on():
    # Keys that all start alike, and a text of their first words: each word is tried only
    # as far as some key goes on.
    lexicon = Lexicon(entry(" ".join(f"w{i}x{j}" for j in range(MAX_KEY_WORDS)), "x") for i in range(50))
    text = " ".join(f"w{i % 50}x0" for i in range(500))
    assert lexicon.pieces(text) == [text]
    whole = " ".join(f"w7x{j}" for j in range(MAX_KEY_WORDS))
    assert lexicon.pieces(f"{text} {whole}.") == [f"{text} x."]
