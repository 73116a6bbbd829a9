"""API keys and browser origins, against a real server."""

from __future__ import annotations

import httpx
import pytest
import websockets

from voxwire.server import auth
from voxwire.server.config import AuthConfig, ServerConfig
from tests.conftest import run_server
from tests.fixtures.engines import ToneEngine

KEYS = ("first-key-0123", "second-key-4567")
GOOD_ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def locked():
    config = ServerConfig(auth=AuthConfig(api_keys=KEYS, allowed_origins=(GOOD_ORIGIN,)))
    with run_server(config, engine=ToneEngine) as s:
        yield s


async def first_message(url: str, **kwargs) -> str:
    async with websockets.connect(url, **kwargs) as ws:
        return await ws.recv()


async def close_code(url: str, **kwargs) -> tuple[int, str]:
    async with websockets.connect(url, **kwargs) as ws:
        with pytest.raises(websockets.ConnectionClosed) as e:
            await ws.recv()
        return e.value.rcvd.code, e.value.rcvd.reason


async def test_no_key_or_a_wrong_key_closes_1008(locked):
    assert (await close_code(locked.ws))[0] == 1008
    assert (await close_code(locked.ws, additional_headers={"Authorization": "Bearer nope"}))[0] == 1008
    assert (await close_code(locked.ws + "?token=first-key-012"))[0] == 1008  # a prefix is not the key


@pytest.mark.parametrize("key", KEYS)
async def test_bearer_header_query_token_and_subprotocol_each_let_in(locked, key):
    ready = '"type":"ready"'
    assert ready in await first_message(locked.ws, additional_headers={"Authorization": f"Bearer {key}"})
    assert ready in await first_message(f"{locked.ws}?token={key}")
    async with websockets.connect(locked.ws, subprotocols=["voxwire.v1", f"voxwire.token.{key}"]) as ws:
        assert ready in await ws.recv()
        assert ws.subprotocol == "voxwire.v1"  # the token is never echoed back


async def test_origin_allowlist(locked):
    header = {"Authorization": f"Bearer {KEYS[0]}"}
    assert (await close_code(locked.ws, additional_headers=header, origin="https://evil.example"))[0] == 1008
    assert '"ready"' in await first_message(locked.ws, additional_headers=header, origin=GOOD_ORIGIN)


async def test_http_routes_need_the_key_but_probes_do_not(locked):
    async with httpx.AsyncClient(base_url=locked.http) as http:
        refused = await http.get("/v1/voices")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        ok = await http.get("/v1/voices", headers={"Authorization": f"Bearer {KEYS[1]}"})
        assert ok.status_code == 200 and ok.json()["voices"][0]["id"] == "tone"
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200


async def test_an_http_401_says_how_to_send_the_key(locked):
    speech = {"model": "tts-1", "voice": "tone", "input": "Hello.", "response_format": "pcm"}
    async with httpx.AsyncClient(base_url=locked.http) as http:
        refusals = {
            "/v1/voices": await http.get("/v1/voices"),
            "/v1/audio/speech": await http.post("/v1/audio/speech", json=speech,
                                                headers={"Authorization": "Bearer not-a-key"}),
        }
        for route, refused in refusals.items():
            assert refused.status_code == 401, route
            error = refused.json()["error"]
            assert error["code"] == "unauthorized", route
            assert error["message"] == auth.HTTP_KEY_REFUSED, (route, error)
        # What it says works: the key as a Bearer header, or as ?token=.
        assert (await http.get("/v1/voices", headers={"Authorization": f"Bearer {KEYS[0]}"})).status_code == 200
        assert (await http.get("/v1/voices", params={"token": KEYS[0]})).status_code == 200
    assert "send Authorization: Bearer KEY" in auth.HTTP_KEY_REFUSED and "?token=KEY" in auth.HTTP_KEY_REFUSED


def test_every_key_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    config = AuthConfig(api_keys=KEYS)
    assert auth.key_is_valid(config, KEYS[0])
    assert len(calls) == len(KEYS)  # no early exit on the first match
    calls.clear()
    assert not auth.key_is_valid(config, None)
    assert not auth.key_is_valid(config, "")
    assert len(calls) == 2 * len(KEYS)


def test_open_server_needs_no_key():
    assert auth.key_is_valid(AuthConfig(), None)
