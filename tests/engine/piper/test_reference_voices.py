"""The torch port against Piper itself, on voices that neither this port nor its author
made: random-weight models from piper-tts's own training code, exported as Piper exports
(tests/fixtures/piper_voices.py), in Piper's qualities, with one speaker and with several,
spoken by piper-tts's ``PiperVoice`` on onnxruntime with a speaker id."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from voxwire.engine.base import EngineError, SynthesisParams
from voxwire.engine.errors import ErrorCode
from voxwire.engine.piper.chunked import stream_chunks
from voxwire.engine.piper.onnx_weights import load_vits

TEXT = "Streaming synthesis lets a listener hear the first words while the rest is computed."
# The task's bounds: noise off, fp32, the same durations, and the audio within these of
# Piper's. Measured on an AVX2 EPYC: whole about 130 dB, chunked 62-130 dB (a chunk's
# edge and the padding's trailing silence differ by float rounding).
WHOLE_SNR_DB = 60.0
CHUNKED_SNR_DB = 45.0
# A wrong speaker, or a speaker's embedding zeroed, measured 14-20 dB: far below.
CONTROL_SNR_DB = 30.0


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - test) ** 2), 1e-30)))


@pytest.fixture(scope="module")
def piper(reference_voices):
    """piper-tts's own voice (phonemizer and onnxruntime session) for each voice."""
    import onnxruntime
    from piper import PiperVoice

    out = {}
    for name, path in reference_voices.items():
        voice = PiperVoice.load(path)
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1  # see conftest
        voice.session = onnxruntime.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        out[name] = voice
    return out


@pytest.fixture(scope="module")
def ports(reference_voices):
    return {name: load_vits(path) for name, path in reference_voices.items()}


def piper_audio(voice, ids: list[int], speaker: int | None) -> np.ndarray:
    from piper.config import SynthesisConfig

    syn = SynthesisConfig(speaker_id=speaker, noise_scale=0.0, noise_w_scale=0.0, length_scale=1.0)
    return np.asarray(voice.phoneme_ids_to_audio(ids, syn), dtype=np.float32).reshape(-1)


def speakers_of(voice) -> list[int | None]:
    n = voice.config.num_speakers
    return [None] if n <= 1 else [0, 1, n - 1] if n > 2 else [0, 1]


@pytest.mark.parametrize("name", ["speakers", "x_low", "high"])
def test_the_port_speaks_as_piper_for_every_speaker_whole_and_chunked(name, piper, ports):
    voice, vits = piper[name], ports[name]
    assert vits.sample_rate == voice.config.sample_rate
    assert vits.n_speakers == max(1, voice.config.num_speakers)
    ids = voice.phonemes_to_ids(voice.phonemize(TEXT)[0])
    heard = []
    for speaker in speakers_of(voice):
        expected = piper_audio(voice, ids, speaker)
        z_p, durations = vits.infer_prior(torch.tensor(ids), 0.0, 1.0, 0.0, speaker=speaker)
        g = vits.speaker_embedding([speaker])
        whole = vits.decode(vits.flow_reverse(z_p, speaker=g), g)[0].numpy()
        # The same frames per phoneme: equal lengths, and at this SNR no phoneme can
        # have moved a frame.
        assert int(durations.sum()) * vits.hop_length == expected.size == whole.size
        assert snr_db(expected, whole) > WHOLE_SNR_DB
        chunked = np.concatenate(list(stream_chunks(vits, z_p, speaker=g)))
        assert chunked.size == expected.size
        assert snr_db(expected, chunked) > CHUNKED_SNR_DB
        heard.append(expected)
    for a, b in zip(heard, heard[1:]):  # the speakers differ, or the check tells nothing
        n = min(a.size, b.size)
        assert snr_db(a[:n], b[:n]) < CONTROL_SNR_DB


def test_a_wrong_speaker_or_a_zeroed_embedding_fails_the_check(piper, ports):
    """The negative controls: the check above sees a speaker's conditioning."""
    voice, vits = piper["speakers"], ports["speakers"]
    ids = voice.phonemes_to_ids(voice.phonemize(TEXT)[0])
    expected = piper_audio(voice, ids, 2)

    def port(speaker: int) -> np.ndarray:
        return vits(torch.tensor(ids), 0.0, 1.0, 0.0, speaker=speaker).numpy()

    assert snr_db(expected, port(2)) > WHOLE_SNR_DB
    wrong = port(1)
    assert wrong.size != expected.size or snr_db(expected, wrong) < CONTROL_SNR_DB
    assert vits.emb_g is not None
    kept = vits.emb_g.weight[2].clone()
    try:
        vits.emb_g.weight[2] = 0.0
        zeroed = port(2)
    finally:
        vits.emb_g.weight[2] = kept
    assert zeroed.size != expected.size or snr_db(expected, zeroed) < CONTROL_SNR_DB


def audio(pieces) -> np.ndarray:
    return np.concatenate([p for p in pieces if isinstance(p, np.ndarray)])


def quiet(engine):
    """Noise off: a stream's audio is then a function of its text and speaker alone."""
    for voice in engine._voices.values():
        voice.config = dataclasses.replace(voice.config, noise_scale=0.0, noise_w_scale=0.0)
    return engine


def spoken_together(engine, texts: list[str], params: list[SynthesisParams]) -> tuple[list[np.ndarray], int]:
    """Each text's audio, all opened at once and stepped together until each is done; and
    the widest step."""
    streams = [engine.open(t, p) for t, p in zip(texts, params)]
    together: list[list] = [[] for _ in texts]
    live = list(range(len(texts)))
    widest = 0
    while live:
        widest = max(widest, len(live))
        results = engine.step([streams[i] for i in live])
        for i, r in zip(list(live), results):
            assert not isinstance(r, Exception), r
            together[i] += r.pieces
            if r.done:
                live.remove(i)
    return [audio(pieces) for pieces in together], widest


@pytest.fixture(scope="module")
def engine(reference_voices):
    from voxwire.engine.piper.engine import PiperEngine, voice_files_from_path

    e = PiperEngine([voice_files_from_path(reference_voices["speakers"])], backend="torch", precision="fp32")
    torch.set_num_threads(1)
    return quiet(e)


def test_the_engine_lists_the_speakers_and_refuses_an_unknown_one(engine):
    (voice,) = engine.voices()
    assert voice.speakers == ("alice", "bob", "carol", "dave")
    assert voice.to_dict()["speakers"] == ["alice", "bob", "carol", "dave"]
    for bad in ("erin", "4", "-1", ""):
        with pytest.raises(EngineError) as e:
            engine.open(TEXT, SynthesisParams(voice="speakers", speaker=bad))
        assert e.value.code == ErrorCode.UNKNOWN_SPEAKER


def test_streams_of_different_speakers_batched_sound_as_each_alone(engine):
    texts = ["Hello there, how are you?", TEXT, "Yes! " + TEXT]
    speakers = ["bob", "3", None]  # by name, by number, the default (alice)
    params = [SynthesisParams(voice="speakers", speaker=s) for s in speakers]
    alone = [audio(engine.synthesize(t, p)) for t, p in zip(texts, params)]
    together, widest = spoken_together(engine, texts, params)
    assert widest == 3
    for a, b in zip(alone, together):
        assert b.shape == a.shape and snr_db(a, b) > 60.0
    # And "bob" is bob: the same text as the default speaker sounds otherwise.
    bob_as_alice = audio(engine.synthesize(texts[0], SynthesisParams(voice="speakers")))
    n = min(bob_as_alice.size, alone[0].size)
    assert snr_db(alone[0][:n], bob_as_alice[:n]) < CONTROL_SNR_DB


def test_voices_of_two_rates_speak_together_each_at_its_own_rate(reference_voices):
    """An x_low voice (16 kHz) beside a medium one (22.05 kHz): each utterance comes at its
    voice's rate, and a step that advances both gives each what it gives alone."""
    from voxwire.engine.piper.engine import PiperEngine, voice_files_from_path

    both = quiet(PiperEngine([voice_files_from_path(reference_voices[v]) for v in ("speakers", "x_low")],
                             backend="torch", precision="fp32"))
    torch.set_num_threads(1)
    assert both.sample_rate == 22050  # the default voice's, the first
    assert [(v.id, v.sample_rate, both.voice_rate(v.id)) for v in both.voices()] == [
        ("speakers", 22050, 22050), ("x_low", 16000, 16000)]
    params = [SynthesisParams(voice="x_low"), SynthesisParams(voice="speakers", speaker="carol")]
    alone = [audio(both.synthesize(TEXT, p)) for p in params]
    together, widest = spoken_together(both, [TEXT, TEXT], params)
    assert widest == 2
    for a, b in zip(alone, together):
        assert b.shape == a.shape and snr_db(a, b) > 60.0


def test_the_onnx_backend_passes_the_speaker(reference_voices, engine):
    """onnxruntime's graph gets ``sid``: its audio is the torch port's for that speaker."""
    from voxwire.engine.piper.engine import PiperEngine, voice_files_from_path

    onnx = PiperEngine([voice_files_from_path(reference_voices["speakers"])], backend="onnx")
    by_onnx, by_torch = onnx._loaded["speakers"], engine._loaded["speakers"]
    ids = engine._voices["speakers"].phoneme_ids(TEXT)[0]
    for speaker in (1, 3):
        a = np.concatenate(list(by_onnx.audio(ids, 1.0, noise=False, speaker=speaker)))
        b = np.concatenate(list(by_torch.audio(ids, 1.0, noise=False, speaker=speaker)))
        assert a.shape == b.shape and snr_db(a, b) > CHUNKED_SNR_DB
    other = np.concatenate(list(by_onnx.audio(ids, 1.0, noise=False, speaker=0)))
    n = min(other.size, a.size)
    assert snr_db(a[:n], other[:n]) < CONTROL_SNR_DB
