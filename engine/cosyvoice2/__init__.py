"""CosyVoice2-0.5B: zero-shot voice cloning TTS, native torch streaming inference.

Qwen2 speech-token LM -> chunk-causal flow matching (mel) -> HiFT vocoder, 24 kHz.
Weights come from a user-downloaded model directory; nothing is fetched at run time.
"""

from .weights import missing_files

__all__ = ["CosyVoice2Engine", "missing_files"]


def __getattr__(name: str):  # the engine (and torch) load only when asked for
    if name == "CosyVoice2Engine":
        from .engine import CosyVoice2Engine

        return CosyVoice2Engine
    raise AttributeError(name)
