"""The WebUI (contract §5 ``GET /ui/``): the static files of the top-level ``webui/`` folder, served
by every node; a browser's ``GET /`` is redirected there.

The files are found in a checkout (``<repo>/webui``, also what an editable install runs) or where
``pip install .`` put them (``<prefix>/share/routerd/webui``, setup.cfg ``data_files``).  They hold
no secrets: the guard lets any allowed network fetch them without a key, and the pages send the
admin key themselves on every API call.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import unquote

from twisted.web.iweb import IRequest

from routerd.api.errors import not_found
from routerd.api.routes import Routes
from routerd.errors import HTTPError

UI_PREFIX = "/ui/"
CONTENT_TYPES: dict[str, bytes] = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".json": b"application/json",
    ".png": b"image/png",
    ".svg": b"image/svg+xml",
    ".txt": b"text/plain; charset=utf-8",
}


def webui_dir(package_root: Path | None = None, prefix: str | None = None) -> Path | None:
    """The folder holding ``index.html``: a checkout's ``webui/``, else the installed copy."""
    here = package_root or Path(__file__).resolve().parents[2]
    for candidate in (here / "webui", Path(prefix or sys.prefix) / "share" / "routerd" / "webui"):
        if (candidate / "index.html").is_file():
            return candidate
    return None


def ui_file(root: Path, relative: str) -> Path | None:
    """The file ``relative`` names under ``root`` (``index.html`` for the folder itself), or None
    when there is none, the name would leave ``root`` or the OS refuses the name."""
    base = root.resolve()
    try:
        target = (base / (relative or "index.html")).resolve()
        if target.is_dir():
            target = target / "index.html"
        if base not in target.parents or not target.is_file():
            return None
    except (OSError, ValueError):  # a NUL byte, a name too long: no such file
        return None
    return target


def _wants_html(request: IRequest) -> bool:
    accept = request.getHeader(b"accept")
    return accept is not None and b"text/html" in accept


class WebUI:
    """``/ui/*`` static files; ``/ui`` and a browser's ``/`` redirect to ``/ui/``."""

    routes = Routes()

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def _redirect(self, request: IRequest) -> bytes:
        request.setResponseCode(302)
        request.setHeader(b"location", UI_PREFIX.encode())
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return b"see /ui/\n"

    @routes.route("/", methods=["GET", "HEAD"], auth="ui")
    def root_page(self, request: IRequest) -> bytes:
        if not _wants_html(request):
            raise not_found("/")
        return self._redirect(request)

    @routes.route("/ui", methods=["GET", "HEAD"], auth="ui")
    def ui_bare(self, request: IRequest) -> bytes:
        return self._redirect(request)

    @routes.route(UI_PREFIX, branch=True, methods=["GET", "HEAD"], auth="ui",
                  docs=(UI_PREFIX, UI_PREFIX + "{file}"))
    def files(self, request: IRequest) -> bytes:
        if self.root is None:
            raise HTTPError(404, "the WebUI files are not installed (webui/ next to the routerd "
                            "package, or <prefix>/share/routerd/webui)", "not_found", "not_found")
        path = request.path.decode("utf-8", "replace")
        target = ui_file(self.root, unquote(path[len(UI_PREFIX):]))
        if target is None:
            raise not_found(path)
        request.setHeader(b"content-type", CONTENT_TYPES.get(target.suffix, b"application/octet-stream"))
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"x-content-type-options", b"nosniff")
        # a handful of small files: read whole, like twisted.web.static does for small ones
        return target.read_bytes()


__all__ = ["CONTENT_TYPES", "UI_PREFIX", "WebUI", "ui_file", "webui_dir"]
