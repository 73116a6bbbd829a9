"""``voxwire voices list | download`` against a local HTTP server in the Piper voices
repository's layout (``voices.json`` and the files under their paths), serving a voice
made by piper-tts's training code: a whole download, a truncated file, a wrong digest, a
catalog without the config, a 404 and an unknown name. Nothing half-written is left."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from voxwire.engine.piper.catalog import CatalogError, download, read_catalog
from voxwire.engine.piper.engine import voices_in

FOLDER = "en/en_US/test/x_low"
KEY = "en_US-test-x_low"


def _entry(root: Path, files: dict[str, Path], quality: str = "x_low", speakers: int = 1) -> dict:
    out = {}
    for name, source in files.items():
        path = f"{FOLDER}/{name}"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, root / path)
        data = source.read_bytes()
        out[path] = {"size_bytes": len(data), "md5_digest": hashlib.md5(data).hexdigest()}
    return {"key": "", "language": {"code": "en_US", "family": "en"}, "quality": quality,
            "num_speakers": speakers, "speaker_id_map": {}, "files": out}


@pytest.fixture(scope="module")
def repository(reference_voices, tmp_path_factory) -> Path:
    """The layout, with one good voice and one voice for each way a download goes wrong."""
    root = tmp_path_factory.mktemp("piper-voices-repo")
    model, config = reference_voices["x_low"], Path(f"{reference_voices['x_low']}.json")
    catalog = {KEY: _entry(root, {f"{KEY}.onnx": model, f"{KEY}.onnx.json": config})}
    for bad in ("truncated", "digest", "noconfig", "gone"):
        key = f"en_US-{bad}-x_low"
        catalog[key] = _entry(root, {f"{key}.onnx": model, f"{key}.onnx.json": config})
    served = root / f"{FOLDER}/en_US-truncated-x_low.onnx"
    served.write_bytes(served.read_bytes()[:1000])  # the server's copy cut short
    catalog["en_US-digest-x_low"]["files"][f"{FOLDER}/en_US-digest-x_low.onnx"]["md5_digest"] = "0" * 32
    del catalog["en_US-noconfig-x_low"]["files"][f"{FOLDER}/en_US-noconfig-x_low.onnx.json"]
    (root / f"{FOLDER}/en_US-gone-x_low.onnx").unlink()  # listed, but a 404
    catalog["de_DE-other-medium"] = dict(_entry(root, {}), language={"code": "de_DE"}, quality="medium", num_speakers=3)
    (root / "voices.json").write_text(json.dumps(catalog), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def base(repository) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(repository))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_catalog_lists_each_voice_with_its_files(base):
    catalog = read_catalog(base)
    voice = catalog[KEY]
    assert (voice.language, voice.quality, voice.speakers) == ("en_US", "x_low", 1)
    assert voice.model is not None and voice.model.path == f"{FOLDER}/{KEY}.onnx"
    assert catalog["en_US-noconfig-x_low"].config is None
    assert catalog["de_DE-other-medium"].speakers == 3


def test_a_downloaded_voice_is_the_repositorys_and_a_voices_folder_reads_it(base, repository, tmp_path):
    model = download(KEY, tmp_path / "voices", base)
    assert model == tmp_path / "voices" / f"{KEY}.onnx"
    assert model.read_bytes() == (repository / FOLDER / f"{KEY}.onnx").read_bytes()
    assert Path(f"{model}.json").read_bytes() == (repository / FOLDER / f"{KEY}.onnx.json").read_bytes()
    assert sorted(p.name for p in model.parent.iterdir()) == [f"{KEY}.onnx", f"{KEY}.onnx.json"]
    assert [v.id for v in voices_in(model.parent)] == [KEY]


@pytest.mark.parametrize(
    "key, says",
    [
        ("en_US-truncated-x_low", "1000 bytes where the catalog says"),
        ("en_US-digest-x_low", "the catalog's 00000000"),
        ("en_US-noconfig-x_low", "lists no config (.onnx.json)"),
        ("en_US-gone-x_low", "HTTP 404"),
        ("en_US-nobody-x_low", "no voice 'en_US-nobody-x_low' in the catalog"),
    ],
)
def test_a_download_that_fails_says_why_and_leaves_nothing(base, tmp_path, key, says):
    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / "keep.onnx").write_bytes(b"someone else's")
    with pytest.raises(CatalogError, match=says.replace("(", r"\(").replace(")", r"\)")):
        download(key, folder, base)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.onnx"]


def _voices(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voxwire", "voices", *args], capture_output=True, text=True, timeout=120)


def test_the_command_lists_and_downloads_and_fails_in_one_line(base, tmp_path):
    listed = _voices("--base-url", base, "list", "--language", "en")
    assert listed.returncode == 0
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [KEY, "en_US", "x_low", "1"] in rows and not any(r[0].startswith("de_DE") for r in rows)
    fetched = _voices("--base-url", base, "download", KEY, "--dir", str(tmp_path))
    assert fetched.returncode == 0 and (tmp_path / f"{KEY}.onnx").is_file(), fetched.stderr
    failed = _voices("--base-url", base, "download", "en_US-gone-x_low", "--dir", str(tmp_path))
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and "HTTP 404" in failed.stderr
