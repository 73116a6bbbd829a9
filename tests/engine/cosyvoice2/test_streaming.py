"""Streaming against our own one-shot pipeline, and the seams between chunks.

Measures (stated, and asserted):
* mel: streamed chunks (incremental encoder/decoder caches, trimmed prompt) equal the
  one-shot chunk-causal mel of the same sequence: max abs error < 1e-3;
* audio: SNR of the streamed audio against a one-shot vocoding of the same mel,
  > 60 dB (measured ~92 dB on the tiny model; the vocoder is not causal, so each
  seam re-renders 8 frames and cross-fades them);
* seams: the largest sample-to-sample jump within 10 ms of a seam is no larger than
  the largest jump elsewhere in the utterance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from voxwire.engine.cosyvoice2.flow import FlowStream
from voxwire.engine.cosyvoice2.hift import VocoderStream
from voxwire.engine.cosyvoice2.pipeline import MelStretch, prompt_trim
from voxwire.engine.cosyvoice2.weights import load_models


@pytest.fixture(scope="module")
def models(tiny_dir: Path):
    return load_models(tiny_dir)


def _inputs(models, n_prompt: int = 67, n_tokens: int = 140, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    vocab = models.cfg.flow.vocab_size
    prompt = torch.randint(0, vocab, (n_prompt,), generator=g)
    # A smooth prompt mel, roughly speech-like in level.
    mel = -6 + 2 * torch.sin(torch.arange(2 * n_prompt).float()[:, None] / 7 + torch.arange(80)[None] / 9)
    return prompt, mel, torch.randn(192, generator=g), torch.randint(0, vocab, (n_tokens,), generator=g)


@torch.inference_mode()
def _stream(models, prompt, mel, emb, tokens, first_chunk: int):
    drop = prompt_trim(len(prompt), first_chunk, 25)
    flow = FlowStream(models.flow, prompt[drop:], mel[2 * drop :], emb)
    voc = VocoderStream(models.hift, torch.Generator().manual_seed(1))
    flow.advance()
    mels, pieces, tokens_at_first_audio = [], [], None
    for i, t in enumerate(tokens.tolist()):
        flow.push([t])
        m = flow.advance()
        if m.shape[2]:
            mels.append(m)
            a = voc.push(m)
            if a.numel():
                pieces.append(a.numpy())
                tokens_at_first_audio = tokens_at_first_audio or i + 1
    m = flow.advance(final=True)
    mels.append(m)
    pieces.append(voc.push(m, final=True).numpy())
    return drop, torch.cat(mels, dim=2), pieces, tokens_at_first_audio


@torch.inference_mode()
def test_stream_matches_one_shot(models) -> None:
    prompt, mel, emb, tokens = _inputs(models)
    drop, streamed_mel, pieces, first = _stream(models, prompt, mel, emb, tokens, first_chunk=10)
    assert (len(prompt) - drop + 10) % 25 == 0
    assert first == 10 + 3, "first audio after first_chunk + lookahead LM tokens"
    one_shot_mel = models.flow.inference(tokens.view(1, -1), prompt[drop:].view(1, -1), mel[2 * drop :].view(1, -1, 80), emb.view(1, -1), streaming=True, finalize=True)
    assert streamed_mel.shape == one_shot_mel.shape == (1, 80, 2 * len(tokens))
    mel_err = (streamed_mel - one_shot_mel).abs().max().item()
    assert mel_err < 1e-3, mel_err

    streamed = np.concatenate(pieces)
    whole = VocoderStream(models.hift, torch.Generator().manual_seed(1)).push(one_shot_mel, final=True).numpy()
    assert streamed.shape == whole.shape == (len(tokens) * 2 * 480,)
    snr = 10 * np.log10(np.sum(whole**2) / np.sum((streamed - whole) ** 2))
    assert snr > 60, f"streamed vs one-shot audio SNR {snr:.1f} dB"


@torch.inference_mode()
def test_seams_have_no_clicks(models) -> None:
    prompt, mel, emb, tokens = _inputs(models, seed=3)
    _, _, pieces, _ = _stream(models, prompt, mel, emb, tokens, first_chunk=12)
    audio = np.concatenate(pieces)
    assert len(pieces) >= 5
    seams = np.cumsum([len(p) for p in pieces[:-1]])
    jump = np.abs(np.diff(audio))
    near = np.zeros_like(jump, dtype=bool)
    for s in seams:  # the seam and the 8-frame cross-fade after it
        near[max(0, s - 240) : s + 8 * 480 + 240] = True
    assert jump[near].max() <= jump[~near].max(), (jump[near].max(), jump[~near].max())

    # The check can fail: a 0.1 step (a click) at one seam is caught.
    clicked = audio.copy()
    clicked[seams[1] :] += 0.1
    jump_c = np.abs(np.diff(clicked))
    assert jump_c[near].max() > jump_c[~near].max()


def test_speed_stretch_streams_like_one_shot() -> None:
    """MelStretch in pieces equals stretching the whole mel at once (exact)."""
    mel = torch.randn(1, 80, 97)
    for speed in (0.75, 1.3):
        whole = MelStretch(speed)(mel, final=True)
        s = MelStretch(speed)
        parts = [s(mel[:, :, a:b]) for a, b in ((0, 20), (20, 21), (21, 60), (60, 97))]
        parts.append(s(mel[:, :, :0], final=True))
        assert torch.allclose(torch.cat(parts, dim=2), whole)
        assert abs(whole.shape[2] - 97 / speed) <= 1
