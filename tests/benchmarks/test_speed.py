"""What docs/protocol.md says of ``speed``: Voxwire shortens speech exactly as much as
Piper's own ``length_scale`` does, less than the speed itself, and never below a frame
per phoneme id (benchmarks/speed.py)."""

from __future__ import annotations

import pytest

from voxwire.benchmarks import speed


def test_shortening_is_each_speeds_median_against_speed_one():
    totals = {"1.0": [30.0, 32.0, 31.0], "1.5": [20.0, 22.0, 21.0], "2.0": [19.0]}
    assert speed.shortening(totals) == {"1.0": 1.0, "1.5": round(31 / 21, 3), "2.0": round(31 / 19, 3)}


@pytest.fixture(scope="module")
def piper():
    return speed.piper_voice()


def test_the_floor_is_a_frame_for_each_phoneme_id(piper):
    text = "Sure, I can help with that."
    ids = [len(piper.phonemes_to_ids(p)) for p in piper.phonemize(text) if p]
    frame_s = piper.config.hop_length / piper.config.sample_rate
    assert speed.floor_seconds(piper, text) == pytest.approx(sum(ids) * frame_s)
    # Piper's own speech at the fastest speed stays above it.
    assert speed.piper_seconds(piper)(text, 2.0) >= speed.floor_seconds(piper, text)


@pytest.mark.slow  # both engines speak every text at every speed
@pytest.mark.timeout(600)
def test_voxwire_shortens_speech_as_piper_does_at_the_same_length_scale():
    r = speed.measure(repeats=1, backend="torch", said=speed.texts()[:4])  # 21 s of speech at speed 1
    ours, theirs = r["shortening"]["voxwire"], r["shortening"]["piper"]
    for s in ("1.5", "2.0"):
        # The same as Piper's own length scale, within the spread of its drawn durations
        # (0.01 apart over three repeats; each speed's total here is a single draw).
        assert ours[s] == pytest.approx(theirs[s], abs=0.08), (s, ours, theirs)
        # Less than the speed: every id's duration is rounded up to a whole frame.
        assert 1.2 < ours[s] < 0.95 * float(s), (s, ours)
    for totals in r["seconds"].values():
        assert min(min(v) for v in totals.values()) > r["floor_s"]
