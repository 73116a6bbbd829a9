"""Every utterance counted once and logged once, whichever door it came through and
however it ended: the one place that turns an outcome into metrics and a log line.

Outcomes: ``done``; ``cancelled`` (by the client); ``disconnected`` (the client went
away); ``failed`` with the error's code (the engine, a timeout, a shutdown); ``refused``
with the refusal's code (at capacity, an unknown voice, bad input). A connection turned
away before it could speak is counted by the reason it was refused.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from typing import Any

from voxwire.server.metrics import Metrics

UTTERANCES = logging.getLogger("voxwire.utterance")
CONNECTIONS = logging.getLogger("voxwire.connection")


class Accounting:
    def __init__(self, metrics: Metrics, log_text: bool, digest_key: bytes | None = None) -> None:
        self.metrics = metrics
        self.log_text = log_text
        # The digest tells two utterances' texts apart in the logs; keyed, so that short
        # common phrases cannot be recovered by hashing a dictionary. A key of the
        # operator's makes digests comparable across processes and restarts.
        self._digest_key = digest_key or os.urandom(16)

    def utterance(
        self, door: str, outcome: str, code: str | None, ids: dict[str, str], voice: str, text: str,
        figures: dict[str, Any], speaker: str | None = None,
    ) -> None:
        """Count and log one utterance; ``speaker``: a multi-speaker voice's, where one was
        named (the log line has it then)."""
        m = self.metrics
        m.utterances.labels(door, outcome, code or "").inc()
        if outcome == "done":
            if isinstance(figures.get("ttfa_ms"), float):
                m.ttfa.labels(door).observe(figures["ttfa_ms"] / 1000)
            if figures.get("cached"):
                m.cache_hits.inc()
            elif isinstance(figures.get("rtf"), float):
                m.rtf.observe(figures["rtf"])
        fields: dict[str, Any] = {"door": door, **ids, "outcome": outcome}
        if code:
            fields["code"] = code
        fields["voice"] = voice
        if speaker is not None:
            fields["speaker"] = speaker
        fields.update(figures)
        fields["text_chars"] = len(text)
        # What an utterance cut short had sent and played: its words counted, and shown
        # as the text is, only with log_text.
        for heard in ("text_sent", "text_played"):
            words = fields.pop(heard, None)
            if words is not None:
                fields[heard.replace("text", "words")] = len(words.split())
                if self.log_text:
                    fields[heard] = words
        if self.log_text:
            fields["text"] = text
        else:
            fields["text_digest"] = hmac.new(self._digest_key, text.encode(), hashlib.sha256).hexdigest()[:12]
        level = logging.INFO if outcome != "failed" else logging.WARNING
        UTTERANCES.log(level, "utterance %s", outcome, extra=fields)

    def connection_refused(self, door: str, reason: str, close_code: int) -> None:
        self.metrics.connections_refused.labels(reason).inc()
        CONNECTIONS.info("connection refused: %s", reason, extra={"door": door, "reason": reason, "close_code": close_code})
