"""Speech-token sampling as the reference does it: nucleus + repetition-aware (RAS).

RAS (VALL-E 2): sample from the top-p/top-k nucleus; if the token drawn already
occurs in the last ``win_size`` tokens at least ``win_size * tau_r`` times, draw
again from the whole distribution instead. This breaks the loops a speech LM
otherwise falls into.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .model_config import SamplingConfig


def nucleus_keep(probs: Tensor, top_p: float, top_k: int) -> tuple[Tensor, Tensor]:
    """The reference's nucleus: tokens in probability order while the mass *before*
    them is under ``top_p``, at most ``top_k`` of them. Returns (probs, ids)."""
    sorted_p, sorted_ids = probs.sort(descending=True, stable=True)
    mass_before = torch.cumsum(sorted_p, dim=0) - sorted_p
    n = int(((mass_before < top_p).cumprod(0)).sum().clamp(1, top_k).item())
    return sorted_p[:n], sorted_ids[:n]


class RasSampler:
    """Stateless apart from its random generator; the history is passed in."""

    def __init__(self, cfg: SamplingConfig, generator: torch.Generator | None = None) -> None:
        self.cfg = cfg
        self.generator = generator

    def sample(self, logp: Tensor, history: list[int]) -> int:
        """``logp``: (V,) log-probabilities, already masked as the caller wants."""
        probs = logp.float().softmax(dim=0)
        kept_p, kept_ids = nucleus_keep(probs, self.cfg.top_p, self.cfg.top_k)
        token = int(kept_ids[torch.multinomial(kept_p, 1, generator=self.generator)].item())
        window = history[-self.cfg.win_size :]
        if window.count(token) >= self.cfg.win_size * self.cfg.tau_r:
            token = int(torch.multinomial(probs, 1, generator=self.generator).item())
        return token
