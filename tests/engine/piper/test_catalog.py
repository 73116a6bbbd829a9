"""``voxwire voices list | download`` against a local HTTP server in the Piper voices
repository's layout (``voices.json`` and the files under their paths), serving a voice
made by piper-tts's training code: a whole download, a truncated file, a connection lost
mid-file, a wrong digest, a catalog without the config, a 404 and an unknown name.
Nothing half-written is left."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from voxwire.benchmarks.catalog_mirror import add_voice, serve, write_catalog
from voxwire.engine.piper.catalog import CatalogError, Downloads, download, read_catalog
from voxwire.engine.piper.engine import voices_in

FOLDER = "en/en_US/test/x_low"
KEY = "en_US-test-x_low"


@pytest.fixture(scope="module")
def repository(reference_voices, tmp_path_factory) -> Path:
    """The layout, with one good voice and one voice for each way a download goes wrong."""
    root = tmp_path_factory.mktemp("piper-voices-repo")
    catalog: dict = {}
    model = reference_voices["x_low"]
    folders = {bad: add_voice(root, catalog, f"en_US-{bad}-x_low", model)
               for bad in ("test", "truncated", "digest", "noconfig", "gone")}
    served = root / folders["truncated"] / "en_US-truncated-x_low.onnx"
    served.write_bytes(served.read_bytes()[:1000])  # the server's copy cut short
    catalog["en_US-digest-x_low"]["files"][f"{folders['digest']}/en_US-digest-x_low.onnx"]["md5_digest"] = "0" * 32
    del catalog["en_US-noconfig-x_low"]["files"][f"{folders['noconfig']}/en_US-noconfig-x_low.onnx.json"]
    (root / folders["gone"] / "en_US-gone-x_low.onnx").unlink()  # listed, but a 404
    catalog["de_DE-other-medium"] = {"language": {"code": "de_DE"}, "quality": "medium", "num_speakers": 3,
                                     "speaker_id_map": {"anna": 0, "ben": 2}, "files": {}}
    write_catalog(root, catalog)
    return root


@pytest.fixture(scope="module")
def base(repository) -> Iterator[str]:
    with serve(repository) as catalog:
        yield catalog.base


def test_the_catalog_lists_each_voice_with_its_files(base):
    catalog = read_catalog(base)
    voice = catalog[KEY]
    assert (voice.language, voice.quality, voice.speakers) == ("en_US", "x_low", 1)
    assert voice.model is not None and voice.model.path == f"{FOLDER}/{KEY}.onnx"
    assert catalog["en_US-noconfig-x_low"].config is None
    other = catalog["de_DE-other-medium"]
    assert (other.speakers, other.speaker_names, other.sample_rate) == (3, ("anna", "1", "ben"), 22050)
    assert voice.sample_rate == 16000 and voice.speaker_names == ()


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


def test_a_folder_that_cannot_be_written_is_said_in_one_line(base, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(CatalogError, match="cannot write into .*a-file"):
        download(KEY, blocked, base)
    assert blocked.read_text() == "not a folder"


def test_a_download_cut_off_mid_file_says_so_and_leaves_nothing(repository, tmp_path):
    with serve(repository) as mirror:
        mirror.cuts[f"{FOLDER}/{KEY}.onnx"] = 4096
        with pytest.raises(CatalogError, match="4096 bytes where the catalog says"):
            download(KEY, tmp_path, mirror.base)
        assert list(tmp_path.iterdir()) == []
        del mirror.cuts[f"{FOLDER}/{KEY}.onnx"]  # the control: the same mirror, not cut
        assert download(KEY, tmp_path, mirror.base).is_file()


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


def test_a_server_keeps_a_copy_of_the_catalog_for_when_it_cannot_be_reached(base, tmp_path, caplog):
    folder = tmp_path / "voices"
    read = Downloads(base, folder).catalog()
    assert KEY in read and (folder / "voices.json").is_file()
    assert [p.name for p in folder.iterdir()] == ["voices.json"]  # nothing half-written beside it
    unreachable = "http://127.0.0.1:9/"  # the discard port: refused
    with caplog.at_level(logging.WARNING):
        assert Downloads(unreachable, folder).catalog() == read
        assert "the copy kept in" in caplog.text
        caplog.clear()
        assert Downloads(unreachable, tmp_path / "elsewhere").catalog() == {}
        assert "only the voices already there are served" in caplog.text
