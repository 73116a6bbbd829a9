"""LM sampling against the pinned official commit's own functions (exact draws).

The official functions draw from torch's global RNG; ours from a torch.Generator. Both
are seeded alike, so the same rule gives the same token; a different rule gives a
different token for some seed, which each negative control shows on the same inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import types

import pytest
import torch

from voxwire.engine.cosyvoice2.model_config import SamplingConfig
from voxwire.engine.cosyvoice2.sampling import RasSampler, eos_id, forbid_stop, is_stop, repeats

from . import pinned

CFG = SamplingConfig()
SEEDS = range(40)


@pytest.fixture(scope="module")
def official() -> types.ModuleType:
    return pinned.load("common.py")


@pytest.fixture(scope="module")
def official_lm(reference) -> types.ModuleType:
    return pinned.load("llm.py")  # imports the oracle's cosyvoice package (``reference`` checks it)


def _logp(seed: int, vocab: int = 300, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * scale).log_softmax(0)


def _ours(logp: torch.Tensor, history: list[int], seed: int, cfg: SamplingConfig = CFG) -> int:
    return RasSampler(cfg, torch.Generator().manual_seed(seed)).sample(logp.clone(), list(history))


def _official_ras(fn, logp: torch.Tensor, history: list[int], seed: int) -> int:
    torch.manual_seed(seed)
    return int(fn(logp.clone(), list(history), 25, top_p=CFG.top_p, top_k=CFG.top_k, win_size=CFG.win_size, tau_r=CFG.tau_r))


def test_official_files_are_the_pinned_blobs() -> None:
    for name, (upstream, blob) in pinned.BLOBS.items():
        assert pinned.git_blob_id((pinned.OFFICIAL / name).read_bytes()) == blob, upstream


def test_nucleus_draws_equal_official(official) -> None:
    """No repetition (empty history): the nucleus draw, over 40 seeds x 3 distributions."""
    wrong = dataclasses.replace(CFG, top_k=CFG.top_k - 15)
    mismatches_with_wrong_rule = 0
    for scale in (1.0, 3.0, 8.0):
        for seed in SEEDS:
            logp = _logp(seed, scale=scale)
            ref = _official_ras(official.ras_sampling, logp, [], seed)
            assert _ours(logp, [], seed) == ref, (scale, seed)
            mismatches_with_wrong_rule += _ours(logp, [], seed, wrong) != ref
    # Negative control: a nucleus of 10 instead of 25 is told apart on these inputs.
    assert mismatches_with_wrong_rule > 0


def test_ras_redraw_excludes_the_repeated_token(official, reference) -> None:
    """A repeated draw is redrawn from the rest of the distribution (official f2ddcbe)."""
    redraws = 0
    old_rule_differs = 0
    for seed in SEEDS:
        logp = _logp(seed, scale=1.5)
        top = logp.argsort(descending=True)[:4].tolist()
        history = top * 2 + [7, 8]  # the likeliest tokens just repeated: RAS fires often
        ref = _official_ras(official.ras_sampling, logp, history, seed)
        ours = _ours(logp, history, seed)
        assert ours == ref, seed
        # Which branch ran: the nucleus draw with this seed, and whether it repeats.
        first = _ours(logp, [], seed)
        if repeats(first, history, CFG):
            redraws += 1
            assert ours != first  # the repeated token is excluded from the redraw
        # The oracle package predates the fix: its RAS may redraw the repeated token.
        old_rule_differs += _official_ras(reference.common.ras_sampling, logp, history, seed) != ref
    assert redraws >= 10, redraws
    # Negative control: the pre-fix rule (a redraw from the full distribution) differs.
    assert old_rule_differs > 0


def test_min_length_forbids_eos_only(official, official_lm) -> None:
    """Below the minimum length the official ``sampling_ids`` masks EOS and nothing
    else: the task and fill ids may be drawn (and stop decoding)."""
    size = 50  # speech tokens; ids 50, 51, 52 are eos, task, fill
    lm = types.SimpleNamespace(
        speech_token_size=size,
        sampling=functools.partial(official.ras_sampling, top_p=CFG.top_p, top_k=CFG.top_k, win_size=CFG.win_size, tau_r=CFG.tau_r),
    )
    eos = eos_id(size)
    drew_other_stop = 0
    all_masked_differs = 0
    for seed in SEEDS:
        scores = torch.randn(size + 3, generator=torch.Generator().manual_seed(seed))
        scores[size : size + 3] += 3.0  # the stop ids are likely
        logp = scores.log_softmax(0)
        for ignore_eos in (True, False):
            torch.manual_seed(seed)
            ref = int(official_lm.Qwen2LM.sampling_ids(lm, logp.clone(), [], 25, ignore_eos=ignore_eos))
            masked = forbid_stop(logp.clone(), eos) if ignore_eos else logp.clone()
            ours = RasSampler(CFG, torch.Generator().manual_seed(seed)).sample(masked, [])
            assert ours == ref, (seed, ignore_eos)
            if ignore_eos:
                assert ours != eos
                drew_other_stop += is_stop(ours, size)
                # Negative control: the project's earlier rule masked all three stop ids.
                all3 = logp.clone()
                all3[size : size + 3] = -float("inf")
                all_masked_differs += RasSampler(CFG, torch.Generator().manual_seed(seed)).sample(all3, []) != ref
    assert drew_other_stop > 0 and all_masked_differs > 0


def test_forbid_stop_on_a_batch() -> None:
    logp = torch.zeros(3, 10)
    forbid_stop(logp, 7, rows=torch.tensor([True, False, True]))
    assert torch.isinf(logp[[0, 2], 7]).all() and logp[1, 7] == 0 and torch.isfinite(logp[:, :7]).all()
    forbid_stop(logp, 7)
    assert torch.isinf(logp[:, 7]).all()


def test_stop_ids_are_the_official_ones(official, official_lm) -> None:
    lm = official_lm.Qwen2LM(8, 8, 50, torch.nn.Identity(), official.ras_sampling)
    assert [t for t in range(60) if is_stop(t, 50)] == lm.stop_token_ids
    assert eos_id(50) == lm.eos_token
