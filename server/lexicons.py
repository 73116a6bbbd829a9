"""The server's pronunciation lexicons: ``--lexicon FILE`` for every voice and
``--lexicon VOICE=FILE`` for one, read and checked against the engine's voices at start,
and merged with a request's own entries (engine/text/lexicon.py) for each utterance."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from voxwire.engine.base import Engine, EngineError, Voice
from voxwire.engine.text.lexicon import Lexicon, LexiconError, load


_REMEMBERED = 256


class ServerLexicons:
    def __init__(self, everyone: Lexicon | None = None, by_voice: dict[str, Lexicon] | None = None) -> None:
        self.everyone = everyone or Lexicon()
        self.by_voice = by_voice or {}
        # Each voice's merged entries, or why it cannot say them: merging and checking
        # 10,000 entries takes milliseconds, once a voice. Bounded, since a Kokoro blend is
        # a voice a request names. Keyed also by whether the voice was installed: one
        # downloaded since is checked against its phonemes.
        self._merged: OrderedDict[tuple[str, bool], Lexicon | EngineError] = OrderedDict()

    @classmethod
    def load(cls, flags: Sequence[str], engine: Engine) -> ServerLexicons:
        """Read each ``FILE`` or ``VOICE=FILE`` and check it against the voices it is for.
        A file that cannot be read, a bad entry, a voice the engine lacks or a phoneme a
        voice cannot say raises ``ValueError`` with one line that names it."""
        everyone = Lexicon()
        by_voice: dict[str, Lexicon] = {}
        for flag in flags:
            voice_id, sep, path = flag.partition("=")
            if not sep or "/" in voice_id:  # a path with "=" in it: no voice id has a slash
                voice_id, path = "", flag
            try:
                lexicon = load(path)
            except OSError as e:
                raise ValueError(f"--lexicon {flag}: cannot read it ({e.strerror or e})") from None
            except UnicodeDecodeError:
                raise ValueError(f"--lexicon {flag}: not UTF-8 text") from None
            except LexiconError as e:
                raise ValueError(f"--lexicon {flag}: {e}") from None
            if voice_id:
                voice = engine.voice(voice_id)
                if voice is None:
                    known = ", ".join(v.id for v in engine.voices()) or "none yet"
                    raise ValueError(f"--lexicon {flag}: the {engine.name} engine has no voice {voice_id!r} "
                                     f"(its voices: {known})")
                voices: Sequence[Voice] = [voice]
                by_voice[voice_id] = by_voice.get(voice_id, Lexicon()) | lexicon
            else:
                voices = engine.voices()
                if engine.clones_voices:  # and the voices registered later
                    later = Voice("(a voice registered later)", "", "", engine.sample_rate,
                                  phonemes=engine.cloned_voice_phonemes)
                    voices = [*voices, later]
                everyone = everyone | lexicon
            try:
                for voice in voices:
                    voice.check_lexicon(lexicon)
            except EngineError as e:
                raise ValueError(f"--lexicon {flag}: {e.message}") from None
        return cls(everyone, by_voice)

    def for_voice(self, voice: Voice) -> Lexicon:
        """The server's entries for ``voice``, checked against it (``EngineError``
        ``invalid_lexicon`` where it cannot say one: a voice registered since the start)."""
        key = (voice.id, voice.installed)
        merged = self._merged.get(key)
        if merged is None:
            merged = self._check(voice)
            self._merged[key] = merged
            if len(self._merged) > _REMEMBERED:
                self._merged.popitem(last=False)
        else:
            self._merged.move_to_end(key)
        if isinstance(merged, EngineError):
            raise merged
        return merged

    def _check(self, voice: Voice) -> Lexicon | EngineError:
        merged = self.everyone | self.by_voice.get(voice.id, Lexicon())
        try:
            voice.check_lexicon(merged)
        except EngineError as e:
            return e
        return merged
