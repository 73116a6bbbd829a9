"""The speech-token LM: Qwen2 plus CosyVoice2's embeddings and speech-token head.

Input layout (the reference's "unistream" zero-shot prompt)::

    [sos] [prompt text + text tokens] [task] [prompt speech tokens] -> speech tokens...

``llm_embedding`` holds the sos (row 0) and task (row 1) vectors, ``speech_embedding``
embeds speech tokens (6561 + 3 stop/fill ids), ``llm_decoder`` maps hidden states to
speech-token logits. Attribute names match the reference so ``llm.pt`` loads strictly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from .model_config import LMConfig
from .qwen2 import KVCache, Qwen2ForCausalLM, SlotBatch
from .sampling import RasSampler, eos_id, forbid_stop, is_stop

SOS, TASK_ID = 0, 1


class _Backbone(nn.Module):
    """Holds the HF-layout model under ``.model`` (the reference's Qwen2Encoder)."""

    def __init__(self, model: Qwen2ForCausalLM) -> None:
        super().__init__()
        self.model = model


class SpeechLM(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, s = cfg.qwen.hidden_size, cfg.speech_token_size
        self.llm_embedding = nn.Embedding(2, d)
        self.llm = _Backbone(Qwen2ForCausalLM(cfg.qwen))
        self.llm_decoder = nn.Linear(d, s + 3)
        self.speech_embedding = nn.Embedding(s + 3, d)

    @property
    def stop_ids(self) -> range:
        # eos, and the two ids the reference also treats as stops (task/fill).
        s = self.cfg.speech_token_size
        return range(s, s + 3)

    def prompt_embeds(self, text_ids: Tensor, prompt_speech_ids: Tensor) -> Tensor:
        """(1, L, D) prefill input. ``text_ids`` = prompt transcript followed by the text."""
        emb = self.llm.model.model.embed_tokens
        parts = [
            self.llm_embedding.weight[SOS].view(1, 1, -1),
            emb(text_ids.view(1, -1)),
            self.llm_embedding.weight[TASK_ID].view(1, 1, -1),
        ]
        if prompt_speech_ids.numel():
            parts.append(self.speech_embedding(prompt_speech_ids.view(1, -1)))
        return torch.cat(parts, dim=1)

    def logprobs(self, embeds: Tensor, cache: KVCache) -> Tensor:
        """Advance the cache by ``embeds``; log-probabilities (V,) of the next speech token."""
        return self.batch_logprobs(embeds, cache)[0]

    def batch_logprobs(self, embeds: Tensor, cache: KVCache | SlotBatch) -> Tensor:
        """``embeds`` (B, T, D), one row per sequence of ``cache``: (B, V) log-probabilities
        of each sequence's next speech token."""
        hidden = self.llm.model(embeds, cache)
        return self.llm_decoder(hidden[:, -1]).float().log_softmax(dim=-1)

    def token_embed(self, token: int) -> Tensor:
        return self.speech_embedding.weight[token].view(1, 1, -1)


def token_bounds(cfg: LMConfig, n_text_tokens: int) -> tuple[int, int]:
    """Min/max speech tokens for a text, by the reference's ratios (of the target text only)."""
    return (
        int(n_text_tokens * cfg.min_token_text_ratio),
        int(n_text_tokens * cfg.max_token_text_ratio),
    )


@torch.inference_mode()
def generate_speech_tokens(
    lm: SpeechLM,
    text_ids: Tensor,
    prompt_speech_ids: Tensor,
    n_text_tokens: int,
    sampler: RasSampler,
    on_step: Callable[[], None] | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
) -> Iterator[int]:
    """Yield speech tokens one LM step at a time; the caller's loop *is* the decode loop.

    Closing the iterator stops decoding at once. ``min_tokens``/``max_tokens`` override
    the text-length bounds (used to force a fixed token count in benchmarks).
    """
    lo, hi = token_bounds(lm.cfg, n_text_tokens)
    lo = lo if min_tokens is None else min_tokens
    hi = hi if max_tokens is None else max_tokens
    embeds = lm.prompt_embeds(text_ids, prompt_speech_ids)
    param = lm.llm_decoder.weight
    cache = KVCache(lm.cfg.qwen, embeds.shape[1] + hi + 1, param.device, param.dtype)
    size = lm.cfg.speech_token_size
    history: list[int] = []
    for i in range(hi):
        logp = lm.logprobs(embeds, cache)
        if on_step is not None:
            on_step()
        if i < lo:  # too early to stop (the official rule: see sampling.py)
            forbid_stop(logp, eos_id(size))
        token = sampler.sample(logp, history)
        if is_stop(token, size):
            return
        history.append(token)
        yield token
        embeds = lm.token_embed(token)
