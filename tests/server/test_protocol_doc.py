"""docs/protocol.md's own examples and claims, checked against a real server on loopback
(Piper): the complete exchange, replayed line by line, gets the very messages it shows,
with exactly their fields; the `ready` example has the server's fields; and each reader
in the table of a streamed FLAC's readers does what the table says, on both doors' FLAC.

The server keeps a result cache, so the FLAC of one text through the socket and the
OpenAI route and its PCM are made from the very same engine audio, sample for sample."""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgpack
import numpy as np
import orjson
import pytest
import soundfile
import websockets

from voxwire.engine.registry import EngineOptions
from voxwire.server.config import ServerConfig
from tests.conftest import RunningServer, run_server
from tests.server.codec_checks import decode
from voxwire_client import Client
from voxwire_client.formats import as_file

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
FLAC_TEXT = "Lossless speech, streamed as it is made, and read back by three readers."
SF_COUNT_MAX = 2**63 - 1  # what libsndfile takes a FLAC total of 0 ("unknown") to be


@pytest.fixture(scope="module")
def server():
    with run_server(ServerConfig(engine=EngineOptions(name="piper"), cache_mb=64)) as s:
        yield s


# -- reading the doc ----------------------------------------------------------------------


def section(heading: str) -> str:
    """The text under a heading, up to the next heading of the same or a higher level."""
    text = DOC.read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    level = heading.split()[0]
    following = re.compile(rf"^#{{1,{len(level)}}} ", re.M).search(text, start)
    return text[start : following.start() if following else len(text)]


def first_block(text: str) -> str:
    return text.split("```", 2)[1].split("\n", 1)[1]


@dataclass(frozen=True)
class Line:
    """One line of the example exchange: sent (→) or received (←), as the doc shows it."""

    sent: bool
    text: str
    message: dict
    abbreviated: bool  # shown with "...": only its type can be checked here


def exchange() -> list[Line]:
    lines = []
    for raw in first_block(section("## A complete exchange")).splitlines():
        if raw.strip() == "...":  # frames left out
            continue
        arrow, text = raw.split(" ", 1)
        assert arrow in ("→", "←"), raw
        text = text.removeprefix("audio ")
        if "..." in text:
            kind = re.match(r'\{"type":"(\w+)"', text)
            assert kind, raw
            lines.append(Line(arrow == "→", text, {"type": kind.group(1)}, abbreviated=True))
        else:  # an audio frame's bytes are shown by their length
            lines.append(Line(arrow == "→", text, orjson.loads(re.sub(r"<\d+ bytes>", '""', text)), abbreviated=False))
    return lines


def collapsed(messages: list[dict]) -> dict[str | None, list[str]]:
    """Each ctx's message types in order, a run of audio frames counted as one."""
    out: dict[str | None, list[str]] = {}
    for m in messages:
        kinds = out.setdefault(m.get("ctx"), [])
        if not (kinds and kinds[-1] == m["type"] == "audio"):
            kinds.append(m["type"])
    return out


# -- the example exchange ------------------------------------------------------------------


class Receiver:
    """The server's messages, in order, each matched at most once to a line of the doc."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.received: list[dict] = []
        self._unmatched: list[dict] = []

    async def next(self, kind: str, ctx: str | None) -> dict:
        while True:
            for m in self._unmatched:
                if m["type"] == kind and m.get("ctx") == ctx:
                    # What came before it stays unmatched for good: the doc's order must be
                    # the server's (the frames it leaves out are checked by collapsed()).
                    self._unmatched = self._unmatched[self._unmatched.index(m) + 1 :]
                    return m
            data = await asyncio.wait_for(self.ws.recv(), 60)
            m = msgpack.unpackb(data) if isinstance(data, bytes) else orjson.loads(data)
            self.received.append(m)
            self._unmatched.append(m)


async def test_the_example_exchange_is_what_the_server_sends(server):
    lines = exchange()
    assert [line.message["type"] for line in lines if line.sent] == ["config", "speak", "speak", "speak", "speak", "cancel", "speak"]
    pairs = []
    async with websockets.connect(server.ws) as ws:
        receiver = Receiver(ws)
        # Each client line is sent once the server lines before it have arrived, as recorded.
        for line in lines:
            if line.sent:
                await ws.send(line.text)
            else:
                pairs.append((line, await receiver.next(line.message["type"], line.message.get("ctx"))))
    shown = [line.message for line in lines if not line.sent]
    # The same messages for each utterance, in the same order (frames left out are audio).
    assert collapsed(receiver.received) == collapsed(shown)
    for line, real in pairs:
        if not line.abbreviated:
            assert set(line.message) == set(real), (line.text, sorted(real))
        if real["type"] in ("configured", "started", "error"):  # nothing measured in these
            assert line.message == real, line.text


async def test_the_ready_example_has_the_servers_fields(server):
    example = orjson.loads(first_block(section("### `ready`")))
    async with websockets.connect(server.ws) as ws:
        ready = orjson.loads(await ws.recv())
    assert set(example) == set(ready)
    for key in ("defaults", "features", "limits"):
        assert set(example[key]) == set(ready[key]), key
    assert set(example["voices"][0]) == set(ready["voices"][0])
    assert example["formats"] == ready["formats"]


# -- a streamed FLAC and its readers ---------------------------------------------------------


@dataclass(frozen=True)
class Streams:
    pcm: np.ndarray  # int16, the pcm stream of FLAC_TEXT at 24 kHz
    flac: dict[str, bytes]  # door -> the FLAC stream as sent
    samples: int  # done.samples of the socket's FLAC


async def fetch_streams(server: RunningServer) -> Streams:
    async with await Client.connect(server.ws) as client:  # first: it fills the cache
        u = await client.speak(FLAC_TEXT, format="flac", sample_rate=24000)
        frames, done = await u.collect()
    body = {"model": "tts-1", "voice": "joe", "input": FLAC_TEXT}
    async with httpx.AsyncClient(timeout=60) as http:
        url = f"{server.http}/v1/audio/speech"
        openai_flac = (await http.post(url, json={**body, "response_format": "flac"})).content
        pcm = (await http.post(url, json={**body, "response_format": "pcm"})).content
    return Streams(np.frombuffer(pcm, "<i2"), {"socket": b"".join(f.data for f in frames), "openai": openai_flac}, done["samples"])


@pytest.fixture(scope="module")
def streams(server) -> Streams:
    got = asyncio.run(fetch_streams(server))
    assert got.samples == got.pcm.size > 24000  # the same engine audio, from the cache
    return got


class Pipe(io.RawIOBase):
    """Bytes that can only be read forward, as from a pipe or a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        return self._data.readinto(buffer)


def as_s16(x: np.ndarray) -> np.ndarray:
    return np.round(x * 32767).astype(np.int16)


def read_with_pyav(data: bytes, tmp: Path) -> np.ndarray:
    from_file = as_s16(decode(data)[0])
    import av

    with av.open(Pipe(data), format="flac") as container:
        from_pipe = np.concatenate([f.to_ndarray()[0] for f in container.decode(audio=0)])
    np.testing.assert_array_equal(from_pipe, from_file)
    return from_file


def read_with_flac_cli(data: bytes, tmp: Path) -> np.ndarray:
    if shutil.which("flac") is None:
        pytest.skip("the flac command is not installed (Debian: apt-get install flac)")
    (tmp / "in.flac").write_bytes(data)
    subprocess.run(["flac", "-s", "-t", "-"], input=data, check=True)
    subprocess.run(["flac", "-s", "-d", "-f", "-o", str(tmp / "out.wav"), str(tmp / "in.flac")], check=True)
    return soundfile.read(tmp / "out.wav", dtype="int16")[0]


def read_with_libsndfile(data: bytes, tmp: Path) -> np.ndarray:
    (tmp / "in.flac").write_bytes(data)
    return soundfile.read(tmp / "in.flac", dtype="int16")[0]


READERS = {"PyAV": read_with_pyav, "flac": read_with_flac_cli, "libsndfile": read_with_libsndfile}


def flac_readers_in_the_doc() -> dict[str, bool]:
    """The table's readers, each by the name READERS knows it by: does it read the stream?"""
    rows = [r for r in section("#### A streamed FLAC and its readers").splitlines() if r.startswith("| ")][1:]
    verdicts = {}
    for row in rows:
        reader, verdict = (cell.strip() for cell in row.strip("|").split("|")[:2])
        names = [name for name in READERS if name in reader]
        assert len(names) == 1, reader
        assert verdict.startswith(("reads it", "cannot read it")), verdict
        verdicts[names[0]] = verdict.startswith("reads it")
    return verdicts


def test_the_flac_readers_table_names_the_readers_checked_here():
    assert set(flac_readers_in_the_doc()) == set(READERS)


@pytest.mark.parametrize("door", ["socket", "openai"])
@pytest.mark.parametrize("reader", list(READERS))
def test_each_flac_reader_does_what_the_doc_says(streams, reader, door, tmp_path):
    data = streams.flac[door]
    if flac_readers_in_the_doc()[reader]:
        # Every sample: the very samples of the pcm stream (FLAC is lossless).
        np.testing.assert_array_equal(READERS[reader](data, tmp_path), streams.pcm)
    else:
        with pytest.raises((soundfile.LibsndfileError, ValueError, MemoryError)):
            READERS[reader](data, tmp_path)


def test_libsndfile_fails_on_a_streamed_flac_as_the_doc_says(streams, tmp_path):
    path = tmp_path / "speech.flac"
    path.write_bytes(streams.flac["socket"])
    assert soundfile.info(path).frames == SF_COUNT_MAX  # the header's 0, "unknown"
    read = 0
    with soundfile.SoundFile(path) as f, pytest.raises(soundfile.LibsndfileError, match="Internal psf_fseek"):
        while True:  # in pieces: each read but the last that reaches the end
            read += len(f.read(4096, dtype="int16"))
    assert streams.samples - 4096 <= read < streams.samples


def test_flac_cli_on_a_streamed_flac_does_what_the_doc_says(streams, tmp_path):
    if shutil.which("flac") is None:
        pytest.skip("the flac command is not installed (Debian: apt-get install flac)")
    data = streams.flac["openai"]
    wav = subprocess.run(["flac", "-s", "-d", "-c", "-"], input=data, capture_output=True, check=True).stdout
    data_chunk = wav.index(b"data")
    assert int.from_bytes(wav[data_chunk + 4 : data_chunk + 8], "little") == 0  # "a length of 0"
    assert np.array_equal(np.frombuffer(wav[data_chunk + 8 :], "<i2"), streams.pcm)
    (tmp_path / "in.flac").write_bytes(data)
    again = subprocess.run(["flac", "-s", "-f", "-o", str(tmp_path / "again.flac"), str(tmp_path / "in.flac")], capture_output=True, text=True)
    assert again.returncode != 0 and "unknown total samples" in again.stderr


def read_from_a_pipe(data: bytes) -> np.ndarray:
    read_end, write_end = os.pipe()

    def write() -> None:
        with open(write_end, "wb") as w:
            try:
                w.write(data)
            except BrokenPipeError:  # the reader gave up: what the test is about
                pass

    writer = threading.Thread(target=write)
    writer.start()
    try:
        with soundfile.SoundFile(read_end, closefd=False) as f:
            return f.read(len(data) * 8, dtype="int16")
    finally:
        os.close(read_end)
        writer.join(10)


def test_with_its_total_written_in_libsndfile_reads_the_file_and_only_then(streams, tmp_path):
    data = streams.flac["socket"]
    fixed = tmp_path / "fixed.flac"
    fixed.write_bytes(as_file(data, "flac", streams.samples))  # what `voxwire say -o x.flac` does
    np.testing.assert_array_equal(soundfile.read(fixed, dtype="int16")[0], streams.pcm)
    # A total over the true one, as a header sent ahead might guess, fails at the end too.
    over = tmp_path / "over.flac"
    over.write_bytes(as_file(data, "flac", streams.samples + 1))
    with pytest.raises(soundfile.LibsndfileError, match="Internal psf_fseek"):
        soundfile.read(over, dtype="int16")
    # And from a pipe libsndfile reads no FLAC at all, whatever its header says.
    with pytest.raises(soundfile.LibsndfileError):
        read_from_a_pipe(fixed.read_bytes())
