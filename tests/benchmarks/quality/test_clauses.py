"""benchmarks/quality/clauses.py: the tokens and segments it measures are the server's,
and its timing path (a real server, a connection configured with the policy, a reply
streamed token by token) times the first audio of each policy."""

from __future__ import annotations

import asyncio
import math

from voxwire.benchmarks import corpus
from voxwire.benchmarks.quality import clauses
from voxwire.engine.text import normalize


def test_llm_tokens_are_words_and_punctuation_that_join_to_the_text():
    text = "Sure, it's 7:45 a.m. - see you!"
    tokens = corpus.llm_tokens(text)
    assert "".join(tokens) == text
    assert tokens[:3] == ["Sure", ",", " it"]


def test_segments_are_the_streamed_texts_and_a_policy_only_moves_the_first_boundary():
    text = "Sure, the museum opens at nine, and tours start at ten. Want a ticket?"
    waiting, early = clauses.segments(text, 0), clauses.segments(text, 3)
    assert "".join(waiting) == "".join(early) == normalize(text)
    assert waiting[0] == "Sure, the museum opens at nine, and tours start at ten."
    assert early[:2] == ["Sure, the museum opens at nine,", " and tours start at ten."]
    assert clauses.started_early([text, "Hello there."], 3) == [0]


async def test_each_policy_times_the_first_audio_of_each_reply(tone_server):
    texts = ["Sure, the museum opens at nine, and tours start at ten.", "Hello there."]
    times = await clauses.time_policies(tone_server.ws, texts, (0, 3), pace_s=0.01)
    assert set(times) == {0, 3}
    assert all(len(t) == len(texts) and all(math.isfinite(v) and v > 0 for v in t) for t in times.values())
    # Each was cancelled once heard: the server lets go of them all.
    for _ in range(500):
        if tone_server.service.admission.utterances == 0:
            break
        await asyncio.sleep(0.01)
    assert tone_server.service.admission.utterances == 0
