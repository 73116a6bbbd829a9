"""The app's routing: what a wrong path or a capability the engine lacks is answered."""

from __future__ import annotations

import httpx
import pytest
import websockets

from tests.conftest import RunningServer


async def test_an_unknown_websocket_path_is_404_not_an_auth_failure(piper_server: RunningServer):
    with pytest.raises(websockets.InvalidStatus) as e:
        async with websockets.connect(f"ws://127.0.0.1:{piper_server.port}/v1/wrong"):
            pass
    assert e.value.response.status_code == 404


def test_an_unknown_http_path_is_404(piper_server: RunningServer):
    r = httpx.get(f"{piper_server.http}/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "body,content_type",
    [
        (b"not a form at all", "text/plain"),
        (b"--x\r\nbroken", "multipart/form-data; boundary=x"),
        (b"\x00" * 100, "multipart/form-data; boundary=zz"),
    ],
)
def test_an_engine_that_cannot_clone_answers_501_before_reading_the_upload(piper_server, body, content_type):
    r = httpx.post(f"{piper_server.http}/v1/voices", content=body, headers={"content-type": content_type})
    assert r.status_code == 501
    error = r.json()["error"]
    assert error["code"] == "voice_registration_unsupported"
    assert "<" not in error["message"] and "0x" not in error["message"]
