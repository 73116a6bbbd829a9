"""Text normalisation and word error rate for the ASR round trip.

The quality harness speaks a corpus sentence, transcribes the audio with Whisper and counts
word errors against the sentence. Whisper writes what it hears in its own orthography: "7.45am"
for a reference's "7:45 a.m.", "$42.50" for "forty two dollars fifty cents", "OK" for "Okay",
"it is" for "it's". Counted raw, those are errors of spelling, not of speech, and they would
swamp the errors the harness exists to find (skipped, slurred or wrong words). So both the
reference and the hypothesis go through the same `normalise`, which maps every written form of
one spoken reading onto a single spelled-out form. Because the function is applied to both
sides, a rule only has to be consistent, not linguistically "right": "'d" always becomes
"would" even where it means "had", and 2026 becomes whatever inflect says for 2026 on both sides.

The rules, and why each exists:

* Unicode quotes and dashes become ASCII, so typographic and plain text compare equal.
* Contractions expand from one fixed table (it's -> it is, won't -> will not, 'd -> would): a
  voice may say either form and Whisper writes either, and no listener hears the difference as
  an error. Remaining possessive apostrophes are simply dropped.
* Times: "7:45", "7.45 am", "7:45 a.m." and "7.45AM" all read "seven forty five a m"; ":00"
  reads as the bare hour, and "o'clock" is dropped, because "7:00", "7 o'clock" and "seven" are
  the same words to a listener. Whisper writes spoken times as "6.30" and "630" as often as
  "6:30", so a dotted number with exactly two valid minute digits ("6.30", "12.15") is a time,
  and so is a bare "630"/"1215" with am/pm or after a preposition of time ("at", "by", "for",
  "until", "till", "from", "to"). Both sides read a true decimal like "1.08" the same way, so
  this costs nothing when both write digits; only "4.5" and other one-digit decimals stay
  "point" numbers. "a.m.", "am", "AM" after a number, in digits or words, become "a m".
* Dates: a day number after a month name is an ordinal ("April 8" is "April eighth").
* Unit symbols after a number are spelled out (km, mph, kg ...), as Whisper abbreviates them.
* Money: "$42.50", "42 dollars 50 cents" and "42 dollars and 50 cents" all become "forty two
  dollars fifty cents"; "$1" is "one dollar".
* "%" is "percent" (and "per cent" is one word); "°" is "degrees" ("°C" degrees celsius); "&"
  is "and". "$1.5 million" is "one point five million dollars".
* Ordinals, "3rd" -> "third", and numbers, "8,432" or "4.5", become words with inflect, without
  the British "and" inside numbers: Whisper writes digits for spoken numbers, a reference may
  write either.
* A few title abbreviations (Dr., Mr., Mrs.) and "OK" are spelled out, since Whisper uses
  both forms for the same sound.
* Hyphens become spaces (twenty-one == twenty one), all other punctuation goes, case folds and
  whitespace collapses: none of these are audible.

The rules are general on purpose. A rule written for one corpus sentence would hide that
sentence's real errors; anything that is not a spelling variant must stay an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import inflect
import jiwer

__all__ = ["normalise", "sentence_errors", "wer"]

_INFLECT = inflect.engine()

_UNICODE = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u2032": "'",
        "\u02bc": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u2033": '"',
        "\u2010": "-",
        "\u2011": "-",
        "\u2012": "-",
        "\u2013": "-",
        "\u2014": "-",
        "\u2015": "-",
        "\u2212": "-",
        "\u2026": "...",
        "\u00a0": " ",
        "\u202f": " ",
    }
)

# Whole-word contractions whose expansion is not the regular suffix rule below.
_CONTRACTIONS = {
    "won't": "will not",
    "can't": "can not",
    "cannot": "can not",
    "shan't": "shall not",
    "ain't": "is not",
    "let's": "let us",
    "it's": "it is",
    "that's": "that is",
    "what's": "what is",
    "there's": "there is",
    "here's": "here is",
    "where's": "where is",
    "who's": "who is",
    "how's": "how is",
    "he's": "he is",
    "she's": "she is",
    "when's": "when is",
    "why's": "why is",
    "y'all": "you all",
    "o'clock": "",
}
_CONTRACTION_RE = re.compile(r"\b(" + "|".join(re.escape(k) for k in _CONTRACTIONS) + r")(?!\w)")
_SUFFIXES = (
    (re.compile(r"(?<=\w)n't\b"), " not"),
    (re.compile(r"(?<=\w)'re\b"), " are"),
    (re.compile(r"(?<=\w)'ve\b"), " have"),
    (re.compile(r"(?<=\w)'ll\b"), " will"),
    (re.compile(r"(?<=\w)'m\b"), " am"),
    (re.compile(r"(?<=\w)'d\b"), " would"),
)

_ABBREVIATIONS = (
    (re.compile(r"\bdr\.?(?=\s+[a-z])"), "doctor"),
    (re.compile(r"\bmrs\.?(?=\s+[a-z])"), "missus"),
    (re.compile(r"\bmr\.?(?=\s+[a-z])"), "mister"),
    (re.compile(r"\bo\.?k\.?(?!\w)"), "okay"),
)

_MERIDIEM = r"(?P<mer>[ap])\.?\s?m\b\.?"
_HOUR = r"(?P<h>[01]?\d|2[0-3])"
_MINUTE = r"(?P<m>[0-5]\d)"
# "7:45", "7.45", "7:45 pm", "7.45am": an hour, a colon or dot, two digits of minutes.
_TIME_SEPARATED = re.compile(
    r"(?<![\d.,])\b" + _HOUR + r"[:.]" + _MINUTE + r"(?!\d|[.,]\d)(?:\s*" + _MERIDIEM + ")?"
)
# "930am" always; "930" only after a preposition of time ("at 930", "from 930 to 1030"), and
# not on the hour, since "at 300" is more often a quantity than a time.
_TIME_COMPACT = re.compile(
    r"(?:\b(?P<pre>at|by|for|until|till|from|to)\s+)?(?<![\d.,])\b"
    + r"(?P<h>[1-9]|1\d|2[0-3])"
    + _MINUTE
    + r"(?!\d|[.,]\d)(?:\s*"
    + _MERIDIEM
    + ")?"
)
_TIME_HOUR = re.compile(r"\b(?P<h>\d{1,2})\s*" + _MERIDIEM)
# A dotted "a.m." needs no number before it to be unambiguous.
_DOTTED_MERIDIEM = re.compile(r"\b([ap])\.\s?m\.")

_MONEY = re.compile(r"\$\s?(?P<d>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<c>\d+))?(?!\d|[.,]\d)")
# "$1.5 million" is "one point five million dollars".
_MONEY_SCALE = re.compile(
    r"\$\s?(?P<n>\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*(?P<s>thousand|million|billion|trillion)\b"
)
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
# "April 8" is read "April eighth"; the "th" is only a marker for the ordinal rule below.
_MONTH_DAY = re.compile(r"\b(" + _MONTHS + r")\s+([1-9]|[12]\d|3[01])(?![\d:.,]\d|\w)")
_UNITS = {
    "km/h": "kilometers per hour",
    "kph": "kilometers per hour",
    "mph": "miles per hour",
    "km": "kilometers",
    "kg": "kilograms",
    "cm": "centimeters",
    "mm": "millimeters",
    "ft": "feet",
    "lbs": "pounds",
    "lb": "pounds",
}
# Unit symbols only after a number, where they cannot be a word.
_UNIT = re.compile(r"(?<=\d)\s*(" + "|".join(re.escape(u) for u in _UNITS) + r")(?![\w/])")
_NUMBER_WORDS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    "sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|oh|zero"
)
# "seven forty five am", once the numbers are words: "am" after a number is the meridiem.
_WORD_MERIDIEM = re.compile(r"\b(" + _NUMBER_WORDS + r") ([ap])m\b")
_DOLLARS_AND_CENTS = re.compile(r"\b(dollars?) and (?=(?:\w+ )*?cents?\b)")
_PERCENT = re.compile(r"\s*%")
_ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")
_LEADING_POINT = re.compile(r"(?<![\w.])\.(\d+)")
_NUMBER = re.compile(r"(?<!\d)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")
_APOSTROPHE = re.compile(r"'")
_NON_WORD = re.compile(r"[^a-z0-9 ]+")
_SPACE = re.compile(r"\s+")


def _words(number: str) -> str:
    return str(_INFLECT.number_to_words(number, andword=""))


def _clock(hour: str, minute: str, meridiem: str | None) -> str:
    spoken = [_words(str(int(hour)))]
    m = int(minute)
    if m:
        spoken.append(("oh " if m < 10 else "") + _words(str(m)))
    if meridiem:
        spoken.append(f"{meridiem} m")
    return " ".join(spoken)


def _time(match: re.Match[str]) -> str:
    groups = match.groupdict()
    return " " + _clock(groups["h"], groups.get("m") or "00", groups["mer"]) + " "


def _compact_time(match: re.Match[str]) -> str:
    if not match["mer"] and (not match["pre"] or match["m"] == "00"):
        return match[0]  # "at 300 meters" is a distance, "at 930" a time
    return " " + (match["pre"] or "") + _time(match)


def _money(match: re.Match[str]) -> str:
    dollars = match["d"].replace(",", "")
    if match["c"] and len(match["c"]) != 2:  # "$2.5" is two point five dollars, not cents
        return " " + _words(dollars + "." + match["c"]) + " dollars "
    spoken = _words(dollars) + (" dollar" if int(dollars) == 1 else " dollars")
    if match["c"] and int(match["c"]):
        cents = int(match["c"])
        spoken += " " + _words(str(cents)) + (" cent" if cents == 1 else " cents")
    return " " + spoken + " "


def _number(match: re.Match[str]) -> str:
    return " " + _words(match[1].replace(",", "") + (match[2] or "")) + " "


def _ordinal(match: re.Match[str]) -> str:
    return " " + _words(str(_INFLECT.ordinal(match[1]))) + " "


def normalise(text: str) -> str:
    """One spelled-out, lower-case, punctuation-free form of ``text``, for scoring."""
    text = text.translate(_UNICODE).lower()
    text = _CONTRACTION_RE.sub(lambda m: _CONTRACTIONS[m[1]], text)
    for pattern, expansion in _SUFFIXES:
        text = pattern.sub(expansion, text)
    for pattern, expansion in _ABBREVIATIONS:
        text = pattern.sub(expansion, text)
    text = _MONEY_SCALE.sub(r" \g<n> \g<s> dollars ", text)
    text = _MONEY.sub(_money, text)
    text = _TIME_SEPARATED.sub(_time, text)
    text = _TIME_COMPACT.sub(_compact_time, text)
    text = _TIME_HOUR.sub(_time, text)
    text = _MONTH_DAY.sub(r"\1 \2th", text)
    text = _UNIT.sub(lambda m: " " + _UNITS[m[1]] + " ", text)
    text = _DOTTED_MERIDIEM.sub(r" \1 m ", text)
    text = _PERCENT.sub(" percent ", text).replace("per cent", "percent")
    text = text.replace("\u00b0c", " degrees celsius ").replace("\u00b0f", " degrees fahrenheit ")
    text = text.replace("\u00b0", " degrees ").replace("&", " and ")
    text = _ORDINAL.sub(_ordinal, text)
    text = _LEADING_POINT.sub(lambda m: " " + _words("0." + m[1]).removeprefix("zero ") + " ", text)
    text = _NUMBER.sub(_number, text)
    text = _APOSTROPHE.sub("", text)
    text = _NON_WORD.sub(" ", text)
    text = _SPACE.sub(" ", text).strip()
    text = _WORD_MERIDIEM.sub(r"\1 \2 m", text)
    return _DOLLARS_AND_CENTS.sub(r"\1 ", text)


def _pairs(
    references: Sequence[str], hypotheses: Sequence[str]
) -> tuple[list[str], list[str], int]:
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    refs = [normalise(r) for r in references]
    hyps = [normalise(h) for h in hypotheses]
    return refs, hyps, sum(len(r.split()) for r in refs)


def _edits(output: jiwer.WordOutput) -> int:
    return int(output.substitutions + output.deletions + output.insertions)


def sentence_errors(reference: str, hypothesis: str) -> int:
    """Word edits (substitutions + deletions + insertions) between one normalised pair."""
    ref, hyp = normalise(reference), normalise(hypothesis)
    if not ref or not hyp:
        return len(ref.split()) + len(hyp.split())
    return _edits(jiwer.process_words(ref, hyp))


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus word error rate in percent: all edits over all reference words, normalised.

    An empty hypothesis counts every word of its reference as deleted.
    """
    refs, hyps, total = _pairs(references, hypotheses)
    if total == 0:
        raise ValueError("the references have no words")
    edits = 0
    scored_refs: list[str] = []
    scored_hyps: list[str] = []
    for ref, hyp in zip(refs, hyps, strict=True):
        if ref and hyp:
            scored_refs.append(ref)
            scored_hyps.append(hyp)
        else:
            edits += len(ref.split()) + len(hyp.split())
    if scored_refs:
        edits += _edits(jiwer.process_words(scored_refs, scored_hyps))
    return 100.0 * edits / total
