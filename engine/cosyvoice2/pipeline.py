"""The streaming loop's rules: LM tokens -> flow chunks -> vocoder -> audio pieces.

Schedule (:class:`Schedule`). By default it is the pinned official CosyVoice2Model's
(FunAudioLLM/CosyVoice ace7c47, cosyvoice/cli/model.py): the whole flow prompt is
kept; the first chunk is rendered once the LM has emitted token_hop + pad + 3 tokens,
pad = ceil(P/25)*25 - P for a flow prompt of P tokens (so that the chunk ends on a
25-token boundary of [prompt, generated]) and 3 the flow's pre-lookahead; each later
chunk once hop + 3 more exist, the hop doubling per chunk from 25 up to 100. The
flow's attention is chunk-causal with 25-token chunks, so the mel is the reference's.

``fast_start`` is the project's own, faster start: it trims the start of the flow
prompt (never the LM's) so that the first chunk boundary falls ``first_chunk_tokens``
into the generated speech, and renders every 25-token chunk as soon as it is final.
The first audio then needs ``first_chunk_tokens + 3`` LM steps instead of 28-52; the
trade-off is up to 24 prompt tokens (~1 s) less speaker conditioning, so the mel is
no longer the official one.

The loop itself is ``batch.py``'s: it steps many utterances together, one LM token per
stream per step, on the schedule, speed stretch (:class:`MelStretch`) and counters
(:class:`Stats`) defined here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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


# The pinned CosyVoice2Model: the hop starts at the flow's chunk (25), is multiplied by
# stream_scale_factor (2) after each chunk, up to token_max_hop_len (4 x 25).
HOP_SCALE = 2
MAX_HOP_CHUNKS = 4


class Schedule:
    """When one text segment's flow renders a chunk, counted in generated tokens.

    The official schedule also keeps its grown hop on the model across utterances (an
    upstream quirk); here every segment starts again from one chunk."""

    def __init__(self, n_prompt: int, chunk: int, lookahead: int, fast_start: bool, first_chunk: int) -> None:
        self.fast_start, self.lookahead = fast_start, lookahead
        self.drop = prompt_trim(n_prompt, first_chunk, chunk) if fast_start else 0
        self.hop, self.max_hop = chunk, MAX_HOP_CHUNKS * chunk
        self.pad = -n_prompt % chunk  # ceil(P / chunk) * chunk - P
        self.offset = 0  # generated tokens whose chunk has been rendered

    def next_at(self) -> int | None:
        """Generated tokens at which the next chunk renders; None under ``fast_start``."""
        if self.fast_start:
            return None
        return self.offset + self.hop + (self.pad if self.offset == 0 else 0) + self.lookahead

    def due(self, n_generated: int) -> bool:
        """Whether the flow should render now that ``n_generated`` tokens exist. Under
        ``fast_start`` every ready chunk renders at once (``FlowStream.ready`` decides)."""
        at = self.next_at()
        if at is None:
            return True
        if n_generated < at:
            return False
        self.offset = at - self.lookahead
        self.hop = min(self.max_hop, self.hop * HOP_SCALE)
        return True


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
