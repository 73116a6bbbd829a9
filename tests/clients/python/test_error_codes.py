"""The Pipecat and LiveKit integrations' maps of error codes, against the server's one list.

The client shares no code with the server (tests/test_layers.py), so each integration
writes the codes it maps as strings. Here every code they name must be the server's
(``ErrorCode``), and every code protocol v1 can send must be mapped by both, or listed
below as falling to the framework's default, with the reason that default is right.
"""

from __future__ import annotations

import pytest

from tests.engine.test_error_codes import SOCKET_TABLE, documented_codes
from voxwire.engine.errors import ErrorCode

MESSAGE_REFUSED = "a message the integration itself wrote refused: a bug in the client, not the request"
THIS_TEXT = "this utterance's text or length: another utterance may pass"
# Refusals of a message the integration wrote itself: neither integration maps them.
BAD_MESSAGES = dict.fromkeys(
    ["invalid_json", "invalid_msgpack", "invalid_message", "missing_field", "unknown_type", "unknown_field",
     "unknown_ctx", "ctx_finished"],
    MESSAGE_REFUSED,
)

PIPECAT_UNKNOWN = {
    # ErrorCategory.UNKNOWN: neither permanent (INVALID_REQUEST would make the service
    # unusable) nor a load or server state to wait out.
    **BAD_MESSAGES,
    "timestamps_unsupported": "the service asks for timestamps only where ready.features says the engine has them",
    "idle_timeout": "one utterance whose text stopped coming; the next one starts afresh",
    "listener_stalled": "one utterance whose audio was not taken; the next one starts afresh",
    "text_too_long": THIS_TEXT,
    "utterance_too_long": THIS_TEXT,
    "over_memory_budget": THIS_TEXT,
    "invalid_ssml": "the service sends plain text, never text_format ssml; were it asked, " + THIS_TEXT,
}

LIVEKIT_400 = {
    # 400: the caller's mistake, which the framework does not retry (the same request
    # would fail again).
    **BAD_MESSAGES,
    "invalid_field": "a setting of the wrong shape: the same request is refused again",
    "invalid_format": "a setting out of range: the same request is refused again",
    "invalid_sample_rate": "a setting out of range: the same request is refused again",
    "invalid_chunk_ms": "a setting out of range: the same request is refused again",
    "invalid_speed": "a setting out of range: the same request is refused again",
    "unsupported_sample_rate": "a rate the format cannot take: the same request is refused again",
    "unknown_voice": "no such voice: the same request is refused again",
    "unknown_speaker": "the voice has no such speaker: the same request is refused again",
    "invalid_voice_blend": "a voice blend that cannot be read: the same request is refused again",
    "invalid_lexicon": "a lexicon that cannot be read: the same request is refused again",
    "invalid_ssml": "an SSML document that cannot be read: the same request is refused again",
    "no_voice": "no voice registered yet: a retry now is refused again",
    "timestamps_unsupported": "the plugin asks for timestamps only where ready.features says the engine has them",
    "text_too_long": THIS_TEXT + ", but this one never will",
    "utterance_too_long": THIS_TEXT + ", but this one never will",
    "over_memory_budget": THIS_TEXT + ", but this one never will",
}


def socket_codes() -> set[str]:
    return set(documented_codes(SOCKET_TABLE))


def pipecat_map() -> dict[str, object]:
    pytest.importorskip("pipecat")
    from voxwire_client.pipecat import _CATEGORIES

    return dict(_CATEGORIES)


def livekit_map() -> dict[str, int]:
    pytest.importorskip("livekit.agents")
    from voxwire_client.livekit import _STATUS

    return dict(_STATUS)


INTEGRATIONS = pytest.mark.parametrize(
    "mapped, defaulted", [(pipecat_map, PIPECAT_UNKNOWN), (livekit_map, LIVEKIT_400)], ids=["pipecat", "livekit"]
)


@INTEGRATIONS
def test_every_code_an_integration_names_is_the_servers(mapped, defaulted) -> None:
    members = {str(m) for m in ErrorCode}
    assert sorted(set(mapped()) - members) == []
    assert sorted(set(defaulted) - members) == []


@INTEGRATIONS
def test_every_code_of_protocol_v1_is_mapped_or_falls_to_the_default_for_a_reason(mapped, defaulted) -> None:
    codes = mapped()
    assert sorted(socket_codes() - set(codes) - set(defaulted)) == [], "neither mapped nor listed here"
    assert sorted(set(codes) & set(defaulted)) == [], "mapped, yet listed here as falling to the default"
    assert sorted(set(codes) - socket_codes()) == [], "a code protocol v1 never sends"
    assert sorted(set(defaulted) - socket_codes()) == [], "a code protocol v1 never sends"
