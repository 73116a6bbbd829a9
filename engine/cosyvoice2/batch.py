"""Continuous batching: one engine step advances every stream of a batch by one LM token.

A step runs, in order:

1. one batched LM decode for every stream in the middle of a segment: each owns a slot
   of a :class:`SlotPool` (its own length, its own RoPE positions, attention masked to
   its own keys). This is the only call that may fail for the whole batch, and it
   commits nothing until it has succeeded;
2. for each newcomer (or a stream starting its next text segment): the flow's prompt
   chunks and the LM prefill into a fresh slot (one prefill per newcomer: the
   prompts differ in length, and on the CPU padding them costs more than it saves);
3. for each stream: sampling with its own ``torch.Generator`` (so a stream's tokens do
   not depend on who it shares a batch with);
4. the flow chunks of all streams that have one ready, batched where the chunks are
   the same size (``flow.advance_batch``: one encoder call and one estimator call per
   Euler step; each stream's caches, of its own length, padded and masked); a
   segment's last, full-attention pass (``FlowStream.finish_full``) runs alone;
5. the vocoder windows of all streams that have one, batched where their shapes are
   equal (the steady state: one chunk each), grouped otherwise.

A failure in steps 2-5 is pinned on its stream: its slot gets the exception and the
other streams carry on. A batched flow or vocoder call that fails changes no stream,
and its streams are run again one at a time, so only the faulty one fails. That is not
the worker's retry of a failed step (engine/base.py, ``Engine.step``), which only step 1
leaves to it: by steps 4-5 every stream has drawn and kept its token (its generator, KV
cache and flow input have moved), so the step can no longer raise for the whole batch
and leave every stream as it was. Closing a stream frees its slot at once; nothing of it
runs after that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..base import Step, Stream, WordTimings
from .flow import FlowStream, advance_batch, cache_bound
from .frontend import Prompt
from .hift import OfficialVocoderStream, SeamWindow, VocoderStream, Window, finish_window, make_vocoder, render
from .lm import token_bounds
from .pipeline import MAX_HOP_CHUNKS, MelStretch, Schedule, Stats
from .qwen2 import SlotPool, kv_bytes_per_token
from .sampling import RasSampler, eos_id, forbid_stop, is_stop
from .weights import Models


@dataclass(frozen=True)
class Plan:
    """What one text segment will need: its LM input, token bounds and memory."""

    text_ids: list[int]
    n_prefill: int  # LM positions of [sos, prompt text + text, task, prompt speech]
    lo: int
    hi: int
    drop: int  # flow-prompt tokens trimmed (only under fast_start: see pipeline.Schedule)
    fast_start: bool = False  # this stream's schedule: each request may choose its own


@dataclass
class FlowBatching:
    """How the flow chunks ran (tests and benchmarks read it): the batched calls by
    size, and the batched calls that failed and were run again one stream at a time."""

    sizes: Counter[int] = field(default_factory=Counter)
    fallbacks: int = 0


@dataclass
class Turn:
    """One stream's share of a step after sampling, before its flow chunk runs."""

    jobs: list[tuple[Tensor, bool]] = field(default_factory=list)  # mel for the vocoder: (mel, final)
    chunk: bool = False  # a flow chunk is due (run in the step's flow batch)
    end: bool = False  # the segment ends after that chunk (its final flow pass)


class Segment:
    """One text segment in flight: its LM sequence, flow, vocoder and speed stretch."""

    def __init__(
        self, models: Models, prompt: Prompt, plan: Plan, schedule: Schedule, speed: float, generator: torch.Generator, seams: str
    ) -> None:
        flow, ratio = models.flow, models.cfg.token_mel_ratio
        self.schedule = schedule
        device = flow.input_embedding.weight.device
        self.plan = plan
        n_flow = len(prompt.speech_tokens) - plan.drop + plan.hi
        self.flow = FlowStream(
            flow,
            torch.from_numpy(prompt.speech_tokens[plan.drop :]),
            torch.from_numpy(prompt.mel[ratio * plan.drop :]),
            torch.from_numpy(prompt.embedding),
            max_tokens=n_flow + flow.cfg.pre_lookahead_len,
        )
        self.vocoder = make_vocoder(models.hift, generator, seams)
        self.stretch = MelStretch(speed)
        self.sampler = RasSampler(models.cfg.lm.sampling, generator)
        self.prefill = models.lm.prompt_embeds(
            torch.tensor(list(prompt.text_ids) + plan.text_ids, device=device),
            torch.from_numpy(prompt.speech_tokens).to(device),
        )
        self.history: list[int] = []
        self.slot: int | None = None
        self.length = 0  # KV positions held
        self.next_embed: Tensor | None = None  # the last token's embedding, input of the next decode


class CosyStream(Stream):
    """One utterance: its text segments, spoken one after the other with one generator."""

    def __init__(self, batcher: Batcher, prompt: Prompt, plans: list[Plan], speed: float, seed: int) -> None:
        self.batcher, self.prompt, self.plans, self.speed = batcher, prompt, plans, speed
        self.seed = seed
        self.generator: torch.Generator | None = None
        self.next_plan = 0
        self.segment: Segment | None = None
        self.started = self.finished = self.closed = False
        self.tokens: list[int] = []  # every speech token drawn, all segments (for tests and stats)
        self.memory_bytes = max((batcher.plan_bytes(prompt, p) for p in plans), default=0)

    def cost(self) -> int:
        """The next step's work in tokens: LM positions (1 to decode, a whole prefill for a
        segment about to start) plus the flow tokens it will encode (the prompt's chunks
        for a segment about to start, a chunk when this token completes one)."""
        seg = self.segment
        if seg is not None and seg.slot is not None:
            flow = seg.flow
            at = seg.schedule.next_at()
            if at is not None and len(seg.history) + 1 < at:
                return 1  # the official schedule renders no chunk at this token
            end = len(flow.tokens) + 1 - flow.lookahead
            ready = (end // flow.chunk) * flow.chunk if end > 0 else 0
            return 1 + max(0, ready - flow.done)
        if self.next_plan < len(self.plans):
            plan = self.plans[self.next_plan]
            return plan.n_prefill + len(self.prompt.speech_tokens) - plan.drop
        return 1

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.batcher.release(self)
        if self.started and not self.finished:
            self.batcher.stats.utterances_closed += 1


class Batcher:
    """Steps a batch of :class:`CosyStream`; owns the KV slot pool."""

    def __init__(
        self, models: Models, stats: Stats, first_chunk_tokens: int, fast_start: bool = False, seams: str = "official"
    ) -> None:
        self.models, self.stats, self.first_chunk = models, stats, first_chunk_tokens
        self.fast_start, self.seams = fast_start, seams  # fast_start: only the default; each Plan has its own
        lm = models.lm
        param = lm.llm_decoder.weight
        self.pool = SlotPool(models.cfg.lm.qwen, param.device, param.dtype)
        self.kv_per_token = kv_bytes_per_token(models.cfg.lm.qwen, param.dtype)
        self.flow_dtype = models.flow.decoder.estimator.final_proj.weight.dtype
        self.device = models.flow.input_embedding.weight.device
        self.flow_batching = FlowBatching()

    # ------------------------------------------------------------------ planning

    def plan(
        self, prompt: Prompt, text_ids: list[int], min_tokens: int | None = None, max_tokens: int | None = None,
        fast_start: bool | None = None,
    ) -> Plan:
        """``fast_start``: this segment's schedule; None takes the batcher's default."""
        fast = self.fast_start if fast_start is None else fast_start
        cfg = self.models.cfg
        ratio = cfg.token_mel_ratio
        lo, hi = token_bounds(cfg.lm, len(text_ids))
        lo = lo if min_tokens is None else min_tokens
        hi = hi if max_tokens is None else max_tokens
        # The fixed noise covers so many frames: bound the speech length by it.
        room = self.models.flow.decoder.noise.shape[2] // ratio - len(prompt.speech_tokens) - 1
        n_prefill = 1 + len(prompt.text_ids) + len(text_ids) + 1 + len(prompt.speech_tokens)
        drop = self.schedule(prompt, fast).drop
        return Plan(list(text_ids), n_prefill, lo, min(hi, room), drop, fast)

    def schedule(self, prompt: Prompt, fast_start: bool) -> Schedule:
        cfg = self.models.cfg.flow
        return Schedule(len(prompt.speech_tokens), cfg.encoder.static_chunk_size, cfg.pre_lookahead_len, fast_start, self.first_chunk)

    def plan_bytes(self, prompt: Prompt, plan: Plan) -> int:
        """Device memory one segment holds at its largest: its KV slot at the most tokens
        it may emit, its flow caches at that length, and the vocoder's carried state."""
        kv = self.kv_per_token * (plan.n_prefill + plan.hi + 1)
        n_flow = len(prompt.speech_tokens) - plan.drop + plan.hi + self.models.cfg.flow.pre_lookahead_len
        flow = cache_bound(self.models.flow, n_flow, self.flow_dtype)
        # A window's new frames: the longest hop (official schedule) and its lookahead,
        # stretched by speed 0.5 at most.
        chunk = self.models.cfg.flow.encoder.static_chunk_size
        chunk_frames = 2 * self.models.cfg.token_mel_ratio * (MAX_HOP_CHUNKS * chunk + 3)
        vocoder = OfficialVocoderStream if self.seams == "official" else VocoderStream
        return kv + flow + vocoder.state_bound(self.models.hift, chunk_frames)

    def open(
        self, prompt: Prompt, pieces: list[list[int]], speed: float, seed: int, fast_start: bool | None = None, **bounds: int
    ) -> CosyStream:
        plans = [self.plan(prompt, ids, fast_start=fast_start, **bounds) for ids in pieces]
        return CosyStream(self, prompt, plans, speed, seed)

    def release(self, stream: CosyStream) -> None:
        seg = stream.segment
        if seg is not None and seg.slot is not None:
            self.pool.release(seg.slot)
            seg.slot = None
        stream.segment = None

    # ------------------------------------------------------------------ stepping

    @torch.inference_mode()
    def step(self, streams: Sequence[CosyStream]) -> list[Step | Exception]:
        results: list[Step | Exception | None] = [None] * len(streams)
        for i, s in enumerate(streams):
            if s.closed:
                results[i] = RuntimeError("stepped a closed CosyVoice2 stream")
        logps = self._decode([(i, s) for i, s in enumerate(streams) if results[i] is None and s.segment is not None and s.segment.slot is not None])
        pieces: list[list[np.ndarray | WordTimings]] = [[] for _ in streams]
        turns: dict[int, Turn] = {}
        for i, s in enumerate(streams):
            if results[i] is not None:
                continue
            try:
                turns[i] = self._advance(s, logps.get(i))
            except Exception as e:  # this stream's failure; the others carry on
                results[i] = e
        jobs = self._flow(streams, turns, results)
        for round_ in range(2):  # a segment's last step may vocode a chunk, then the final window
            todo = {i: job[round_] for i, job in jobs.items() if len(job) > round_ and results[i] is None}
            for i, audio in self._vocode(streams, todo, results).items():
                if audio.numel():
                    pieces[i].append(audio.cpu().numpy())
        for i, s in enumerate(streams):
            if results[i] is None:
                done = s.segment is None and s.next_plan >= len(s.plans)
                if done and not s.finished:
                    s.finished = True
                    self.stats.utterances_finished += 1
                results[i] = Step(pieces[i], done)
        return results  # type: ignore[return-value]

    def _decode(self, members: list[tuple[int, CosyStream]]) -> dict[int, Tensor]:
        """One batched LM step for every stream mid-segment: (V,) log-probabilities each.
        Raises for the whole batch, having changed no stream."""
        if not members:
            return {}
        segs = [s.segment for _, s in members]
        batch = self.pool.batch([g.slot for g in segs], [g.length for g in segs])  # type: ignore[union-attr, misc]
        logp = self.models.lm.batch_logprobs(torch.cat([g.next_embed for g in segs]), batch)  # type: ignore[union-attr, misc]
        for g in segs:
            g.length += 1  # type: ignore[union-attr]
        return {i: row for (i, _), row in zip(members, logp)}

    def _start(self, s: CosyStream) -> Segment:
        if s.generator is None:
            s.generator = torch.Generator(device=self.device).manual_seed(s.seed)
            s.started = True
            self.stats.utterances_started += 1
        plan = s.plans[s.next_plan]
        s.next_plan += 1
        seg = Segment(self.models, s.prompt, plan, self.schedule(s.prompt, plan.fast_start), s.speed, s.generator, self.seams)
        s.segment = seg
        seg.flow.advance()  # the prompt's complete chunks, before the first LM step
        return seg

    def _advance(self, s: CosyStream, logp: Tensor | None) -> Turn:
        """This stream's share of the step after the batched decode: prefill if it is new,
        sample. Returns the mel for the vocoder so far, and whether a flow chunk is due."""
        seg = s.segment
        if logp is None:  # a newcomer, or the start of its next text segment
            seg = self._start(s)
            if seg.plan.hi <= 0:
                return Turn(self._end_segment(s))
            seg.slot = self.pool.acquire(seg.plan.n_prefill + seg.plan.hi + 1)
            logp = self.models.lm.batch_logprobs(seg.prefill, self.pool.batch([seg.slot], [0]))[0]
            seg.length = seg.plan.n_prefill
        assert seg is not None
        self.stats.lm_steps += 1
        size = self.models.cfg.lm.speech_token_size
        if len(seg.history) < seg.plan.lo:  # too early to stop (the official rule: see sampling.py)
            forbid_stop(logp, eos_id(size))
        token = seg.sampler.sample(logp, seg.history)
        if is_stop(token, size):
            return Turn(self._end_segment(s))
        seg.history.append(token)
        s.tokens.append(token)
        seg.next_embed = self.models.lm.token_embed(token)
        seg.flow.push([token])
        end = len(seg.history) >= seg.plan.hi
        if seg.schedule.due(len(seg.history)):
            return Turn(chunk=True, end=end)
        return Turn(self._end_segment(s) if end else [])

    def _flow(
        self, streams: Sequence[CosyStream], turns: dict[int, Turn], results: list[Step | Exception | None]
    ) -> dict[int, list[tuple[Tensor, bool]]]:
        """Run the due flow chunks, batching those of the same size; then the final pass
        of the segments that end. Returns each stream's mel for the vocoder, in order."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, turn in turns.items():
            pending = streams[i].segment.flow.pending() if turn.chunk else (0, 0)  # type: ignore[union-attr]
            if pending[0] > 0:  # (under fast_start a due stream may have no whole chunk yet)
                groups.setdefault(pending, []).append(i)
        mels: dict[int, Tensor] = {}
        for members in groups.values():
            flows = [streams[i].segment.flow for i in members]  # type: ignore[union-attr]
            if len(members) > 1:
                try:
                    mels.update(zip(members, advance_batch(flows)))
                    self.flow_batching.sizes[len(members)] += 1
                    continue
                except Exception:  # it changed no stream: run them one by one to find the faulty one
                    self.flow_batching.fallbacks += 1
            for i, flow in zip(members, flows):
                try:
                    mels[i] = flow.advance()
                except Exception as e:
                    results[i] = e
        jobs: dict[int, list[tuple[Tensor, bool]]] = {}
        for i, turn in turns.items():
            if results[i] is not None:
                continue
            jobs[i] = turn.jobs
            seg = streams[i].segment
            mel = mels.get(i)
            try:
                if mel is not None and mel.shape[2]:
                    assert seg is not None
                    self.stats.flow_chunks += 1
                    jobs[i].append((seg.stretch(mel), False))
                if turn.end:
                    jobs[i] += self._end_segment(streams[i])
            except Exception as e:
                results[i] = e
        return jobs

    def _end_segment(self, s: CosyStream) -> list[tuple[Tensor, bool]]:
        """The LM is done with this segment: free its slot, flush the flow."""
        seg = s.segment
        assert seg is not None
        if seg.slot is not None:
            self.pool.release(seg.slot)
            seg.slot = None
        self.stats.flow_chunks += 1
        mel = seg.flow.advance(final=True) if seg.schedule.fast_start else seg.flow.finish_full()
        return [(seg.stretch(mel, final=True), True)]

    def _vocode(
        self, streams: Sequence[CosyStream], todo: dict[int, tuple[Tensor, bool]], results: list[Step | Exception | None]
    ) -> dict[int, Tensor]:
        """Vocode one window per stream, batching equal shapes; audio per stream."""
        windows: dict[int, Window | SeamWindow] = {}
        audio: dict[int, Tensor] = {}
        for i, (mel, final) in todo.items():
            seg = streams[i].segment
            assert seg is not None
            self.stats.vocoder_chunks += 1
            try:
                w = seg.vocoder.prepare(mel, final)
            except Exception as e:
                results[i] = e
                continue
            if w is None:
                audio[i] = torch.zeros(0)
            else:
                windows[i] = w
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, w in windows.items():
            groups.setdefault(w.shape_key(), []).append(i)
        for members in groups.values():
            try:
                rendered = render(self.models.hift, [windows[i] for i in members])
            except Exception:  # pin the failure on its stream: render them one by one
                rendered = []
                for i in members:
                    try:
                        rendered.append(render(self.models.hift, [windows[i]])[0])
                    except Exception as e:
                        results[i] = e
                        rendered.append(None)  # type: ignore[arg-type]
            for i, a in zip(members, rendered):
                if a is None:
                    continue
                seg = streams[i].segment
                assert seg is not None
                try:
                    audio[i] = finish_window(seg.vocoder, windows[i], a)
                except Exception as e:
                    results[i] = e
        for i, (_, final) in todo.items():
            if final and results[i] is None:
                self._next_segment(streams[i])
        return audio

    def _next_segment(self, s: CosyStream) -> None:
        s.segment = None  # the next step starts the next plan, if any
