"""Written words: what a word timing names, in scripts written with spaces and without.

Most scripts put spaces between words, and a written word is a whitespace-separated
token. Chinese, Japanese, Thai, Lao, Khmer and Burmese do not, and no phonemizer here
says where their words end, so in those scripts each character (a grapheme cluster, so
a Thai consonant keeps its vowel and tone marks) is a written word of its own. A run of
another script inside such text ("iPhone", "2024") stays one word.
"""

from __future__ import annotations

import regex

# Script_Extensions, so that marks shared by the two kana ("ー", "゛") count with them.
_UNSPACED = regex.compile(r"[\p{scx=Han}\p{scx=Hiragana}\p{scx=Katakana}\p{scx=Thai}\p{scx=Lao}"
                          r"\p{scx=Khmer}\p{scx=Myanmar}]")
_CLUSTER = regex.compile(r"\X")


def unspaced(word: str) -> bool:
    """Whether ``word`` is of a script written without spaces (one character of it)."""
    return _UNSPACED.match(word) is not None


def pieces(token: str) -> list[str]:
    """A whitespace-separated token cut into its written words: each character of a
    script written without spaces alone, the runs of other characters between them whole."""
    if _UNSPACED.search(token) is None:
        return [token]
    out: list[str] = []
    run = ""
    for cluster in _CLUSTER.findall(token):
        if unspaced(cluster):
            if run:
                out.append(run)
                run = ""
            out.append(cluster)
        else:
            run += cluster
    if run:
        out.append(run)
    return out


def join(words: list[str]) -> str:
    """Written words as text: a space between two, unless both are of a script written
    without spaces ("今日は", "the quick fox", "I said 你好 to her"). Whether the text had a
    space between a Latin word and a kana is not known here: it gets one."""
    text = ""
    for i, word in enumerate(words):
        if i and not (unspaced(word) and unspaced(words[i - 1])):
            text += " "
        text += word
    return text
