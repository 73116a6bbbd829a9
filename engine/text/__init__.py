"""Text handling that precedes every engine: normalisation, then segmentation."""

from engine.text.normalize import normalize
from engine.text.segment import Segmenter, segment

__all__ = ["Segmenter", "normalize", "segment"]
