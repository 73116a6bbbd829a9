"""Piper's public voice catalog, and voices fetched from it: by ``voxwire voices list |
download``, or by a server on a voice's first request (``--download-voices``: ``Downloads``).

The catalog is the layout of the Piper voices repository (rhasspy/piper-voices):
``voices.json`` at its base maps each voice's key (``en_US-lessac-medium``) to its
language, quality, speakers and files, each file by its path under the base with its
``size_bytes`` and ``md5_digest``. A download fetches a voice's ``MODEL.onnx`` and
``MODEL.onnx.json`` into a folder ``--piper-voices-dir`` reads, each checked against
the catalog's size and digest before it takes its name there: the config first, then the
model, so that a voice the folder lists is whole (a model without its config is never
left, and a config alone is not a voice). Nothing is downloaded but what is asked for.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import logging
import os
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BASE_URL = "https://huggingface.co/rhasspy/piper-voices/resolve/main/"
DEFAULT_DIR = Path("pretrained_models/piper-voices")
TIMEOUT_SECONDS = 60
BLOCK = 1 << 20
# The rate each quality is trained at (Piper's training recipe): the catalog names a
# voice's quality, not its rate, and a server lists a voice before its config is here.
QUALITY_RATES = {"x_low": 16000, "low": 16000, "medium": 22050, "high": 22050}
CATALOG_COPY = "voices.json"
"""The last catalog a server read, kept in its voices folder for when the catalog cannot be reached."""


class CatalogError(Exception):
    """A catalog or a download that cannot be used, said in one line."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    """Under the base URL."""
    size: int
    md5: str


@dataclass(frozen=True)
class CatalogVoice:
    key: str
    language: str
    quality: str
    speakers: int
    model: RemoteFile | None
    config: RemoteFile | None
    speaker_names: tuple[str, ...] = ()
    """A multi-speaker voice's speakers, each at its id (``speaker_names``)."""

    @property
    def sample_rate(self) -> int | None:
        """Its rate, as its quality implies (None: a quality Piper does not name)."""
        return QUALITY_RATES.get(self.quality)


def speaker_names(speakers: int, id_map: Mapping[str, Any]) -> tuple[str, ...]:
    """A voice's speakers named at their ids from its ``speaker_id_map``, an id the map
    leaves out by its number; empty for a voice with one speaker."""
    n = speakers if speakers > 1 else 0
    names = [str(i) for i in range(n)]
    for name, i in id_map.items():
        if isinstance(i, int) and 0 <= i < n:
            names[i] = name
    return tuple(names)


def _url(base: str, path: str) -> str:
    return urllib.parse.urljoin(base if base.endswith("/") else base + "/", urllib.parse.quote(path))


def _open(url: str) -> Any:
    try:
        return urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as e:
        raise CatalogError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise CatalogError(f"{url}: {getattr(e, 'reason', e)}") from None


def _file(files: Mapping[str, Any], suffix: str) -> RemoteFile | None:
    for path, about in files.items():
        if path.endswith(suffix) and isinstance(about, dict):
            size, md5 = about.get("size_bytes"), about.get("md5_digest")
            if isinstance(size, int) and isinstance(md5, str):
                return RemoteFile(path, size, md5.lower())
    return None


def read_catalog(base: str = BASE_URL) -> dict[str, CatalogVoice]:
    """The voices of the catalog at ``base``, by key. Raises ``CatalogError``."""
    return parse_catalog(_catalog_bytes(base), _url(base, "voices.json"))


def _catalog_bytes(base: str) -> bytes:
    url = _url(base, "voices.json")
    with _open(url) as response:
        try:
            data: bytes = response.read()
        except (OSError, http.client.HTTPException) as e:
            raise CatalogError(f"{url}: {e or type(e).__name__}") from None
    return data


def parse_catalog(data: bytes, where: str) -> dict[str, CatalogVoice]:
    """The voices of a ``voices.json`` read from ``where``, by key. Raises ``CatalogError``."""
    try:
        table = json.loads(data)
    except ValueError:
        raise CatalogError(f"{where}: not JSON") from None
    if not isinstance(table, dict):
        raise CatalogError(f"{where}: not a catalog of voices")
    out = {}
    for key, entry in table.items():
        if not isinstance(entry, dict):
            continue
        files = entry.get("files")
        if not isinstance(files, dict):
            files = {}
        language = entry.get("language", {})
        speakers = entry.get("num_speakers", 1)
        speakers = speakers if isinstance(speakers, int) and speakers > 1 else 1
        id_map = entry.get("speaker_id_map")
        out[key] = CatalogVoice(
            key=key,
            language=language.get("code", "") if isinstance(language, dict) else "",
            quality=str(entry.get("quality", "")),
            speakers=speakers,
            model=_file(files, ".onnx"),
            config=_file(files, ".onnx.json"),
            speaker_names=speaker_names(speakers, id_map if isinstance(id_map, dict) else {}),
        )
    return out


def _fetch(url: str, expected: RemoteFile, folder: Path) -> Path:
    """The file at ``url``, written to a temporary file in ``folder`` and checked against
    the catalog's size and digest; removed again if it does not match."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".download-", suffix=".part")
    except OSError as e:
        raise CatalogError(f"cannot write into {folder}: {e.strerror or e}") from None
    part = Path(name)
    try:
        digest, size = hashlib.md5(usedforsecurity=False), 0
        with os.fdopen(fd, "wb") as out, _open(url) as response:
            while block := response.read(BLOCK):
                size += len(block)
                if size > expected.size:
                    break
                digest.update(block)
                out.write(block)
        if size != expected.size:
            raise CatalogError(f"{url}: {'more' if size > expected.size else size} bytes where the catalog says "
                               f"{expected.size}")
        if digest.hexdigest() != expected.md5:
            raise CatalogError(f"{url}: its MD5 is {digest.hexdigest()}, the catalog's {expected.md5}")
        return part
    except (OSError, http.client.HTTPException) as e:  # a connection reset or timed out mid-file, a disk full
        part.unlink(missing_ok=True)
        raise CatalogError(f"{url}: {e or type(e).__name__}") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def download(key: str, folder: Path, base: str = BASE_URL, catalog: Mapping[str, CatalogVoice] | None = None) -> Path:
    """Fetch voice ``key`` into ``folder`` as ``KEY.onnx`` and ``KEY.onnx.json``; its model's
    path. Raises ``CatalogError``, leaving nothing of this voice behind that was not there."""
    voices = read_catalog(base) if catalog is None else catalog
    voice = voices.get(key)
    if voice is None:
        near = sorted(k for k in voices if k.lower().startswith(key.lower().split("-")[0]))[:5]
        hint = f" (the catalog has {', '.join(near)}, ...)" if near else ""
        raise CatalogError(f"no voice {key!r} in the catalog at {base}{hint}; `voxwire voices list` lists them")
    if voice.model is None or voice.config is None:
        missing = "model (.onnx)" if voice.model is None else "config (.onnx.json)"
        raise CatalogError(f"the catalog lists no {missing} for {key!r}, with its size and MD5")
    model = folder / f"{key}.onnx"
    config = folder / f"{key}.onnx.json"
    fetched: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for remote in (voice.config, voice.model):
            fetched.append(_fetch(_url(base, remote.path), remote, folder))
        os.replace(fetched[0], config)
        os.replace(fetched[1], model)
    except OSError as e:  # the folder cannot be made or written
        for part in fetched:
            part.unlink(missing_ok=True)
        raise CatalogError(f"cannot write into {folder}: {e.strerror or e}") from None
    except BaseException:
        for part in fetched:
            part.unlink(missing_ok=True)
        raise
    return model


class Downloads:
    """A server's voices fetched on their first request (``--download-voices``), as
    wyoming-piper fetches them: from the catalog at ``base`` into ``folder``."""

    def __init__(self, base: str, folder: Path) -> None:
        self.base = base
        self.folder = folder
        self._one_at_a_time = threading.Lock()

    def catalog(self) -> dict[str, CatalogVoice]:
        """The catalog, read now and kept in the folder (``CATALOG_COPY``); where it cannot
        be reached, the copy an earlier start kept, else none: a server that starts
        without a network serves the voices it has, and says so."""
        copy = self.folder / CATALOG_COPY
        try:
            data = _catalog_bytes(self.base)
            voices = parse_catalog(data, _url(self.base, "voices.json"))
        except CatalogError as e:
            try:
                voices = parse_catalog(copy.read_bytes(), str(copy))
            except (OSError, CatalogError):
                log.warning("--download-voices: the voice catalog cannot be read (%s), and no copy of it is kept in "
                            "%s: only the voices already there are served", e, self.folder)
                return {}
            log.warning("--download-voices: the voice catalog cannot be read (%s); the copy kept in %s is used",
                        e, copy)
            return voices
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.folder, prefix=".catalog-", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(name, copy)
            except BaseException:
                Path(name).unlink(missing_ok=True)
                raise
        except OSError as e:
            log.warning("--download-voices: the catalog's copy could not be kept in %s (%s)", self.folder, e)
        return voices

    def fetch(self, voice: CatalogVoice) -> Path:
        """Download ``voice`` into the folder; its model's path. Raises ``CatalogError``."""
        with self._one_at_a_time:
            return download(voice.key, self.folder, self.base, {voice.key: voice})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="voxwire voices", description="Piper's public voices: list, download")
    parser.add_argument("--base-url", default=os.environ.get("VOXWIRE_VOICES_URL", BASE_URL),
                        help="the catalog's base, in the Piper voices repository's layout (env VOXWIRE_VOICES_URL; "
                        f"default {BASE_URL})")
    sub = parser.add_subparsers(dest="action", required=True)
    listing = sub.add_parser("list", help="the catalog's voices: key, language, quality, speakers")
    listing.add_argument("--language", help="only this language's (en_US, or en for every English one)")
    fetch = sub.add_parser("download", help="fetch voices into a folder for --piper-voices-dir")
    fetch.add_argument("names", nargs="+", metavar="NAME", help="a voice's key, as `list` gives it")
    fetch.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"where to put them (default {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    try:
        catalog = read_catalog(args.base_url)
        if args.action == "list":
            for v in sorted(catalog.values(), key=lambda v: v.key):
                if args.language is None or v.language == args.language or v.language.split("_")[0] == args.language:
                    print(f"{v.key}\t{v.language}\t{v.quality}\t{v.speakers}")
            return 0
        for name in args.names:
            path = download(name, args.dir, args.base_url, catalog)
            print(f"{name}: {path}")
    except CatalogError as e:
        print(f"voxwire: {e}", file=sys.stderr)
        return 1
    return 0
