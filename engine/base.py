"""The contract between an engine and the worker thread that drives it.

An engine turns one segment of text into audio. It knows nothing of sockets, queues or
scheduling: the worker owns those. Each ``next()`` on the iterator returned by
``synthesize`` is one step of computation, so the worker can interleave many utterances
on one thread and stop one of them between two steps by closing its generator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    language: str
    sample_rate: int
    description: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "language": self.language,
            "sample_rate": self.sample_rate,
            "description": self.description,
        }


@dataclass(frozen=True)
class SynthesisParams:
    voice: str
    speed: float = 1.0
    timestamps: bool = False
    """Ask for WordTimings (engines that have alignments; it may cost a little time)."""


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


class EngineError(Exception):
    """A failure the client should hear about, with a stable machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Engine(ABC):
    """A loaded model. All methods but ``voices`` run on the engine's worker thread."""

    name: str
    sample_rate: int
    device: str = "cpu"
    timestamps: bool = False
    """Whether ``synthesize`` yields ``WordTimings`` when ``params.timestamps`` asks."""
    clones_voices: bool = False
    """Whether ``register_voice`` can make a voice: the server refuses uploads otherwise,
    before it decodes anything."""

    @abstractmethod
    def voices(self) -> Sequence[Voice]:
        """The voices this engine can speak with now."""

    def has_voice(self, voice_id: str) -> bool:
        return any(v.id == voice_id for v in self.voices())

    def default_voice(self) -> str | None:
        """The voice a request that names none speaks with: the first of ``voices``, which
        an engine lists in a stable order, so every process gives the same answer. None
        while the engine has no voice (a cloning engine before its first registration)."""
        voices = self.voices()
        return voices[0].id if voices else None

    @abstractmethod
    def synthesize(self, text: str, params: SynthesisParams) -> Iterator[np.ndarray | WordTimings]:
        """Yield float32 mono pieces at ``sample_rate`` for one segment of text, and, where
        the engine has alignments, ``WordTimings`` ahead of the audio they describe.

        Raise ``EngineError`` for failures the client can act on; any other exception is
        reported as an internal engine error for that utterance alone.
        """

    def register_voice(
        self, audio: np.ndarray, sample_rate: int, transcript: str, name: str
    ) -> Registered:
        """Make a voice from reference audio (zero-shot cloning engines only). The same
        audio and transcript give the same voice: ``created`` is true for the one
        registration that made it."""
        raise EngineError(
            "voice_registration_unsupported", f"the {self.name} engine cannot clone voices"
        )

    def warmup(self) -> None:
        """Run one small synthesis so the first real request pays no start-up cost."""
        voices = self.voices()
        if voices:
            for _ in self.synthesize("Warm up, please.", SynthesisParams(voice=voices[0].id)):
                pass

    def close(self) -> None:
        """Release the model. The default holds nothing that needs releasing."""
