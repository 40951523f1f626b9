"""Inline Netron: the model's graph inside the notebook, served through the Jupyter server.

The browser may not reach the kernel machine's localhost (JupyterHub, a remote JupyterLab),
so nothing here starts a server of its own. ``netron(artifact)`` registers the model's files
(the main file and the weights it needs, nothing else) under a random key in the Jupyter
runtime folder; the server extension ``workbench.ui.netron_server`` serves Netron's static
page (from the installed ``netron`` package) and only those registered files at
``{base_url}workbench/netron/{key}/``, behind the server's own authentication. The iframe's
address is completed in the browser from JupyterLab's page config (``baseUrl``), so it is
relative to the notebook's base URL and never names a host or port.
"""

from __future__ import annotations

import html
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from ..artifact.record import Artifact
from ..errors import InputError, WorkbenchError
from ..onnx_io import check_model_file, external_data_files

ROUTE = "workbench/netron"
REGISTRY = "workbench-netron"
MAX_AGE = 7 * 24 * 3600  # registrations older than this are removed at the next registration


def registry_dir(runtime_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder (in the Jupyter runtime dir) where the kernel lists files the server may serve."""
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir  # the lab extra: only when shown

        runtime_dir = jupyter_runtime_dir()
    return Path(runtime_dir) / REGISTRY


def model_files(source: Any) -> tuple[str, dict[str, Path]]:
    """The main file's name and every file Netron needs for it ({name: absolute path})."""
    if isinstance(source, Artifact):
        path = source.path
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
    else:
        raise InputError(f"netron() takes an Artifact or a model path, got {type(source).__name__}",
                         "e.g. wb.ui.netron(onx) or wb.ui.netron('model.onnx'); .onnx, "
                         ".ncnn.param and .pnnx.param are shown")
    path = path.absolute()
    fmt = check_model_file(path)  # ModelFileError for a missing, folder or non-model path
    files = {path.name: path}
    if fmt == "onnx":
        extra = external_data_files(path)
    else:  # ncnn and pnnx: the .bin next to the .param (netron fetches it by that name)
        extra = [path.name[: -len(".param")] + ".bin"] if path.name.endswith(".param") else []
    for rel in extra:
        f = (path.parent / rel).resolve()
        # only files beside the model: a location naming another folder is not served
        if f.parent == path.parent.resolve() and f.is_file():
            files[f.name] = f
    return path.name, files


def register(source: Any, runtime_dir: str | os.PathLike[str] | None = None) -> tuple[str, str,
                                                                                      dict[str, Path]]:
    """List ``source``'s files for the server under a fresh random key; returns (key, main, files)."""
    main, files = model_files(source)
    folder = registry_dir(runtime_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = time.time()
    for old in folder.glob("*.json"):  # keep the folder from growing without end
        try:
            if now - old.stat().st_mtime > MAX_AGE:
                old.unlink()
        except OSError:
            pass
    key = secrets.token_urlsafe(18)
    entry = {"main": main, "files": {n: str(p) for n, p in files.items()}, "created": now}
    tmp = folder / f".{key}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(entry, f)
    os.replace(tmp, folder / f"{key}.json")
    return key, main, files


def server_base_url() -> str | None:
    """The base URL of the Jupyter server that started this kernel (its parent process), if any."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir  # the lab extra; without it, no guess

        ppid = os.getppid()
        for info in Path(jupyter_runtime_dir()).glob("jpserver-*.json"):
            try:
                data = json.loads(info.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if data.get("pid") == ppid:
                return str(data.get("base_url") or "/")
    except Exception:  # a guess only: the browser side computes the real base URL
        return None
    return None


class NetronView:
    """Netron in an iframe for one model; shows itself when it is a cell's last value."""

    def __init__(self, key: str, main: str, files: dict[str, Path], height: int = 600,
                 base_url: str | None = None) -> None:
        self.key = key
        self.main = main
        self.files = files
        self.height = height
        self.base_url = base_url

    @property
    def path(self) -> str:
        """The page's path relative to the server's base URL (no host, no port)."""
        return f"{ROUTE}/{self.key}/"

    def src(self, base_url: str | None = None) -> str:
        """The iframe address under ``base_url`` ('/' by default): path only, never a host."""
        base = base_url or self.base_url or "/"
        return (base if base.endswith("/") else base + "/") + self.path

    def html(self) -> str:
        """An iframe plus a one-line script that re-bases its address on the page's baseUrl."""
        key = html.escape(self.key)
        # The script runs where the output is trusted (a cell just run, an Output widget);
        # elsewhere the kernel's guess of the base URL stays.
        script = (
            "(function(){var s=document.currentScript;if(!s)return;"
            "var f=s.parentNode.querySelector('iframe[data-wb-netron]');if(!f)return;"
            "var b=null,c=document.getElementById('jupyter-config-data');"
            "if(c){try{b=JSON.parse(c.textContent).baseUrl}catch(e){}}"
            "if(!b&&document.body&&document.body.dataset)b=document.body.dataset.baseUrl;"
            "if(!b)return;if(b.slice(-1)!=='/')b+='/';"
            "var u=b+f.getAttribute('data-wb-netron');if(f.getAttribute('src')!==u)f.src=u;})();"
        )
        return (
            f'<div class="wb-netron" data-key="{key}">'
            f'<iframe data-wb-netron="{html.escape(self.path)}" src="{html.escape(self.src())}" '
            f'title="Netron: {html.escape(self.main)}" loading="eager" '
            f'style="width:100%;height:{int(self.height)}px;border:1px solid #ccc"></iframe>'
            f"<script>{script}</script>"
            f'<div style="font-size:11px;color:#666">Netron: {html.escape(self.main)} '
            f"({len(self.files)} file(s) served through this Jupyter server). If the frame "
            "says 404, enable the server extension: <code>python -m "
            "workbench.ui.netron_server enable</code> and restart JupyterLab.</div></div>"
        )

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return f"NetronView({self.main!r}, path={self.path!r}, files={sorted(self.files)})"


def netron(source: Any, *, height: int = 600) -> NetronView:
    """Show ``source`` (an Artifact or a .onnx/.ncnn.param/.pnnx.param path) with Netron inline."""
    if not isinstance(height, int) or isinstance(height, bool) or height < 100:
        raise InputError(f"height={height!r} is not a pixel count >= 100", "e.g. height=600")
    try:
        key, main, files = register(source)
    except OSError as e:
        raise WorkbenchError(f"cannot register the model for the Jupyter server in "
                             f"{registry_dir()}: {e.strerror or e}",
                             "make the Jupyter runtime folder writable, or set "
                             "JUPYTER_RUNTIME_DIR to the folder the server uses") from e
    return NetronView(key, main, files, height=height, base_url=server_base_url())
