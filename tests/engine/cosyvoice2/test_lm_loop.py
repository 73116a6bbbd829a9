"""The engine's LM decode loop against the pinned official ``Qwen2LM.inference``.

Ours is the loop the engine runs: ``batch.Batcher`` (the steps ``CosyVoice2Engine.step``
runs), one stream stepped alone, its tokens read from the stream. Both run the same tiny
random weights (``llm.pt`` of the fixture, loaded strictly into the pinned ``Qwen2LM``
and into ``SpeechLM``) with the pinned ``ras_sampling`` settings of the yaml. The
official samplers draw from torch's global RNG, ours from the stream's own
``torch.Generator``; a generator seeded with ``s`` yields the same numbers as the global
RNG after ``torch.manual_seed(s)``, and nothing else in the official loop draws (eval
mode, no dropout). Ours also renders the flow and vocoder as it goes, and the vocoder
draws its noise from the stream's generator once a chunk is due; here it draws from a
generator of its own instead, so that the LM's draws alone are compared. So one seed
gives one stream of random numbers to both, consumed in the same
order only if both loops make the same calls: one nucleus draw per step, plus a redraw
from the full distribution when RAS fires. The token lists therefore agree exactly only
when everything the loop decides agrees: the prompt layout ([sos] prompt text + text
[task] prompt speech), the min/max lengths (from the target text's length only), EOS
masked below the minimum and nothing else, the three stop ids (eos, task, fill) ending
the utterance without being emitted, and the RAS history. The logits of the two
backbones differ only by rounding (``test_parity.py`` bounds it at 1e-4), too little to
move a draw on these seeds. The negative controls break one of those decisions and see the tokens change.

One seam is not the pinned code's: its ``Qwen2Encoder.forward_one_step`` passes a
(1, new tokens) all-ones attention mask, shorter than the cache. Under the transformers
it pins (4.51.3) an all-ones 2D mask is "no padding" (``_ignore_causal_mask_sdpa`` drops
it; the eager path only masks the columns it covers), so each step attends to the whole
cache. transformers 5 right-pads a short mask with zeros (``prepare_padding_mask``), so
each decode step would attend to position 0 and nothing else (log-probabilities off by
~3 from the second token on). ``_PinnedMaskReading`` gives the HF model the 4.51.3
reading: an all-ones mask is dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from voxwire.engine.base import Step
from voxwire.engine.cosyvoice2 import batch as batch_module
from voxwire.engine.cosyvoice2.batch import Batcher
from voxwire.engine.cosyvoice2.frontend import Prompt
from voxwire.engine.cosyvoice2.lm import SpeechLM, token_bounds
from voxwire.engine.cosyvoice2.model_config import SamplingConfig, load_config
from voxwire.engine.cosyvoice2.pipeline import Stats
from voxwire.engine.cosyvoice2.weights import Models, load_models

from . import pinned

SEEDS = range(6)
N_PROMPT_TEXT, N_TEXT, N_PROMPT_SPEECH = 7, 6, 15


class _PinnedMaskReading(torch.nn.Module):
    """The HF ``Qwen2ForCausalLM`` as transformers 4.51.3 reads the pinned loop's masks.

    ``.model`` stays the HF ``Qwen2Model`` (the official code embeds text with
    ``llm.model.model.embed_tokens``)."""

    def __init__(self, hf: torch.nn.Module) -> None:
        super().__init__()
        self.hf = hf
        self.model = hf.model

    def forward(self, *, attention_mask: torch.Tensor | None = None, **kwargs):
        if attention_mask is not None and bool((attention_mask == 1).all()):
            attention_mask = None  # no padding: causal attention over the whole cache
        return self.hf(attention_mask=attention_mask, **kwargs)


@dataclasses.dataclass
class Pair:
    official: torch.nn.Module  # the pinned Qwen2LM
    models: Models  # ours: the LM, with the flow and vocoder the batcher also runs
    speech_token_size: int

    @property
    def ours(self) -> SpeechLM:
        return self.models.lm


@pytest.fixture(scope="module")
def pair(tiny_dir: Path, reference) -> Pair:
    """The pinned ``Qwen2LM`` and our ``SpeechLM``, both loaded from the fixture's ``llm.pt``."""
    llm = pinned.load("llm.py")
    common = pinned.load("common.py")
    cfg = load_config(tiny_dir)
    s = cfg.lm.sampling
    # The backbone: the pinned Qwen2Encoder around the HF model the oracle builds from
    # the fixture's config.json (from_pretrained would need a checkpoint directory).
    hf = reference.build(tiny_dir, "llm").llm.model
    encoder = llm.Qwen2Encoder.__new__(llm.Qwen2Encoder)
    torch.nn.Module.__init__(encoder)
    encoder.model = hf
    hidden = cfg.lm.qwen.hidden_size
    sampling = functools.partial(common.ras_sampling, top_p=s.top_p, top_k=s.top_k, win_size=s.win_size, tau_r=s.tau_r)
    official = llm.Qwen2LM(hidden, hidden, cfg.lm.speech_token_size, encoder, sampling)
    state = torch.load(tiny_dir / "llm.pt", map_location="cpu", weights_only=True)
    official.load_state_dict(state, strict=True)
    encoder.model = _PinnedMaskReading(hf)  # after loading: the wrapper renames the keys
    return Pair(official.eval(), load_models(tiny_dir), cfg.lm.speech_token_size)


def _inputs(seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    prompt_text = torch.randint(0, 300, (1, N_PROMPT_TEXT), generator=g)
    text = torch.randint(0, 300, (1, N_TEXT), generator=g)
    prompt_speech = torch.randint(0, size, (1, N_PROMPT_SPEECH), generator=g)
    return prompt_text, text, prompt_speech


def _official(p: Pair, seed: int, max_ratio: float = 20.0) -> list[int]:
    prompt_text, text, prompt_speech = _inputs(seed, p.speech_token_size)
    torch.manual_seed(seed)
    out = p.official.inference(
        text=text,
        text_len=torch.tensor([N_TEXT], dtype=torch.int32),
        prompt_text=prompt_text,
        prompt_text_len=torch.tensor([N_PROMPT_TEXT], dtype=torch.int32),
        prompt_speech_token=prompt_speech,
        prompt_speech_token_len=torch.tensor([N_PROMPT_SPEECH], dtype=torch.int32),
        embedding=torch.zeros(1, 192),
        max_token_text_ratio=max_ratio,
    )
    return [int(t) for t in out]


def _ours(
    p: Pair, seed: int, max_ratio: float = 20.0, sampling: SamplingConfig | None = None, transcript: bool = True,
    **bounds: int,
) -> list[int]:
    """The speech tokens of one stream through the batcher; ``transcript=False`` leaves
    the prompt's transcript out of the prefill; ``bounds``: min_tokens, max_tokens."""
    prompt_text, text, prompt_speech = _inputs(seed, p.speech_token_size)
    cfg = p.models.cfg
    lm = dataclasses.replace(cfg.lm, max_token_text_ratio=max_ratio, sampling=sampling or cfg.lm.sampling)
    models = dataclasses.replace(p.models, cfg=dataclasses.replace(cfg, lm=lm))
    ratio = cfg.token_mel_ratio
    prompt = Prompt(
        text_ids=prompt_text[0].numpy() if transcript else np.zeros(0, dtype=np.int64),
        speech_tokens=prompt_speech[0].numpy(),
        mel=np.zeros((ratio * N_PROMPT_SPEECH, cfg.flow.output_size), dtype=np.float32),
        embedding=np.zeros(192, dtype=np.float32),
    )
    batcher = Batcher(models, Stats(), first_chunk_tokens=10)
    make_vocoder = batch_module.make_vocoder
    with pytest.MonkeyPatch.context() as patch:  # the vocoder's noise from a generator of its own
        patch.setattr(batch_module, "make_vocoder", lambda hift, generator, seams: make_vocoder(
            hift, torch.Generator().manual_seed(seed), seams))
        stream = batcher.open(prompt, [text[0].tolist()], 1.0, seed=seed, **bounds)
        done = False
        while not done:
            (result,) = batcher.step([stream])
            assert isinstance(result, Step), result
            done = result.done
        stream.close()
    return stream.tokens


def _set_eos_bias(p: Pair, bias: float) -> types.SimpleNamespace:
    """Set the EOS logit bias of both heads; returns the previous values to restore."""
    eos = p.speech_token_size
    before = types.SimpleNamespace(official=p.official.llm_decoder.bias[eos].item(), ours=p.ours.llm_decoder.bias[eos].item())
    with torch.no_grad():
        p.official.llm_decoder.bias[eos] = bias
        p.ours.llm_decoder.bias[eos] = bias
    return before


@pytest.fixture
def eos_bias(pair: Pair):
    """Yields a setter for the EOS bias of both models; the fixture's bias is restored."""
    saved: list[types.SimpleNamespace] = []

    def set_bias(bias: float) -> None:
        saved.append(_set_eos_bias(pair, bias))

    yield set_bias
    if saved:
        with torch.no_grad():
            pair.official.llm_decoder.bias[pair.speech_token_size] = saved[0].official
            pair.ours.llm_decoder.bias[pair.speech_token_size] = saved[0].ours


def test_stops_at_min_length_as_official(pair: Pair) -> None:
    """The fixture's EOS bias (30): EOS comes out as soon as it is allowed, so both stop at
    min_len = 2 x 6 target-text tokens (the prompt text does not count)."""
    lo, hi = token_bounds(pair.ours.cfg, N_TEXT)
    assert (lo, hi) == (12, 120)
    wrong_min = 0
    for seed in SEEDS:
        ref = _official(pair, seed)
        assert _ours(pair, seed) == ref, seed
        assert len(ref) == lo, (seed, len(ref))
        # Negative control: a minimum one token short stops one token early.
        wrong_min += _ours(pair, seed, min_tokens=lo - 1) != ref
    assert wrong_min == len(SEEDS)


def test_sampled_stop_as_official(pair: Pair, eos_bias) -> None:
    """A moderate EOS bias: where each utterance stops is itself a draw, between the bounds."""
    eos_bias(3.0)
    lo, hi = token_bounds(pair.ours.cfg, N_TEXT)
    lengths = []
    layout_differs = 0
    for seed in SEEDS:
        ref = _official(pair, seed)
        assert _ours(pair, seed) == ref, seed
        lengths.append(len(ref))
        # Negative control: the prompt transcript left out of the prefill.
        layout_differs += _ours(pair, seed, transcript=False) != ref
    assert all(lo <= n < hi for n in lengths), lengths
    assert len(set(lengths)) > 1 and max(lengths) > lo, lengths  # the stop really is sampled
    assert layout_differs == len(SEEDS)


def test_max_length_and_ras_as_official(pair: Pair, eos_bias) -> None:
    """EOS suppressed and a short maximum (3 tokens per text token): the loop ends at
    max_len unless the task or fill id is drawn; long runs make RAS redraw."""
    eos_bias(-30.0)
    _, hi = token_bounds(dataclasses.replace(pair.ours.cfg, max_token_text_ratio=3.0), N_TEXT)
    no_ras = dataclasses.replace(pair.ours.cfg.sampling, tau_r=float(hi + 1))  # never repeats "enough"
    at_max = 0
    ras_matters = 0
    for seed in SEEDS:
        ref = _official(pair, seed, max_ratio=3.0)
        assert _ours(pair, seed, max_ratio=3.0) == ref, seed
        at_max += len(ref) == hi
        # Negative control: the same loop without RAS.
        ras_matters += _ours(pair, seed, max_ratio=3.0, sampling=no_ras) != ref
    assert at_max > 0
    assert ras_matters > 0
