"""The seam metric on synthetic audio: clean cuts score about 1, damaged joins well above
the bound, at any rate, and pauses do not blow it up."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from voxwire.benchmarks.loadgen import joins
from voxwire.benchmarks.quality.seams import seam_ratios
from tests.fixtures.damage import flip_alternate, splice_gaps

# "Any seam ratio exceeds" this. On real Piper audio (55 utterances; its own piece joins,
# 200 ms frame joins, and those at 16 and 48 kHz) the worst clean seam scored 2.82, and
# the mildest damaged utterance's worst seam 3.61 (sign flips at 200 ms frame joins).
BOUND = 3.3


def voiced(rate: int, seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """A noise-excited harmonic signal, roughly speech-shaped: 140 Hz with vibrato,
    harmonics falling 12 dB an octave up to 7 kHz, a syllable-rate swell, and noise
    40 dB down. The same continuous signal at every rate."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k**2 for k in range(1, 50))
    x = x * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)) + 0.01 * np.std(x) * rng.standard_normal(len(t))
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def at_peaks(x: np.ndarray, rate: int, every_ms: float = 200.0) -> list[int]:
    """Joins every ~200 ms, each moved to the loudest sample within 10 ms: where a sign
    flip makes its biggest jump (at a zero crossing it would make almost none)."""
    step, near = int(rate * every_ms / 1000), rate // 100
    return [j - near + int(np.argmax(np.abs(x[j - near:j + near]))) for j in range(step, len(x) - step // 2, step)]


def test_joins_are_where_consecutive_pieces_meet():
    assert joins([3, 4, 5]) == [3, 7]
    assert joins([0, 3, 0, 0, 4, 0]) == [3]
    assert joins([5]) == [] and joins([]) == []
    assert joins([3584, 7168, 14336]) == [3584, 10752]
    with pytest.raises(ValueError):
        joins([3, -1, 4])


def test_damage_fixtures_change_only_the_joins():
    x = np.arange(1, 11, dtype=np.float32)
    g, moved = splice_gaps(x, 1000, [3, 7], ms=2.0)
    assert moved == [3, 9]
    assert g.tolist() == [1, 2, 3, 0, 0, 4, 5, 6, 7, 0, 0, 8, 9, 10]
    assert flip_alternate(x, [3, 7]).tolist() == [1, 2, 3, -4, -5, -6, -7, 8, 9, 10]
    assert x.tolist() == list(range(1, 11))  # the input is left alone


@pytest.mark.parametrize("rate", [16000, 22050, 48000])
def test_a_continuous_signal_cut_anywhere_scores_about_one(rate):
    x = voiced(rate)
    cuts = sorted(np.random.default_rng(1).choice(np.arange(rate // 50, len(x) - rate // 50), 30, replace=False))
    ratios = seam_ratios(x, rate, cuts)
    assert len(ratios) == 30
    assert 0.7 < np.median(ratios) < 1.4
    assert max(ratios) < BOUND


def test_tones_and_chirps_cut_anywhere_are_not_seams():
    rate = 16000
    t = np.arange(2 * rate) / rate
    cuts = list(range(3200, 2 * rate, 3203))
    for x in (np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * (200 * t + 1000 * t**2))):
        assert max(seam_ratios(0.5 * x, rate, cuts)) < 1  # nothing ever changes abruptly
        assert min(seam_ratios(flip_alternate(0.5 * x, cuts), rate, cuts)) > BOUND


@pytest.mark.parametrize("rate", [16000, 22050, 48000])
def test_a_gap_a_sign_flip_or_a_click_at_each_join_scores_far_above_the_bound(rate):
    x = voiced(rate)
    js = at_peaks(x, rate)
    assert max(seam_ratios(x, rate, js)) < BOUND
    gapped, moved = splice_gaps(x, rate, js)  # 10 ms of zeros
    assert min(seam_ratios(gapped, rate, moved)) > 2 * BOUND
    assert min(seam_ratios(flip_alternate(x, js), rate, js)) > BOUND
    clicked = x.copy()
    clicked[js] += 0.25  # half the signal's peak, for one sample
    assert min(seam_ratios(clicked, rate, js)) > BOUND


def test_the_same_signal_scores_alike_at_16_and_48_khz():
    x48 = voiced(48000)
    x16 = soxr.resample(x48, 48000, 16000)
    j48 = list(range(4807, len(x48) - 2400, 4807))
    j16 = [round(j / 3) for j in j48]
    r48, r16 = np.array(seam_ratios(x48, 48000, j48)), np.array(seam_ratios(x16, 16000, j16))
    assert len(r48) == len(r16) == len(j48)
    assert abs(np.median(r48) - np.median(r16)) < 0.15 * np.median(r48)
    assert np.max(np.abs(r48 - r16)) < 0.6
    f48, f16 = flip_alternate(x48, j48), flip_alternate(x16, j16)
    assert max(seam_ratios(f48, 48000, j48)) > BOUND and max(seam_ratios(f16, 16000, j16)) > BOUND


def test_joins_in_a_pause_or_at_a_smooth_onset_do_not_blow_up():
    rate = 16000
    x = voiced(rate, 3.0).astype(np.float64)
    a, b, fade = rate, 2 * rate, rate // 50  # a pause from 1 s to 2 s, with 20 ms fades
    x[a:b] = 0
    x[a - fade:a] *= np.cos(np.linspace(0, np.pi / 2, fade)) ** 2
    x[b:b + fade] *= np.sin(np.linspace(0, np.pi / 2, fade)) ** 2
    js = [a - fade // 2, a, a + 1600, a + 8000, b - 1600, b, b + fade // 2, b + fade]
    assert max(seam_ratios(x, rate, js)) < 1
    hiss = x.copy()
    hiss[a:b] = 5e-4 * np.random.default_rng(3).standard_normal(b - a)  # 60 dB down
    assert max(seam_ratios(hiss, rate, js)) < 2
    clicked = x.copy()
    clicked[a + 8000] = 0.005  # 40 dB under the speech peak, but in digital silence
    assert seam_ratios(clicked, rate, [a + 8000])[0] > BOUND


def test_long_pauses_do_not_inflate_the_ratios_of_clean_cuts():
    rate = 16000
    x = voiced(rate, 4.0)
    for start in range(0, len(x), rate):  # 0.3 s of speech in every second
        x[start + int(0.3 * rate):start + rate] = 0
    cuts = [start + k * 800 + 37 for start in range(0, len(x), rate) for k in (1, 2, 3, 4)]
    ratios = seam_ratios(x, rate, cuts)
    assert 0.7 < np.median(ratios) < 1.4
    assert max(ratios) < BOUND


def test_joins_near_the_ends_are_skipped_and_silence_scores_zero():
    rate = 16000
    x = voiced(rate)
    assert len(seam_ratios(x, rate, [10, len(x) // 2, len(x) - 10])) == 1
    assert seam_ratios(np.zeros(rate, np.float32), rate, [4000, 8000]) == [0.0, 0.0]
    with pytest.raises(ValueError):
        seam_ratios(x, rate, list(range(160, len(x), 160)))  # every 10 ms: no elsewhere left
