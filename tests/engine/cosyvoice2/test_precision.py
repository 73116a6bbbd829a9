"""bf16 against fp32 on the CPU: the LM's tokens, the flow's mel and the audio.

The engine runs fp32 on the CPU and bf16 on a GPU; these tests run the tiny fixture both
ways on the CPU to bound what bf16 alone does. The tolerances and the figures measured
on the fixture are in README.md ("Precision (LM, flow, vocoder)"). Random weights make
the LM's top-1 margins small (near-uniform speech logits), so the agreement here is a
lower bound on a trained model's, not an estimate of it. The audio is the fp32 vocoder's
(the engine never runs HiFT in bf16: ``weights.load_models`` keeps it fp32, and its sine
source does not run in bf16 at all), from the bf16 and the fp32 flow's mel.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from voxwire.engine.cosyvoice2.flow import CausalFlow
from voxwire.engine.cosyvoice2.hift import HiFTGenerator
from voxwire.engine.cosyvoice2.lm import SpeechLM
from voxwire.engine.cosyvoice2.model_config import CosyVoice2Config, load_config
from voxwire.engine.cosyvoice2.qwen2 import KVCache
from voxwire.engine.cosyvoice2.sampling import RasSampler
from voxwire.engine.cosyvoice2.weights import load_flow, load_hift, load_lm

SEEDS = (0, 1, 2)
N_DECODE = 80  # speech tokens per fixed decode
# Tolerances: the measured figures (README.md) with a margin.
# Seeds 0-9 measured: top-1 0.975-1.000, max |dlogp| 0.088-0.101, mel 38.2-39.2 dB,
# audio 97.7-99.0 dB (the tiny vocoder hardly hears its mel, see test_audio_snr_...).
MIN_TOP1_AGREEMENT = 0.90
MAX_SPEECH_LOGP_ERR = 0.2
MIN_MEL_SNR_DB = 33.0
MIN_AUDIO_SNR_DB = 85.0


@dataclasses.dataclass
class Models:
    cfg: CosyVoice2Config
    lm: dict[torch.dtype, SpeechLM]
    flow: dict[torch.dtype, CausalFlow]
    hift: HiFTGenerator  # fp32 whatever the engine's dtype (weights.load_models)


@pytest.fixture(scope="module")
def models(tiny_dir: Path) -> Models:
    cfg = load_config(tiny_dir)
    dtypes = (torch.float32, torch.bfloat16)
    return Models(
        cfg,
        {d: load_lm(tiny_dir / "llm.pt", cfg).to(d).eval() for d in dtypes},
        {d: load_flow(tiny_dir / "flow.pt", cfg).to(d).eval() for d in dtypes},
        load_hift(tiny_dir / "hift.pt", cfg).eval(),
    )


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.double(), x.double()
    return 10.0 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum()).item()


def _prompt(seed: int, cfg: CosyVoice2Config) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    text_ids = torch.randint(0, 300, (20,), generator=g)
    prompt_speech = torch.randint(0, cfg.lm.speech_token_size, (30,), generator=g)
    return text_ids, prompt_speech


@torch.inference_mode()
def fixed_decode(m: Models, seed: int) -> list[int]:
    """The fp32 LM's own sampled decode (RAS sampler), N_DECODE tokens: all three stop
    ids masked so that every decode has the same length."""
    lm = m.lm[torch.float32]
    text_ids, prompt_speech = _prompt(seed, m.cfg)
    sampler = RasSampler(m.cfg.lm.sampling, torch.Generator().manual_seed(seed))
    embeds = lm.prompt_embeds(text_ids, prompt_speech)
    cache = KVCache(lm.cfg.qwen, embeds.shape[1] + N_DECODE, "cpu", torch.float32)
    size = m.cfg.lm.speech_token_size
    tokens: list[int] = []
    for _ in range(N_DECODE):
        logp = lm.logprobs(embeds, cache)
        logp[size:] = -float("inf")
        tokens.append(sampler.sample(logp, tokens))
        embeds = lm.token_embed(tokens[-1])
    return tokens


@torch.inference_mode()
def teacher_forced_logp(lm: SpeechLM, text_ids: torch.Tensor, prompt_speech: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """(len(tokens), V) log-probabilities of each token's position, the previous tokens fed."""
    embeds = lm.prompt_embeds(text_ids, prompt_speech)
    param = lm.llm_decoder.weight
    cache = KVCache(lm.cfg.qwen, embeds.shape[1] + len(tokens), param.device, param.dtype)
    rows = []
    for t in tokens:
        rows.append(lm.logprobs(embeds, cache))
        embeds = lm.token_embed(t)
    return torch.stack(rows)


def lm_agreement(m: Models, seed: int) -> tuple[float, float, int]:
    """(top-1 agreement over speech ids, max |dlogp| over speech ids, decode length)."""
    tokens = fixed_decode(m, seed)
    text_ids, prompt_speech = _prompt(seed, m.cfg)
    size = m.cfg.lm.speech_token_size
    # Speech ids only: the tiny model's EOS bias (30) would make every position agree.
    a, b = (teacher_forced_logp(m.lm[d], text_ids, prompt_speech, tokens)[:, :size] for d in (torch.float32, torch.bfloat16))
    agree = (a.argmax(-1) == b.argmax(-1)).double().mean().item()
    return agree, (a - b).abs().max().item(), len(tokens)


@torch.inference_mode()
def flow_and_audio(m: Models, seed: int) -> tuple[float, float]:
    """(mel SNR, audio SNR) in dB of bf16 against fp32: the same tokens through the flow
    (streaming mode, final), then the fp32 vocoder with the same noise seed."""
    tokens = torch.tensor([fixed_decode(m, seed)])
    g = torch.Generator().manual_seed(50 + seed)
    prompt = torch.randint(0, m.cfg.flow.vocab_size, (1, 25), generator=g)
    prompt_feat = torch.randn(1, 50, 80, generator=g)
    embedding = torch.randn(1, 192, generator=g)
    mels = {
        d: m.flow[d].inference(tokens, prompt, prompt_feat, embedding, streaming=True, finalize=True).float()
        for d in (torch.float32, torch.bfloat16)
    }
    audio = {d: m.hift.inference(mel, generator=torch.Generator().manual_seed(seed))[0] for d, mel in mels.items()}
    return snr_db(mels[torch.float32], mels[torch.bfloat16]), snr_db(audio[torch.float32], audio[torch.bfloat16])


@pytest.mark.parametrize("seed", SEEDS)
def test_lm_bf16_tokens_agree_with_fp32(models: Models, seed: int) -> None:
    """Teacher-forced over a fixed 80-token decode: bf16's top-1 speech token equals fp32's
    at >= 90% of positions, and no speech log-probability moves by more than 0.2."""
    agree, err, n = lm_agreement(models, seed)
    assert n == N_DECODE
    assert agree >= MIN_TOP1_AGREEMENT and err <= MAX_SPEECH_LOGP_ERR, f"top-1 {agree:.3f}, max |dlogp| {err:.3f}"
    # Not vacuous: the bf16 model really computes in bf16 (it differs from fp32).
    assert err > 1e-4


@pytest.mark.parametrize("seed", SEEDS)
def test_flow_mel_and_audio_bf16_snr(models: Models, seed: int) -> None:
    """The same tokens: bf16 flow mel >= 33 dB SNR against fp32; the fp32 vocoder's audio
    from the two mels >= 85 dB (the tiny vocoder's audio is mostly its sine source)."""
    mel_snr, audio_snr = flow_and_audio(models, seed)
    assert mel_snr >= MIN_MEL_SNR_DB and audio_snr >= MIN_AUDIO_SNR_DB, f"mel {mel_snr:.1f} dB, audio {audio_snr:.1f} dB"
    assert mel_snr < 100  # not vacuous: bf16 really ran


def test_snr_bounds_tell_a_wrong_mel_apart(models: Models) -> None:
    """Negative control for both bounds: the mel of other tokens (the decode rotated by one
    position) is far below the mel bound (measured 7.7 dB), and the audio the fp32 vocoder
    makes of it far below the audio bound (measured 68 dB): the random vocoder attenuates
    mel differences by ~60 dB, but does not ignore them."""
    tokens = fixed_decode(models, 0)
    shifted = tokens[-1:] + tokens[:-1]
    g = torch.Generator().manual_seed(50)
    prompt = torch.randint(0, models.cfg.flow.vocab_size, (1, 25), generator=g)
    prompt_feat = torch.randn(1, 50, 80, generator=g)
    embedding = torch.randn(1, 192, generator=g)
    flow = models.flow[torch.float32]
    with torch.inference_mode():
        a, b = (flow.inference(torch.tensor([t]), prompt, prompt_feat, embedding, streaming=True, finalize=True) for t in (tokens, shifted))
        wa, wb = (models.hift.inference(x, generator=torch.Generator().manual_seed(0))[0] for x in (a, b))
    mel_snr, audio_snr = snr_db(a, b), snr_db(wa, wb)
    assert mel_snr < MIN_MEL_SNR_DB - 10 and audio_snr < MIN_AUDIO_SNR_DB - 10, f"mel {mel_snr:.1f} dB, audio {audio_snr:.1f} dB"
