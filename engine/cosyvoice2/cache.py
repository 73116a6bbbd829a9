"""Growable per-utterance caches for the flow's chunk-causal attention."""

from __future__ import annotations

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
