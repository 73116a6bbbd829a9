"""Percentiles and summaries, the same way for every figure."""

from __future__ import annotations

import math

import numpy as np


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    if not clean:
        return {f"p{p}": float("nan") for p in ps}
    # "higher": a reported p95 is a value that was actually observed, never interpolated.
    return {f"p{p}": float(np.percentile(clean, p, method="higher")) for p in ps}


def summary(values: list[float]) -> dict[str, float]:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    out = percentiles(clean)
    out["mean"] = float(np.mean(clean)) if clean else float("nan")
    out["n"] = len(clean)
    return out
