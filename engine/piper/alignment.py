"""Word timings from a VITS voice's durations: which samples each word of the text spans.

Piper's phoneme ids are ``^ _ p1 _ p2 _ ... $``, a pad after every phoneme, and the
duration predictor gives frames per id. Phoneme words are separated by " ". espeak-ng may
speak one written word as several ("$3.50" is "three dollars fifty"), so each written
word is phonemized alone to learn how many phoneme words it becomes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.base import WordTiming

Phonemize = Callable[[str], list[list[str]]]


def _phoneme_words(phonemes: Sequence[str]) -> list[tuple[int, int]]:
    """[start, end) phoneme index ranges of the words, split at spaces."""
    words, start = [], 0
    for i, p in enumerate([*phonemes, " "]):
        if p == " ":
            if i > start:
                words.append((start, i))
            start = i + 1
    return words


def word_spans(text: str, phonemize: Phonemize) -> list[tuple[str, int]]:
    """The written words worth timing, each with the number of phoneme words it becomes."""
    out = []
    for token in text.split():
        word = token.strip("\"'()[]{},.;:!?")
        if not any(ch.isalnum() for ch in word):
            continue
        n = sum(len(_phoneme_words(s)) for s in phonemize(token))
        out.append((word, max(1, n)))
    return out


class Aligner:
    """Hands out the written words of a segment to its sentences, as each is spoken."""

    def __init__(self, words: list[tuple[str, int]], ids_per_phoneme: Callable[[str], int], hop: int) -> None:
        self.words = list(words)
        self.ids_per_phoneme = ids_per_phoneme
        self.hop = hop

    def sentence(self, phonemes: Sequence[str], frames: Sequence[int], offset: int) -> list[WordTiming]:
        """Timings of the words in one sentence; ``frames`` per phoneme id (its ^, pads
        and $ too); ``offset``: the sentence's first sample within the segment.

        Phoneme words that do not add up to what the written words predict (an unusual
        expansion) are shared out in order, so timings stay monotonic."""
        starts, pos = [], 2  # ^ and _ come first, then each phoneme's ids and a pad
        for p in phonemes:
            starts.append(pos)
            pos += self.ids_per_phoneme(p) + 1
        cum = [0]
        for f in frames:
            cum.append(cum[-1] + int(f))
        groups = []
        for a, b in _phoneme_words(phonemes):
            last = starts[b - 1] + self.ids_per_phoneme(phonemes[b - 1])  # its pad included
            groups.append((offset + cum[starts[a]] * self.hop, offset + cum[last + 1] * self.hop))
        taken, need = [], 0
        while self.words and need + self.words[0][1] <= len(groups):
            taken.append(self.words.pop(0))
            need += taken[-1][1]
        if not taken and self.words and groups:
            taken.append(self.words.pop(0))  # a word espeak spoke as fewer phoneme words
            need = len(groups)
        out, i = [], 0
        for k, (word, n) in enumerate(taken):
            last = len(groups) if k == len(taken) - 1 else min(len(groups), i + n)
            if i < len(groups):
                out.append(WordTiming(word, groups[i][0], groups[max(i, last - 1)][1]))
            i = last
        return out
