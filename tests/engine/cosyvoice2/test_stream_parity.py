"""The streamed token-to-wave path against the pinned official one, same random weights.

The reference side is the pinned ``CosyVoice2Model.tts`` itself (official/model.py,
blob-checked), in streaming mode, with its LLM thread replaced by one that hands over
fixed speech tokens: its own schedule (25 + pad + 3 tokens first, the hop then
doubling up to 100) calls its own ``token2wav`` (flow in streaming mode over the whole
sequence, hift cache of 8 mel frames, cached source, Hamming fade). Its flow and HiFT
are the oracle package's. Ours is the engine's own decode path, ``batch.Batcher`` (the
steps ``CosyVoice2Engine.step`` runs), with the default options, its sampler made to
hand over the same fixed tokens (drawing nothing) and its token bounds set to their
number. Both vocoders draw their noise in the same order from the same seed.

Tolerances: mel max abs < 1e-4 per chunk; audio SNR > 60 dB. Negative controls: the
project's own seams and the fast start both miss them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from voxwire.engine.base import Step
from voxwire.engine.cosyvoice2 import batch as batch_module
from voxwire.engine.cosyvoice2.batch import Batcher
from voxwire.engine.cosyvoice2.frontend import Prompt
from voxwire.engine.cosyvoice2.pipeline import MelStretch, Stats
from voxwire.engine.cosyvoice2.weights import load_models

from . import pinned

N_PROMPT, N_TOKENS, SEED = 37, 200, 11


def _inputs(vocab: int):
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, vocab, (1, N_PROMPT), generator=g)
    feat = -6 + 2 * torch.sin(torch.arange(2 * N_PROMPT).float()[:, None] / 7 + torch.arange(80)[None] / 9)
    return prompt, feat.unsqueeze(0), torch.randn(1, 192, generator=g), torch.randint(0, vocab, (N_TOKENS,), generator=g)


@pytest.fixture(scope="module")
def official(tiny_dir_512: Path, reference):
    """(mel per chunk, audio per chunk) from the pinned CosyVoice2Model streaming loop."""
    ref_flow = reference.build(tiny_dir_512, "flow")
    ref_hift = reference.build(tiny_dir_512, "hift")
    _voiced(ref_hift)
    prompt, feat, emb, tokens = _inputs(ref_flow.input_embedding.num_embeddings)

    class Fixed(pinned.load("model.py").CosyVoice2Model):
        def llm_job(self, text, prompt_text, llm_prompt_speech_token, llm_embedding, uuid):
            self.tts_speech_token_dict[uuid].extend(tokens.tolist())
            self.llm_end_dict[uuid] = True

    model = Fixed(None, ref_flow, ref_hift)
    mels = []
    flow_inference = ref_flow.inference

    def recording(*args, **kwargs):
        mel, cache = flow_inference(*args, **kwargs)
        mels.append(mel)
        return mel, cache

    ref_flow.inference = recording
    torch.manual_seed(SEED)
    with torch.inference_mode():
        pieces = [out["tts_speech"][0].numpy() for out in model.tts(
            flow_prompt_speech_token=prompt, prompt_speech_feat=feat, flow_embedding=emb, stream=True,
        )]  # fmt: skip
    # Each call's mel starts at the first generated token; token2wav keeps it from the
    # chunk's token_offset on, where the last call's ended: cut the same way.
    ends = [0] + [m.shape[2] for m in mels]
    mels = [m[:, :, a:] for m, a in zip(mels, ends)]
    return mels, pieces


def _voiced(hift) -> None:
    # Random weights give F0 ~ 0 Hz (unvoiced): shift it to ~150 Hz so the sines count.
    with torch.no_grad():
        hift.f0_predictor.classifier.bias.fill_(150.0)


def _ours(tiny_dir_512: Path, seams: str = "official", fast_start: bool = False):
    """(mel per chunk, audio pieces) from one stream stepped alone through the batcher."""
    models = load_models(tiny_dir_512)
    _voiced(models.hift)
    prompt, feat, emb, tokens = _inputs(models.cfg.flow.vocab_size)
    p = Prompt(
        text_ids=np.zeros(0, dtype=np.int64), speech_tokens=prompt[0].numpy(), mel=feat[0].numpy(), embedding=emb[0].numpy()
    )
    fixed = iter(tokens.tolist())
    mels: list[torch.Tensor] = []

    class Fixed:
        """The LM's sampler, handing over the fixed tokens: the vocoder alone draws from
        the stream's generator, as the reference's alone draws from torch's."""

        def __init__(self, cfg, generator) -> None:
            pass

        def sample(self, logp, history) -> int:
            return next(fixed)

    class Recording(MelStretch):
        """Sees each chunk's mel, as the flow gives it (speed 1: passed on unchanged)."""

        def __call__(self, mel: torch.Tensor, final: bool = False) -> torch.Tensor:
            mels.append(mel)
            return super().__call__(mel, final)

    batcher = Batcher(models, Stats(), first_chunk_tokens=10, fast_start=fast_start, seams=seams)
    pieces: list[np.ndarray] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch_module, "RasSampler", Fixed)
        patch.setattr(batch_module, "MelStretch", Recording)
        stream = batcher.open(p, [[1, 2, 3, 4, 5]], 1.0, seed=SEED, min_tokens=N_TOKENS, max_tokens=N_TOKENS)
        done = False
        while not done:
            (result,) = batcher.step([stream])
            assert isinstance(result, Step), result
            pieces += result.pieces
            done = result.done
        stream.close()
    assert stream.tokens == tokens.tolist()
    return mels, pieces


def _snr(ref: np.ndarray, ours: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - ours) ** 2)))


def test_streamed_audio_equals_the_official_streaming_loop(tiny_dir_512: Path, official) -> None:
    ref_mels, ref_pieces = official
    # The pinned schedule for P = 37 (pad 13): 38, 50, 100 tokens, then the rest (12).
    assert [m.shape[2] // 2 for m in ref_mels] == [38, 50, 100, 12]
    mels, pieces = _ours(tiny_dir_512)
    assert [m.shape[2] for m in mels] == [m.shape[2] for m in ref_mels]
    errs = [(a - b).abs().max().item() for a, b in zip(ref_mels, mels)]
    assert max(errs) < 1e-4, errs
    assert [len(p) for p in pieces] == [len(p) for p in ref_pieces]
    ref, ours = np.concatenate(ref_pieces), np.concatenate(pieces)
    assert np.abs(ref).max() > 0.01  # not silence
    snr = _snr(ref, ours)
    print(f"official schedule+seams: mel max abs per chunk {errs}, audio SNR {snr:.1f} dB")
    assert snr > 60, f"SNR {snr:.1f} dB"


def test_negative_controls_miss(tiny_dir_512: Path, official) -> None:
    ref_mels, ref_pieces = official
    ref = np.concatenate(ref_pieces)
    _, pieces = _ours(tiny_dir_512, seams="project")
    ours = np.concatenate(pieces)
    snr = _snr(ref, ours)
    mels, _ = _ours(tiny_dir_512, fast_start=True)
    err = (torch.cat(mels, dim=2) - torch.cat(ref_mels, dim=2)).abs().max().item()
    print(f"negative controls: project seams SNR {snr:.1f} dB; fast start mel max abs {err:.3f}")
    assert ours.shape == ref.shape and snr < 60
    assert [m.shape[2] for m in mels] != [m.shape[2] for m in ref_mels]
    assert err > 1e-2
