"""Text handling that precedes every engine: normalisation, then segmentation."""

from voxwire.engine.text.normalize import expanded_length, normalize
from voxwire.engine.text.segment import Segmenter, segment

__all__ = ["Segmenter", "expanded_length", "normalize", "segment"]
