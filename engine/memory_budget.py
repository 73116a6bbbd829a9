"""The engine memory a worker's streams may hold at once.

Each engine stream says how many bytes it needs (``Stream.memory_bytes``); a stream is
admitted against the budget before its first step and gives its bytes back when it
closes. The scheduler lets a stream join a step only while it fits what is left
(engine/scheduler.py), and a stream that could never fit fails at once. Used on the
worker's thread alone.
"""

from __future__ import annotations

from voxwire.engine.audio_queue import Failed
from voxwire.engine.errors import ErrorCode

MIB = 1 << 20


class MemoryBudget:
    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        """Bytes; None: no bound."""
        self.used = 0
        """Bytes admitted now."""

    def left(self) -> int | None:
        return None if self.limit is None else self.limit - self.used

    def admit(self, size: int) -> None:
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size

    def refusal(self, size: int) -> Failed | None:
        """Why a stream of ``size`` bytes can never run here; None when it can."""
        if self.limit is None or size <= self.limit:
            return None
        return Failed(
            ErrorCode.OVER_MEMORY_BUDGET,
            f"this text needs {size / MIB:.0f} MiB of engine memory at once; "
            f"the budget is {self.limit / MIB:.0f} MiB: send it in shorter pieces",
        )
