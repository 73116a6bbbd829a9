"""Light text normalisation for the LM (no wetext): spacing, quotes, English numbers.

The server already segments text into sentences; ``split_ids`` only guards the LM
against a segment longer than it was trained on (the reference keeps <= 80 tokens).
"""

from __future__ import annotations

import re

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred")]
_CJK = re.compile(r"[\u4e00-\u9fff]")


def number_words(n: int) -> str:
    """Cardinal English words for 0 <= n < 10**15."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    for value, word in _SCALES:
        if n >= value:
            head, rest = divmod(n, value)
            return f"{number_words(head)} {word}" + ("" if rest == 0 else " " + number_words(rest))
    raise AssertionError(n)


def _spell_number(match: re.Match[str]) -> str:
    text = match.group(0).replace(",", "")
    whole, _, frac = text.partition(".")
    if len(whole) > 15:
        return " ".join(_ONES[int(d)] for d in whole)  # read out digit by digit
    words = number_words(int(whole))
    if frac:
        words += " point " + " ".join(_ONES[int(d)] for d in frac)
    return words


def normalize_text(text: str) -> str:
    text = text.replace("\u00a0", " ").replace("\r", " ").replace("\n", " ")
    text = re.sub(r"[“”„]", '"', text)
    text = re.sub(r"[‘’]", "'", text)
    text = re.sub(r"\s+", " ", text).strip()
    if not _CJK.search(text):  # numbers are spelled out for English-like text only
        text = re.sub(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])\d+(?:\.\d+)?(?![\w])", _spell_number, text)
        text = text.replace("%", " percent").replace("&", " and ")
        text = re.sub(r"\s+", " ", text).strip()
    return text


def split_ids(ids: list[int], boundaries: set[int], max_tokens: int = 80, min_tokens: int = 20) -> list[list[int]]:
    """Split a long token sequence at punctuation tokens (``boundaries``) into pieces of
    at most ``max_tokens``; a piece shorter than ``min_tokens`` is not split off."""
    pieces: list[list[int]] = []
    start = 0
    while len(ids) - start > max_tokens:
        end = start + max_tokens
        cut = next((i + 1 for i in range(end - 1, start + min_tokens - 1, -1) if ids[i] in boundaries), end)
        pieces.append(ids[start:cut])
        start = cut
    if start < len(ids):
        pieces.append(ids[start:])
    return pieces
