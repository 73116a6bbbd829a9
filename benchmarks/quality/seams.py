"""Seams: how far each chunk join of a stream stands out from the rest of its utterance.

A seam ratio is the spectral flux across a join divided by the median of the same flux
at speech positions away from every join (the issue's definition). Clean seams score
about 1 or less; a click, a dropped-chunk gap or a sign (phase) jump scores several
times that. Why the flux is measured the way it is:

* Around a frame that *straddles* the join, against its two neighbours half a window
  away, which just touch the join. Flipping a chunk's sign leaves the magnitude spectrum
  of every window lying wholly on one side unchanged, so only a window across the join
  can see it: there the jump is a step in the waveform, broadband energy.

* On band log-energies (500 Hz bands, dB) rather than magnitude bins. A step's energy is
  negligible next to a vowel's formants but large next to its 6-11 kHz content: a
  linear-magnitude norm is dominated by the loudest bands and never sees it, a per-band
  dB scale does. Bands rather than bins because single bins of voiced speech swing by
  several dB from frame to frame. Bands reach 12 kHz (the engines' own bandwidth) or
  0.45 of the rate, whichever is lower, so the top bands, where steps show most, count
  wherever the rate has them, and the same audio at 16 and 48 kHz scores alike. (At
  8 kHz that leaves 3.6 kHz, and a sign flip is often too faint to catch there.)

* As how far the straddling frame lies *outside the range* its neighbours span, per band
  (RMS over bands), not its distance from them. Any monotonic change, a speech onset or
  offset wherever it falls, keeps the middle frame between its neighbours; a distance
  scored ordinary onsets at 4-6x the median. What still leaves the range is short (a
  burst, a flap), and that is the natural variation the median measures.

* Frames of 10 ms, in milliseconds so every rate sees the same time scales. At 20 ms a
  10 ms gap is smeared into a dip no deeper than a natural stop closure, while a 10 ms
  frame inside it drops to the floor; shorter frames see single glottal pulses. The test
  is made at the join and half a window either side, and the largest counts: a gap's
  middle, or an inexactly reported boundary, lies up to that far from the join. The
  elsewhere positions get exactly the same treatment, so a join at an arbitrary point of
  clean speech scores ~1.

* Blackman-Harris windows: a Hann window's sidelobes leak a tone into distant bands at a
  level that depends on the tone's phase within the frame, which reads as change; these
  sidelobes lie under the floor.

* Floors. Band energies are floored 80 dB under the loudest band of the utterance, so in a
  pause every frame sits on the floor and a join there scores ~0 rather than a ratio of
  noise, while a click in silence rises far above it. The median is taken only over
  positions within 35 dB of the loudest frame, since pauses would otherwise pull it down
  and inflate every ratio; and never below 0.5 dB (speech gives 4-8 dB), so a steady
  signal such as a pure tone, where nothing ever leaves its range, does not turn
  rounding noise into ratios.

Joins closer than 15 ms (the test's reach: the window and a half) to either end of the
audio are skipped, having no frames on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WINDOW_MS = 10.0
BAND_HZ = 500.0
TOP_HZ = 12000.0
FLOOR_DB = 80.0  # below the loudest band of the loudest frame
SPEECH_DB = 35.0  # positions this close to the loudest frame count as speech
MIN_MEDIAN_DB = 0.5


def _geometry(rate: int) -> tuple[int, int]:
    n = max(16, int(round(WINDOW_MS * rate / 1000)))
    return n, n // 2


def _band_edges(rate: int) -> np.ndarray:
    top = min(TOP_HZ, 0.45 * rate)
    edges = list(np.arange(0.0, top, BAND_HZ))
    if top - edges[-1] < BAND_HZ / 2 and len(edges) > 1:
        edges[-1] = top
    else:
        edges.append(top)
    return np.asarray(edges)


def _blackman_harris(n: int) -> np.ndarray:
    """The 4-term Blackman-Harris window: sidelobes 92 dB down, under the floor."""
    k = 2 * np.pi * (np.arange(n) + 0.5) / n
    return 0.35875 - 0.48829 * np.cos(k) + 0.14128 * np.cos(2 * k) - 0.01168 * np.cos(3 * k)


def _band_energy(x: np.ndarray, centres: np.ndarray, rate: int, n: int) -> np.ndarray:
    """Band energies (frames x bands) of windowed frames of n samples centred at
    `centres` (audio outside [0, len) reads as zeros)."""
    padded = np.concatenate([np.zeros(n), x, np.zeros(n)])
    idx = centres[:, None] + (np.arange(n) - n // 2 + n)[None, :]
    window = _blackman_harris(n)
    power = np.abs(np.fft.rfft(padded[idx] * window, axis=1)) ** 2
    freqs = np.fft.rfftfreq(n, 1 / rate)
    edges = _band_edges(rate)
    band = np.searchsorted(edges, freqs, side="right") - 1
    out = np.zeros((len(centres), len(edges) - 1))
    for b in range(len(edges) - 1):
        out[:, b] = power[:, band == b].sum(axis=1)
    return out


def _excursion(db: np.ndarray) -> np.ndarray:
    """For frames k-1, k, k+1 along axis 1 (shape positions x 3 x bands): the RMS over
    bands of how far frame k leaves the range spanned by frames k-1 and k+1 (dB)."""
    left, mid, right = db[:, 0], db[:, 1], db[:, 2]
    lo, hi = np.minimum(left, right), np.maximum(left, right)
    out = np.maximum(mid - hi, 0) + np.maximum(lo - mid, 0)
    return np.sqrt(np.mean(out**2, axis=1))


def _flux(db5: np.ndarray) -> np.ndarray:
    """Seam flux at positions whose five surrounding frames (half a window apart, the
    middle one centred on the position) are given as band dB, shape positions x 5 x bands:
    the largest excursion of the three middle frames."""
    return np.max(np.stack([_excursion(db5[:, k - 1:k + 2]) for k in (1, 2, 3)]), axis=0)


def seam_ratios(audio: np.ndarray, rate: int, joins: Sequence[int]) -> list[float]:
    """The seam ratio at each join (sample index of the first sample after it) of mono
    audio at `rate`: its flux over the median flux at speech positions away from every
    join. Joins within 15 ms of either end are skipped (see the module docstring), so the
    list can be shorter than `joins`; it keeps their order. Audio that is silent
    throughout scores 0 at every join; ValueError when the joins leave no speech between
    them to compare with (joins closer together than about 30 ms)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    x = np.asarray(audio, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"mono audio expected, got shape {x.shape}")
    n, h = _geometry(rate)
    reach = 2 * h + n // 2
    js = np.asarray([int(j) for j in joins if reach <= int(j) <= len(x) - reach], dtype=np.int64)
    if len(js) == 0:
        return []
    # Frames every half window along the whole utterance: the elsewhere positions.
    grid = np.arange(0, len(x), h)
    energy = _band_energy(x, grid, rate, n)
    floor = energy.max() * 10 ** (-FLOOR_DB / 10)
    if floor <= 0:  # digital silence throughout: nothing to hear at any join
        return [0.0] * len(js)

    def db(e: np.ndarray) -> np.ndarray:
        return 10 * np.log10(e + floor)

    grid_db = db(energy)
    total = energy.sum(axis=1)
    inner = np.arange(2, len(grid) - 2)
    inner = inner[(grid[inner] >= reach) & (grid[inner] <= len(x) - reach)]
    away = np.min(np.abs(grid[inner][:, None] - js[None, :]), axis=1) >= reach
    speech = total[inner] >= total.max() * 10 ** (-SPEECH_DB / 10)
    keep = inner[away & speech]
    if len(keep) == 0:
        raise ValueError("no speech away from the joins to compare them with")
    elsewhere = _flux(np.stack([grid_db[keep + d] for d in range(-2, 3)], axis=1))
    reference = max(float(np.median(elsewhere)), MIN_MEDIAN_DB)
    offsets = np.arange(-2, 3) * h
    at = db(_band_energy(x, (js[:, None] + offsets[None, :]).ravel(), rate, n))
    at_joins = _flux(at.reshape(len(js), 5, -1))
    return [float(v) / reference for v in at_joins]
