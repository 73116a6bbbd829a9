"""Batched flow chunks (issue 12): several streams' chunks in one encoder call and one
estimator call per Euler step equal each stream's own ``advance()``.

Measures (stated, and asserted), on the tiny random-weight model:
* mel: three streams whose caches differ in length (prompts of 37, 67 and 90 tokens:
  25, 50 and 75 tokens encoded before their first chunk) advance a 25-token chunk and
  then a 50-token chunk together; every chunk equals the same stream advanced alone,
  max abs error < 1e-4, the tolerance of the official-parity tests (measured 1-2e-6
  on mels of magnitude ~4.5: float32 rounding of the padded products);
* the caches a batched call leaves are each stream's own: a last chunk computed alone
  afterwards still equals the stream that never shared a batch;
* all or nothing: a batched call that fails half-way (in its fourth estimator call)
  leaves every stream as it was, and the same batch run again is exact;
* negative controls: the batch given the first stream's positions for every row
  misses by far; with full attention, where the chunk mask does not hide a shorter
  row's padding, dropping the key-length mask misses too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from voxwire.engine.cosyvoice2 import encoder as encoder_module
from voxwire.engine.cosyvoice2 import estimator as estimator_module
from voxwire.engine.cosyvoice2.flow import FlowStream, advance_batch
from voxwire.engine.cosyvoice2.weights import load_models

PROMPTS = (37, 67, 90)  # different lengths, so their caches differ
TOL = 1e-4


@pytest.fixture(scope="module")
def models(tiny_dir: Path):
    return load_models(tiny_dir)


def _open(models, n_prompt: int, seed: int) -> tuple[FlowStream, list[int]]:
    """A stream with its prompt's chunks done, and the tokens it will be given."""
    g = torch.Generator().manual_seed(seed)
    vocab = models.cfg.flow.vocab_size
    prompt = torch.randint(0, vocab, (n_prompt,), generator=g)
    mel = -6 + 2 * torch.sin(torch.arange(2 * n_prompt).float()[:, None] / 7 + torch.arange(80)[None] / (9 + seed))
    stream = FlowStream(models.flow, prompt, mel, torch.randn(192, generator=g), max_tokens=n_prompt + 200)
    stream.advance()
    return stream, torch.randint(0, vocab, (200,), generator=g).tolist()


def _fill(stream: FlowStream, tokens: list[int], n: int) -> None:
    """Push tokens until a chunk of ``n`` tokens is ready."""
    while stream.pending()[0] < n:
        stream.push([tokens[len(stream.tokens) - stream.n_prompt]])


def _pairs(models) -> tuple[list[FlowStream], list[FlowStream], list[list[int]]]:
    """The same three streams twice: one set to batch, one to run alone."""
    batched, alone, tokens = [], [], []
    for seed, n in enumerate(PROMPTS):
        (b, t), (a, _) = _open(models, n, seed), _open(models, n, seed)
        batched.append(b)
        alone.append(a)
        tokens.append(t)
    return batched, alone, tokens


def _err(x: torch.Tensor, y: torch.Tensor) -> float:
    assert x.shape == y.shape
    return (x - y).abs().max().item()


def _state(f: FlowStream):
    """What a stream's caches hold: lengths of every cache, and its conv tails."""
    enc = [(k.length, v.length) for k, v in f.enc.kv + f.enc.up_kv]
    steps = [sorted((slot, k.length, v.length) for slot, (k, v) in st.kv.items()) for st in f.steps]
    tails = [{slot: id(t) for slot, t in st.tails.items()} for st in f.steps]
    return f.done, f.enc.done, enc, steps, tails, id(f.enc.lookahead_tail), id(f.enc.up_tail)


@torch.inference_mode()
def test_batched_chunks_equal_each_stream_alone(models) -> None:
    batched, alone, tokens = _pairs(models)
    assert len({f.done for f in batched}) == len(PROMPTS), "the caches differ in length"
    for n in (25, 50):
        for b, a, t in zip(batched, alone, tokens):
            _fill(b, t, n)
            _fill(a, t, n)
        assert {f.pending() for f in batched} == {(n, 3)}
        out = advance_batch(batched)
        for b, a, mel in zip(batched, alone, out):
            assert b.done == a.done + n
            ref = a.advance()
            assert _err(mel, ref) < TOL, (n, _err(mel, ref))
            assert b.cache_bytes() == a.cache_bytes()
    # Then alone, from the caches the batched calls left: the rest of each utterance.
    for b, a, t in zip(batched, alone, tokens):
        for f in (a, b):
            f.push(t[len(f.tokens) - f.n_prompt : 100])
        assert _err(b.advance(final=True), a.advance(final=True)) < TOL


@torch.inference_mode()
def test_a_failed_batch_changes_no_stream(models, monkeypatch) -> None:
    batched, alone, tokens = _pairs(models)
    for b, a, t in zip(batched, alone, tokens):
        _fill(b, t, 25)
        _fill(a, t, 25)
    before = [_state(f) for f in batched]
    estimator = models.flow.decoder.estimator
    real, calls = estimator.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # the encoder and three Euler steps have extended the caches
            raise RuntimeError("out of memory (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(estimator, "forward", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        advance_batch(batched)
    monkeypatch.undo()
    assert [_state(f) for f in batched] == before
    for b, a, mel in zip(batched, alone, advance_batch(batched)):
        assert _err(mel, a.advance()) < TOL


@torch.inference_mode()
def test_streams_of_different_chunks_are_not_batched(models) -> None:
    batched, _, tokens = _pairs(models)
    _fill(batched[0], tokens[0], 25)
    _fill(batched[1], tokens[1], 50)
    with pytest.raises(ValueError, match="same pending chunk"):
        advance_batch(batched[:2])


@torch.inference_mode()
def test_each_row_needs_its_own_positions(models, monkeypatch) -> None:
    """Negative control: the first stream's positions for every row miss by far."""
    batched, alone, tokens = _pairs(models)
    for b, a, t in zip(batched, alone, tokens):
        _fill(b, t, 25)
        _fill(a, t, 25)
    real = encoder_module.attention_mask

    def first_rows_positions(starts, n_q, n_k, chunk, lengths):
        return real(starts[:1].expand_as(starts), n_q, n_k, chunk, lengths)

    monkeypatch.setattr(encoder_module, "attention_mask", first_rows_positions)
    monkeypatch.setattr(estimator_module, "attention_mask", first_rows_positions)
    errors = [_err(mel, a.advance()) for mel, a in zip(advance_batch(batched), alone)]
    assert errors[0] < TOL  # its own positions: still exact
    assert min(errors[1:]) > 100 * TOL, errors


@torch.inference_mode()
def test_full_attention_batch_masks_the_padding(models, monkeypatch) -> None:
    """The encoder with full attention (no chunk mask to hide the padding): rows of
    different cache lengths equal each alone, and only because of the key-length mask."""
    enc = models.flow.encoder
    d = models.cfg.flow.input_size
    g = torch.Generator().manual_seed(7)
    history = [torch.randn(1, n, d, generator=g) for n in (25, 50)]
    xs, ahead = torch.randn(2, 25, d, generator=g), torch.randn(2, 3, d, generator=g)

    def states():
        out = []
        for h in history:
            st = enc.new_state(1, torch.device("cpu"), torch.float32)
            enc.forward_chunk(h[:, :-3], h[:, -3:], st, streaming=False)
            out.append(st)
        return out

    with torch.inference_mode():
        solo = [enc.forward_chunk(xs[i : i + 1], ahead[i : i + 1], st, streaming=False) for i, st in enumerate(states())]
        together = enc.forward_chunks(xs, ahead, states(), streaming=False)
        assert max(_err(together[i : i + 1], solo[i]) for i in range(2)) < TOL

        real = encoder_module.attention_mask
        monkeypatch.setattr(encoder_module, "attention_mask", lambda s, q, k, c, lengths: real(s, q, k, c, None))
        unmasked = enc.forward_chunks(xs, ahead, states(), streaming=False)
    assert _err(unmasked[:1], solo[0]) > 100 * TOL  # the shorter row saw its padding
    assert _err(unmasked[1:], solo[1]) < TOL  # the longest row has none
