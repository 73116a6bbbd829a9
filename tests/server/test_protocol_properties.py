"""Property tests: no input makes the parser raise anything but a ProtocolError."""

import msgpack
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from voxwire.server import protocol
from voxwire.server.protocol import ProtocolError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from(["type", "ctx", "text", "final", "voice", "format", "sample_rate", "chunk_ms", "speed", "x"])
types = st.sampled_from(["config", "speak", "flush", "cancel", "other", ""])
messages = st.fixed_dictionaries({"type": types}, optional={}).flatmap(
    lambda base: st.dictionaries(fields, json_values, max_size=6).map(lambda extra: {**extra, **base})
)


def parse_or_protocol_error(data):
    try:
        return protocol.parse(data)
    except ProtocolError as e:
        assert e.code and e.message
        return e


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_any_text_frame(text):
    parse_or_protocol_error(text)


@settings(max_examples=400, deadline=None)
@given(st.binary())
def test_any_binary_frame(data):
    parse_or_protocol_error(data)


@settings(max_examples=600, deadline=None)
@given(messages)
def test_any_structured_message_as_json_and_msgpack(message):
    a = parse_or_protocol_error(orjson.dumps(message).decode())
    b = parse_or_protocol_error(msgpack.packb(message))
    # Both encodings mean the same thing.
    assert type(a) is type(b)
    if isinstance(a, ProtocolError):
        assert a.code == b.code


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_any_json_value(value):
    parse_or_protocol_error(orjson.dumps(value).decode())
