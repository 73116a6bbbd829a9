"""Word timings from a VITS voice's durations: which samples each word of the text spans.

Piper's phoneme ids are ``^ _ p1 _ p2 _ ... $``, a pad after every phoneme, and the
duration predictor gives frames per id. Kokoro's (engine/kokoro/g2p.py) are ``0 p1 p2 ... 0``,
no pad between phonemes; an ``IdLayout`` says which a sentence's durations follow.

The words timed are the *written words* of the segment: its whitespace-separated tokens,
stripped of surrounding punctuation (``"'()[]{},.;:!?``), that hold at least one letter or
digit; in scripts written without spaces (Chinese, Japanese, Thai...), each character
(engine/text/words.py). Text normalisation (engine/text) expands nothing, so these are
also the words of the normalised text; a number or abbreviation is one written word
however many words espeak-ng speaks for it ("1,000" is "one thousand"). Tokens of
punctuation alone ("-", "...") are not words. Every written word gets exactly one
timing, in text order, with ``start < end`` and each word starting at or after the
previous one's end (unless espeak-ng speaks nothing at all for the segment: then there
is nothing to time).

espeak-ng's words are not the written ones: it may speak one written word as several, and
it joins unstressed words to their neighbour ("for the" is one phoneme word, "fɚðə"). So
counting phoneme words cannot say which is which. Instead each written word is phonemized
alone, and the concatenation of those phonemes is aligned (difflib, on phonemes) with the
speech phonemes of the whole segment as spoken; each written word takes the run of spoken
phonemes its own phonemes align with, so "for" and "the" share "fɚðə" at the phoneme where
they meet, and context changes ("fˈɔːɹ" alone, "fɚ" in context) are substitutions.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from voxwire.engine.base import WordTiming
from voxwire.engine.text import words

Phonemize = Callable[[str], list[list[str]]]
IdsPerPhoneme = Callable[[str], int]

_STRIP = "\"'()[]{},.;:!?"


@dataclass(frozen=True)
class IdLayout:
    """Where each phoneme's ids sit among a sentence's ids, which the durations follow."""

    lead: int
    """Ids before the first phoneme's: Piper's ``^ _`` (2), Kokoro's pad (1)."""
    pad: int
    """Ids after each phoneme's own (one that has ids): Piper's ``_`` (1), Kokoro none (0).
    A word's time runs to the end of its last phoneme's pad."""


PIPER = IdLayout(lead=2, pad=1)
KOKORO = IdLayout(lead=1, pad=0)


def _tokens(text: str) -> list[tuple[str, str]]:
    """(token, written word) for each written word of ``text``: a whitespace-separated
    token, or a character of a script written without spaces (engine/text/words.py)."""
    out = []
    for token in text.split():
        for piece in words.pieces(token):
            word = piece.strip(_STRIP)
            if any(ch.isalnum() for ch in word):
                out.append((piece, word))
    return out


def written_words(text: str) -> list[str]:
    """The written words of ``text`` that get a timing (see the module's docstring)."""
    return [word for _, word in _tokens(text)]


def _is_speech(phoneme: str, ids_per_phoneme: IdsPerPhoneme) -> bool:
    """A phoneme that is spoken: not a word space or punctuation, and known to the voice
    (an unknown one gets no ids, so no frames)."""
    return (
        not phoneme.isspace()
        and not all(unicodedata.category(ch).startswith("P") for ch in phoneme)
        and ids_per_phoneme(phoneme) > 0
    )


def word_phonemes(text: str, phonemize: Phonemize, ids_per_phoneme: IdsPerPhoneme) -> list[tuple[str, list[str]]]:
    """Each written word with the speech phonemes it has when phonemized alone."""
    return [
        (word, [p for s in phonemize(token) for p in s if _is_speech(p, ids_per_phoneme)])
        for token, word in _tokens(text)
    ]


def _starts(expected: list[tuple[str, int]], spoken: list[str], n_words: int) -> list[int]:
    """For each written word, the index in ``spoken`` of its first phoneme: strictly
    increasing when there are at least as many spoken phonemes as words."""
    n = len(spoken)
    if not n_words:
        return []
    if n < n_words or not expected:
        return [k * n // max(1, n_words) for k in range(n_words)]  # words share phonemes
    label = [0] * n  # the written word each spoken phoneme belongs to
    matcher = SequenceMatcher(None, [p for p, _ in expected], spoken, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for j in range(j1, j2):
            if tag in ("equal", "replace"):
                label[j] = expected[i1 + (j - j1) * (i2 - i1) // (j2 - j1)][1]
            elif tag == "insert":  # spoken but in no word alone: the word being spoken
                label[j] = expected[max(0, i1 - 1)][1]
    starts, j = [], 0
    for k in range(n_words):
        while j < n and label[j] < k:
            j += 1
        starts.append(j)
    starts[0] = 0
    # A word whose phonemes matched nothing (or lost them all to a neighbour) takes one.
    for k in range(1, n_words):
        starts[k] = max(starts[k], starts[k - 1] + 1)
    for k in reversed(range(n_words)):
        starts[k] = min(starts[k], n - (n_words - k), starts[k + 1] - 1 if k + 1 < n_words else n)
    return starts


class Aligner:
    """Times the written words of a segment, sentence by sentence as each is spoken.

    ``sentences`` are the segment's phonemes as synthesised (one list per sentence); the
    words are placed on them up front, and ``sentence`` turns each one's durations into
    sample positions."""

    def __init__(
        self,
        words: list[tuple[str, list[str]]],
        sentences: Sequence[Sequence[str]],
        ids_per_phoneme: IdsPerPhoneme,
        hop: int,
        layout: IdLayout = PIPER,
    ) -> None:
        self.ids_per_phoneme = ids_per_phoneme
        self.hop = hop
        self.layout = layout
        # Every speech phoneme of the segment, as (sentence, index in it).
        spoken = [
            (s, i)
            for s, phonemes in enumerate(sentences)
            for i, p in enumerate(phonemes)
            if _is_speech(p, ids_per_phoneme)
        ]
        expected = [(p, k) for k, (_, alone) in enumerate(words) for p in alone]
        starts = _starts(expected, [sentences[s][i] for s, i in spoken], len(words))
        # Per sentence: (word, index of its first phoneme, index of its last) in that
        # sentence. A word ends where the next starts, or with its own sentence.
        # Words that share a start (fewer phonemes than words) share an end too.
        self._plan: list[list[tuple[str, int, int]]] = [[] for _ in sentences]
        ends, end = [0] * len(words), len(spoken)
        for k in reversed(range(len(words))):
            ends[k] = end
            if k and starts[k - 1] < starts[k]:
                end = starts[k]
        for k, (word, _) in enumerate(words if spoken else []):  # nothing spoken: nothing to time
            a, b = starts[k], ends[k]
            s = spoken[a][0]
            last = max(j for j in range(a, b) if spoken[j][0] == s)
            self._plan[s].append((word, spoken[a][1], spoken[last][1]))
        self._next = 0

    def sentence(self, phonemes: Sequence[str], frames: Sequence[int], offset: int) -> list[WordTiming]:
        """Timings of the words in the next sentence; ``phonemes`` as given to the
        constructor, ``frames`` per phoneme id (the layout's pads too); ``offset``: the
        sentence's first sample within the segment."""
        plan = self._plan[self._next] if self._next < len(self._plan) else []
        self._next += 1
        lead, pad = self.layout.lead, self.layout.pad
        starts, pos = [], lead  # the leading ids come first, then each phoneme's ids and its pad
        for p in phonemes:
            starts.append(pos)
            n = self.ids_per_phoneme(p)
            pos += n + pad if n else 0  # a phoneme missing from the voice gets no ids, nor pad
        cum = [0]
        for f in frames:
            cum.append(cum[-1] + int(f))

        def span(first: int, last: int) -> tuple[int, int]:
            end = starts[last] + self.ids_per_phoneme(phonemes[last]) + pad  # its pad included
            return offset + cum[starts[first]] * self.hop, offset + cum[min(end, len(cum) - 1)] * self.hop

        out: list[WordTiming] = []
        i = 0
        while i < len(plan):
            # Words that share their phonemes (more words than phonemes) share the time.
            j = i
            while j < len(plan) and plan[j][1:] == plan[i][1:]:
                j += 1
            start, end = span(plan[i][1], plan[i][2])
            n = j - i
            for k in range(n):
                a, b = start + (end - start) * k // n, start + (end - start) * (k + 1) // n
                out.append(WordTiming(plan[i + k][0], a, b))
            i = j
        return out
