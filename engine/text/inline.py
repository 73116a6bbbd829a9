"""Inline phonemes: ``[word](/phonemes/)`` in the text says how that word is said.

The form is misaki's (Kokoro's front end), and reads as a link in Markdown, which is how
an LLM told about it writes it. The words are the written words (the word timings name
them); the phonemes are in the voice's alphabet, as a lexicon's are (docs/lexicons.md).
A markup is words (as a lexicon's key) and 1 to ``MAX_VALUE_CHARS`` phonemes without a
slash; anything else in brackets is text, spoken as it always was.

The markup must reach the engine whole, though text arrives in any pieces, normalisation
would change phonemes (NFKC makes ``ᵊ`` an ``ə`` and ``ʰ`` an ``h``) and the segmenter may
cut a long run at any space. So the utterance reads its text with an ``InlineReader``
before either: each markup becomes its words between ``OPEN`` and ``CLOSE``, which
normalisation and the segmenter leave alone, and its phonemes wait in order. When a
segment's stream is opened, ``resolve`` takes the marks out and gives the segment's
entries as a lexicon, over the request's.
"""

from __future__ import annotations

from collections import deque

import regex

from voxwire.engine.text.lexicon import MAX_KEY_CHARS, MAX_VALUE_CHARS, Entry, Lexicon, LexiconError, entry
from voxwire.engine.text.normalize import normalize

OPEN, CLOSE = "\u27e6", "\u27e7"
"""Mathematical white square brackets: NFKC keeps them, the segmenter ends nothing at
them, and a client's own are read as ``[`` and ``]``."""

_MARKUP = regex.compile(rf"\[([^\[\]/\n]{{1,{MAX_KEY_CHARS}}})\]\(/([^/()\[\]\n]{{1,{MAX_VALUE_CHARS}}})/\)")
_OWN_MARKS = str.maketrans({OPEN: "[", CLOSE: "]"})
_MARKS = regex.compile(rf"[{OPEN}{CLOSE}]")


class InlineError(ValueError):
    """A markup that cannot be spoken: its message names it."""


class InlineReader:
    """One utterance's inline phonemes, read as its text arrives and given back segment
    by segment, in order (both on the worker's thread)."""

    def __init__(self) -> None:
        self._held = ""
        """A ``[`` and what follows it, while it may still become a markup."""
        self._waiting: deque[Entry | InlineError] = deque()
        """Each markup's entry, or why it has none, in the order of its marks."""

    def push(self, text: str, final: bool = False) -> str:
        """The text to segment: what has arrived, each markup as its words between marks.
        A ``[`` that may begin a markup is held until the markup ends or cannot; ``final``
        (no more text, or a flush) lets it go as text."""
        text = self._held + text.translate(_OWN_MARKS)
        self._held = ""
        if "[" not in text:
            return text
        out: list[str] = []
        at = 0
        while (start := text.find("[", at)) >= 0:
            out.append(text[at:start])
            m = _MARKUP.match(text, start, partial=not final)
            if m is None:
                out.append("[")
                at = start + 1
            elif m.partial:
                self._held = text[start:]
                return "".join(out)
            else:
                words, phonemes = m.group(1), m.group(2)
                out.append(OPEN + words + CLOSE)
                self._waiting.append(_entry(words, phonemes, m.group()))
                at = m.end()
        out.append(text[at:])
        return "".join(out)

    def resolve(self, segment: str) -> tuple[str, Lexicon]:
        """``segment`` as written (its marks taken out) and its markups' entries. Raises
        ``InlineError`` for a markup that cannot be read. A markup the segmenter cut in two
        (a forced split, in a run of ``max_chars`` without punctuation) is spoken as text."""
        if OPEN not in segment and CLOSE not in segment:
            return segment, Lexicon()
        entries: list[Entry] = []
        opened: Entry | None = None
        for m in _MARKS.finditer(segment):
            if m.group() == OPEN:
                found = self._waiting.popleft() if self._waiting else None
                if isinstance(found, InlineError):
                    raise found
                opened = found
            elif opened is not None:
                entries.append(opened)
                opened = None
        return _MARKS.sub("", segment), Lexicon(entries)


def _entry(words: str, phonemes: str, markup: str) -> Entry | InlineError:
    try:
        # The words as the segment will have them, normalised; the phonemes as written.
        return entry(normalize(words), f"/{phonemes}/")
    except LexiconError as e:
        return InlineError(f"inline phonemes {markup[:MAX_KEY_CHARS]!r}: {e.why}")
