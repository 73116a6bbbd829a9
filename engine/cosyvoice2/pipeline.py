"""The streaming inference loop: LM tokens -> flow chunks -> vocoder -> audio pieces.

Chunking. The flow's attention is chunk-causal with 25-token chunks counted from
the start of [flow prompt, generated] and needs 3 lookahead tokens, so a chunk's
mel is final once the LM has emitted its 25 tokens + 3. We trim the start of the
flow prompt (never the LM's) so that the first chunk boundary falls
``first_chunk_tokens`` into the generated speech: the first audio needs only
``first_chunk_tokens + 3`` LM steps instead of 25-49 + 3, with no approximation.
After that, one chunk per 25 tokens, as the reference. The vocoder re-renders the
last 8 mel frames of each chunk with the next one and cross-fades them.

Each ``next()`` runs LM steps until a chunk is ready and returns its audio; closing
the generator stops the loop between two LM steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .flow import FlowStream
from .frontend import Prompt
from .hift import VocoderStream
from .lm import generate_speech_tokens
from .sampling import RasSampler
from .weights import Models


@dataclass
class Stats:
    """Counters a test (or /metrics) can read; cumulative over the engine's life."""

    lm_steps: int = 0
    flow_chunks: int = 0
    vocoder_chunks: int = 0
    frontend_runs: int = 0
    utterances_started: int = 0
    utterances_finished: int = 0
    utterances_closed: int = 0


def prompt_trim(n_prompt: int, first_chunk: int, chunk: int) -> int:
    """Flow-prompt tokens to drop so that (n_prompt - drop + first_chunk) % chunk == 0."""
    drop = (n_prompt + first_chunk) % chunk
    if drop <= n_prompt - chunk // 2 or drop == 0:
        return drop
    return 0  # too short a prompt to trim: keep it whole, the first chunk is then longer


class MelStretch:
    """Streaming linear time-stretch of mel frames for ``speed`` != 1 (output frame j
    samples input position j * speed), identical to stretching the whole mel at once."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.buf: Tensor | None = None
        self.base = 0  # absolute index of buf[..., 0]
        self.j = 0  # next output frame

    def __call__(self, mel: Tensor, final: bool = False) -> Tensor:
        if self.speed == 1.0:
            return mel
        self.buf = mel if self.buf is None else torch.cat([self.buf, mel], dim=2)
        end = self.base + self.buf.shape[2]
        last = end - 1 if final else end - 2  # need frame floor(p) + 1 unless at the end
        n = max(0, int(last / self.speed) - self.j + 1) if last >= 0 else 0
        pos = (torch.arange(self.j, self.j + n, device=mel.device, dtype=torch.float64) * self.speed).clamp(max=end - 1)
        lo = pos.floor().long()
        hi = torch.clamp(lo + 1, max=end - 1)
        w = (pos - lo).to(mel.dtype)
        out = self.buf[:, :, lo - self.base] * (1 - w) + self.buf[:, :, hi - self.base] * w
        self.j += n
        keep = min(int(self.j * self.speed), end - 1)
        self.buf, self.base = self.buf[:, :, keep - self.base :], keep
        return out


def synthesize_ids(
    models: Models,
    prompt: Prompt,
    text_ids: list[int],
    *,
    stats: Stats,
    first_chunk_tokens: int = 10,
    speed: float = 1.0,
    generator: torch.Generator | None = None,
    min_tokens: int | None = None,
    max_tokens: int | None = None,
) -> Iterator[np.ndarray]:
    """Stream one text segment (already tokenised) in the prompt's voice."""
    flow_model, device = models.flow, models.flow.input_embedding.weight.device
    chunk, ratio = models.cfg.flow.encoder.static_chunk_size, models.cfg.token_mel_ratio
    drop = prompt_trim(len(prompt.speech_tokens), first_chunk_tokens, chunk)
    flow = FlowStream(
        flow_model,
        torch.from_numpy(prompt.speech_tokens[drop:]),
        torch.from_numpy(prompt.mel[ratio * drop :]),
        torch.from_numpy(prompt.embedding),
    )
    vocoder = VocoderStream(models.hift, generator)
    stretch = MelStretch(speed)
    # The fixed noise covers so many frames: bound the speech length by it.
    room = models.flow.decoder.noise.shape[2] // ratio - len(prompt.speech_tokens) - 1
    text_max = int(len(text_ids) * models.cfg.lm.max_token_text_ratio)
    max_tokens = min(text_max if max_tokens is None else max_tokens, room)

    def count() -> None:
        stats.lm_steps += 1

    tokens = generate_speech_tokens(
        models.lm,
        torch.tensor(list(prompt.text_ids) + list(text_ids), device=device),
        torch.from_numpy(prompt.speech_tokens).to(device),
        len(text_ids),
        RasSampler(models.cfg.lm.sampling, generator),
        on_step=count,
        min_tokens=min_tokens,
        max_tokens=max_tokens,
    )
    flow.advance()  # the prompt's complete chunks, before the first LM step
    try:
        for token in tokens:
            flow.push([token])
            mel = flow.advance()
            if mel.shape[2]:
                stats.flow_chunks += 1
                audio = vocoder.push(stretch(mel))
                stats.vocoder_chunks += 1
                if audio.numel():
                    yield audio.cpu().numpy()
        audio = vocoder.push(stretch(flow.advance(final=True), final=True), final=True)
        stats.flow_chunks += 1
        stats.vocoder_chunks += 1
        if audio.numel():
            yield audio.cpu().numpy()
    finally:
        tokens.close()  # stop the LM loop now, whatever ended us
