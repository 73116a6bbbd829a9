"""``CosyVoice2Engine``: zero-shot voice cloning, streamed, on the engine worker thread."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..base import Engine, EngineError, Registered, Step, Stream, SynthesisParams, Voice
from ..errors import ErrorCode
from ..precision import Precision, resolve
from ..precision import dtype as precision_dtype
from ..threads import configure_cpu_threads
from .batch import Batcher, CosyStream
from .frontend import Frontend, Prompt
from .model_config import ConfigError
from .pipeline import Stats
from .text import normalize_text, split_ids
from .tokenizer import load_tokenizer
from .voices import StoredVoice, VoiceStore, content_id
from .weights import DOWNLOAD_HINT, CheckpointError, load_models, missing_files

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 2000
MAX_SEGMENT_TOKENS = 80  # the reference splits longer text before the LM
_PUNCTUATION = ".,!?;:。，！？；：、"


def resolve_precision(setting: str, device: str) -> Precision:
    """CosyVoice2's precision: its bf16 paths (the LM, the flow estimator, HiFT) are CUDA's.
    ``auto`` takes bf16 on a GPU that computes it natively and fp16 on an older one (whose
    tensor cores have fp16 only); the CPU runs fp32, the only precision tested on it."""
    try:
        precision = resolve(setting, device)
    except ValueError as e:
        raise EngineError(ErrorCode.BAD_CONFIG, str(e)) from None
    if torch.device(device).type != "cuda":
        if setting == "bf16":
            raise EngineError(ErrorCode.BAD_CONFIG, "CosyVoice2 computes in fp32 on the CPU; bf16 needs a CUDA device")
        return "fp32"
    return "fp16" if setting == "auto" and precision == "fp32" else precision


# Batch limits. A step's cost is in tokens (CosyStream.cost): 1 per decoding stream, +25
# when its flow chunk is due, and a prefill plus the prompt's flow chunks (a few hundred)
# per newcomer. On the CPU the flow dominates and is not batched, so the budget lets
# about one newcomer start per step, and those already speaking keep their pace; on
# CUDA a few dozen newcomers may start together.
CUDA_MAX_BATCH, CPU_MAX_BATCH = 64, 16
CUDA_STEP_BUDGET, CPU_STEP_BUDGET = 8192, 256
MEMORY_HEADROOM = 0.8  # of the device memory free after loading: activations need the rest


def batch_limits(device: torch.device, max_batch: int | None, memory_budget: int | None) -> tuple[int, int, int | None]:
    """(max_batch, step_budget, memory_budget). On CUDA the memory budget is a share of
    what is free once the weights are loaded; on the CPU there is none (None): host
    memory is not what bounds CPU throughput, the cores are."""
    if device.type == "cuda":
        if memory_budget is None:
            free, _ = torch.cuda.mem_get_info(device)
            memory_budget = int(MEMORY_HEADROOM * free)
        return max_batch or CUDA_MAX_BATCH, CUDA_STEP_BUDGET, memory_budget
    return max_batch or CPU_MAX_BATCH, CPU_STEP_BUDGET, memory_budget


@dataclass(frozen=True)
class ClonedVoice(Voice):
    fast_start: bool | None = None
    """The voice's own default for a request that does not choose; None: the engine's."""

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "fast_start": self.fast_start}


class CosyVoice2Engine(Engine):
    name = "cosyvoice2"
    sample_rate = 24000
    clones_voices = True

    def __init__(
        self,
        model_dir: Path,
        device: str = "cpu",
        precision: str = "auto",
        voices_dir: Path | None = None,
        *,
        first_chunk_tokens: int = 10,
        fast_start: bool = False,
        vocoder_seams: str = "official",
        seed: int | None = None,
        cpu_threads: int | None = None,
        max_batch: int | None = None,
        memory_budget: int | None = None,
    ) -> None:
        """``cpu_threads`` sets torch's (process-wide) intra-op threads (engine/threads.py);
        1 is much faster for the tiny test model on a loaded machine, where threads contend.
        Without it torch keeps its own count.

        ``fast_start`` trades the official streaming schedule for a sooner first chunk
        (after ``first_chunk_tokens`` + 3 LM tokens) by trimming up to 24 tokens from the
        start of the flow prompt: less speaker conditioning, mel no longer the official one
        (see pipeline.py). It is only the default: a voice may carry its own, and a request
        (``SynthesisParams.fast_start``) overrides both; each stream keeps the schedule it
        was opened with. ``first_chunk_tokens`` only matters with it. ``vocoder_seams``:
        "official" (the pinned reference's) or "project" (see hift.make_vocoder)."""
        model_dir = Path(model_dir)
        if cpu_threads is not None:
            configure_cpu_threads(cpu_threads)
        missing = missing_files(model_dir)
        if missing:
            raise EngineError(
                ErrorCode.MODEL_MISSING,
                f"the CosyVoice2 model directory {model_dir} lacks: {', '.join(missing)}. {DOWNLOAD_HINT}",
            )
        dev = torch.device(device)
        self.precision = resolve_precision(precision, device)
        dtype = precision_dtype(self.precision)
        if not 5 <= first_chunk_tokens <= 25:
            raise ValueError("first_chunk_tokens must be within 5..25 (a first chunk under 5 tokens is all overlap)")
        try:
            self.models = load_models(model_dir, dev, dtype)
            self.tokenizer = load_tokenizer(model_dir / "CosyVoice-BlankEN")
            self.frontend = Frontend(model_dir, self.models.cfg, self.tokenizer)
        except (ConfigError, CheckpointError) as exc:
            raise EngineError(ErrorCode.MODEL_INVALID, f"{model_dir}: {exc}") from exc
        self.device = str(dev)
        self.sample_rate = self.models.cfg.sample_rate
        self.first_chunk_tokens = first_chunk_tokens
        self.stats = Stats()
        self.fast_start = fast_start
        if vocoder_seams not in ("official", "project"):
            raise ValueError(f"vocoder_seams must be official or project, not {vocoder_seams!r}")
        self.batcher = Batcher(self.models, self.stats, first_chunk_tokens, fast_start, vocoder_seams)
        self.max_batch, self.step_budget, self.memory_budget = batch_limits(dev, max_batch, memory_budget)
        self.width_costs_time = dev.type != "cuda"
        self.store = VoiceStore(voices_dir)
        self._seed = seed if seed is not None else secrets.randbits(62)
        self._utterance = 0
        self._boundaries = {
            ids[0] for ids in (self.tokenizer.encode(p) for p in _PUNCTUATION) if len(ids) == 1
        }

    # ------------------------------------------------------------------ voices

    def _voice(self, stored: StoredVoice) -> ClonedVoice:
        return ClonedVoice(
            id=stored.id,
            name=stored.name,
            language="multilingual",
            sample_rate=self.sample_rate,
            description=f"zero-shot clone ({len(stored.prompt.speech_tokens) / 25:.1f} s reference)",
            fast_start=stored.fast_start,
        )

    def voices(self) -> Sequence[Voice]:
        return [self._voice(v) for v in self.store.all()]

    def has_voice(self, voice_id: str) -> bool:
        return self.store.get(voice_id) is not None

    def register_voice(
        self, audio: np.ndarray, sample_rate: int, transcript: str, name: str, fast_start: bool | None = None
    ) -> Registered:
        """Run the frontend once per distinct (audio, transcript); store the result, with
        ``fast_start`` as the voice's default schedule (None: the engine's). A known
        content under another name, or with another ``fast_start`` asked for, is refused:
        what a voice does is not changed behind the backs of those who use it."""
        if not isinstance(audio, np.ndarray):
            raise EngineError(ErrorCode.BAD_AUDIO, "the reference audio must be a numpy array")
        voice_id = content_id(audio, int(sample_rate), transcript or "")
        name = (name or "").strip()[:100]
        known = self.store.get(voice_id)
        if known is None:
            prompt = self.frontend.extract(audio, int(sample_rate), transcript)
            self.stats.frontend_runs += 1
            stored = self.store.add(StoredVoice(voice_id, name or voice_id, prompt, transcript.strip(), fast_start=fast_start))
            if stored.prompt is prompt:
                return Registered(self._voice(stored), created=True)
            known = stored  # another registration of the same content won the race
        if name and name != known.name:
            raise EngineError(
                ErrorCode.VOICE_EXISTS,
                f"this audio and transcript are already registered as {known.name!r} (id {known.id}); "
                "use that voice, or register other audio under the new name",
            )
        if fast_start is not None and fast_start != known.fast_start:
            raise EngineError(
                ErrorCode.VOICE_EXISTS,
                f"this audio and transcript are already registered as {known.name!r} (id {known.id}) with "
                f"fast_start {json.dumps(known.fast_start)}; choose per request with the speak field \"fast_start\" instead",
            )
        return Registered(self._voice(known), created=False)

    def fast_start_for(self, params: SynthesisParams, voice: StoredVoice) -> bool:
        """The schedule a request gets: its own choice, else its voice's, else the engine's."""
        for choice in (params.fast_start, voice.fast_start):
            if choice is not None:
                return choice
        return self.fast_start

    # ------------------------------------------------------------------ synthesis

    def open(self, text: str, params: SynthesisParams) -> CosyStream:
        """Check the request and tokenise its text; no model work (that is ``step``'s)."""
        stored = self.store.get(params.voice)
        if stored is None:
            raise EngineError(ErrorCode.UNKNOWN_VOICE, f"no CosyVoice2 voice {params.voice!r}; register one first")
        if not 0.5 <= params.speed <= 2.0:
            raise EngineError(ErrorCode.BAD_SPEED, f"speed {params.speed} is outside 0.5-2.0")
        if len(text) > MAX_TEXT_CHARS:
            raise EngineError(ErrorCode.TEXT_TOO_LONG, f"text is {len(text)} characters; at most {MAX_TEXT_CHARS}")
        # CosyVoice2 reads text, not phonemes: a lexicon may only respell (its voices list
        # no phonemes, so the pipeline refuses phoneme entries).
        ids = self.tokenizer.encode(normalize_text(params.lexicon.respelled(text) if params.lexicon else text))
        self._utterance += 1  # the seed follows the order of arrival
        seed = (self._seed + self._utterance) % (1 << 63)
        return self._open(stored.prompt, ids, params.speed, seed, fast_start=self.fast_start_for(params, stored))

    def _open(
        self, prompt: Prompt, ids: list[int], speed: float, seed: int, fast_start: bool | None = None, **lm_bounds: int
    ) -> CosyStream:
        pieces = split_ids(ids, self._boundaries, MAX_SEGMENT_TOKENS)
        return self.batcher.open(prompt, pieces, speed, seed, fast_start=fast_start, **lm_bounds)

    def step(self, streams: Sequence[Stream]) -> list[Step | Exception]:
        return self.batcher.step(streams)  # type: ignore[arg-type]

    def warmup(self) -> None:
        voices = self.store.all()
        if voices:
            prompt = voices[0].prompt
        else:  # a silent stand-in prompt: enough to touch every kernel once
            n = 50
            prompt = Prompt(
                text_ids=np.asarray(self.tokenizer.encode("warm up"), dtype=np.int64),
                speech_tokens=np.zeros(n, dtype=np.int64),
                mel=np.full((2 * n, self.models.cfg.flow.output_size), -5.0, dtype=np.float32),
                embedding=np.ones(self.models.cfg.flow.spk_embed_dim, dtype=np.float32),
            )
        ids = self.tokenizer.encode("Warm up.")
        for _ in self._stepped_alone(self._open(prompt, ids, 1.0, 0, min_tokens=30, max_tokens=30)):
            pass

    def close(self) -> None:
        self.models = self.batcher = None  # type: ignore[assignment]  # the KV slot pool with them
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
