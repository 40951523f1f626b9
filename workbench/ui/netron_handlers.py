"""The inline-Netron routes, inside the Jupyter server: the page, Netron's files, the model.

``netron_server`` declares this module as its extension point, so only jupyter_server imports
it, and jupyter_server and tornado (the ``lab`` extra) are imported at the top. Each handler
is given the registry folder and Netron's folder (tornado's ``initialize``); the routes are
listed in ``netron_server``'s docstring.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .netron_server import _netron_dir, index_html
from .netronview import REGISTRY, ROUTE

KEY = r"(?P<key>[A-Za-z0-9_-]{16,64})"
ASSET_TYPES = {".js": "text/javascript", ".css": "text/css", ".json": "application/json",
               ".png": "image/png", ".ico": "image/x-icon"}

# Netron's page runs only its own scripts (index.js and the modules it loads, same origin):
# no inline or foreign script, no plugins, framed only by JupyterLab (same origin); its
# inline styles and the data:/blob: images of its exports are allowed.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
       "worker-src 'self' blob:; object-src 'none'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'self'")


class _Handler(JupyterHandler):
    """What every route shares: the registry entry of a key (404 when there is none)."""

    def initialize(self, registry: Path, netron_dir: Path) -> None:
        self._registry = registry
        self._netron_dir = netron_dir

    def _entry(self, key: str) -> dict[str, Any]:
        f = self._registry / f"{key}.json"
        try:
            entry = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise web.HTTPError(404, "no model registered under this key") from None
        return entry


class PageHandler(_Handler):
    """Netron's ``index.html``, pointed at the registered model."""

    @web.authenticated
    def get(self, key: str) -> None:
        entry = self._entry(key)
        if not self.request.path.endswith("/"):  # relative addresses need the slash
            self.redirect(self.request.path + "/")
            return
        # Netron asks for consent to cookies once per browser; the page is local, say yes
        self.set_cookie("consent", str(int(time.time() * 1000)),
                        path=url_path_join(self.base_url, ROUTE, key) + "/")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(index_html(entry["main"], self._netron_dir))


class AssetHandler(_Handler):
    """Netron's static files, from the ``netron`` package; nothing outside its folder."""

    @web.authenticated
    def get(self, key: str, name: str) -> None:
        self._entry(key)
        ext = Path(name).suffix
        path = (self._netron_dir / name).resolve()
        if ext not in ASSET_TYPES or path.parent != self._netron_dir or not path.is_file():
            raise web.HTTPError(404)
        self.set_header("Content-Type", ASSET_TYPES[ext])
        self.set_header("Cache-Control", "private, max-age=3600")
        self.finish(path.read_bytes())


class DataHandler(_Handler):
    """A file the kernel registered under the key; any other name is refused (403)."""

    @web.authenticated
    async def get(self, key: str, name: str) -> None:
        files = self._entry(key).get("files", {})
        if name not in files:
            raise web.HTTPError(403, "this file was not registered for this model")
        path = Path(files[name])
        if not path.is_file():
            raise web.HTTPError(404, "the registered file is gone")
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Disposition", "attachment")
        with open(path, "rb") as f:  # in chunks: weights can be large
            while chunk := f.read(1 << 20):
                self.write(chunk)
                await self.flush()
        self.finish()


def _load_jupyter_server_extension(serverapp: Any) -> None:
    folders = {"registry": Path(serverapp.runtime_dir) / REGISTRY, "netron_dir": _netron_dir()}
    base = url_path_join(serverapp.base_url, ROUTE)
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, KEY) + "/?", PageHandler, folders),
        (url_path_join(base, KEY, "data", r"(?P<name>[^/]+)"), DataHandler, folders),
        (url_path_join(base, KEY, r"(?P<name>[A-Za-z0-9_.-]+)"), AssetHandler, folders),
    ])
    serverapp.log.info("workbench: inline Netron served at %s/", base)
