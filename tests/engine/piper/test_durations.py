"""Speech stays proportional to its phonemes: however odd the text, or the duration
predictor's answer for it, no phoneme is spoken for longer than MAX_PHONEME_SECONDS."""

from __future__ import annotations

import math

import pytest
import torch

from voxwire.engine.piper.vits import MAX_PHONEME_SECONDS


@pytest.mark.parametrize("length_scale", [1.0, 2.0])
def test_no_phoneme_outlasts_the_bound_whatever_the_predictor_says(vits, phoneme_ids, monkeypatch, length_scale):
    ids = torch.tensor(phoneme_ids["medium"])
    _, natural = vits.infer_prior(ids, 0.667, length_scale, 0.8, torch.Generator().manual_seed(0))
    longest = math.ceil(MAX_PHONEME_SECONDS * vits.sample_rate / vits.hop_length * length_scale)
    assert 0 < int(natural.max()) < longest  # real speech is far from the bound: it changes nothing there

    # A predictor gone wild (e^12 frames, hours, for every phoneme), as hostile input could make it.
    monkeypatch.setattr(vits.dp, "reverse", lambda x, mask, noise, speaker=None: torch.full_like(noise[:, :1], 12.0) * mask)
    z_p, durations = vits.infer_prior(ids, 0.667, length_scale, 0.8, torch.Generator().manual_seed(0))
    assert int(durations.max()) == longest
    assert z_p.shape[-1] == int(durations.sum()) <= ids.numel() * longest
