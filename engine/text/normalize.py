"""Normalise text before it is segmented and spoken.

Normalisation is deliberately conservative: it only removes what no engine can speak
(control characters, odd whitespace, compatibility forms) so that the segmenter's
guarantee — segments joined equal the normalised text — stays meaningful to a reader.
Number and abbreviation expansion belongs to each engine's own front end (espeak-ng for
Piper), which knows its language.

Combining marks (``MARK``: the characters that extend the grapheme cluster of the one
before them, UAX #29) are bounded, because nothing can speak a long run of them and each
one costs the engine as much as a letter:

- a run of marks that follows no character, or follows whitespace, has no base to sit on
  and is dropped (``" \\u0301"``; the spacing ``"\\u00b4"`` that NFKC turns into it is
  taken for the apostrophe it is typed for);
- a run after one base keeps at most ``MAX_MARKS`` (30, the bound of Unicode's
  Stream-Safe Text Format, UAX #15; no real text reaches it), counted in canonical
  decomposed order, and drops the rest. Where the cut falls inside a group of non-starter
  marks and a starter mark follows in the run (an Indic vowel sign, a variation
  selector), that mark takes the 30th place: it seals the run, so that renormalising the
  capped text together with text that follows (the segmenter renormalises its pending
  tail with each new piece) can never let a later mark sort in before the cut, and a
  run straddling two pieces is capped exactly as if it had come whole.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata

import numpy as np
import regex

# Typographic punctuation that phonemizers treat inconsistently, mapped to ASCII.
_PUNCTUATION = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u2032": "'",
        "\u2033": '"',
        "\u2013": "-",
        "\u2014": " - ",
        "\u2212": "-",
        "\u00a0": " ",
        # The acute accent typed for an apostrophe ("don\u00b4t"): NFKC would make it a
        # space and a mark with no base, so it is mapped before decomposing.
        "\u00b4": "'",
    }
)
_SPACES = re.compile(r"\s+")

MARK = r"\p{M}\p{Grapheme_Cluster_Break=Extend}\p{Grapheme_Cluster_Break=SpacingMark}"
"""The body of a regex character class: combining marks, emoji modifiers and Indic spacing
marks, which extend the cluster of the character before them (and ``unicodedata.combining``
misses, since many Indic marks have combining class 0)."""

MAX_MARKS = 30
"""The most combining marks kept after one base (Stream-Safe Text Format, UAX #15)."""


def _dropped_table() -> np.ndarray:
    # Cc: control characters, Cf: format characters (zero-width joiners, BOM), Cs: lone
    # surrogates that cannot be encoded, Co/Cn: private use and unassigned. Whitespace
    # controls are kept as whitespace. One flag per code point (1.1 MB, built in ~0.1 s),
    # read from unicodedata rather than written as regex's \p{C}: regex follows a newer
    # Unicode than Python's normaliser (Unicode 14 in Python 3.11), and a character that
    # Python does not know must stay dropped. A character class of these ~700 ranges would
    # be slower than a per-character test: re and regex try ranges above U+FFFF in turn.
    dropped = dict.fromkeys(("Cc", "Cf", "Cs", "Co", "Cn"), True).get
    flags = np.fromiter(
        map(dropped, map(unicodedata.category, map(chr, range(0x110000))), itertools.repeat(False)),
        dtype=bool,
        count=0x110000,
    )
    flags[[ord(ch) for ch in "\t\n\r\v\f"]] = False
    return flags


_DROPPED = _dropped_table()


def _drop(text: str) -> str:
    if text.isprintable():  # no character of category C at all: the usual piece
        return text
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    keep = ~_DROPPED[points]
    return text if keep.all() else points[keep].tobytes().decode("utf-32-le")


# Only a run longer than the cap needs work before NFKD; the lookbehind starts each try
# at a run's first mark, so a run is read once.
_LONG_RUN = regex.compile(rf"(?<![{MARK}])[{MARK}]{{{MAX_MARKS + 1},}}")
_MARK_RUN = regex.compile(rf"[{MARK}]+")
# After NFKD: a run with no base before it (at the start, after whitespace), or over the cap.
_UNBOUNDED_RUN = regex.compile(rf"(?:^|(?<=\s))[{MARK}]+|(?<![{MARK}])[{MARK}]{{{MAX_MARKS + 1},}}")


def _cap(marks: str) -> str:
    """Bound a run of marks that is in canonical order (see the module's docstring)."""
    kept = list(marks[:MAX_MARKS])
    for ch in marks[MAX_MARKS:]:
        if unicodedata.combining(ch) == 0 and unicodedata.combining(kept[-1]) != 0:
            kept[-1] = ch
            break
    return "".join(kept)


def _canonical_order(marks: str) -> str:
    # Stable sort by combining class between starters: what NFKD does, in n log n.
    out: list[str] = []
    group: list[str] = []
    for ch in marks:
        if unicodedata.combining(ch):
            group.append(ch)
        else:
            out += sorted(group, key=unicodedata.combining)
            out.append(ch)
            group = []
    out += sorted(group, key=unicodedata.combining)
    return "".join(out)


def _settle(base: str, marks: str) -> str:
    """``base`` and the long run of ``marks`` after it, decomposed, in canonical order and
    capped: what the pipeline would make of them, done here because CPython's canonical
    reordering is quadratic in a run's length (20,000 alternating marks take seconds)."""
    decomposed = unicodedata.normalize("NFKD", base) + marks
    if unicodedata.is_normalized("NFKD", decomposed):  # linear: NFKD has no "maybe"
        return _MARK_RUN.sub(lambda m: _cap(m.group()), decomposed)
    decomposed = unicodedata.normalize("NFKD", base) + "".join(
        [unicodedata.normalize("NFKD", ch) for ch in marks]
    )
    # A mark may decompose into a mark and a letter (Thai SARA AM): one run may become two.
    return _MARK_RUN.sub(lambda m: _cap(_canonical_order(m.group())), decomposed)


def _shorten_long_runs(text: str) -> str:
    if _LONG_RUN.search(text) is None:
        return text
    out, last = [], 0
    for m in _LONG_RUN.finditer(text):
        start = max(m.start() - 1, last)
        out += [text[last:start], _settle(text[start : m.start()], m.group())]
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def _bound_run(m: regex.Match[str]) -> str:
    if m.start() == 0 or m.string[m.start() - 1].isspace():
        return ""
    return _cap(m.group())


def normalize_piece(text: str) -> str:
    """Normalise a piece of streamed text without trimming its edges.

    Whitespace runs collapse to one space but a leading or trailing space survives, so
    that pieces normalised one at a time join the way the whole text would. Marks at the
    start of ``text`` are dropped as having no base: the segmenter only renormalises its
    pending text from a character that is no mark.
    """
    # Drop before composing: dropping after NFKC could leave a base and a combining mark
    # side by side that a second pass would compose, and then normalising streamed
    # pieces one at a time would disagree with normalising the whole text.
    text = _shorten_long_runs(_drop(text))
    # NFKC in two steps, so that marks are bounded in canonical decomposed order (where a
    # run straddling two pieces sorts the same as whole) before composing.
    text = unicodedata.normalize("NFKD", text.translate(_PUNCTUATION)).translate(_PUNCTUATION)
    # Marks go before whitespace collapses: dropping " \u0301 " must leave one space.
    text = _SPACES.sub(" ", _UNBOUNDED_RUN.sub(_bound_run, text))
    return unicodedata.normalize("NFC", text)


def normalize(text: str) -> str:
    """Normalise a whole text: NFKC, ASCII punctuation, no controls, single spaces,
    combining marks bounded."""
    return normalize_piece(text).strip()


@functools.lru_cache(maxsize=8192)  # bounded: a client chooses which characters it sends
def _expanded(char: str) -> int:
    return len(unicodedata.normalize("NFKC", char))


def expanded_length(text: str) -> int:
    """The length of ``text`` as normalisation expands it: each character counts as many
    as its compatibility form has (U+FDFA, one character, is eighteen). Length limits
    count this, or a short text could stand for a long one. Character by character, so
    that it stays linear where NFKC of a whole text is not (a long run of combining
    marks sorts in quadratic time) and can run on the event loop."""
    if text.isascii():
        return len(text)
    return sum(map(_expanded, text))
