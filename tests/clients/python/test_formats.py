"""The Python client's decoders of G.711 (voxwire_client/formats.py) and the WAV files it
writes of them (wav.py), against G.711's levels: ITU-T's reference and FFmpeg's decoder,
and libsndfile reading the WAV."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

from tests.fixtures import g711
from voxwire_client.formats import alaw_to_int16, mulaw_to_int16, to_float32
from voxwire_client.wav import write_wav

DECODERS = {"alaw": alaw_to_int16, "mulaw": mulaw_to_int16}
CODES = bytes(range(256))


@pytest.mark.parametrize("law", g711.LAWS)
def test_every_code_decodes_to_its_g711_level(law):
    levels = DECODERS[law](CODES)
    assert levels.dtype == np.int16
    np.testing.assert_array_equal(levels, g711.reference_levels(law))
    np.testing.assert_array_equal(levels, g711.ffmpeg_decode(law, CODES))
    np.testing.assert_array_equal(to_float32(CODES, law), levels.astype(np.float32) / 32767)


def test_alaw_known_levels():
    # The middle of each step: +-8 by silence, +-32256 at the top (the last step is 1024).
    assert alaw_to_int16(bytes([0xD5, 0x55, 0xC5, 0xAA, 0x2A])).tolist() == [8, -8, 264, 32256, -32256]


@pytest.mark.parametrize("law,tag,subtype", [("alaw", 6, "ALAW"), ("mulaw", 7, "ULAW")])
def test_a_g711_wav_is_tagged_and_read_as_written(tmp_path, law, tag, subtype):
    path = tmp_path / f"{law}.wav"
    write_wav(path, CODES, 8000, law)
    raw = path.read_bytes()
    assert int.from_bytes(raw[20:22], "little") == tag  # the fmt chunk's format tag
    info = soundfile.info(str(path))
    assert (info.samplerate, info.channels, info.subtype, info.frames) == (8000, 1, subtype, 256)
    audio, _ = soundfile.read(str(path), dtype="int16")
    np.testing.assert_array_equal(audio, DECODERS[law](CODES))
