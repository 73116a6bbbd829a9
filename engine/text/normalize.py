"""Normalise text before it is segmented and spoken.

Normalisation is deliberately conservative: it only removes what no engine can speak
(control characters, odd whitespace, compatibility forms) so that the segmenter's
guarantee — segments joined equal the normalised text — stays meaningful to a reader.
Number and abbreviation expansion belongs to each engine's own front end (espeak-ng for
Piper), which knows its language.
"""

from __future__ import annotations

import re
import unicodedata

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
    }
)
_SPACES = re.compile(r"\s+")


def _is_dropped(ch: str) -> bool:
    # Cc: control characters, Cf: format characters (zero-width joiners, BOM), Cs: lone
    # surrogates that cannot be encoded. Whitespace controls are kept as whitespace.
    if ch in "\t\n\r\v\f":
        return False
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn")


def normalize_piece(text: str) -> str:
    """Normalise a piece of streamed text without trimming its edges.

    Whitespace runs collapse to one space but a leading or trailing space survives, so
    that pieces normalised one at a time join the way the whole text would.
    """
    # Drop before composing: dropping after NFKC could leave a base and a combining mark
    # side by side that a second pass would compose, and then normalising streamed
    # pieces one at a time would disagree with normalising the whole text.
    text = "".join(ch for ch in text if not _is_dropped(ch))
    text = unicodedata.normalize("NFKC", text).translate(_PUNCTUATION)
    return _SPACES.sub(" ", text)


def normalize(text: str) -> str:
    """Normalise a whole text: NFKC, ASCII punctuation, no controls, single spaces."""
    return normalize_piece(text).strip()
