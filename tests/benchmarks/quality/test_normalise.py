"""The ASR round-trip normaliser and word error rate, and the quality corpus file."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxwire.benchmarks.quality.normalise import normalise, sentence_errors, wer

CORPUS = Path(__file__).resolve().parents[3] / "benchmarks" / "corpus" / "quality.txt"


@pytest.mark.parametrize(
    ("written", "spoken"),
    [
        # times, with and without minutes, meridiem in every spelling
        ("It's 7:45 a.m.", "it is seven forty five a m"),
        ("7:45 AM", "seven forty five a m"),
        ("7.45am", "seven forty five a m"),
        ("7.45 p. m.", "seven forty five p m"),
        ("7am", "seven a m"),
        ("I am at seven am", "i am at seven a m"),
        ("7 P.M.", "seven p m"),
        ("8:02", "eight oh two"),
        ("12:00 p.m.", "twelve p m"),
        ("at 9 o'clock", "at nine"),
        ("at 930 with", "at nine thirty with"),
        ("930pm", "nine thirty p m"),
        ("lunch at 1215.", "lunch at twelve fifteen"),
        ("the alarm for 645", "the alarm for six forty five"),
        ("1.08", "one oh eight"),
        # money
        ("$42.50", "forty two dollars fifty cents"),
        ("$1,284.37", "one thousand two hundred eighty four dollars thirty seven cents"),
        ("$1", "one dollar"),
        ("$3.01", "three dollars one cent"),
        ("$36.00", "thirty six dollars"),
        ("42 dollars and 50 cents", "forty two dollars fifty cents"),
        ("$1.5 million", "one point five million dollars"),
        ("$2.5", "two point five dollars"),
        # percent, ordinals, dates
        ("84%", "eighty four percent"),
        ("84 per cent", "eighty four percent"),
        ("March 3rd", "march third"),
        ("the 150th day", "the one hundred fiftieth day"),
        ("April 8", "april eighth"),
        ("May 2026", "may two thousand twenty six"),
        # numbers
        ("8,432 steps", "eight thousand four hundred thirty two steps"),
        ("4.5 percent", "four point five percent"),
        (".5", "point five"),
        ("24°C", "twenty four degrees celsius"),
        ("101", "one hundred one"),
        ("at 300 meters", "at three hundred meters"),
        ("50 km", "fifty kilometers"),
        ("15 mph", "fifteen miles per hour"),
        # contractions
        ("I won't, you can't, they don't", "i will not you can not they do not"),
        ("We're sure you've said we'll go", "we are sure you have said we will go"),
        ("I'm sure I'd know", "i am sure i would know"),
        ("Let's see what's there", "let us see what is there"),
        ("Luigi's", "luigis"),
        # abbreviations, hyphens, punctuation, Unicode
        ("Dr. Patel", "doctor patel"),
        ("OK.", "okay"),
        ("twenty-one check-in", "twenty one check in"),
        ("\u201cHello\u201d \u2014 it\u2019s  me!", "hello it is me"),
        ("Wait... what?!", "wait what"),
    ],
)
def test_each_rule_spells_out_one_reading(written: str, spoken: str) -> None:
    assert normalise(written) == spoken


@pytest.mark.parametrize(
    ("reference", "whisper"),
    [
        ("It's 7:45 a.m.", "It's 7.45am"),
        ("It's 7:45 a.m.", "it is seven forty-five AM"),
        ("at 6:30 tomorrow", "at 6.30 tomorrow"),
        ("moved to 2:30 this afternoon", "moved to 230 this afternoon"),
        ("The total is $42.50.", "The total is 42 dollars and 50 cents."),
        ("Take 2 cups.", "Take two cups."),
        ("It is 12% lower.", "It's 12 percent lower."),
        ("Monday, the 14th.", "Monday the fourteenth"),
        ("April 8th at 10 a.m.", "April 8 at 10 a.m."),
        ("Okay, I've done it.", "OK, I have done it."),
        ("Elm and 5th", "Elm and Fifth"),
        ("gusts of 50 kilometers per hour", "gusts of 50 km per hour"),
    ],
)
def test_both_sides_land_on_the_same_form(reference: str, whisper: str) -> None:
    assert normalise(reference) == normalise(whisper)
    assert sentence_errors(reference, whisper) == 0


def test_a_real_misreading_stays_an_error() -> None:
    assert normalise("at 7:45 a.m.") != normalise("at 7:15 a.m.")
    found = sentence_errors("I found 5 Italian restaurants.", "I found fire battalion restaurants.")
    assert found == 2
    assert normalise("3 tickets for $36") != normalise("3 tickets for $1.36")


def test_wer_counts_edits_over_reference_words() -> None:
    assert wer(["the cat sat down"], ["the dog sat down"]) == 25.0
    assert wer(["the cat sat down"], ["the cat sat down"]) == 0.0
    assert wer(["the cat sat"], ["the cat sat down"]) == pytest.approx(100 / 3)


def test_wer_is_corpus_level_not_a_mean_of_sentences() -> None:
    # 1 edit in 2 words and 0 in 8: corpus 10%, mean of sentences would be 25%.
    refs = ["hello there", "one two three four five six seven eight"]
    hyps = ["hello where", "one two three four five six seven eight"]
    assert wer(refs, hyps) == 10.0


def test_an_empty_hypothesis_deletes_every_word() -> None:
    assert wer(["the cat sat down"], [""]) == 100.0
    assert wer(["the cat sat down", "hello there"], ["the cat sat down", "  "]) == pytest.approx(
        100 * 2 / 6
    )
    assert sentence_errors("the cat sat down", "") == 4


def test_wer_normalises_before_counting() -> None:
    assert wer(["It's 7:45 a.m."], ["it is 7.45am"]) == 0.0
    assert sentence_errors("It costs $42.50.", "It costs 42 dollars.") == 2  # "fifty cents" deleted


def test_wer_rejects_mismatched_or_empty_input() -> None:
    with pytest.raises(ValueError):
        wer(["a b"], ["a b", "c"])
    with pytest.raises(ValueError):
        wer([""], [""])


def test_the_quality_corpus_is_a_clean_list_of_sentences() -> None:
    raw = CORPUS.read_text(encoding="utf-8")
    lines = raw.splitlines()
    assert len(lines) >= 100
    assert all(line.strip() for line in lines), "blank line in the corpus"
    assert all(line == line.strip() for line in lines), "stray whitespace"
    assert len(set(lines)) == len(lines), "duplicate lines"
    assert all(line.endswith((".", "?", "!")) for line in lines)
    assert not any(line.lstrip().startswith("#") for line in lines)
    assert all(normalise(line) for line in lines)
