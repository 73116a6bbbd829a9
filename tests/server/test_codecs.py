"""Compressed formats (opus, mp3, aac, flac) in the sans-I/O frame stream: each chunk's
bytes leave with it, the frames concatenated decode with PyAV to the same speech as the
PCM stream, a cancelled stream still decodes, and impossible settings are refused with
stable codes. The same through both doors, with real speech: test_codecs_doors.py."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from voxwire.engine.audio_queue import Done, Failed, Flushed
from voxwire.server.audio import FORMATS, FormatError, describe, stream_rate
from voxwire.server.framing import AudioFrame, FailedEvent, FlushedEvent, Framer
from voxwire.server.protocol import ProtocolError, StreamSettings, parse
from tests.server.codec_checks import HELD_BACK, PRIMING, assert_matches_pcm, codec_frame, decode

ENGINE_RATE = 22050
COMPRESSED = ("opus", "mp3", "aac", "flac")


def speechlike(seconds: float, rate: int = ENGINE_RATE) -> np.ndarray:
    """Voiced syllables and gaps: a gliding harmonic tone under a 4 Hz envelope, with a
    little noise, so that every codec has something like speech to code."""
    t = np.arange(int(rate * seconds)) / rate
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 2 * t), 0, None) ** 2
    noise = np.random.default_rng(0).normal(0, 0.01, t.size)
    return (0.25 * envelope * voiced + noise).astype(np.float32)


def settings(fmt: str, rate: int = 24000, **kw: object) -> StreamSettings:
    return StreamSettings(voice="v", format=fmt, sample_rate=stream_rate(fmt, rate), chunk_ms=200, **kw)  # type: ignore[arg-type]


def pieces(x: np.ndarray, size: int = 2000) -> list[np.ndarray]:
    return [x[i : i + size] for i in range(0, x.size, size)]


def run(stream: Framer, items: list[object]) -> list[object]:
    events: list[object] = []
    for item in items:
        events += stream.receive(item)  # type: ignore[arg-type]
    return events


def frames_of(events: list[object]) -> list[AudioFrame]:
    return [e for e in events if isinstance(e, AudioFrame)]


def pcm_of(fmt: str, audio: np.ndarray) -> np.ndarray:
    """The pcm_s16le stream of the same audio at the compressed stream's rate."""
    rate = stream_rate(fmt, 24000)
    frames = frames_of(run(Framer(ENGINE_RATE, settings("pcm_s16le", rate)), [*pieces(audio), Done()]))
    return np.frombuffer(b"".join(f.data for f in frames), "<i2").astype(np.float32) / 32767.0


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_frames_concatenated_decode_to_the_pcm_streams_speech(fmt):
    audio = speechlike(3.0)
    stream = Framer(ENGINE_RATE, settings(fmt))
    events = run(stream, [*pieces(audio), Done()])
    frames = frames_of(events)
    data = b"".join(f.data for f in frames)
    rate = stream.settings.sample_rate
    pcm = pcm_of(fmt, audio)
    # The frames still count samples as PCM frames do: all of the stream's, in order.
    assert sum(f.samples for f in frames) == stream.samples == pcm.size
    assert [f.offset for f in frames] == list(np.cumsum([0] + [f.samples for f in frames[:-1]]))
    assert stream.bytes == len(data) > 0
    decoded = assert_matches_pcm(data, pcm, fmt, rate)
    if fmt == "flac":  # lossless: the very samples of pcm_s16le
        np.testing.assert_array_equal(np.round(decoded * 32767), np.round(pcm * 32767))
    _, _, container, codec = decode(data)
    # FFmpeg reads ADTS with its demuxer named "aac".
    assert {"aac": "adts"}.get(container, container) == describe(fmt)["container"]
    assert codec.startswith(describe(fmt)["codec"])


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_each_chunk_leaves_with_its_bytes_before_the_engine_has_finished(fmt):
    stream = Framer(ENGINE_RATE, settings(fmt))
    audio = speechlike(2.0)
    sent_before_the_end = []
    for piece in pieces(audio, 4410):  # 200 ms engine steps
        sent_before_the_end += frames_of(stream.receive(piece))
    tail = frames_of(stream.receive(Done()))
    # Counters, not clocks: frames with real bytes were out while the engine still had
    # audio to give, and at most one codec frame of samples waited for the next chunk.
    assert len(sent_before_the_end) >= 8 and all(f.data for f in sent_before_the_end)
    assert sent_before_the_end[0].seq == 0
    first = decode(sent_before_the_end[0].data)[0]
    assert first.size - PRIMING[fmt] >= sent_before_the_end[0].samples - HELD_BACK[fmt] > 0
    # At the end: the resampler's tail, the codec's held samples and the stream's end.
    assert 1 <= len(tail) <= 2 and tail[-1].data


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_a_stream_cut_short_decodes_up_to_its_last_whole_frame(fmt):
    stream = Framer(ENGINE_RATE, settings(fmt))
    frames = frames_of(run(stream, pieces(speechlike(1.5))))
    stream.close()  # a cancel: nothing more is made
    assert len(frames) >= 5
    for end in range(1, len(frames) + 1):
        # Every prefix of the frames sent is a stream PyAV reads without an error.
        decoded, _, _, _ = decode(b"".join(f.data for f in frames[:end]))
        covered = sum(f.samples for f in frames[:end])
        speech = decoded.size - PRIMING[fmt]
        assert covered - HELD_BACK[fmt] <= speech <= covered + codec_frame(fmt, stream.settings.sample_rate)


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_flush_sends_what_is_buffered_and_keeps_one_stream(fmt):
    stream = Framer(ENGINE_RATE, settings(fmt))
    audio = speechlike(1.0)
    events = run(stream, [audio[:3000], Flushed(), audio[3000:], Done()])
    assert any(isinstance(e, FlushedEvent) for e in events)
    data = b"".join(f.data for f in frames_of(events))
    assert_matches_pcm(data, pcm_of(fmt, audio), fmt, stream.settings.sample_rate)


def test_a_failed_utterance_ends_its_encoder_with_no_more_frames():
    stream = Framer(ENGINE_RATE, settings("opus"))
    events = run(stream, [speechlike(0.5), Failed("engine_error", "boom")])
    assert isinstance(events[-1], FailedEvent) and not isinstance(events[-2], FailedEvent)
    decode(b"".join(f.data for f in frames_of(events)))  # what went out still decodes


def test_pcm_formats_are_unchanged_byte_for_sample():
    stream = Framer(ENGINE_RATE, settings("pcm_f32le"))
    frames = frames_of(run(stream, [*pieces(speechlike(1.0)), Done()]))
    assert all(len(f.data) == 4 * f.samples for f in frames) and stream.bytes == 4 * stream.samples


# -- rates and names -------------------------------------------------------------------


def test_opus_is_sent_at_48_khz_whatever_rate_was_asked():
    assert {stream_rate("opus", r) for r in (8000, 16000, 22050, 24000, 48000)} == {48000}


@pytest.mark.parametrize("fmt,rate", [("flac", 22050), ("flac", 9000), ("mp3", 22050), ("aac", 8000), ("mulaw", 11111), ("alaw", 11111)])
def test_rates_a_codec_takes_are_kept(fmt, rate):
    assert stream_rate(fmt, rate) == rate


@pytest.mark.parametrize("fmt,rate", [("mp3", 9000), ("mp3", 44000), ("aac", 20000)])
def test_a_rate_the_codec_cannot_take_has_a_stable_code(fmt, rate):
    with pytest.raises(FormatError) as e:
        stream_rate(fmt, rate)
    assert e.value.code == "unsupported_sample_rate" and str(rate) in e.value.message


def test_every_format_is_named_in_one_place_and_accepted_by_the_protocol():
    assert set(COMPRESSED) < set(FORMATS)
    for fmt in FORMATS:
        assert parse(f'{{"type": "config", "format": "{fmt}"}}').settings == {"format": fmt}  # type: ignore[union-attr]
    with pytest.raises(ProtocolError) as e:
        parse('{"type": "config", "format": "ogg_vorbis"}')
    assert e.value.code == "invalid_format" and "opus" in e.value.message


def test_describe_names_container_and_codec():
    assert describe("opus") == {"container": "ogg", "codec": "opus"}
    assert describe("aac") == {"container": "adts", "codec": "aac"}
    assert describe("pcm_s16le") == {"container": "raw", "codec": "pcm_s16le"}
    assert describe("alaw") == {"container": "raw", "codec": "alaw"}


def test_the_streams_are_what_standard_tools_recognise():
    """The first bytes are each container's magic, so a file of them plays anywhere."""
    magic = {"opus": b"OggS", "flac": b"fLaC"}
    for fmt, head in magic.items():
        frames = frames_of(run(Framer(ENGINE_RATE, settings(fmt)), [speechlike(0.5), Done()]))
        assert frames[0].data.startswith(head)
    mp3 = frames_of(run(Framer(ENGINE_RATE, settings("mp3")), [speechlike(0.5), Done()]))[0].data
    assert mp3[0] == 0xFF and mp3[1] & 0xE0 == 0xE0  # an MPEG audio frame sync, no ID3 tag
    with av.open(io.BytesIO(mp3)) as c:
        assert c.streams.audio[0].codec_context.name.startswith("mp3")
