"""The speech-token LM: Qwen2 plus CosyVoice2's embeddings and speech-token head.

Input layout (the reference's "unistream" zero-shot prompt)::

    [sos] [prompt text + text tokens] [task] [prompt speech tokens] -> speech tokens...

``llm_embedding`` holds the sos (row 0) and task (row 1) vectors, ``speech_embedding``
embeds speech tokens (6561 + 3 stop/fill ids), ``llm_decoder`` maps hidden states to
speech-token logits. Attribute names match the reference so ``llm.pt`` loads strictly.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .model_config import LMConfig
from .qwen2 import KVCache, Qwen2ForCausalLM, SlotBatch

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
