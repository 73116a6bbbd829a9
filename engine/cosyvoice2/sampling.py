"""Speech-token sampling as the pinned official commit does it (FunAudioLLM/CosyVoice
ace7c47; see tests/engine/cosyvoice2/README.md).

* RAS (VALL-E 2): draw from the top-p/top-k nucleus; if the token drawn already occurs
  in the last ``win_size`` tokens at least ``win_size * tau_r`` times, exclude that token
  and draw again from the whole remaining distribution (official ``ras_sampling`` since
  f2ddcbe "fix ras"; before it the redraw could return the same token).
* Minimum length: below it only EOS is forbidden (official ``sampling_ids``); the two
  other stop ids (task, fill) may still be drawn, and end the utterance when they are.

A decode loop, per sequence and step ``i`` (0-based count of tokens already decoded)::

    if i < min_len:
        forbid_stop(logp, eos_id)          # in place
    token = sampler.sample(logp, history)  # may write -inf into logp (the RAS redraw)
    if is_stop(token, speech_token_size):
        stop                               # the stop token is not emitted
"""

from __future__ import annotations

import torch
from torch import Tensor

from .model_config import SamplingConfig

N_STOP_IDS = 3  # eos, task id, fill: the official stop_token_ids of Qwen2LM


def eos_id(speech_token_size: int) -> int:
    return speech_token_size


def is_stop(token: int, speech_token_size: int) -> bool:
    """Any of the three ids after the speech tokens ends decoding (official stop_token_ids)."""
    return speech_token_size <= token < speech_token_size + N_STOP_IDS


def forbid_stop(logp: Tensor, eos: int, rows: Tensor | None = None) -> Tensor:
    """Below the minimum length: forbid EOS only, in place, as official ``sampling_ids``.

    ``logp``: (V,) or (B, V). ``rows``: for (B, V), a bool (B,) mask or index tensor of
    the sequences still under their minimum length (None: every row). Returns ``logp``.
    """
    if rows is None:
        logp[..., eos] = -float("inf")
    else:
        logp[rows, eos] = -float("inf")
    return logp


def nucleus_keep(probs: Tensor, top_p: float, top_k: int) -> tuple[Tensor, Tensor]:
    """The official nucleus: tokens in probability order while the mass *before* them is
    under ``top_p``, at most ``top_k`` of them. Returns (probs, ids)."""
    sorted_p, sorted_ids = probs.sort(descending=True, stable=True)
    # Exclusive cumsum, the running sum the official loop compares (cumsum - p is not
    # always equal to it in floating point).
    mass_before = torch.cat([sorted_p.new_zeros(1), torch.cumsum(sorted_p, dim=0)[:-1]])
    n = int(((mass_before < top_p).cumprod(0)).sum().clamp(1, top_k).item())
    return sorted_p[:n], sorted_ids[:n]


def repeats(token: int, history: list[int], cfg: SamplingConfig) -> bool:
    """RAS's trigger: ``token`` occurs often enough in the last ``win_size`` tokens."""
    return history[-cfg.win_size :].count(token) >= cfg.win_size * cfg.tau_r


class RasSampler:
    """Stateless apart from its random generator; the history is passed in."""

    def __init__(self, cfg: SamplingConfig, generator: torch.Generator | None = None) -> None:
        self.cfg = cfg
        self.generator = generator

    def sample(self, logp: Tensor, history: list[int]) -> int:
        """``logp``: (V,) log-probabilities, already masked as the caller wants (see
        forbid_stop). On a RAS redraw the repeated token's entry is set to -inf in place,
        as the official code does."""
        probs = logp.float().softmax(dim=0)
        kept_p, kept_ids = nucleus_keep(probs, self.cfg.top_p, self.cfg.top_k)
        token = int(kept_ids[torch.multinomial(kept_p, 1, replacement=True, generator=self.generator)].item())
        if repeats(token, history, self.cfg):
            logp[token] = -float("inf")
            token = int(torch.multinomial(logp.float().softmax(dim=0), 1, replacement=True, generator=self.generator).item())
        return token
