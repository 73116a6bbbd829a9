"""Voxwire behind a real nginx running the shipped deploy/nginx.conf.

nginx runs in the foreground (`-g 'daemon off;'`) as a subprocess, with its pid, logs and
temp files in a temporary directory, listening on a free (unprivileged) port of
127.0.0.1, in front of the real Piper server. The site config is deploy/nginx.conf itself, with only its
`listen` lines and its upstream's `server` lines changed, so these tests exercise the
file that is shipped. nginx is required: without it these tests fail, never skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.conftest import Loopback, RunningServer, free_port
from tests.server.test_stream import SENTENCE, SEVERAL, assert_speech
from voxwire_client import Audio, Client
from voxwire_client.sync import synthesize_async

pytestmark = pytest.mark.slow  # runs a real nginx

ROOT = Path(__file__).resolve().parents[2]
SITE_CONF = ROOT / "deploy" / "nginx.conf"
JS_DIR = ROOT / "clients" / "js"
REVALIDATE = "no-cache"


def find_nginx() -> str:
    path = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if path is None:
        pytest.fail(
            "nginx is not installed: `apt-get install -y nginx` (.ci/run does this on a fresh machine). "
            "tests/deploy/test_nginx.py runs deploy/nginx.conf in a real nginx and is never skipped."
        )
    return path


def _replace_lines(text: str, pattern: str, replacement: str, what: str) -> str:
    """The first line matching ``pattern`` becomes ``replacement`` (same indent), the others go."""
    first = re.search(pattern, text, flags=re.M)
    assert first, f"deploy/nginx.conf has no {what}: the test cannot render it"
    after = re.sub(pattern, "", text[first.end() :], flags=re.M)
    return f"{text[: first.start()]}{first.group(1)}{replacement}\n{after}"


def render_site(conf: str, listen_port: int, upstream: str) -> str:
    """deploy/nginx.conf with nginx on 127.0.0.1:listen_port and one worker, ``upstream``."""
    conf = _replace_lines(conf, r"^([ \t]*)listen[ \t][^;#\n]*;[^\n]*\n", f"listen 127.0.0.1:{listen_port};", "listen line")
    block = re.search(r"^upstream voxwire \{\n.*?^\}", conf, flags=re.M | re.S)
    assert block, "deploy/nginx.conf has no `upstream voxwire { ... }` block"
    body = _replace_lines(block.group(0), r"^([ \t]*)server[ \t][^;#\n]*;[^\n]*\n", f"server {upstream};", "upstream server")
    return conf[: block.start()] + body + conf[block.end() :]


def main_conf(d: Path) -> str:
    """The full test config: the main and http contexts around the shipped site file,
    with every path nginx writes inside ``d``."""
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must reach the temp dirs in d
    return f"""{user}worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log notice;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    include {d}/voxwire.conf;
}}
"""


@dataclass
class Nginx(Loopback):
    dir: Path

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.dir / name).read_text(errors='replace')[-4000:]}"
            for name in ("stderr.log", "error.log")
            if (self.dir / name).is_file()
        )


@contextlib.contextmanager
def run_nginx(site_conf: str, upstream: RunningServer, d: Path) -> Iterator[Nginx]:
    """A real nginx in the foreground, on a free port, with ``site_conf`` (the text of
    deploy/nginx.conf) rendered to proxy to ``upstream``."""
    binary = find_nginx()
    port = free_port()
    (d / "voxwire.conf").write_text(render_site(site_conf, port, f"{upstream.host}:{upstream.port}"))
    (d / "nginx.conf").write_text(main_conf(d))
    proxy = Nginx("127.0.0.1", port, d)
    with open(d / "stderr.log", "wb") as err:
        proc = subprocess.Popen(
            [binary, "-p", f"{d}/", "-e", f"{d}/error.log", "-c", f"{d}/nginx.conf", "-g", "daemon off;"],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err,
        )
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"nginx exited with {proc.returncode} on the config rendered from deploy/nginx.conf:\n{proxy.logs()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"nginx did not listen on 127.0.0.1:{port} within 15 s:\n{proxy.logs()}")
                time.sleep(0.05)
        yield proxy
    finally:
        proc.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def nginx(piper_server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    with run_nginx(SITE_CONF.read_text(), piper_server, tmp_path_factory.mktemp("nginx")) as proxy:
        yield proxy


# -- the WebSocket, through the proxy --------------------------------------------------


async def test_real_speech_through_nginx_in_frames_of_the_asked_duration(nginx):
    result = await synthesize_async(SENTENCE, nginx.ws, sample_rate=16000)
    assert len(result.data) == 2 * result.done["samples"]
    assert_speech(result.audio, 16000, words=9)

    async with await Client.connect(nginx.ws) as client:
        u = await client.speak(SEVERAL, chunk_ms=150, sample_rate=16000)
        async with asyncio.timeout(120):
            frames, done = await u.collect()
    assert done.type == "done" and done["chunks"] == len(frames) and done["samples"] == sum(f.samples for f in frames)
    assert 2100 <= frames[0].samples <= 2400  # 150 ms of engine audio, less the resampler's delay
    assert all(f.samples == 2400 for f in frames[1:-1])  # then 150 ms at 16 kHz
    assert 0 < frames[-1].samples <= 2400
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert [f.offset for f in frames] == list(np.cumsum([0] + [f.samples for f in frames[:-1]]))
    assert_speech(np.concatenate([f.to_float32() for f in frames]), 16000, words=27)


async def test_audio_is_streamed_through_nginx_not_buffered(nginx):
    """The first sentence's audio must reach the client while the utterance is still
    open (its text not final, so no `done` can exist yet): nothing holds frames back."""
    async with await Client.connect(nginx.ws) as client:
        u = await client.speak("The first sentence is already complete. ", ctx="open", final=False, sample_rate=16000)
        items = aiter(u)
        before: list[str] = []
        async with asyncio.timeout(60):
            while not isinstance(first := await anext(items), Audio):
                before.append(first.type)
        assert before == ["started"]
        await u.send("And then the rest of the text arrives.", final=True)
        rest = []
        async with asyncio.timeout(60):
            async for item in items:
                rest.append(item)
    done = rest[-1]
    assert done.type == "done" and done.received_at > first.received_at
    assert first.seq == 0 and done["chunks"] == 1 + sum(isinstance(i, Audio) for i in rest)
    assert done["engine_steps_at_first_chunk"] < done["engine_steps"]


async def test_cancel_through_nginx(nginx, piper_server):
    worker = piper_server.service.worker
    async with await Client.connect(nginx.ws) as client:
        u = await client.speak(SEVERAL * 4, ctx="long")
        frames: list[Audio] = []
        async with asyncio.timeout(60):
            async for item in u:
                if isinstance(item, Audio):
                    frames.append(item)
                    if len(frames) == 1:
                        await u.cancel()
                elif item.type != "started":
                    break
        assert item.type == "cancelled", item
        # Every frame the server sent before `cancelled` came through, and nothing else.
        assert item["frames"] == len(frames) and item["samples_sent"] == sum(f.samples for f in frames) > 0
        for _ in range(500):  # the cancel reached the worker, which dropped the utterance
            if worker.active == 0:
                break
            await asyncio.sleep(0.01)
        assert worker.active == 0
        # The socket carries on through the proxy.
        async with asyncio.timeout(60):
            frames, done = await (await client.speak("Next.", ctx="next")).collect()
        assert done.type == "done" and frames


# -- HTTP, through the proxy -------------------------------------------------------------


async def test_health_and_voices_through_nginx(nginx):
    async with httpx.AsyncClient(base_url=nginx.http, timeout=30) as http:
        health = await http.get("/healthz")
        voices = await http.get("/v1/voices")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert health.headers["server"].startswith("nginx")  # it went through nginx
    assert voices.status_code == 200 and voices.json()["default"] == "joe"
    assert "joe" in [v["id"] for v in voices.json()["voices"]]


async def test_demo_page_and_static_client_through_nginx(nginx):
    async with httpx.AsyncClient(base_url=nginx.http, timeout=30) as http:
        demo = await http.get("/", follow_redirects=True)
        statics = {
            name: await http.get(f"/client/{name}")
            for name in ("index.js", "voxwire.js", "player-worklet.js", "demo.css", "demo.js")
        }
        private = [await http.get(f"/client/{name}") for name in ("package.json", "README.md", "test/pcm.test.js", "tools/screenshot.py")]
        etag = statics["voxwire.js"].headers.get("etag")
        revalidated = await http.get("/client/voxwire.js", headers={"If-None-Match": etag}) if etag else None
        missing = await http.get("/client/no-such-file.js")

    # `/` redirects to the demo page, on nginx's address (not the worker's).
    assert [r.status_code for r in demo.history] in ([307], [302])
    assert httpx.URL(nginx.http).join(demo.history[0].headers["location"]).port == nginx.port
    assert demo.status_code == 200 and demo.url.path == "/client/demo.html"
    assert demo.headers["content-type"].startswith("text/html") and 'src="demo.js"' in demo.text
    # The HTML is revalidated, so a new release reaches browsers.
    assert "immutable" not in demo.headers.get("cache-control", "")
    assert "max-age=31536000" not in demo.headers.get("cache-control", "")

    for name, r in statics.items():
        assert r.status_code == 200, name
        assert r.headers.get("cache-control") == REVALIDATE, name
        assert r.content == (JS_DIR / name).read_bytes(), name
    assert statics["voxwire.js"].headers["content-type"].startswith(("text/javascript", "application/javascript"))
    if revalidated is not None:
        assert revalidated.status_code == 304 and revalidated.headers.get("cache-control") == REVALIDATE
    assert missing.status_code == 404 and "immutable" not in missing.headers.get("cache-control", "")
    assert [r.status_code for r in private] == [404] * 4  # the client's tests and metadata are not served


# -- uploads: nginx's body-size limit --------------------------------------------------


def wav_bytes(n_bytes: int, rate: int = 16000) -> bytes:
    t = np.arange(n_bytes // 2) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


MIB16 = 16 * 1024 * 1024  # Voxwire's limit on a voice upload's request body
BOUNDARY = "voxwire-nginx-test"


def multipart_of_size(total: int) -> bytes:
    """A /v1/voices form of exactly ``total`` bytes, its audio field zero bytes."""
    head = "".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in (("transcript", "Hello."), ("name", "big"))
    ) + f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="audio"; filename="ref.wav"\r\nContent-Type: audio/wav\r\n\r\n'
    tail = f"\r\n--{BOUNDARY}--\r\n"
    body = head.encode() + bytes(total - len(head) - len(tail)) + tail.encode()
    assert len(body) == total
    return body


async def test_uploads_up_to_the_apps_limit_reach_it(nginx):
    """2 MB is over nginx's default 1 MiB: with the shipped limit it reaches Voxwire, which
    answers for Piper with its own JSON 501 (not nginx's HTML 413). A body of exactly
    16 MiB still reaches the app, which reads it before its 501 (else nginx, still sending
    it, would answer 502); one byte more gets the app's JSON error from nginx, and
    never a 502, however often it is tried on one connection."""
    form = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    async with httpx.AsyncClient(base_url=nginx.http, timeout=60) as http:
        r = await http.post(
            "/v1/voices", files={"audio": ("ref.wav", wav_bytes(2_000_000), "audio/wav")}, data={"transcript": "Hello.", "name": "big"}
        )
        assert r.status_code == 501, (r.status_code, r.text[:300])
        assert r.json()["error"]["code"] == "voice_registration_unsupported"

        at_limit = await http.post("/v1/voices", content=multipart_of_size(MIB16), headers=form)
        assert at_limit.status_code == 501, (at_limit.status_code, at_limit.text[:300])  # the app's answer, not a 502
        assert at_limit.json()["error"]["code"] == "voice_registration_unsupported"

        over = multipart_of_size(MIB16 + 1)
        for _ in range(3):
            r = await http.post("/v1/voices", content=over, headers=form)
            assert r.status_code == 413, (r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("application/json")
            assert r.json()["error"]["code"] == "upload_too_large"


async def test_a_speech_request_over_the_apps_limit_gets_its_413_never_a_502(nginx):
    """The speech route's body limit is the app's 128 KiB at nginx too: an 8 MiB body (once
    let through by the server-wide 16m, refused unread by the app, and answered 502 by
    nginx most of the time) gets OpenAI's 413, every time; one within it is spoken."""
    from voxwire.server.doors.openai import MAX_BODY_BYTES

    padding = "x" * (8 << 20)
    async with httpx.AsyncClient(base_url=nginx.http, timeout=60) as http:
        for _ in range(3):
            r = await http.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "joe", "pad": padding})
            assert r.status_code == 413, (r.status_code, r.text[:300])
            assert r.json()["error"]["code"] == "request_too_large"
            assert r.json()["error"]["type"] == "invalid_request_error"
        near = "x" * (MAX_BODY_BYTES - 1024)
        r = await http.post("/v1/audio/speech", json={
            "model": "tts-1", "input": "Hi.", "voice": "joe", "response_format": "pcm", "pad": near,
        })
        assert r.status_code == 200 and len(r.content) > 0


# -- streamed HTTP bodies: proxy_buffering off under /v1/ ------------------------------


@contextlib.contextmanager
def serve_app(app: Starlette) -> Iterator[RunningServer]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started or not thread.is_alive():
            break
        time.sleep(0.05)
    assert server.started, "the streaming stub did not start"
    try:
        yield RunningServer("127.0.0.1", port, None)  # type: ignore[arg-type]
    finally:
        server.should_exit = True
        thread.join(10)


CHUNK = 64 * 1024
TOTAL_CHUNKS = 1024  # 64 MiB: far more than the loopback sockets and nginx can hold in flight


def test_a_streamed_http_body_is_not_buffered(tmp_path):
    """What a streaming HTTP route (a future POST /v1/audio/speech) needs from /v1/: the
    first chunk reaches the client before the rest exists, and a client that stops
    reading stops the producer (backpressure) instead of nginx reading the whole body
    ahead into memory and temp files. The upstream is a stub that streams 64 MiB."""
    release = threading.Event()
    produced = [0]

    async def speech(request: Request) -> StreamingResponse:
        async def body():
            yield b"first-chunk"
            for _ in range(300):  # the rest waits (at most 30 s) for the client to see the first
                if release.is_set():
                    break
                await asyncio.sleep(0.1)
            for _ in range(TOTAL_CHUNKS):
                yield bytes(CHUNK)
                produced[0] += 1

        return StreamingResponse(body(), media_type="application/octet-stream")

    app = Starlette(routes=[Route("/v1/audio/speech", speech, methods=["POST"])])
    with serve_app(app) as stub, run_nginx(SITE_CONF.read_text(), stub, tmp_path) as proxy:
        with httpx.Client(base_url=proxy.http, timeout=httpx.Timeout(20)) as http:
            with http.stream("POST", "/v1/audio/speech", json={"input": "Hello."}) as r:
                assert r.status_code == 200
                chunks = r.iter_raw()
                first = next(chunks)  # times out (20 s) if nginx holds the body back
                assert first == b"first-chunk" and not release.is_set()
                release.set()
                # Read nothing more until the producer stalls (0.5 s without progress).
                last, still = -1, 0
                for _ in range(100):
                    time.sleep(0.1)
                    still = still + 1 if produced[0] == last else 0
                    last = produced[0]
                    if still >= 5 or last == TOTAL_CHUNKS:
                        break
                stalled_at = produced[0]
                rest = sum(len(c) for c in chunks)
    assert stalled_at < TOTAL_CHUNKS, "nginx read the whole streamed body ahead of a client that was not reading"
    assert rest == TOTAL_CHUNKS * CHUNK and produced[0] == TOTAL_CHUNKS


def test_openai_speech_streams_through_nginx(nginx):
    import io

    import numpy as np
    import openai
    import soundfile

    sdk = openai.OpenAI(base_url=nginx.http + "/v1", api_key="unused", max_retries=0)
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="joe", input="Streaming speech through nginx, chunk by chunk.", response_format="wav"
    ) as response:
        assert response.headers.get("server", "").startswith("nginx")
        chunks = list(response.iter_bytes())
    assert len(chunks) > 3
    audio, rate = soundfile.read(io.BytesIO(b"".join(chunks)), dtype="float32")
    assert rate == 24000 and audio.size > rate and np.sqrt(np.mean(audio**2)) > 0.01


async def test_stalled_listeners_through_nginx_are_reclaimed(tmp_path):
    """Behind nginx a client that stops listening is still found out (stall_timeout_seconds):
    one that reads but never reports more progress than its first `played: 0`, one that
    reports that and then reads nothing (the flow window holds both, so the server sees it
    at once, whatever nginx buffers), and one that reports nothing and reads nothing
    (found once nginx's buffers are full and the socket takes nothing). Each utterance
    ends `listener_stalled`, and its slot serves a new client."""
    from voxwire.server.config import ServerConfig
    from voxwire.server.limits import Limits
    from tests.conftest import run_server
    from tests.fixtures.engines import ToneEngine
    from tests.server.test_metrics import scrape
    from tests.server.test_stalls import LONG, NO_PROGRESS, NOT_READING, Reader, deaf_client, message, speak, until

    limits = Limits(max_utterances_total=3, stall_timeout_seconds=2.0, flow_window_seconds=1.0)
    config = ServerConfig(limits=limits, cache_mb=0)
    with (
        run_server(config, engine=lambda: ToneEngine(step_delay=0.002)) as s,
        run_nginx(SITE_CONF.read_text(), s, tmp_path) as proxy,
    ):
        before = scrape(s)
        reader = await Reader.connect(proxy)
        await reader.ws.send(speak("quiet", LONG))
        await reader.ws.send(message(type="progress", ctx="quiet", played=0))
        paced_deaf, deaf = await deaf_client(proxy), await deaf_client(proxy)
        await paced_deaf.send(speak("paced", LONG))
        await paced_deaf.send(message(type="progress", ctx="paced", played=0))
        await deaf.send(speak("deaf", LONG))
        await until(lambda: s.service.admission.utterances == 3, 10, "three utterances admitted")

        end = await reader.ended("quiet", 30)
        assert end["type"] == "error" and end["code"] == "listener_stalled" and end["terminal"] is True, end
        await until(lambda: scrape(s)[NO_PROGRESS] - before[NO_PROGRESS] == 2, 30, "both paced listeners reclaimed")
        # nginx holds megabytes for the deaf one before the server's sends block.
        await until(lambda: s.service.admission.utterances == 0, 90, "the deaf listener reclaimed")
        assert scrape(s)[NOT_READING] - before[NOT_READING] == 1

        async with await Client.connect(proxy.ws) as client:
            frames, done = await asyncio.wait_for((await client.speak("quick brown fox jumps.")).collect(), 30)
        assert done["samples"] == sum(f.samples for f in frames) > 0
        await reader.close()
        for ws in (paced_deaf, deaf):
            ws.transport.abort()
