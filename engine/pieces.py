"""How a segment's frames are cut into the pieces an engine decodes, step by step, and
how a step's streams are cut into batches: shared by the engines that stream below the
sentence (Piper's VITS, Kokoro)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def piece_spans(n_frames: int, first_piece_frames: int, piece_frames: int) -> list[tuple[int, int]]:
    """[start, end) frame spans: first_piece_frames, then doubling up to piece_frames.
    A tail shorter than half the longest piece is merged into the span before it."""
    spans: list[tuple[int, int]] = []
    start, size = 0, max(1, min(first_piece_frames, piece_frames))
    while start < n_frames:
        end = min(n_frames, start + size)
        if n_frames - end < size // 2:
            end = n_frames
        spans.append((start, end))
        start, size = end, min(piece_frames, 2 * size)
    return spans


def batch_parts(items: list[T]) -> list[list[T]]:
    """``items`` cut into runs whose sizes are powers of two (7 -> 4, 2, 1): batch sizes,
    like widths, then come in a few shapes, so oneDNN's kernel cache stays bounded."""
    parts, start = [], 0
    while start < len(items):
        size = 1 << ((len(items) - start).bit_length() - 1)
        parts.append(items[start : start + size])
        start += size
    return parts
