"""The browser client's files under ``/client``: only what ships, always revalidated.

Only the files a page loads are served: the library modules that package.json ships and
the demo page with its own script, style and timeline. The client's tests, tools and
package metadata stay private. Every file is sent with ``Cache-Control: no-cache``: a
browser keeps it but asks again each time (a cheap 304 with the ETag), because the file
names carry no version and a module's relative imports cannot carry one either, so a
long-lived cache would keep an old module after an upgrade.
"""

from __future__ import annotations

import json
from pathlib import Path

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

DEMO_FILES = frozenset({"demo.html", "demo.js", "demo.css", "timeline.js", "example.html"})
CACHE_CONTROL = "no-cache"


PAGE_SUFFIXES = (".js", ".css", ".html")


def shipped_files(directory: Path) -> frozenset[str]:
    """The modules package.json ships (not its README) and the demo page's files."""
    package = json.loads((directory / "package.json").read_text())
    modules = {name for name in package.get("files", ()) if name.endswith(PAGE_SUFFIXES)}
    return frozenset(modules) | DEMO_FILES


class ClientFiles(StaticFiles):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory=directory)
        self.allowed = shipped_files(directory)

    async def get_response(self, path: str, scope: Scope) -> Response:
        if path not in self.allowed:
            return Response("Not Found", status_code=404, media_type="text/plain")
        response = await super().get_response(path, scope)
        if response.status_code in (200, 304):
            response.headers["Cache-Control"] = CACHE_CONTROL
        return response
