"""DNSMOS P.835, as the ``speechmos`` package ships it (its ONNX models are in its wheel).

DNSMOS predicts what listeners would rate noisy, processed speech on ITU-T P.835's three
scales (1 to 5): SIG, the speech signal itself (distortion, artefacts); BAK, the
background (noise); OVRL, the whole. It was trained on the output of noise suppressors,
not of TTS: a proxy that moves with clicks, buzz, band-limiting and codec damage, and
that compares servers speaking the same voice. It is not a TTS naturalness MOS, and its
absolute values say little about one voice against another.

speechmos imports librosa (the P.808 model's mel spectrogram) without declaring it; the
``bench`` and ``test`` extras carry it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DNSMOS_RATE = 16000


@dataclass(frozen=True)
class Dnsmos:
    sig: float
    bak: float
    ovrl: float


def dnsmos(audio: np.ndarray) -> Dnsmos:
    """DNSMOS of one utterance at 16 kHz. Shorter than the model's 9 s window, speechmos
    repeats the utterance to fill it, as the DNS challenge's own script does."""
    from speechmos import dnsmos as model

    if audio.size == 0:
        raise ValueError("no audio to score")
    scores = model.run(np.clip(audio, -1.0, 1.0).astype(np.float32), DNSMOS_RATE)
    return Dnsmos(sig=float(scores["sig_mos"]), bak=float(scores["bak_mos"]), ovrl=float(scores["ovrl_mos"]))
