"""Which voice a name on the OpenAI route speaks with.

Stock OpenAI clients check the voice name before they send anything (Pipecat's
``OpenAITTSService`` takes only OpenAI's own names), so a server reached through them
must give those names a voice. The operator maps each name to an installed voice or a
speaker of one (``--openai-voice nova=libritts:12``); a name left unmapped speaks with
the server's default voice. The same map may also give short names to any voice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from voxwire.engine.base import Engine, EngineError

# OpenAI's built-in voices, as its API reference lists them.
OPENAI_VOICES = frozenset("alloy ash ballad coral echo fable nova onyx sage shimmer verse marin cedar".split())


class VoiceMapError(ValueError):
    """A map entry that cannot be read, or names a voice the engine does not have."""


def parse_map(entries: Iterable[str]) -> Mapping[str, str]:
    """``NAME=VOICE`` entries (VOICE may be ``VOICE:SPEAKER``), as a map. Raises
    ``VoiceMapError`` naming the entry."""
    out: dict[str, str] = {}
    for entry in entries:
        name, eq, target = (part.strip() for part in entry.partition("="))
        if not eq or not name or not target:
            raise VoiceMapError(f"--openai-voice {entry}: must be NAME=VOICE or NAME=VOICE:SPEAKER")
        if name in out:
            raise VoiceMapError(f"--openai-voice {entry}: {name!r} is mapped twice")
        out[name] = target
    return MappingProxyType(out)


def split_speaker(engine: Engine, requested: str) -> tuple[str, str | None]:
    """``VOICE:SPEAKER``: a multi-speaker voice's speaker (a name, or its id), after the
    first ':' (or, for a voice whose id has one, after the first ':' that ends a voice's
    id). A name the engine has as a voice is that voice, ':' or not. The speaker is
    checked against the voice by the pipeline."""
    if ":" not in requested or engine.has_voice(requested):
        return requested, None
    ids = [v.id for v in engine.voices() if requested.startswith(v.id + ":")]
    voice = min(ids, key=len) if ids else requested.split(":", 1)[0]
    return voice, requested[len(voice) + 1 :]


def resolve(engine: Engine, voice_map: Mapping[str, str], requested: str, default: str) -> tuple[str, str | None]:
    """The voice and speaker a requested name speaks with: the map's entry for it; else
    the engine's voice of that name (with ``:SPEAKER``); else, for one of OpenAI's names,
    the ``default`` voice (``""``: the engine's own), its ``:SPEAKER`` kept. Any other name is checked by the
    pipeline, which refuses it as an unknown voice."""
    mapped = voice_map.get(requested)
    if mapped is not None:
        return split_speaker(engine, mapped)
    voice, speaker = split_speaker(engine, requested)
    if voice in OPENAI_VOICES and not engine.has_voice(voice):
        return default, speaker
    return voice, speaker


def check_map(engine: Engine, voice_map: Mapping[str, str]) -> None:
    """Refuse, before serving, a map entry whose voice or speaker the engine does not have
    (an engine that clones voices may have it later, so there only the speaker of a voice
    it has is checked). Raises ``VoiceMapError``."""
    for name, target in voice_map.items():
        voice_id, speaker = split_speaker(engine, target)
        try:
            voice = engine.voice(voice_id)
            if voice is None:
                if engine.clones_voices:
                    continue
                known = ", ".join(v.id for v in engine.voices()) or "none"
                raise VoiceMapError(f"--openai-voice {name}={target}: the {engine.name} engine has no voice "
                                    f"{voice_id!r} (its voices: {known})")
            voice.speaker_id(speaker)
        except EngineError as e:
            raise VoiceMapError(f"--openai-voice {name}={target}: {e.message}") from None
