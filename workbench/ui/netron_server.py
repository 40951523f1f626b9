"""jupyter_server extension: Netron's page and the registered model files, through Jupyter.

Enabled by ``jupyter-config/jupyter_server_config.d/workbench.json`` (installed with the
package into ``etc/jupyter``). Routes, under the server's base URL and its authentication:

- ``workbench/netron/{key}/``            Netron's ``index.html``, pointed at the model
- ``workbench/netron/{key}/{asset}``     Netron's static files, from the ``netron`` package
- ``workbench/netron/{key}/data/{name}`` a file the kernel registered under ``key``; any
                                          other name is refused (403), an unknown key is 404

We serve Netron's files ourselves instead of proxying ``netron.serve``: netron's server
serves every file in the model's folder and runs one more process per model; here nothing
listens anywhere but the Jupyter server, and only the listed files are readable.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from .netronview import REGISTRY, ROUTE

KEY = r"(?P<key>[A-Za-z0-9_-]{16,64})"
ASSET_TYPES = {".js": "text/javascript", ".css": "text/css", ".json": "application/json",
               ".png": "image/png", ".ico": "image/x-icon"}


def enable(user: bool = False) -> Path:
    """Write the config that enables this extension (what a wheel install puts in place).

    For installs that skip data files (editable ones, conda's ``-e .``); ``jupyter server
    extension enable`` only toggles extensions some config already lists.
    """
    import sys

    from jupyter_core.paths import jupyter_config_dir

    base = Path(jupyter_config_dir()) if user else Path(sys.prefix) / "etc" / "jupyter"
    target = base / "jupyter_server_config.d" / "workbench.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {
        "workbench.ui.netron_server": True}}}, indent=2) + "\n", encoding="utf-8")
    return target


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "workbench.ui.netron_server"}]


def _netron_dir() -> Path:
    import netron

    return Path(netron.__file__).resolve().parent


# Netron's page runs only its own scripts (index.js and the modules it loads, same origin):
# no inline or foreign script, no plugins, framed only by JupyterLab (same origin); its
# inline styles and the data:/blob: images of its exports are allowed.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
       "worker-src 'self' blob:; object-src 'none'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'self'")


def index_html(main: str, netron_dir: Path) -> bytes:
    """Netron's page with the model named in its meta tags (as netron's own server does).

    Version 0.0.0 turns off Netron's telemetry (it only reports from a packaged build), and
    dropping the build date turns off its "please update" loop on old installs.
    """
    from html import escape
    from urllib.parse import quote

    text = (netron_dir / "index.html").read_text(encoding="utf-8")
    # the file name is the user's (or an attacker's): escaped for HTML, quoted for the URL,
    # so a name like `x"><script>...` stays text on the Jupyter origin
    meta = ('<meta name="type" content="Python">\n<meta name="version" content="0.0.0">\n'
            f'<meta name="file" content="data/{escape(quote(main, safe=""), quote=True)}">\n'
            f'<meta name="identifier" content="{escape(main, quote=True)}">')
    text = re.sub(r'<meta name="version" content="[^"]*">', lambda _: meta, text, count=1)
    text = re.sub(r'<meta name="date" content="[^"]*">\n?', "", text, count=1)
    return text.encode("utf-8")


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server.base.handlers import JupyterHandler
    from jupyter_server.utils import url_path_join
    from tornado import web

    registry = Path(serverapp.runtime_dir) / REGISTRY
    netron_dir = _netron_dir()

    class _Handler(JupyterHandler):
        def _entry(self, key: str) -> dict[str, Any]:
            f = registry / f"{key}.json"
            try:
                entry = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raise web.HTTPError(404, "no model registered under this key") from None
            return entry

    class PageHandler(_Handler):
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
            self.finish(index_html(entry["main"], netron_dir))

    class AssetHandler(_Handler):
        @web.authenticated
        def get(self, key: str, name: str) -> None:
            self._entry(key)
            ext = Path(name).suffix
            path = (netron_dir / name).resolve()
            if ext not in ASSET_TYPES or path.parent != netron_dir or not path.is_file():
                raise web.HTTPError(404)
            self.set_header("Content-Type", ASSET_TYPES[ext])
            self.set_header("Cache-Control", "private, max-age=3600")
            self.finish(path.read_bytes())

    class DataHandler(_Handler):
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

    base = url_path_join(serverapp.base_url, ROUTE)
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, KEY) + "/?", PageHandler),
        (url_path_join(base, KEY, "data", r"(?P<name>[^/]+)"), DataHandler),
        (url_path_join(base, KEY, r"(?P<name>[A-Za-z0-9_.-]+)"), AssetHandler),
    ])
    serverapp.log.info("workbench: inline Netron served at %s/", base)


if __name__ == "__main__":  # python -m workbench.ui.netron_server enable [--user]
    import sys

    if sys.argv[1:2] != ["enable"]:
        sys.exit("usage: python -m workbench.ui.netron_server enable [--user]")
    print(f"wrote {enable(user='--user' in sys.argv)}; restart JupyterLab")
