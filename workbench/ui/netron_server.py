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

This module is what the config names and what ``enable`` writes; the handlers are in
``netron_handlers``, the extension point jupyter_server loads (it alone imports
jupyter_server and tornado).
"""

from __future__ import annotations

import json
import re
import sys
from html import escape
from pathlib import Path
from urllib.parse import quote


def enable(user: bool = False) -> Path:
    """Write the config that enables this extension (what a wheel install puts in place).

    For installs that skip data files (editable ones, conda's ``-e .``); ``jupyter server
    extension enable`` only toggles extensions some config already lists.
    """
    from jupyter_core.paths import jupyter_config_dir  # the lab extra: only when enabling

    base = Path(jupyter_config_dir()) if user else Path(sys.prefix) / "etc" / "jupyter"
    target = base / "jupyter_server_config.d" / "workbench.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {
        "workbench.ui.netron_server": True}}}, indent=2) + "\n", encoding="utf-8")
    return target


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "workbench.ui.netron_handlers"}]


def _netron_dir() -> Path:
    import netron  # the lab extra: only under a Jupyter server (or a test of the page)

    return Path(netron.__file__).resolve().parent


def index_html(main: str, netron_dir: Path) -> bytes:
    """Netron's page with the model named in its meta tags (as netron's own server does).

    Version 0.0.0 turns off Netron's telemetry (it only reports from a packaged build), and
    dropping the build date turns off its "please update" loop on old installs.
    """
    text = (netron_dir / "index.html").read_text(encoding="utf-8")
    # the file name is the user's (or an attacker's): escaped for HTML, quoted for the URL,
    # so a name like `x"><script>...` stays text on the Jupyter origin
    meta = ('<meta name="type" content="Python">\n<meta name="version" content="0.0.0">\n'
            f'<meta name="file" content="data/{escape(quote(main, safe=""), quote=True)}">\n'
            f'<meta name="identifier" content="{escape(main, quote=True)}">')
    text = re.sub(r'<meta name="version" content="[^"]*">', lambda _: meta, text, count=1)
    text = re.sub(r'<meta name="date" content="[^"]*">\n?', "", text, count=1)
    return text.encode("utf-8")


if __name__ == "__main__":  # python -m workbench.ui.netron_server enable [--user]
    if sys.argv[1:2] != ["enable"]:
        sys.exit("usage: python -m workbench.ui.netron_server enable [--user]")
    print(f"wrote {enable(user='--user' in sys.argv)}; restart JupyterLab")
