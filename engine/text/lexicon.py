"""Pronunciation lexicons: the words and phrases a user wants said their way.

An entry maps a word or phrase, as written, to how it is said: phonemes in the voice's
own alphabet (written between slashes, ``/vˈɑkswaɪɚ/``) or a respelling in plain words
(``engine x``). docs/lexicons.md is the reference for users; in short:

- a key is one to ``MAX_KEY_WORDS`` words (letters and digits, with apostrophes or
  hyphens inside a word) separated by single spaces;
- matching is whole-word and case-aware: a key written all in lower case matches the
  words in any case ("nginx" matches "Nginx" and "NGINX"), a key with a capital matches
  only that spelling ("US" is not "us"); an exact-case key wins over a lower-case one,
  and a longer phrase over a shorter one at the same place;
- a phrase matches its words separated by whitespace only.

The lexicon only says what to speak; the engine says it (engine/piper, engine/kokoro
splice the phonemes into their own, and phonemize respellings as text), and the word
timings keep naming the written words, because the aligner times the text as written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import regex

MAX_KEY_WORDS = 8
MAX_KEY_CHARS = 100
MAX_VALUE_CHARS = 400
MAX_FILE_ENTRIES = 1_000_000
"""A lexicon file's bound: far beyond any real one (CMUdict has 135,000 words)."""

# A written word: letters, marks and digits, with apostrophes or hyphens inside it.
_WORD = regex.compile(r"[\p{L}\p{M}\p{N}]+(?:['’\-][\p{L}\p{M}\p{N}]+)*")


_MARKS = regex.compile(r"(?:\s*[.,;:!?])*")


class LexiconError(ValueError):
    """An entry refused: ``key`` names it, the message says why."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"lexicon entry {key[:MAX_KEY_CHARS]!r}: {why}" if key else why)
        self.key = key
        self.why = why


@dataclass(frozen=True)
class Entry:
    key: str
    phonemes: str | None = None
    """In the voice's alphabet, one symbol a character; spaces between words."""
    respelling: str | None = None


class Phonemes(str):
    """A piece of text to speak as these phonemes, not to phonemize."""


def entry(key: str, value: str) -> Entry:
    """An entry from its key and value as written (``/phonemes/`` or a respelling),
    checked; a bad one raises ``LexiconError``."""
    if not isinstance(key, str) or not isinstance(value, str):
        raise LexiconError(str(key), "the key and its value must be strings")
    words = _WORD.findall(key)
    if not words or " ".join(words) != key:
        raise LexiconError(key, "a key is one or more words (letters and digits, apostrophes or hyphens inside a "
                                "word) separated by single spaces")
    if len(key) > MAX_KEY_CHARS or len(words) > MAX_KEY_WORDS:
        raise LexiconError(key, f"a key has at most {MAX_KEY_WORDS} words and {MAX_KEY_CHARS} characters")
    if not value.strip() or len(value) > MAX_VALUE_CHARS or not value.isprintable():
        raise LexiconError(key, f"its value must be 1 to {MAX_VALUE_CHARS} printable characters")
    value = value.strip()
    if len(value) > 1 and value[0] == value[-1] == "/":
        phonemes = " ".join(value[1:-1].split())
        if not phonemes or "/" in phonemes:
            raise LexiconError(key, "phonemes are written between two slashes, with none inside")
        return Entry(key, phonemes=phonemes)
    if "/" in value:
        raise LexiconError(key, "a value is phonemes between slashes (/.../) or a respelling without slashes")
    if not _WORD.search(value):
        raise LexiconError(key, "a respelling needs at least one word")
    return Entry(key, respelling=value)


class _Table:
    """One source's entries (a file, a request), indexed by their words."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.entries: dict[str, Entry] = {e.key: e for e in entries}
        self.exact: dict[tuple[str, ...], Entry] = {}
        self.folded: dict[tuple[str, ...], Entry] = {}
        for e in self.entries.values():
            words = tuple(e.key.split(" "))
            self.exact[words] = e
            if e.key == e.key.lower():
                self.folded[words] = e
        # Every key's first words, lower-cased: a match is tried only as far as some key
        # goes on, so a word that starts no key costs one lookup.
        self.prefixes: set[tuple[str, ...]] = set()
        for words in self.exact:
            folded = tuple(w.lower() for w in words)
            self.prefixes.update(folded[:n] for n in range(1, len(folded) + 1))
        h = hashlib.blake2b(digest_size=16)
        for e in sorted(self.entries.values(), key=lambda e: e.key):
            h.update(repr((e.key, e.phonemes, e.respelling)).encode())
        self.fingerprint = h.hexdigest()


class Lexicon:
    """Entries by key, and the text they match. Immutable. ``a | b`` layers ``b`` over
    ``a`` without copying either (a request's few entries over a file's 10,000 cost
    nothing per utterance): where both have a key, ``b``'s entry is the one in force."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        table = _Table(entries)
        self._tables: tuple[_Table, ...] = (table,) if table.entries else ()
        self._len: int | None = None

    @classmethod
    def _layered(cls, tables: tuple[_Table, ...]) -> Lexicon:
        lexicon = cls()
        lexicon._tables = tables
        return lexicon

    def __bool__(self) -> bool:
        return bool(self._tables)

    def __len__(self) -> int:
        """The entries in force: each key once, however many layers give it."""
        if self._len is None:
            self._len = sum(
                sum(1 for key in t.entries if not any(key in above.entries for above in self._tables[i + 1:]))
                for i, t in enumerate(self._tables)
            ) if len(self._tables) > 1 else sum(len(t.entries) for t in self._tables)
        return self._len

    def __iter__(self) -> Iterator[Entry]:
        """The entries in force."""
        seen: set[str] = set()
        for t in reversed(self._tables):
            for key, e in t.entries.items():
                if key not in seen:
                    seen.add(key)
                    yield e

    def __or__(self, other: Lexicon) -> Lexicon:
        if not other:
            return self
        if not self:
            return other
        return Lexicon._layered(self._tables + other._tables)

    @property
    def fingerprint(self) -> str:
        """A digest of the layers' entries: the same lexicon speaks the same audio (the
        cache's key)."""
        if len(self._tables) == 1:
            return self._tables[0].fingerprint
        return hashlib.blake2b("".join(t.fingerprint for t in self._tables).encode(), digest_size=16).hexdigest()

    def pieces(self, text: str) -> list[str]:
        """``text`` as the engine should speak it, in order: plain text (respellings put
        in place of their words) to phonemize, and ``Phonemes`` to speak as they are, with
        the punctuation that follows their words."""
        out: list[str] = []
        plain: list[str] = []
        at = 0
        for start, end, e in self._matches(text):
            plain.append(text[at:start])
            if e.phonemes is not None:
                # The punctuation right after the word goes with its phonemes: a phonemizer
                # drops it at the start of the text that follows, where it would be lost
                # (and with it the end of a sentence).
                marks = _MARKS.match(text, end)
                after = marks.end() if marks else end  # the pattern matches the empty string
                out.extend(["".join(plain), Phonemes(e.phonemes + "".join(text[end:after].split()))])
                plain = []
                at = after
                continue
            plain.append(e.respelling or "")
            at = end
        plain.append(text[at:])
        out.append("".join(plain))
        return [p for p in out if p]

    def respelled(self, text: str) -> str:
        """``text`` with respellings in place of their words, for an engine that takes no
        phonemes (a phoneme entry keeps its written words there)."""
        out, at = [], 0
        for start, end, e in self._matches(text):
            out.append(text[at:start])
            out.append(e.respelling if e.respelling is not None else text[start:end])
            at = end
        out.append(text[at:])
        return "".join(out)

    def _lookup(self, words: tuple[str, ...]) -> Entry | None:
        # The exact spelling first, in any layer; then the lower-case keys.
        for t in reversed(self._tables):
            if (e := t.exact.get(words)) is not None:
                return e
        folded = tuple(w.lower() for w in words)
        for t in reversed(self._tables):
            if (e := t.folded.get(folded)) is not None:
                return e
        return None

    def _matches(self, text: str) -> Iterator[tuple[int, int, Entry]]:
        """Each match's span and entry, left to right, the longest at each word."""
        if not self._tables:
            return
        words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]
        # joined[i]: how many words from i on follow each other across whitespace alone,
        # the most a phrase starting at i may have.
        joined = [1] * len(words)
        for i in range(len(words) - 2, -1, -1):
            gap = text[words[i][1]:words[i + 1][0]]
            if gap and not gap.strip():
                joined[i] = joined[i + 1] + 1
        folded = [w.lower() for _, _, w in words]
        i = 0
        while i < len(words):
            most = 0
            while most < joined[i] and any(tuple(folded[i:i + most + 1]) in t.prefixes for t in self._tables):
                most += 1
            for n in range(most, 0, -1):
                found = self._lookup(tuple(w for _, _, w in words[i:i + n]))
                if found is not None:
                    yield words[i][0], words[i + n - 1][1], found
                    i += n
                    break
            else:
                i += 1


def from_mapping(entries: Mapping[str, str], *, limit: int) -> Lexicon:
    """A lexicon from ``{key: value}`` (a request's), at most ``limit`` entries."""
    if len(entries) > limit:
        raise LexiconError("", f"a lexicon has at most {limit} entries here; this one has {len(entries)}")
    return Lexicon(entry(k, v) for k, v in entries.items())


def load(path: str | Path) -> Lexicon:
    """A lexicon file: one entry a line, ``KEY = VALUE``; blank lines and lines starting
    with ``#`` are skipped. A bad line raises ``LexiconError`` naming the file and line;
    a key given twice is refused, since only one can be meant."""
    entries: dict[str, Entry] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            where = f"{path}:{number}"
            if not sep:
                raise LexiconError(line, f"{where}: write KEY = VALUE")
            try:
                e = entry(key.strip(), value.strip())
            except LexiconError as err:
                raise LexiconError(err.key, f"{where}: {err.why}") from None
            if e.key in entries:
                raise LexiconError(e.key, f"{where}: given twice")
            entries[e.key] = e
            if len(entries) > MAX_FILE_ENTRIES:
                raise LexiconError(e.key, f"{where}: a lexicon file has at most {MAX_FILE_ENTRIES} entries")
    return Lexicon(entries.values())
