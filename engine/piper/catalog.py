"""``voxwire voices list | download``: Piper's public voice catalog, and voices fetched from it.

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
import json
import os
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASE_URL = "https://huggingface.co/rhasspy/piper-voices/resolve/main/"
DEFAULT_DIR = Path("pretrained_models/piper-voices")
TIMEOUT_SECONDS = 60
BLOCK = 1 << 20


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
    url = _url(base, "voices.json")
    with _open(url) as response:
        try:
            table = json.loads(response.read())
        except ValueError:
            raise CatalogError(f"{url}: not JSON") from None
    if not isinstance(table, dict):
        raise CatalogError(f"{url}: not a catalog of voices")
    out = {}
    for key, entry in table.items():
        if not isinstance(entry, dict):
            continue
        files = entry.get("files")
        if not isinstance(files, dict):
            files = {}
        language = entry.get("language", {})
        out[key] = CatalogVoice(
            key=key,
            language=language.get("code", "") if isinstance(language, dict) else "",
            quality=str(entry.get("quality", "")),
            speakers=int(entry.get("num_speakers", 1) or 1),
            model=_file(files, ".onnx"),
            config=_file(files, ".onnx.json"),
        )
    return out


def _fetch(url: str, expected: RemoteFile, folder: Path) -> Path:
    """The file at ``url``, written to a temporary file in ``folder`` and checked against
    the catalog's size and digest; removed again if it does not match."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=".download-", suffix=".part")
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
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"{key}.onnx"
    config = folder / f"{key}.onnx.json"
    fetched = []
    try:
        for remote in (voice.config, voice.model):
            fetched.append(_fetch(_url(base, remote.path), remote, folder))
    except BaseException:
        for part in fetched:
            part.unlink(missing_ok=True)
        raise
    os.replace(fetched[0], config)
    os.replace(fetched[1], model)
    return model


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
