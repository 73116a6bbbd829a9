"""Our modules against the reference implementation, same random weights, same inputs.

Every comparison is in fp32 on CPU. Tolerances are stated per test; they sit a few
orders of magnitude above what we measure (reported in the assertion messages),
and far below what any wiring mistake produces (those show up as O(1) errors).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from voxwire.engine.cosyvoice2.model_config import load_config
from voxwire.engine.cosyvoice2.flow import FlowStream
from voxwire.engine.cosyvoice2.qwen2 import KVCache
from voxwire.engine.cosyvoice2.tokenizer import load_tokenizer
from voxwire.engine.cosyvoice2.weights import load_flow, load_hift, load_lm


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@torch.inference_mode()
def test_lm_logits_match_reference(tiny_dir: Path, reference) -> None:
    """LM log-probabilities, prefill and 6 cached decode steps: max abs error < 1e-4."""
    cfg = load_config(tiny_dir)
    ref = reference.build(tiny_dir, "llm")
    ours = load_lm(tiny_dir / "llm.pt", cfg).eval()
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 300, (1, 12), generator=g)
    prompt_speech = torch.randint(0, cfg.lm.speech_token_size, (1, 20), generator=g)

    # Reference: the embedding layout of Qwen2LM.inference, then Qwen2Encoder steps.
    emb = ref.llm.model.model.embed_tokens
    lm_input = torch.cat(
        [
            ref.llm_embedding.weight[0].view(1, 1, -1),
            emb(text),
            ref.llm_embedding.weight[1].view(1, 1, -1),
            ref.speech_embedding(prompt_speech),
        ],
        dim=1,
    )
    ours_input = ours.prompt_embeds(text[0], prompt_speech[0])
    assert _max_err(lm_input, ours_input) == 0.0

    cache = KVCache(cfg.lm.qwen, 64, "cpu", torch.float32)
    ref_cache = None
    x_ref, x_ours = lm_input, ours_input
    tokens = [5, 17, 5, 200, 3, 99]
    for step in range(len(tokens) + 1):
        n = x_ref.shape[1]
        out = ref.llm.model(
            inputs_embeds=x_ref,
            attention_mask=torch.ones(1, (cache.length + n), dtype=torch.long),
            output_hidden_states=True,
            use_cache=True,
            past_key_values=ref_cache,
        )
        ref_cache = out.past_key_values
        ref_logp = ref.llm_decoder(out.hidden_states[-1][:, -1]).log_softmax(-1)[0]
        our_logp = ours.logprobs(x_ours, cache)
        err = _max_err(ref_logp, our_logp)
        assert err < 1e-4, f"step {step}: max |dlogp| = {err:.2e}"
        if step < len(tokens):
            x_ref = ref.speech_embedding.weight[tokens[step]].view(1, 1, -1)
            x_ours = ours.token_embed(tokens[step])


@pytest.mark.parametrize("streaming,finalize", [(False, True), (True, True), (True, False)])
@torch.inference_mode()
def test_flow_mel_matches_reference(tiny_dir_512: Path, reference, streaming: bool, finalize: bool) -> None:
    """Flow mel under the fixed noise (10 Euler steps, CFG 0.7): max abs error < 2e-3,
    relative RMS error < 1e-4, for each of the reference's three inference modes."""
    cfg = load_config(tiny_dir_512)
    ref = reference.build(tiny_dir_512, "flow")
    ours = load_flow(tiny_dir_512 / "flow.pt", cfg).eval()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.flow.vocab_size, (1, 37), generator=g)
    token = torch.randint(0, cfg.flow.vocab_size, (1, 61), generator=g)
    prompt_feat = torch.randn(1, 2 * 37, 80, generator=g)
    embedding = torch.randn(1, 192, generator=g)
    ref_mel, _ = ref.inference(
        token=token,
        token_len=torch.tensor([61]),
        prompt_token=prompt,
        prompt_token_len=torch.tensor([37]),
        prompt_feat=prompt_feat,
        prompt_feat_len=torch.tensor([74]),
        embedding=embedding,
        streaming=streaming,
        finalize=finalize,
    )
    our_mel = ours.inference(token, prompt, prompt_feat, embedding, streaming=streaming, finalize=finalize)
    assert our_mel.shape == ref_mel.shape
    err = _max_err(ref_mel, our_mel)
    rel = ((ref_mel - our_mel).pow(2).mean() / ref_mel.pow(2).mean()).sqrt().item()
    assert err < 2e-3 and rel < 1e-4, f"max {err:.2e}, rel rms {rel:.2e}"


@torch.inference_mode()
def test_flow_stream_is_exact_chunk_causal(tiny_dir_512: Path, reference) -> None:
    """Incremental FlowStream (cached encoder + decoder attention, chunk by chunk as
    tokens arrive) equals the reference's one-shot streaming-mode mel: max abs < 2e-3."""
    cfg = load_config(tiny_dir_512)
    ref = reference.build(tiny_dir_512, "flow")
    ours = load_flow(tiny_dir_512 / "flow.pt", cfg).eval()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, cfg.flow.vocab_size, (1, 40), generator=g)
    token = torch.randint(0, cfg.flow.vocab_size, (1, 83), generator=g)
    prompt_feat = torch.randn(1, 80, 80, generator=g)
    embedding = torch.randn(1, 192, generator=g)
    ref_mel, _ = ref.inference(
        token=token, token_len=torch.tensor([83]), prompt_token=prompt, prompt_token_len=torch.tensor([40]),
        prompt_feat=prompt_feat, prompt_feat_len=torch.tensor([80]), embedding=embedding,
        streaming=True, finalize=True,
    )  # fmt: skip
    stream = FlowStream(ours, prompt, prompt_feat, embedding)
    pieces = [stream.advance()]  # the prompt's complete chunks
    for t in token[0].tolist():
        stream.push([t])
        pieces.append(stream.advance())
    pieces.append(stream.advance(final=True))
    assert sum(p.shape[2] > 0 for p in pieces) >= 4  # really incremental
    our_mel = torch.cat(pieces, dim=2)
    err = _max_err(ref_mel, our_mel)
    assert err < 2e-3, f"max {err:.2e}"


@torch.inference_mode()
def test_hift_matches_reference(tiny_dir: Path, reference) -> None:
    """HiFT: decode(mel, source) max abs < 1e-4; F0 rel. error < 1e-5; the whole
    inference (F0 -> NSF source with the same RNG draws -> audio) max abs < 1e-3."""
    cfg = load_config(tiny_dir)
    ref = reference.build(tiny_dir, "hift")
    ours = load_hift(tiny_dir / "hift.pt", cfg).eval()
    g = torch.Generator().manual_seed(4)
    mel = torch.randn(1, 80, 30, generator=g) - 4
    source = torch.tanh(torch.randn(1, 1, 30 * 480, generator=g))
    err = _max_err(ref.decode(x=mel, s=source), ours.decode(mel, source))
    assert err < 1e-4, f"decode max {err:.2e}"
    f0_ref, f0_ours = ref.f0_predictor(mel), ours.f0_predictor(mel)
    assert (_max_err(f0_ref, f0_ours) / f0_ref.abs().max().item()) < 1e-5
    # Random weights give F0 ~ 0 Hz (unvoiced); shift both predictors' output to
    # ~100-200 Hz so the sine (voiced) branch is exercised too.
    with torch.no_grad():
        for m in (ref, ours):
            m.f0_predictor.classifier.bias.fill_(150.0)
    mel_voiced = mel
    torch.manual_seed(7)
    ref_audio, ref_source = ref.inference(speech_feat=mel_voiced)
    our_audio, our_source = ours.inference(mel_voiced, generator=torch.Generator().manual_seed(7))
    assert (ref.f0_predictor(mel_voiced) > 10).any()
    s_err = _max_err(ref_source, our_source)
    a_err = _max_err(ref_audio, our_audio)
    assert s_err < 1e-3 and a_err < 1e-3, f"source {s_err:.2e}, audio {a_err:.2e}"


def test_tokenizer_matches_transformers(tiny_dir: Path, reference) -> None:
    """Token ids equal Hugging Face's tokenizer + CosyVoice2's added specials (exact)."""
    from transformers import AutoTokenizer

    from voxwire.engine.cosyvoice2.tokenizer import COSYVOICE2_SPECIALS

    hf = AutoTokenizer.from_pretrained(str(tiny_dir / "CosyVoice-BlankEN"))
    hf.add_special_tokens(
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "additional_special_tokens": list(COSYVOICE2_SPECIALS)}
    )
    ours = load_tokenizer(tiny_dir / "CosyVoice-BlankEN")
    for text in [
        "Hello world, this is a test.",
        "It's 42 degrees   outside!\nNew line's here.",
        "[breath] She said <|endofprompt|> \"yes\" — 你好，世界。",
        "  leading spaces and trailing  ",
    ]:
        assert ours.encode(text) == hf([text])["input_ids"][0], text
