"""The precision setting: what ``auto`` resolves to on which hardware, and how the engines
take it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from voxwire.engine import precision
from voxwire.engine.base import EngineError, SynthesisParams

WITHOUT = {"avx512_f": True, "avx2": True}  # an AVX-512 CPU without its bf16 extension


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_capabilities", lambda: WITHOUT)


@pytest.mark.parametrize("features, expected", [
    (WITHOUT, "fp32"),
    ({**WITHOUT, "avx512_bf16": True}, "bf16"),
    ({"amx_bf16": True, "amx_tile": True}, "bf16"),
    ({"avx512_bf16": False, "amx_bf16": False}, "fp32"),
])
def test_auto_takes_bf16_only_where_the_cpu_computes_it(monkeypatch, features, expected):
    monkeypatch.setattr(precision, "cpu_capabilities", lambda: features)
    assert precision.resolve("auto", "cpu") == expected
    # Named precisions are taken as given: bf16 can be forced, for a measurement.
    assert precision.resolve("fp32", "cpu") == "fp32"
    assert precision.resolve("bf16", "cpu") == "bf16"


def test_this_machines_own_answer_follows_its_cpu_features():
    features = torch.cpu.get_capabilities()
    native = bool(features.get("avx512_bf16") or features.get("amx_bf16"))
    assert precision.resolve("auto", "cpu") == ("bf16" if native else "fp32")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_auto_without_a_cuda_device_is_fp32():
    assert precision.native_bf16("cuda") is False
    assert precision.resolve("auto", "cuda") == "fp32"


@pytest.mark.parametrize("bad", ["fp64", "BF16", "", "int8"])
def test_an_unknown_precision_is_refused(bad):
    with pytest.raises(ValueError, match="auto, fp32, bf16"):
        precision.resolve(bad, "cpu")


def _audio(engine) -> np.ndarray:
    text = "Precision is a setting."
    params = SynthesisParams(voice="joe")
    return np.concatenate([p for p in engine.synthesize(text, params) if isinstance(p, np.ndarray)])


def test_piper_on_a_cpu_without_bf16_gets_fp32_from_auto(cpu_without_bf16):
    from voxwire.engine.piper.engine import PiperEngine

    engine = PiperEngine(precision="auto")
    vits = engine._loaded["joe"].vits
    assert engine.precision == "fp32"
    assert {vits.dtype_of(p) for p in ("enc_p", "dp", "flow", "dec")} == {torch.float32}


def test_piper_in_bf16_speaks():
    """Forced bf16 (whatever this CPU has): real speech, at the voice's rate, as long as
    fp32's within a frame or two (noise off: the same text gives nearly the same durations)."""
    from voxwire.engine.piper.engine import PiperEngine

    engines = {p: PiperEngine(precision=p) for p in ("fp32", "bf16")}
    for e in engines.values():
        voice = e._voices["joe"]
        voice.config = dataclasses.replace(voice.config, noise_scale=0.0, noise_w_scale=0.0)
    fp32, bf16 = (_audio(engines[p]) for p in ("fp32", "bf16"))
    assert engines["bf16"].precision == "bf16" and engines["bf16"].sample_rate == 22050
    assert bf16.dtype == np.float32 and abs(bf16.size - fp32.size) <= 2 * 256
    assert np.sqrt(np.mean(bf16**2)) > 0.2 * np.sqrt(np.mean(fp32**2)) > 0
    assert np.abs(bf16).max() <= 1.0


@pytest.mark.parametrize("backend, setting, error", [
    ("torch", "fp16", "unknown precision 'fp16'"),
    ("onnx", "bf16", "onnx backend computes in fp32 only"),
])
def test_piper_refuses_what_it_cannot_compute(backend, setting, error):
    from voxwire.engine.piper.engine import PiperEngine

    with pytest.raises(EngineError, match=error) as e:
        PiperEngine(backend=backend, precision=setting)
    assert e.value.code == "bad_config"


def test_piper_on_onnxruntime_is_fp32_under_auto():
    from voxwire.engine.piper.engine import PiperEngine

    assert PiperEngine(backend="onnx", precision="auto").precision == "fp32"


def test_cosyvoice2_computes_fp32_on_the_cpu_and_says_so_for_bf16():
    from voxwire.engine.cosyvoice2.engine import resolve_precision

    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("fp32", "cpu") == "fp32"
    with pytest.raises(EngineError, match="bf16 needs a CUDA device"):
        resolve_precision("bf16", "cpu")


def test_cosyvoice2_on_a_gpu_takes_bf16_where_native_else_fp16(monkeypatch):
    from voxwire.engine.cosyvoice2 import engine as cosy

    monkeypatch.setattr(cosy, "resolve", lambda setting, device: "bf16" if setting != "fp32" else "fp32")
    assert cosy.resolve_precision("auto", "cuda") == "bf16"
    monkeypatch.setattr(cosy, "resolve", lambda setting, device: "fp32" if setting == "auto" else setting)
    assert cosy.resolve_precision("auto", "cuda") == "fp16"  # an older GPU: its tensor cores have fp16
    assert cosy.resolve_precision("fp32", "cuda") == "fp32"
    assert cosy.resolve_precision("bf16", "cuda") == "bf16"
