"""The browser side of the widgets, as shipped in the package (``widgets/``, in the wheel as
``workbench/widgets``): a file's text, and the graph view's ES modules for its loader.

anywidget hands the browser one module as text (``_esm``), so modules that import each other
by relative path cannot be loaded as files; ``graph_modules`` ships ``widgets/graph/*.js``
as {name: source} with a key of their content, and ``widgets/graphview.js`` imports them from
Blob URLs (its header says how). No build step, no bundler.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

GRAPH_MODULES = "graph"  # widgets/graph/: the graph view's ES modules


@cache
def widget_source(name: str) -> str:
    """The text of a browser-side file shipped in the package (``widgets/<name>``)."""
    return (resources.files("workbench") / "widgets" / name).read_text(encoding="utf-8")


@cache
def graph_modules() -> dict[str, Any]:
    """The graph view's modules for the browser: {"files": {file name: source}, "key": a
    hash of them (the browser loads each content once per page)}."""
    folder = resources.files("workbench") / "widgets" / GRAPH_MODULES
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.iterdir(),
                                                                     key=lambda p: p.name)
             if p.name.endswith(".js")}
    digest = hashlib.sha256()
    for name, text in files.items():
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return {"files": files, "key": digest.hexdigest()[:16]}
