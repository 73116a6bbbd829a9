"""Split normalised text into the segments an engine speaks one at a time.

Segments are sentences, except that a long first sentence is split at its first clause
boundary, so the first audio is not held back by the whole sentence, and any run without
punctuation is split at a space before it grows past a bound. Text may arrive in pieces
(an LLM's tokens): a boundary is only taken once the character after it has arrived,
since "Dr." or "3." are not sentence ends until the next character says so. While more
text is still to come and the first sentence's end has not arrived, the first segment may
also end at a clause boundary once enough words precede it (``first_clause_words``): at
an LLM's pace the rest of that sentence is still being written, and waiting for it is
most of the wait for the first audio.

The guarantee: the segments, joined, equal ``normalize(text)``. No character is lost,
added or reordered; whitespace between segments starts the following segment.

No boundary splits an extended grapheme cluster (UAX #29) or comes before a combining
mark, so no segment starts with a mark or is made of marks alone. A forced split falls
inside a cluster only where that cluster alone is longer than ``max_chars`` (a run of
Hangul conjoining jamo, an Indic conjunct chain), and then before a character that is
no mark; a segment goes past ``max_chars`` only to keep a cluster and its marks whole.

Cost is linear in the text's length, whether it comes whole or in small pieces. A
sentence end past ``max_chars`` is of no use (the segment is split first), so each
segment's search reads a window of about ``max_chars`` characters from its start; the
word before a dot is read back at most ``_LONGEST_WORD`` characters; what a search has
ruled out is not read again when the next piece arrives; and a new piece is normalised
together with only the pending text after its last character that no following text
can change.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from voxwire.engine.text.normalize import MARK, normalize_piece

_CLOSERS = "\"')]}\u300d\u300f\uff09\u3011"
_CLOSE = regex.escape(_CLOSERS)
# CJK scripts put no space after punctuation, and NFKC has already turned their
# full-width "！？，：；" into ASCII, so a CJK character after a terminator counts as a gap.
_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
# Western terminators need a gap after them to count (which also rules out "3.14" and
# "e.g.x"); the ideographic full stop and comma end a sentence or clause at once. None
# counts before a combining mark, which belongs to the punctuation's cluster.
# Runs are possessive and may only start after a character that is no terminator, or
# where the scan (re)starts (\G): a run of 20,000 dots is read once, not once per dot.
_SENTENCE_END = regex.compile(
    rf"(?:\G|(?<![.!?\u2026]))(?P<run>[.!?\u2026]++)[{_CLOSE}]*(?=\s|$|[{_CJK}])(?![{MARK}])"
    rf"|(?:\G|(?<!\u3002))\u3002++[{_CLOSE}]*(?![{MARK}])"
)
# A clause ends at a comma, semicolon or colon, or at a dash between spaces (normalising
# made every em dash one: " - "; an unspaced hyphen or en dash joins words and numbers).
_CLAUSE_END = regex.compile(
    rf"(?<![,;:])[,;:]++[{_CLOSE}]*(?=[\s{_CJK}])(?![{MARK}])|(?<!\u3001)\u3001++[{_CLOSE}]*(?![{MARK}])"
    rf"|(?<=\s)-++(?=\s)"
)
_TRAILING_RUN = regex.compile(rf"(?r)[.!?\u2026\u3002{_CLOSE}]*")
_INITIALS = regex.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs fig approx dept gen gov lt col sgt capt rev hon mt ave "
    "e.g i.e cf al no".split()
)
_LONGEST_WORD = 64
"""A word before a dot at least this long is no abbreviation (nor read back further)."""

_CLUSTER = regex.compile(r"\X")
_MARK = regex.compile(rf"[{MARK}]")
_BASE = regex.compile(rf"[^\s{MARK}]")
_NOT_MARK = regex.compile(rf"[^{MARK}]")
_NOT_MARK_REVERSE = regex.compile(rf"(?r)[^{MARK}]")
# A space after a prepended letter (Malayalam dot reph) is inside that letter's cluster.
_PREPEND = regex.compile(r"\p{Grapheme_Cluster_Break=Prepend}")
# Where renormalising pending text with a new piece may start: a character that is no
# mark, no space, and composes with nothing before it (every character that can is a
# mark, or a Hangul vowel or final jamo); nor a terminator or closer, so that the
# sentence search does not resume inside a run.
_STABLE_REVERSE = regex.compile(
    rf"(?r)[^{MARK}\s.!?\u2026\u3002{_CLOSE}\u1160-\u11ff\ud7b0-\ud7ff]"
)


@dataclass(frozen=True)
class SegmenterLimits:
    first_split_chars: int = 60
    """A first sentence longer than this is split at a clause boundary."""
    first_clause_min_chars: int = 20
    """... but only where at least this much text precedes the boundary."""
    max_chars: int = 400
    """No segment grows past this; engines degrade on very long inputs."""
    first_clause_words: int = 3
    """Text still arriving: the first segment may end at a clause boundary with at least
    this many words before it, without waiting for its sentence's end; 0 waits."""


class Segmenter:
    """Incremental segmenter for one utterance's text."""

    def __init__(self, limits: SegmenterLimits = SegmenterLimits()) -> None:
        self.limits = limits
        self._pending = ""
        self._emitted = 0
        self._scan = 0
        """Sentence ends before this offset in the pending text are ruled out."""
        self._more = False
        """More text is to come (a piece pushed without ``final``)."""

    def push(self, text: str, final: bool = False) -> list[str]:
        """Add a piece of text; return the segments it completes. ``final``: no more text
        follows (what is pending then waits for ``flush``, not for more text)."""
        self._more = not final
        # Re-normalising the pending tail with the new piece joins whitespace runs and
        # combining marks that straddle two pieces; what precedes the last stable
        # character is final already.
        pending = self._pending
        stable = _STABLE_REVERSE.search(pending)
        cut = stable.start() if stable else 0
        self._pending = pending[:cut] + normalize_piece(pending[cut:] + text)
        # A run of terminators before the cut is read again: the character after it, on
        # which the run's meaning depends, may have changed (a leading jamo becomes a
        # syllable, which counts as a gap).
        self._scan = _run_start(self._pending, 0, min(self._scan, cut))
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """Return everything pending as segments: the input is complete, or the client
        asked for audio now."""
        self._more = False
        segments = self._drain(final=True)
        # Trailing whitespace stays pending: it separates this text from any that follows.
        rest = self._pending.rstrip()
        if rest:
            segments.append(rest)
            self._pending = self._pending[len(rest) :]
            self._emitted += 1
        self._scan = 0
        return segments

    def _drain(self, final: bool) -> list[str]:
        text = self._pending
        if self._emitted == 0:
            stripped = text.lstrip()
            self._scan = max(0, self._scan - (len(text) - len(stripped)))
            text = stripped
        segments, start = [], 0
        while (end := self._boundary(text, start, final)) is not None:
            segments.append(text[start:end])
            start = self._scan = end
            self._emitted += 1
        # One slice per piece, not one per segment: a whole text is not copied per segment.
        self._pending = text[start:]
        self._scan -= start
        return segments

    def _boundary(self, text: str, start: int, final: bool) -> int | None:
        """Where the segment of ``text`` from ``start`` ends, or None if that is not known yet."""
        limits = self.limits
        first = self._emitted == 0
        # The first segment also needs to know whether its sentence is longer than
        # first_split_chars; any other only needs sentence ends within max_chars.
        reach = max(limits.max_chars, limits.first_split_chars if first else 0) + 1
        sentence_end = self._sentence_end(text, start, reach, final)
        end = sentence_end if sentence_end is not None else len(text)
        if first and end - start > limits.first_split_chars:
            clause_end = self._clause_end(text, start, end, limits.first_clause_min_chars)
            if clause_end is not None:
                return clause_end
        if first and sentence_end is None and self._more and limits.first_clause_words:
            clause_end = self._clause_end(text, start, end, min_words=limits.first_clause_words)
            if clause_end is not None:
                return clause_end
        if sentence_end is not None and sentence_end - start <= limits.max_chars:
            return sentence_end
        if len(text) - start > limits.max_chars:
            return _forced_split(text, start, limits.max_chars)
        return None

    def _sentence_end(self, text: str, start: int, reach: int, final: bool) -> int | None:
        """The first sentence end within ``reach`` characters of ``start``, or None: there
        is none there, or the next character has yet to decide. What it rules out is not
        read again while this segment waits for more text."""
        n = len(text)
        stop = min(n, start + reach + 1)
        for m in _SENTENCE_END.finditer(text, max(self._scan, start), stop):
            end = m.end()
            if end - start > reach or (end == n and not final):
                # Too far to be of use, or the next character decides: look again here.
                self._scan = m.start()
                return None
            if end == n and not text[start : m.start()].strip():
                continue  # punctuation alone is no sentence
            if m.group("run") == "." and _is_abbreviation(text, start, m.start()):
                self._scan = end
                continue
            return end
        # Only a run of terminators cut short by ``stop`` may still become a sentence end.
        self._scan = _run_start(text, start, stop)
        return None

    def _clause_end(self, text: str, start: int, sentence_end: int, min_chars: int = 0, min_words: int = 0) -> int | None:
        """The first clause boundary before ``sentence_end`` with at least ``min_chars``
        characters and ``min_words`` words before it. It reads at most ``max_chars``
        characters, so a first sentence that arrives a token at a time costs a bounded
        scan per token."""
        limits = self.limits
        stop = min(sentence_end, start + limits.max_chars + 1)
        words, counted = 0, start
        for m in _CLAUSE_END.finditer(text, start, stop):
            end = m.end() - start
            if end > limits.max_chars:
                break
            if m.end() == len(text):
                break  # the character after it decides (an ideographic comma has none)
            if min_words:  # counted once each: the words between this boundary and the last
                words += len(text[counted : m.start()].split())
                counted = m.end()
            if end >= min_chars and words >= min_words:
                return m.end()
        return None


def _run_start(text: str, start: int, stop: int) -> int:
    """Where the run of terminators and closers that ends at ``stop`` starts."""
    run = _TRAILING_RUN.match(text, start, stop)
    if run is None:
        raise AssertionError("a starred pattern matches, if only the empty run")
    return run.start()


def _is_abbreviation(text: str, start: int, dot: int) -> bool:
    # Only the word before the dot matters, and only back to the segment's start: a
    # bounded look back, where a search over everything before the dot made a text of
    # "Dr. Dr. Dr. ..." quadratic.
    low = max(start, dot - _LONGEST_WORD)
    space = text.rfind(" ", low, dot)
    if space < 0 and low > start:
        return False
    word = text[max(space + 1, low) : dot].lstrip("\"'([{")
    return bool(word) and (word.lower() in _ABBREVIATIONS or _INITIALS.match(word) is not None)


def _forced_split(text: str, start: int, limit: int) -> int | None:
    """Where to split a run of more than ``limit`` characters from ``start`` that has no
    usable sentence end: at its last space, else at its last cluster boundary that is
    before no mark. Where there is none, the cluster there is kept whole if it is no
    longer than ``limit``, and split before its last character that is no mark if it is
    (a run of Hangul jamo, an Indic conjunct chain). The segment before the split always
    holds a character that is neither space nor mark."""
    last = start + limit
    first_base = _BASE.search(text, start, last + 1)
    if first_base is None:
        # Normalisation leaves no mark without a base: only a tiny limit gets here.
        after = _BASE.search(text, last + 1)
        return after.start() if after else None
    base = first_base.start()
    space = text.rfind(" ", base + 1, last + 1)
    while space > base and _PREPEND.match(text, space - 1):
        space = text.rfind(" ", base + 1, space)
    if space > base:
        return space
    # Cluster starts are where each \X match begins; only the last few are looked at.
    boundary = last + 1
    # On a slice: regex's \X reads back before its start for regional indicators.
    for cluster in reversed(_CLUSTER.findall(text[start : last + 1])):
        boundary -= len(cluster)
        if boundary <= base:
            break
        if _MARK.match(text, boundary) is None:
            return boundary
    # ``boundary`` is now where the cluster holding the base starts.
    held = _CLUSTER.match(text[boundary : boundary + limit + 2])
    if held is None:
        raise AssertionError("the cluster holding the base starts at a character of the text")
    cluster_end = boundary + len(held.group())
    if cluster_end - boundary > limit:
        inside = _NOT_MARK_REVERSE.search(text, base + 1, last + 1) or _NOT_MARK.search(text, last + 1)
        return inside.start() if inside else None
    if cluster_end == len(text):
        return None  # the cluster may go on: the next character decides
    # After the cluster, and after any marks that form clusters of their own (U+102B).
    after = _NOT_MARK.search(text, max(cluster_end, last + 1))
    return after.start() if after else None


def segment(text: str, limits: SegmenterLimits = SegmenterLimits()) -> list[str]:
    """Segment a whole text at once (no first clause is taken early: the sentence is here)."""
    s = Segmenter(limits)
    return s.push(text, final=True) + s.flush()
