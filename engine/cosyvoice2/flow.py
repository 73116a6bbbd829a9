"""Speech tokens -> mel: the encoder, then conditional flow matching (10 Euler steps, CFG).

The sequence is always [prompt tokens, generated tokens]; the prompt's mel is the
condition for its own frames and zeros after. :class:`FlowStream` runs this
incrementally, one or more 25-token chunks at a time, and is exact: a chunk's mel
is what the reference computes for it in streaming mode over the whole sequence.
:func:`advance_batch` computes the same chunk of several streams in one batch (each
with its own caches, noise and condition), equal to each one's own up to rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .encoder import EncoderState, UpsampleConformerEncoder
from .estimator import CausalConditionalDecoder, StepRows, StepState, cache_bytes_per_frame
from .model_config import CFMConfig, FlowConfig


def fixed_noise(cfg: CFMConfig, channels: int) -> Tensor:
    """The reference seeds torch with 0 and draws (1, 80, 15000) once; the same draw
    from a private generator, so the process-wide RNG is left alone."""
    g = torch.Generator(device="cpu").manual_seed(cfg.noise_seed)
    return torch.randn([1, channels, cfg.noise_frames], generator=g, device="cpu")


class CausalCFM(nn.Module):
    noise: torch.Tensor  # a buffer (register_buffer), which nn.Module's typing cannot see

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg.cfm
        self.estimator = CausalConditionalDecoder(cfg.estimator)
        self.register_buffer("noise", fixed_noise(cfg.cfm, cfg.output_size), persistent=False)

    def schedule(self, dtype: torch.dtype, device: torch.device) -> list[tuple[Tensor, Tensor]]:
        """(t, dt) per Euler step, accumulated exactly as the reference does."""
        n = self.cfg.n_timesteps
        span = torch.linspace(0, 1, n + 1, device=device, dtype=dtype)
        if self.cfg.t_scheduler == "cosine":
            span = 1 - torch.cos(span * 0.5 * torch.pi)
        t, dt, steps = span[0], span[1] - span[0], []
        for step in range(1, n + 1):
            steps.append((t, dt))
            t = t + dt
            if step < n:
                dt = span[step + 1] - t
        return steps

    def solve(
        self, mu: Tensor, spks: Tensor, cond: Tensor, start: int, states: list[StepState], streaming: bool = True
    ) -> Tensor:
        """Mel for frames [start, start + n) given mu/cond of those frames. (1, 80, n)."""
        return self.solve_batch(mu, spks, cond, [start], [states], streaming)

    def solve_batch(
        self,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        starts: Sequence[int],
        states: Sequence[Sequence[StepState]],
        streaming: bool = True,
    ) -> Tensor:
        """``solve`` for several streams at once: row b of mu/spks/cond is the stream whose
        new frames start at ``starts[b]`` and whose Euler-step states are ``states[b]``.
        Each row draws its own slice of the fixed noise, as it would alone. (B, 80, n)."""
        b, n = mu.shape[0], mu.shape[2]
        if len(starts) != b or len(states) != b:
            raise ValueError(f"{b} rows for {len(starts)} starts and {len(states)} streams' states")
        for start in starts:
            if start + n > self.noise.shape[2]:
                raise ValueError(f"utterance longer than the {self.noise.shape[2]} frames of fixed noise")
        x = torch.cat([self.noise[:, :, start : start + n] for start in starts]).to(mu.dtype)
        rate = self.cfg.inference_cfg_rate
        # Classifier-free guidance: each stream's (conditioned, unconditioned) pair of rows,
        # side by side, so that a stream's rows are one block of the batch (its caches' own).
        mu2 = torch.stack([mu, torch.zeros_like(mu)], dim=1).flatten(0, 1)
        spks2 = torch.stack([spks, torch.zeros_like(spks)], dim=1).flatten(0, 1)
        cond2 = torch.stack([cond, torch.zeros_like(cond)], dim=1).flatten(0, 1)
        first = torch.tensor(list(starts), device=mu.device)
        per_row = first if b == 1 else first.repeat_interleave(2)
        masks: dict[tuple, Tensor | None] = {}  # one chunk's: the same in every block and step
        for i, (t, dt) in enumerate(self.schedule(mu.dtype, mu.device)):
            rows = StepRows([per_stream[i] for per_stream in states], per_row, 2, masks)
            v = self.estimator(x.repeat_interleave(2, dim=0), mu2, t.expand(2 * b), spks2, cond2, rows, streaming)
            v = v.view(b, 2, *v.shape[1:])
            v_cond, v_free = v[:, 0], v[:, 1]
            x = x + dt * ((1.0 + rate) * v_cond - rate * v_free)
        return x


class CausalFlow(nn.Module):
    """Attribute names follow the reference's ``CausalMaskedDiffWithXvec``."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(cfg.encoder)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = CausalCFM(cfg)

    def speaker(self, embedding: Tensor) -> Tensor:
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

    def embed(self, tokens: Tensor) -> Tensor:
        return self.input_embedding(tokens.clamp(min=0).long())

    @torch.inference_mode()
    def inference(
        self,
        token: Tensor,
        prompt_token: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        streaming: bool,
        finalize: bool,
    ) -> Tensor:
        """One shot, the reference's ``flow.inference``: mel (1, 80, frames) of ``token``."""
        stream = FlowStream(self, prompt_token, prompt_feat, embedding, streaming=streaming)
        stream.push(token.view(-1).tolist())
        return stream.advance(final=finalize, all_at_once=True)


class FlowStream:
    """One utterance's flow state. ``push`` tokens, then ``advance`` for new mel frames."""

    def __init__(
        self,
        flow: CausalFlow,
        prompt_tokens: Tensor,
        prompt_mel: Tensor,
        embedding: Tensor,
        streaming: bool = True,
        max_tokens: int | None = None,
    ) -> None:
        """``max_tokens``: the most tokens (prompt and generated) this stream will hold;
        its caches then never grow past ``cache_bound(flow, max_tokens, ...)``."""
        p = flow.decoder.estimator.final_proj.weight
        self.flow, self.streaming = flow, streaming
        self.ratio = flow.cfg.token_mel_ratio
        self.lookahead = flow.cfg.pre_lookahead_len
        self.chunk = flow.cfg.encoder.static_chunk_size
        self.tokens: list[int] = [int(t) for t in prompt_tokens.view(-1).tolist()]
        self.n_prompt = len(self.tokens)
        self.prompt_mel = prompt_mel.to(p.device, p.dtype).view(1, -1, flow.cfg.output_size).transpose(1, 2)
        self.embedding = embedding.to(p.device, p.dtype).view(1, -1)
        self.spks = flow.speaker(self.embedding)
        self.enc = flow.encoder.new_state(1, p.device, p.dtype, limit_tokens=max_tokens)
        frames = None if max_tokens is None else max_tokens * self.ratio
        self.steps = [StepState(frames) for _ in range(flow.cfg.cfm.n_timesteps)]
        self.done = 0  # tokens whose frames are computed

    def push(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def ready(self, final: bool) -> int:
        """How far (in tokens) the mel can be made exact now: the last chunk boundary
        whose lookahead tokens exist, or everything once the LM has finished."""
        if final:
            return len(self.tokens)
        if not self.streaming:
            return self.done
        end = len(self.tokens) - self.lookahead
        return max(self.done, (end // self.chunk) * self.chunk if end > 0 else 0)

    def pending(self) -> tuple[int, int]:
        """(new tokens, lookahead tokens) of the next streaming ``advance()``. Streams of
        one model with the same pending chunk can advance together (``advance_batch``)."""
        upto = self.ready(False)
        return upto - self.done, min(self.lookahead, len(self.tokens) - upto)

    @torch.inference_mode()
    def advance(self, final: bool = False, all_at_once: bool = False) -> Tensor:
        """Compute what is ready; returns mel (1, 80, frames) of *generated* tokens only.

        ``all_at_once`` with ``final=False`` is the reference's non-final call: every
        token but the last ``lookahead`` ones, whatever the chunk boundaries.
        """
        upto = len(self.tokens) - self.lookahead if (all_at_once and not final) else self.ready(final)
        if upto <= self.done:
            return self.spks.new_zeros(1, self.flow.cfg.output_size, 0)
        xs, ahead = self._embedded(upto)
        h = self.flow.encoder.forward_chunk(xs, ahead, self.enc, self.streaming)
        mu = self.flow.encoder_proj(h).transpose(1, 2)
        start = self.done * self.ratio
        mel = self.flow.decoder.solve(mu, self.spks, self._cond(start, mu.shape[2]), start, self.steps, self.streaming)
        return self._emit(mel, upto)

    def _embedded(self, upto: int) -> tuple[Tensor, Tensor]:
        """Embeddings (1, n, D) of tokens [done, upto) and (1, <=L, D) of the lookahead after."""
        tokens = torch.tensor(self.tokens[self.done : upto + self.lookahead], device=self.spks.device)
        n = upto - self.done
        dtype = self.spks.dtype
        return self.flow.embed(tokens[:n]).unsqueeze(0).to(dtype), self.flow.embed(tokens[n:]).unsqueeze(0).to(dtype)

    def _cond(self, start: int, frames: int) -> Tensor:
        """The condition of frames [start, start + frames): the prompt's mel, then zeros."""
        cond = self.spks.new_zeros(1, self.flow.cfg.output_size, frames)
        n_cond = max(0, min(self.prompt_mel.shape[2], start + frames) - start)
        if n_cond:
            cond[:, :, :n_cond] = self.prompt_mel[:, :, start : start + n_cond]
        return cond

    def _emit(self, mel: Tensor, upto: int) -> Tensor:
        """Commit tokens up to ``upto`` as done; the generated part of their ``mel``."""
        first_generated = max(0, self.n_prompt * self.ratio - self.done * self.ratio)
        self.done = upto
        return mel[:, :, first_generated:].float()

    def mark(self) -> Callable[[], None]:
        """A function that puts this stream's caches back as they are now (``done`` only
        moves once a chunk has been computed, so it needs no undo)."""
        undo = [self.enc.mark()] + [st.mark() for st in self.steps]

        def restore() -> None:
            for u in undo:
                u()

        return restore

    @torch.inference_mode()
    def finish_full(self) -> Tensor:
        """The rest of the mel as the reference's last ``token2wav`` call makes it (it is
        called without ``stream``): the whole sequence again with full attention, of
        which the frames not yet returned. Frees this stream's caches first."""
        p = self.spks
        self.enc = self.flow.encoder.new_state(1, p.device, p.dtype)
        self.steps = [StepState() for _ in self.steps]
        prompt = torch.tensor(self.tokens[: self.n_prompt], device=p.device).view(1, -1)
        generated = torch.tensor(self.tokens[self.n_prompt :], device=p.device).view(1, -1)
        whole = self.flow.inference(generated, prompt, self.prompt_mel.transpose(1, 2), self.embedding, streaming=False, finalize=True)
        returned = max(0, self.done - self.n_prompt) * self.ratio
        self.done = len(self.tokens)
        return whole[:, :, returned:].float()

    def cache_bytes(self) -> int:
        return self.enc.nbytes() + sum(s.nbytes() for s in self.steps)


@torch.inference_mode()
def advance_batch(streams: Sequence[FlowStream]) -> list[Tensor]:
    """``advance()`` of several streams as one batch: one encoder call, one estimator call
    per Euler step. The streams share one model, stream, and have the same ``pending()``
    chunk (the caller groups them); their caches may differ in length (padded and
    masked). Each stream's mel is its own ``advance()``'s, up to rounding.

    All or nothing: if this raises, every stream is as it was, so the caller can run
    them one at a time and pin the failure on its stream."""
    if len(streams) == 1:
        return [streams[0].advance()]
    first = streams[0]
    key = first.pending()
    for s in streams:
        if s.flow is not first.flow or not s.streaming or s.pending() != key:
            raise ValueError("advance_batch needs streaming streams of one model with the same pending chunk")
    if key[0] <= 0:
        return [s.advance() for s in streams]  # nothing ready: empty mels
    flow = first.flow
    undo = [s.mark() for s in streams]
    try:
        uptos = [s.ready(False) for s in streams]
        embedded = [s._embedded(upto) for s, upto in zip(streams, uptos)]
        xs = torch.cat([e[0] for e in embedded])
        ahead = torch.cat([e[1] for e in embedded])
        h = flow.encoder.forward_chunks(xs, ahead, [s.enc for s in streams], streaming=True)
        mu = flow.encoder_proj(h).transpose(1, 2)
        starts = [s.done * s.ratio for s in streams]
        cond = torch.cat([s._cond(start, mu.shape[2]) for s, start in zip(streams, starts)])
        spks = torch.cat([s.spks for s in streams])
        mel = flow.decoder.solve_batch(mu, spks, cond, starts, [s.steps for s in streams], streaming=True)
    except BaseException:
        for u in undo:
            u()
        raise
    return [s._emit(m, upto) for s, m, upto in zip(streams, mel.split(1), uptos)]


def cache_bound(flow: CausalFlow, n_tokens: int, dtype: torch.dtype) -> int:
    """The most a :class:`FlowStream` of ``n_tokens`` (prompt and generated) holds in its
    caches, in bytes. The estimator's dominate: see ``cache_bytes_per_frame``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_frame = cache_bytes_per_frame(flow.cfg.estimator, flow.cfg.cfm.n_timesteps, itemsize)
    return n_tokens * (flow.encoder.cache_bytes_per_token(itemsize) + flow.cfg.token_mel_ratio * per_frame)


__all__ = ["CausalFlow", "FlowStream", "EncoderState", "advance_batch"]
