import msgpack
import orjson
import pytest

from voxwire.engine.text.segment import SegmenterLimits
from voxwire.server import protocol
from voxwire.server.protocol import Cancel, Configure, Flush, ProtocolError, Speak


def j(obj) -> str:
    return orjson.dumps(obj).decode()


def test_parses_each_message_type_from_json_and_msgpack():
    speak = {"type": "speak", "ctx": "a", "text": "hi", "final": False, "voice": "joe", "sample_rate": 16000}
    for data in (j(speak), msgpack.packb(speak)):
        m = protocol.parse(data)
        assert m == Speak(ctx="a", text="hi", final=False, settings={"voice": "joe", "sample_rate": 16000})
    assert protocol.parse(j({"type": "config", "format": "mulaw", "speed": 1})) == Configure({"format": "mulaw", "speed": 1.0})
    assert protocol.parse(j({"type": "config", "format": "alaw"})) == Configure({"format": "alaw"})
    assert protocol.parse(j({"type": "flush", "ctx": "a"})) == Flush("a")
    assert protocol.parse(j({"type": "cancel", "ctx": "a"})) == Cancel("a")


def test_speak_defaults_to_final():
    assert protocol.parse(j({"type": "speak", "text": "x"})).final is True


@pytest.mark.parametrize(
    "data,code",
    [
        ("{not json", "invalid_json"),
        (b"\xc1\xff\x00", "invalid_msgpack"),
        (j([1, 2]), "invalid_message"),
        (j({"text": "x"}), "missing_field"),
        (j({"type": "sing"}), "unknown_type"),
        (j({"type": "flush"}), "missing_field"),
        (j({"type": "speak", "text": "x", "final": False}), "missing_field"),
        (j({"type": "speak", "text": 5}), "invalid_field"),
        (j({"type": "speak", "text": "x", "final": "yes"}), "invalid_field"),
        (j({"type": "speak", "ctx": "", "text": "x"}), "invalid_field"),
        (j({"type": "speak", "ctx": "x" * 200, "text": "x"}), "invalid_field"),
        (j({"type": "speak", "text": "x", "colour": "red"}), "unknown_field"),
        (j({"type": "config", "format": "ogg_vorbis"}), "invalid_format"),
        (j({"type": "config", "sample_rate": 7999}), "invalid_sample_rate"),
        (j({"type": "config", "sample_rate": 16000.0}), "invalid_sample_rate"),
        (j({"type": "config", "sample_rate": True}), "invalid_sample_rate"),
        (j({"type": "config", "chunk_ms": 100}), "invalid_chunk_ms"),
        (j({"type": "config", "speed": 3}), "invalid_speed"),
        (j({"type": "config", "voice": ""}), "invalid_field"),
        (j({"type": "speak", "text": "x", "fast_start": "yes"}), "invalid_field"),
        (j({"type": "speak", "text": "x", "fast_start": 1}), "invalid_field"),
        (j({"type": "speak", "text": "x", "fast_start": 0}), "invalid_field"),
        (msgpack.packb({"type": "speak", "text": "x", "fast_start": [True]}), "invalid_field"),
        (j({"type": "config", "fast_start": "true"}), "invalid_field"),
        (j({"type": "speak", "text": "x", "fastStart": True}), "unknown_field"),
        (j({"type": "config", "first_clause_words": -1}), "invalid_field"),
        (j({"type": "config", "first_clause_words": 41}), "invalid_field"),
        (j({"type": "config", "first_clause_words": 3.0}), "invalid_field"),
        (j({"type": "config", "first_clause_words": True}), "invalid_field"),
        (j({"type": "speak", "text": "x", "first_clause_words": None}), "invalid_field"),
    ],
)
def test_bad_messages_raise_protocol_errors_with_stable_codes(data, code):
    with pytest.raises(ProtocolError) as e:
        protocol.parse(data)
    assert e.value.code == code
    assert e.value.message


def test_fast_start_is_a_stream_setting_true_false_or_null():
    for value in (True, False, None):
        speak = {"type": "speak", "text": "x", "fast_start": value}
        for data in (j(speak), msgpack.packb(speak)):
            assert protocol.parse(data).settings == {"fast_start": value}
        assert protocol.parse(j({"type": "config", "fast_start": value})) == Configure({"fast_start": value})
    assert protocol.parse(j({"type": "speak", "text": "x"})).settings == {}  # left to the voice, then the server
    session = protocol.StreamSettings(voice="v", fast_start=True)
    assert session.to_dict()["fast_start"] is True and protocol.StreamSettings(voice="v").fast_start is None
    # null in a speak takes an utterance back to the voice's default from a session's choice.
    assert protocol.with_overrides(session, {"fast_start": None}).fast_start is None


def test_a_bad_fast_start_names_the_field_and_the_ctx():
    with pytest.raises(ProtocolError) as e:
        protocol.parse(j({"type": "speak", "ctx": "u9", "text": "x", "fast_start": "yes"}))
    assert (e.value.code, e.value.ctx) == ("invalid_field", "u9") and "fast_start" in e.value.message


def test_error_names_the_ctx_when_it_can():
    with pytest.raises(ProtocolError) as e:
        protocol.parse(j({"type": "speak", "ctx": "u7", "text": "x", "format": "ogg"}))
    assert e.value.ctx == "u7"


def test_audio_frame_is_a_msgpack_map():
    frame = msgpack.unpackb(protocol.audio_frame("a", 3, 4800, 2, b"\x01\x00\x02\x00"))
    assert frame == {"type": "audio", "ctx": "a", "seq": 3, "offset": 4800, "samples": 2, "audio": b"\x01\x00\x02\x00"}


def test_a_msgpack_map_with_a_non_string_key_is_the_wrong_shape_not_bad_bytes():
    with pytest.raises(ProtocolError) as e:
        protocol.parse(msgpack.packb({"type": "speak", 1: "x"}))
    assert e.value.code == "invalid_message"


@pytest.mark.parametrize("data", ["{not json", '{"type": "speak", "text": }', b"\xc1\xff\x00", b"\x93\x01"])
def test_error_messages_are_for_people_not_parsers(data):
    with pytest.raises(ProtocolError) as e:
        protocol.parse(data)
    for internal in ("Error", "Exception", "0x", "<", "unexpected character"):
        assert internal not in e.value.message, e.value.message


def test_first_clause_words_is_a_stream_setting_from_zero_to_forty():
    for value in (0, 3, 40):
        assert protocol.parse(j({"type": "config", "first_clause_words": value})) == Configure({"first_clause_words": value})
        assert protocol.parse(j({"type": "speak", "text": "x", "first_clause_words": value})).settings == {
            "first_clause_words": value
        }
    # The server's default is the segmenter's: the one the measurement chose.
    assert protocol.StreamSettings(voice="v").first_clause_words == SegmenterLimits().first_clause_words


def test_speaker_is_a_stream_setting_a_name_an_id_or_null():
    for value, kept in (("alice", "alice"), ("p 225", "p 225"), (2, "2"), (0, "0"), ("7", "7"), (None, None)):
        speak = {"type": "speak", "ctx": "u1", "text": "x", "speaker": value}
        for data in (j(speak), msgpack.packb(speak)):
            assert protocol.parse(data).settings == {"speaker": kept}
        assert protocol.parse(j({"type": "config", "speaker": value})) == Configure({"speaker": kept})
    assert protocol.StreamSettings(voice="v").speaker is None
    assert protocol.StreamSettings(voice="v", speaker="bob").to_dict()["speaker"] == "bob"  # configured, started
    # null in a speak takes an utterance back to the voice's default speaker.
    assert protocol.with_overrides(protocol.StreamSettings(voice="v", speaker="bob"), {"speaker": None}).speaker is None


@pytest.mark.parametrize(
    "value", ["", "x" * (protocol.MAX_SPEAKER_CHARS + 1), -1, 1.0, True, False, ["alice"], {"name": "alice"}]
)
def test_a_bad_speaker_is_invalid_field_naming_it_and_the_ctx(value):
    for kind in ("speak", "config"):
        with pytest.raises(ProtocolError) as e:
            protocol.parse(j({"type": kind, "ctx": "u9", "text": "x", "speaker": value} if kind == "speak"
                             else {"type": kind, "speaker": value}))
        assert e.value.code == "invalid_field" and "speaker" in e.value.message
        assert e.value.ctx == ("u9" if kind == "speak" else None)
