"""Fixed texts, so that every run measures the same work: the latency corpus here, and
the quality corpus (``quality()``) in quality.txt."""

from __future__ import annotations

import re
from pathlib import Path

# Replies of the length a voice assistant speaks: one to three sentences.
REPLIES = [
    "Sure, I can help with that.",
    "Your package left the warehouse this morning and should arrive on Thursday.",
    "It is twenty one degrees and sunny right now. Expect light rain after six tonight.",
    "I've set a timer for ten minutes. I'll let you know when it goes off.",
    "The nearest pharmacy is two blocks north, on the corner of Elm and Fifth. It closes at nine.",
    "Here is the summary. Revenue grew eight percent, costs stayed flat, and the margin improved.",
]

# First sentences of growing length with no clause punctuation, so that a sentence-level
# engine must synthesise the whole sentence before its first audio.
_WORDS = (
    "the small brown dog ran quickly across the quiet green park toward the old wooden gate where "
    "a tall man in a grey coat stood waiting patiently for the evening bus that always came late "
    "on rainy days in the middle of the long cold winter"
).split()


def first_sentence(words: int) -> str:
    """A sentence of exactly ``words`` words, then a short second sentence."""
    text = " ".join(_WORDS[i % len(_WORDS)] for i in range(words))
    return text[0].upper() + text[1:] + ". Then it was quiet."


FIRST_SENTENCE_WORDS = (3, 10, 20, 40)

# The comparison's headline text: three sentences, so that a server that streams sentence
# by sentence and one that streams within a sentence both have something to gain.
THREE_SENTENCES = (
    "It is twenty one degrees and sunny right now. Expect light rain after six tonight. "
    "Take an umbrella if you go out later."
)

PRECISION_SENTENCES = [
    "Streaming synthesis lets a listener hear the first words while the rest of the sentence is still being computed.",
    "The quick brown fox jumps over the lazy dog.",
    "Hi there.",
    "Your flight to Denver leaves at seven forty-five tomorrow morning from gate twelve.",
    "I couldn't find a restaurant open after midnight, but the diner on Fifth Street closes at two.",
    "Would you like me to read the rest of the message?",
]
"""Where bf16 is held against fp32, sample by sample: tests/engine/piper/test_precision.py's
bounds and benchmarks/studies/precision_convs.py's decoder SNR."""

_LLM_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s]+)")


def llm_tokens(text: str) -> list[str]:
    """``text`` as an LLM streams it: a word with its leading space, or a run of
    punctuation, as a BPE tokenizer splits them (never a word's end and the next word's
    start in one piece). Joined, they are ``text``."""
    return _LLM_TOKEN.findall(text)


WARMUP = ["Warming up.", "This sentence warms up the voice before anything is measured."]
"""What every server, and the floor, speaks before it is measured."""


def quality() -> list[str]:
    """The quality corpus (benchmarks/quality): assistant replies, one per line of
    quality.txt, written for this project (README.md beside it)."""
    lines = (Path(__file__).parent / "quality.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]
