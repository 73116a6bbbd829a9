"""Growable per-utterance caches for the flow's chunk-causal attention."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class TimeCache:
    """A tensor that grows along one (time) dimension, with amortised O(1) appends.

    Chunk-causal attention only ever appends: a finished chunk's keys and values
    never change. Capacity doubles when full, so an utterance of n frames copies
    O(n) in total instead of O(n^2) for a concatenation per chunk. ``limit``, when the
    caller knows the most it will hold, caps the doubling there, so the cache never
    holds more than that bound (the memory a stream declares for admission).
    """

    def __init__(self, dim: int = 2, reserve: int = 0, limit: int | None = None) -> None:
        self.dim = dim
        self.reserve = reserve
        self.limit = limit
        self.buf: Tensor | None = None
        self.length = 0

    def append(self, x: Tensor) -> Tensor:
        """Append ``x`` and return a view of everything held so far."""
        n = x.shape[self.dim]
        need = self.length + n
        if self.buf is None or self.buf.shape[self.dim] < need:
            cap = max(need, self.reserve, 2 * (0 if self.buf is None else self.buf.shape[self.dim]))
            if self.limit is not None:
                cap = max(need, min(cap, self.limit))
            shape = list(x.shape)
            shape[self.dim] = cap
            grown = torch.empty(shape, dtype=x.dtype, device=x.device)
            if self.buf is not None and self.length:
                grown.narrow(self.dim, 0, self.length).copy_(self.buf.narrow(self.dim, 0, self.length))
            self.buf = grown
        self.buf.narrow(self.dim, self.length, n).copy_(x)
        self.length = need
        return self.buf.narrow(self.dim, 0, need)

    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.numel() * self.buf.element_size()

    def truncate(self, length: int) -> None:
        """Forget everything past ``length`` (undoes appends: they never touch what is held)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} to {length}")
        self.length = length


def append_rows(caches: Sequence[TimeCache], x: Tensor) -> tuple[Tensor, list[int] | None]:
    """Append ``x`` to several streams' caches at once: cache ``i`` gets the ``i``-th of
    ``len(caches)`` equal row blocks of ``x``. Returns everything the caches hold,
    stacked row-wise in that order, and each cache's length along the time dimension
    where they differ (None where they do not: nothing is padded).

    One cache: its own view. Several of equal length: stacked. Otherwise the shorter
    ones are zero-padded at the end to the longest, and the lengths say which keys are
    real; the padding is zeros, not garbage, so a masked key (weight exactly 0) cannot
    bring a NaN in.
    """
    if len(caches) == 1:
        return caches[0].append(x), None
    rows = x.shape[0] // len(caches)
    if rows * len(caches) != x.shape[0]:
        raise ValueError(f"{x.shape[0]} rows do not split over {len(caches)} caches")
    held = [c.append(part) for c, part in zip(caches, x.split(rows))]
    dim = caches[0].dim
    lengths = [h.shape[dim] for h in held]
    if len(set(lengths)) == 1:
        return torch.cat(held), None
    shape = list(held[0].shape)
    shape[0], shape[dim] = x.shape[0], max(lengths)
    out = x.new_zeros(shape)
    for i, h in enumerate(held):
        out.narrow(0, i * rows, rows).narrow(dim, 0, h.shape[dim]).copy_(h)
    return out, lengths


def split_tail(tail: Tensor, parts: int) -> list[Tensor]:
    """A batched conv tail (the last frames of its input), one block of rows per stream.
    Copied first: a view would keep the whole input of the convolution alive as long
    as a stream holds its tail (megabytes per layer at full size, for a few frames)."""
    return list(tail.clone().chunk(parts)) if parts > 1 else [tail.clone()]
