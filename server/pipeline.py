"""One utterance, from admission to its figures, whichever door it came through.

Every door (server/doors/) asks the same ``Pipeline`` to ``open`` an utterance. It
checks what only the engine can tell (the voice, timestamps), takes an admission slot,
and either replays the result cache or submits to the worker. The door's utterance task
(server/doors/base.py) reads the ``Speech``'s events (server/speech.py; the events and
the ``Framer`` that makes them are server/framing.py's), which the door sends in its own
shape, and ends the speech with its outcome (``Speech.end``). The speech then tells the
pipeline (``ended``), which gives the slot back, fills the cache and records the metrics
and the log line, exactly once. A refusal is recorded the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from voxwire.engine.base import Engine, EngineError, SynthesisParams
from voxwire.engine.errors import CodedError, ErrorCode, quoted
from voxwire.engine.text import normalize
from voxwire.engine.text import ssml
from voxwire.engine.text.lexicon import Lexicon
from voxwire.engine.text.ssml import Script
from voxwire.engine.worker import Worker
from voxwire.server.accounting import Accounting
from voxwire.server.audio import FormatError, stream_rate
from voxwire.server.cache import CacheKey, CachedAudio, Replay, ResultCache
from voxwire.server.lexicons import ServerLexicons
from voxwire.server.limits import Admission
from voxwire.server.protocol import MAX_SPEED, MIN_SPEED, StreamSettings
from voxwire.server.speech import Speech, UtteranceRequest

RETRY_AFTER_MS = 1000  # a hint: one second is long next to an utterance's first step


class Refused(CodedError):
    """A new utterance (or connection) was not taken, with when to try again, if soon."""

    def __init__(self, code: str, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(code, message)
        self.retry_after_ms = retry_after_ms


class Pipeline:
    """What every door shares: the worker, admission, the result cache and accounting.
    It is each speech's ``SpeechOwner``."""

    def __init__(
        self,
        worker: Callable[[], Worker],
        admission: Admission,
        cache: ResultCache,
        accounting: Accounting,
        draining: Callable[[], bool],
    ) -> None:
        self._worker = worker
        self.admission = admission
        self.cache = cache
        self.accounting = accounting
        self._draining = draining
        self._speeches: dict[Speech, CacheKey | None] = {}
        """Every open speech, with the key its finished result is cached under (None: not cached)."""
        self.lexicons = ServerLexicons()
        """``--lexicon``'s entries, set once the engine is loaded (server/service.py)."""

    @property
    def open_utterances(self) -> int:
        """How many utterances of this process are open."""
        return len(self._speeches)

    def abort_all(self, code: str, message: str) -> None:
        """Fail every open utterance (a shutdown past its deadline)."""
        for speech in list(self._speeches):
            speech.abort(code, message)

    # -- what a speech tells its owner ------------------------------------------------------

    def ended(
        self, speech: Speech, outcome: str, code: str | None, figures: dict[str, object], result: CachedAudio | None,
    ) -> None:
        key = self._speeches.pop(speech, None)
        self.admission.end_utterance()
        if result is not None and key is not None:
            # Streamed text is keyed by what it added up to, for one-shot repeats of it.
            self.cache.put(replace(key, text=normalize(speech.text)), result)
        request = speech.request
        self.accounting.utterance(
            request.door, outcome, code, request.ids, speech.settings.voice, speech.text, figures,
            speech.settings.speaker,
        )

    def stalled(self, speech: Speech, reason: str) -> None:
        self.accounting.metrics.listeners_stalled.labels(speech.request.door, reason).inc()

    # -- what a door asks -------------------------------------------------------------------

    def open(self, request: UtteranceRequest) -> Speech:
        """Admit an utterance and start it (from the cache, or on the worker), or raise
        ``Refused``, which is recorded here."""
        try:
            return self._open(request)
        except Refused as e:
            settings = request.settings
            self.refused(request.door, e.code, request.ids, settings.voice, request.text, settings.speaker)
            raise

    def engine(self) -> Engine:
        """The loaded engine, or an ``EngineError`` a client can be told."""
        return self._worker().loaded_engine()

    def refused(
        self, door: str, code: str, ids: dict[str, str], voice: str, text: str, speaker: str | None = None,
    ) -> None:
        """Record a new utterance that a door turned away (its own limits, bad input)."""
        self.accounting.utterance(door, "refused", code, ids, voice, text, {}, speaker)

    def resolve(self, settings: StreamSettings, check_voice: bool = True) -> StreamSettings:
        """The settings as the loaded engine will speak them: the default voice (``""``)
        named, and what only the engine can tell checked (whether it has the voice and
        the speaker, whether it can time words, and whether the voice can say the
        lexicon's phonemes). Raises ``Refused``."""
        return self._resolved(settings, check_voice)[0]

    def _resolved(self, settings: StreamSettings, check_voice: bool = True) -> tuple[StreamSettings, Lexicon]:
        """``resolve``'s settings, and the lexicon in force: the server's entries for the
        voice, under the request's own (empty where the voice is not checked)."""
        try:
            engine = self._worker().loaded_engine()
        except EngineError as e:
            raise Refused(e.code, e.message, RETRY_AFTER_MS) from None
        try:
            # Opus is sent at its own rate; MP3 and AAC take only their standard rates.
            settings = replace(settings, sample_rate=stream_rate(settings.format, settings.sample_rate))
        except FormatError as e:
            raise Refused(e.code, e.message) from None
        if settings.timestamps and not engine.timestamps:
            raise Refused(
                ErrorCode.TIMESTAMPS_UNSUPPORTED,
                f"this server's engine ({engine.name}) cannot time words; ready.features says what it can do",
            )
        if not check_voice:
            return settings, Lexicon()
        if not settings.voice:
            default = engine.default_voice()
            if default is None:
                raise Refused(ErrorCode.NO_VOICE, "no voices yet: register one with POST /v1/voices")
            settings = replace(settings, voice=default)
        try:
            voice = engine.voice(settings.voice)  # a blend the engine cannot read says why
        except EngineError as e:
            raise Refused(e.code, e.message) from None
        if voice is None:
            raise Refused(ErrorCode.UNKNOWN_VOICE, f"unknown voice {quoted(settings.voice)}; GET /v1/voices lists them")
        try:
            voice.speaker_id(settings.speaker)
            # The request's entries win over the server's; both must be sayable.
            if settings.lexicon:
                voice.check_lexicon(settings.lexicon)
            lexicon = self.lexicons.for_voice(voice) | (settings.lexicon or Lexicon())
        except EngineError as e:
            raise Refused(e.code, e.message) from None
        return settings, lexicon

    def _open(self, request: UtteranceRequest) -> Speech:
        if self._draining():
            raise Refused(ErrorCode.SHUTTING_DOWN, "the server is shutting down; reconnect shortly")
        settings, lexicon = self._resolved(request.settings)
        request = replace(request, settings=settings)
        script = self._script(request) if settings.text_format == "ssml" else None
        if not self.admission.try_start_utterance():
            raise Refused(ErrorCode.OVERLOADED, "the server is at capacity; try again shortly", RETRY_AFTER_MS)
        worker = self._worker()
        engine = worker.loaded_engine()
        key = (
            self.cache.key(
                engine.name, settings.voice, settings.speed, request.text, settings.fast_start, settings.speaker,
                lexicon.fingerprint if lexicon else None, settings.text_format,
            )
            if self.cache.enabled
            else None
        )
        # Only a one-shot utterance can be looked up: streamed text is not known yet.
        hit = self.cache.get(key, with_words=settings.timestamps) if key is not None and request.final else None
        if hit is not None:
            rate = engine.voice_rate(settings.voice)
            speech = Speech(self, request, Replay(hit, rate), rate, 0, script.ignored if script else ())
            self._speeches[speech] = None
            return speech
        lag = self.admission.limits.max_listener_lag_seconds
        behind = worker.behind_seconds() if lag > 0 else 0.0
        if behind > lag:
            # Measured, not counted: the cores are already too few for the listeners the
            # worker has. One more would make every one of them run dry, not just itself.
            self.admission.end_utterance()
            raise Refused(
                ErrorCode.OVERLOADED,
                f"the server cannot keep up with its listeners now (one has waited {behind:.1f} s for audio); "
                "try again shortly", RETRY_AFTER_MS,
            )
        most = self.admission.limits.max_worker_load
        load = worker.load() if most > 0 and engine.width_costs_time else 0.0
        # Predicted from what each stream has cost: one more would leave the worker short
        # of time for every listener, not just for itself. A newcomer alone is served
        # whatever its cost: a server slower than real time still speaks, to one.
        if load > 0:
            load += worker.stream_cost(settings.voice)
        if load > most:
            self.admission.end_utterance()
            raise Refused(
                ErrorCode.OVERLOADED,
                f"the server is at its measured capacity (its listeners, with this one, would need {load:.0%} of "
                f"its compute); try again shortly", RETRY_AFTER_MS,
            )
        try:
            utterance = worker.submit(
                SynthesisParams(
                    voice=settings.voice, speed=settings.speed, timestamps=settings.timestamps,
                    fast_start=settings.fast_start, speaker=settings.speaker, lexicon=lexicon or None,
                ),
                asyncio.get_running_loop(),
                first_clause_words=settings.first_clause_words,
            )
        except EngineError as e:
            self.admission.end_utterance()
            raise Refused(e.code, e.message, RETRY_AFTER_MS) from None
        capture = self.cache.max_entry_bytes if key is not None else 0
        speech = Speech(self, request, utterance, utterance.sample_rate, capture, script.ignored if script else ())
        self._speeches[speech] = key
        if script is not None:
            utterance.feed_script(script)
        else:
            utterance.feed(request.text, request.final)
        return speech

    @staticmethod
    def _script(request: UtteranceRequest) -> Script:
        """An SSML request's document, read (engine/text/ssml.py). Raises ``Refused``."""
        if not request.final:
            raise Refused(ErrorCode.INVALID_SSML, "SSML comes whole: send the whole document as the utterance's "
                                                  "first and final text")
        try:
            return ssml.parse(request.text, request.settings.speed, (MIN_SPEED, MAX_SPEED))
        except ssml.SsmlError as e:
            raise Refused(ErrorCode.INVALID_SSML, str(e)) from None

