"""The contract between an engine and the worker thread that drives it.

An engine turns one segment of text into audio. It knows nothing of sockets, queues or
scheduling: the worker owns those. ``open`` makes a ``Stream``, one segment's model
state between steps, and each ``step`` call advances a batch of streams by one step
each, so the worker can advance every runnable utterance together (continuous
batching) and stop any one of them between two steps by closing its stream.

An engine that cannot batch only writes ``synthesize`` as a generator: each ``next()``
is one step, and the default ``open``/``step`` run it as a batch of one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from voxwire.engine.errors import CodedError, ErrorCode
from voxwire.engine.text.lexicon import Lexicon


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    language: str
    sample_rate: int
    description: str = ""
    speakers: tuple[str, ...] = ()
    """A multi-speaker voice's speaker names, each at its speaker id (Piper's
    ``speaker_id_map``); empty for a voice with one speaker."""
    quality: str = ""
    """As its maker grades it (Piper's x_low, low, medium, high); "" where none does."""
    phonemes: str = ""
    """The phoneme symbols a lexicon may give this voice, one a character; "" where it
    takes none (then a lexicon may only respell)."""
    installed: bool = True
    """Whether its model is on this machine; False for one the engine downloads on its
    first request (Piper's ``--download-voices``), whose rate and speakers its catalog
    gives and whose phonemes are known once it is downloaded."""

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "language": self.language,
            "sample_rate": self.sample_rate,
            "description": self.description,
            "speakers": list(self.speakers),
            "quality": self.quality,
            "phonemes": self.phonemes,
            "installed": self.installed,
        }

    def check_lexicon(self, lexicon: Lexicon, what: str = "lexicon entry") -> None:
        """Raise ``EngineError`` (``invalid_lexicon``) naming the first entry this voice
        cannot say, as ``what`` calls it: phonemes where it takes none, or a symbol outside
        its alphabet. A voice not installed yet has no alphabet to check against: the
        worker checks the lexicon once the voice is (engine/worker.py)."""
        if not self.installed:
            return
        for e in lexicon:
            if e.phonemes is None:
                continue
            if not self.phonemes:
                raise EngineError(ErrorCode.INVALID_LEXICON,
                                  f"{what} {e.key!r}: voice {self.id!r} takes no phonemes; give a respelling")
            unknown = sorted({ch for ch in e.phonemes if ch != " " and ch not in self.phonemes})
            if unknown:
                raise EngineError(ErrorCode.INVALID_LEXICON,
                                  f"{what} {e.key!r}: voice {self.id!r} has no phoneme {' '.join(unknown)!r} "
                                  "(GET /v1/voices lists its phonemes)")

    def speaker_id(self, speaker: str | None) -> int | None:
        """The id of ``speaker`` (a name, or an id written as a number), or None for the
        voice's default speaker when none is named. An unknown speaker, or any speaker of a
        one-speaker voice, raises ``EngineError`` (``unknown_speaker``)."""
        if speaker is None:
            return None
        if speaker in self.speakers:
            return self.speakers.index(speaker)
        if speaker.isdecimal() and int(speaker) < len(self.speakers):
            return int(speaker)
        if not self.speakers:
            raise EngineError(ErrorCode.UNKNOWN_SPEAKER,
                              f"voice {self.id!r} has one speaker; name none (GET /v1/voices lists the speakers)")
        shown = ", ".join(self.speakers[:8]) + (f", … ({len(self.speakers)} in all)" if len(self.speakers) > 8 else "")
        raise EngineError(ErrorCode.UNKNOWN_SPEAKER,
                          f"voice {self.id!r} has no speaker {speaker[:64]!r}: name one of {shown}, or give its "
                          f"number (0 to {len(self.speakers) - 1})")


@dataclass(frozen=True)
class SynthesisParams:
    voice: str
    speed: float = 1.0
    timestamps: bool = False
    """Ask for WordTimings (engines that have alignments; it may cost a little time)."""
    fast_start: bool | None = None
    """A sooner first chunk at some cost in fidelity, for engines that have that choice
    (CosyVoice2's trimmed flow prompt); None: the voice's own default, else the engine's.
    Engines without the choice (Piper) ignore it."""
    speaker: str | None = None
    """A multi-speaker voice's speaker: a name from ``Voice.speakers`` or its id as a
    number; None: the voice's default speaker (id 0, as Piper does)."""
    lexicon: Lexicon | None = None
    """How the user wants words said (engine/text/lexicon.py), checked against the voice
    (``Voice.check_lexicon``)."""


@dataclass(frozen=True)
class WordTiming:
    word: str
    start: int
    """First sample, counted from the start of the segment being synthesised."""
    end: int


@dataclass(frozen=True)
class WordTimings:
    """Yielded by an engine that knows its alignment, before the audio the words are in."""

    words: tuple[WordTiming, ...]


@dataclass(frozen=True)
class Registered:
    voice: Voice
    created: bool


class EngineError(CodedError):
    """A failure the client should hear about, with a stable machine-readable code:
    ``EngineError(code, message)``, as its base ``CodedError``."""


@dataclass
class Step:
    """What one engine step gave one stream: its pieces, in order (``WordTimings`` ahead
    of the audio they describe), and whether its segment is now fully spoken."""

    pieces: list[np.ndarray | WordTimings]
    done: bool


class Stream:
    """One segment being synthesised: the engine's state for it between steps."""

    memory_bytes: int = 0
    """Device memory this stream may hold at its largest (its caches): the worker admits
    a stream only while the streams it runs fit the memory budget."""

    def cost(self) -> int:
        """The work of this stream's next step, in the engine's own units (frames,
        tokens): the worker fills a step up to ``Engine.step_budget`` of them."""
        return 1

    def close(self) -> None:
        """Release what the stream holds; called once, whether or not it finished."""


class GeneratorStream(Stream):
    """A ``synthesize`` generator seen as a stream: one ``next()`` per step."""

    def __init__(self, pieces: Iterator[np.ndarray | WordTimings]) -> None:
        self._pieces = pieces

    def step(self) -> Step:
        try:
            return Step([next(self._pieces)], done=False)
        except StopIteration:
            return Step([], done=True)

    def close(self) -> None:
        self._pieces.close()  # type: ignore[attr-defined]


class Engine(ABC):
    """A loaded model. All methods but ``voices`` and ``load_voice`` run on the engine's
    worker thread."""

    name: str
    sample_rate: int
    device: str = "cpu"
    precision: str = "fp32"
    """The arithmetic the model computes in ("fp32", "bf16", "fp16"), as resolved from the
    ``precision`` setting on this device (engine/precision.py)."""
    timestamps: bool = False
    """Whether ``synthesize`` yields ``WordTimings`` when ``params.timestamps`` asks."""
    clones_voices: bool = False
    """Whether ``register_voice`` can make a voice: the server refuses uploads otherwise,
    before it decodes anything."""
    cloned_voice_phonemes: str = ""
    """The ``Voice.phonemes`` of a voice ``register_voice`` makes: the server checks its
    lexicon files against them at start, before any such voice exists."""
    max_batch: int = 1
    """Streams one ``step`` may advance together; 1 for an engine that cannot batch."""
    step_budget: int | None = None
    """The most ``Stream.cost`` units one step may take on (None: no bound). The first
    stream chosen always goes in, whatever its cost."""
    width_costs_time: bool = True
    """Whether each stream in a step makes the step take longer, as on a CPU, whose cores
    one stream already fills. The scheduler then gives newcomers, listeners about to run
    dry and comfortable listeners steps of their own, so that none waits for another
    kind's work. On a GPU a wider step costs little more, and they share steps."""
    memory_budget: int | None = None
    """Bytes of ``Stream.memory_bytes`` the engine's streams may hold together (None: no
    bound); the server's setting overrides it."""

    @abstractmethod
    def voices(self) -> Sequence[Voice]:
        """The voices this engine can speak with now."""

    def has_voice(self, voice_id: str) -> bool:
        try:
            return self.voice(voice_id) is not None
        except EngineError:
            return False

    def voice(self, voice_id: str) -> Voice | None:
        """The voice of that id, or None. An engine that makes voices from their names
        (Kokoro's blends) may raise ``EngineError`` for a name it cannot read."""
        return next((v for v in self.voices() if v.id == voice_id), None)

    def voice_rate(self, voice_id: str) -> int:
        """The rate a voice's pieces come at: its own (voices of one engine may differ,
        as Piper's 16 kHz and 22.05 kHz ones do), else the engine's."""
        voice = self.voice(voice_id)
        return voice.sample_rate if voice is not None else self.sample_rate

    def voice_loaded(self, voice_id: str) -> bool:
        """Whether ``open`` can begin a segment in that voice without loading its model
        first (an unknown voice counts as loaded: ``open`` refuses it). The worker asks
        before opening, and loads a voice that is not (``load_voice``) on a thread of its
        own, so that other listeners do not wait for the load."""
        return True

    def load_voice(self, voice_id: str) -> None:
        """Load a voice's model for a later ``open``; the one method besides ``voices``
        that runs off the worker's thread (on a loader thread, while steps go on). Raises
        ``EngineError`` where it cannot. Engines that hold every voice have nothing to do."""

    def default_voice(self) -> str | None:
        """The voice a request that names none speaks with: the first of ``voices``, which
        an engine lists in a stable order, so every process gives the same answer. None
        while the engine has no voice (a cloning engine before its first registration)."""
        voices = self.voices()
        return voices[0].id if voices else None

    def synthesize(self, text: str, params: SynthesisParams) -> Iterator[np.ndarray | WordTimings]:
        """Yield float32 mono pieces at ``sample_rate`` for one segment of text, and, where
        the engine has alignments, ``WordTimings`` ahead of the audio they describe.

        Raise ``EngineError`` for failures the client can act on; any other exception is
        reported as an internal engine error for that utterance alone.

        A batching engine overrides ``open`` and ``step`` instead, and gets this for free:
        the segment's pieces, stepped alone. A request ``open`` refuses raises here, at
        the call, not at the first ``next()``.
        """
        if type(self).open is Engine.open:
            raise NotImplementedError(f"{type(self).__name__} defines neither synthesize nor open and step")
        return self._stepped_alone(self.open(text, params))

    def _stepped_alone(self, stream: Stream) -> Iterator[np.ndarray | WordTimings]:
        try:
            while True:
                (result,) = self.step([stream])
                if isinstance(result, Exception):
                    raise result
                yield from result.pieces
                if result.done:
                    return
        finally:
            stream.close()

    def open(self, text: str, params: SynthesisParams) -> Stream:
        """Begin one segment. Cheap: model work belongs in ``step``. May raise
        ``EngineError`` (an unknown voice, a text the engine refuses)."""
        return GeneratorStream(iter(self.synthesize(text, params)))

    def step(self, streams: Sequence[Stream]) -> list[Step | Exception]:
        """Advance each stream by one step; one result per stream, in order. A stream
        that failed gets its exception in its place and the others carry on.

        A batching engine may raise for the whole batch (a failure it cannot pin on one
        stream); it must then leave every stream as it was before the call, so that the
        worker can step them one by one and fail only the one at fault. That retry is the
        worker's alone: an engine's step does not catch its own failure to step the same
        streams again."""
        results: list[Step | Exception] = []
        for stream in streams:
            assert isinstance(stream, GeneratorStream), "an engine that overrides open overrides step"
            try:
                results.append(stream.step())
            except Exception as e:  # this stream's failure; the others carry on
                results.append(e)
        return results

    def register_voice(
        self, audio: np.ndarray, sample_rate: int, transcript: str, name: str
    ) -> Registered:
        """Make a voice from reference audio (zero-shot cloning engines only). The same
        audio and transcript give the same voice: ``created`` is true for the one
        registration that made it."""
        raise EngineError(
            ErrorCode.VOICE_REGISTRATION_UNSUPPORTED, f"the {self.name} engine cannot clone voices"
        )

    def warmup(self) -> None:
        """Run one small synthesis so the first real request pays no start-up cost."""
        voices = self.voices()
        if voices:
            for _ in self.synthesize("Warm up, please.", SynthesisParams(voice=voices[0].id)):
                pass

    def close(self) -> None:
        """Release the model. The default holds nothing that needs releasing."""
