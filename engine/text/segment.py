"""Split normalised text into the segments an engine speaks one at a time.

Segments are sentences, except that a long first sentence is split at its first clause
boundary, so the first audio is not held back by the whole sentence, and any run without
punctuation is split at a space before it grows past a bound. Text may arrive in pieces
(an LLM's tokens): a boundary is only taken once the character after it has arrived,
since "Dr." or "3." are not sentence ends until the next character says so.

The guarantee: the segments, joined, equal ``normalize(text)``. No character is lost,
added or reordered; whitespace between segments starts the following segment.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from engine.text.normalize import normalize_piece

_CLOSERS = "\"')]}\u300d\u300f\uff09\u3011"
_CLOSE = re.escape(_CLOSERS)
# CJK scripts put no space after punctuation, and NFKC has already turned their
# full-width "！？，：；" into ASCII, so a CJK character after a terminator counts as a gap.
_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
# Western terminators need a gap after them to count (which also rules out "3.14" and
# "e.g.x"); the ideographic full stop and comma end a sentence or clause at once.
_SENTENCE_END = re.compile(rf"[.!?\u2026]+[{_CLOSE}]*(?=\s|$|[{_CJK}])|\u3002+[{_CLOSE}]*")
_CLAUSE_END = re.compile(rf"[,;:]+[{_CLOSE}]*(?=\s|[{_CJK}])|\u3001+[{_CLOSE}]*")
_WORD_BEFORE_DOT = re.compile(r"(\S+)\.$")
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs fig approx dept gen gov lt col sgt capt rev hon mt ave "
    "e.g i.e cf al no".split()
)


@dataclass(frozen=True)
class SegmenterLimits:
    first_split_chars: int = 60
    """A first sentence longer than this is split at a clause boundary."""
    first_clause_min_chars: int = 20
    """... but only where at least this much text precedes the boundary."""
    max_chars: int = 400
    """No segment grows past this; engines degrade on very long inputs."""


class Segmenter:
    """Incremental segmenter for one utterance's text."""

    def __init__(self, limits: SegmenterLimits = SegmenterLimits()) -> None:
        self.limits = limits
        self._pending = ""
        self._emitted = 0

    def push(self, text: str) -> list[str]:
        """Add a piece of text; return the segments it completes."""
        # Re-normalising the pending tail with the new piece joins whitespace runs and
        # combining marks that straddle two pieces.
        self._pending = normalize_piece(self._pending + text)
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """Return everything pending as segments: the input is complete, or the client
        asked for audio now."""
        segments = self._drain(final=True)
        # Trailing whitespace stays pending: it separates this text from any that follows.
        rest = self._pending.rstrip()
        if rest:
            segments.append(self._take(rest))
        return segments

    def _drain(self, final: bool) -> list[str]:
        segments = []
        while True:
            if self._emitted == 0:
                self._pending = self._pending.lstrip()
            end = self._boundary(self._pending, final)
            if end is None:
                return segments
            segments.append(self._take(self._pending[:end]))

    def _take(self, segment: str) -> str:
        self._pending = self._pending[len(segment):]
        self._emitted += 1
        return segment

    def _boundary(self, text: str, final: bool) -> int | None:
        """Where the next segment of ``text`` ends, or None if that is not known yet."""
        sentence_end = _sentence_end(text, final)
        limits = self.limits
        first = self._emitted == 0
        if first and (sentence_end or len(text)) > limits.first_split_chars:
            for m in _CLAUSE_END.finditer(text, 0, sentence_end or len(text)):
                if limits.first_clause_min_chars <= m.end() <= limits.max_chars and m.end() < len(text):
                    return m.end()
        if sentence_end is not None and sentence_end <= limits.max_chars:
            return sentence_end
        if len(text) > limits.max_chars:
            return _forced_split(text, limits.max_chars)
        return None


def _sentence_end(text: str, final: bool) -> int | None:
    for m in _SENTENCE_END.finditer(text):
        end = m.end()
        if end == len(text) and not final:
            return None  # the next character decides
        if end == len(text) and not text[: m.start()].strip():
            continue  # punctuation alone is no sentence
        if m.group().startswith(".") and m.group().rstrip(_CLOSERS) == "." and _is_abbreviation(text[: m.start() + 1]):
            continue
        return end
    return None


def _is_abbreviation(text_to_dot: str) -> bool:
    m = _WORD_BEFORE_DOT.search(text_to_dot)
    if m is None:
        return False
    word = m.group(1).lstrip("\"'([{")
    return word.lower() in _ABBREVIATIONS or bool(_INITIALS.match(word))


def _forced_split(text: str, limit: int) -> int:
    space = text.rfind(" ", 1, limit + 1)
    if space > 0:
        return space
    end = limit
    # Never part a base character from the combining marks that follow it.
    while end > 1 and unicodedata.combining(text[end]):
        end -= 1
    return end


def segment(text: str, limits: SegmenterLimits = SegmenterLimits()) -> list[str]:
    """Segment a whole text at once."""
    s = Segmenter(limits)
    return s.push(text) + s.flush()
