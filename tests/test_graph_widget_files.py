"""The graph view's browser side as plain ES modules with no build step (widgets/graph/,
loaded by widgets/graphview.js from Blob URLs): small files, imports its loader can resolve,
all of them shipped to the browser by workbench.ui.widgetfiles."""

from __future__ import annotations

import graphlib
import re
from pathlib import Path

from workbench.ui.widgetfiles import graph_modules, widget_source

WIDGETS = Path(__file__).resolve().parents[1] / "widgets"
IMPORT = re.compile(r"""^\s*(?:import|export)\b[^;]*?\bfrom\s*(["'])([^"']+)\1""", re.M)
SIBLING = re.compile(r"\./[\w.-]+\.js")
MAX_LINES = 300


def _imports(text: str) -> list[str]:
    return [m.group(2) for m in IMPORT.finditer(text)]


def test_no_widget_file_is_over_300_lines():
    sizes = {p.relative_to(WIDGETS).as_posix(): len(p.read_text().splitlines())
             for p in WIDGETS.rglob("*.js")}
    assert "graph/view.js" in sizes and sizes["graphview.js"] < 60
    assert all(n <= MAX_LINES for n in sizes.values()), sizes


def test_modules_import_only_siblings_without_cycles():
    files = graph_modules()["files"]
    assert set(files) == {p.name for p in (WIDGETS / "graph").glob("*.js")}
    order = graphlib.TopologicalSorter()
    for name, text in files.items():
        deps = _imports(text)
        assert all(SIBLING.fullmatch(d) for d in deps), (name, deps)  # the loader's form
        assert all(d[2:] in files for d in deps), (name, deps)
        order.add(name, *(d[2:] for d in deps))
    assert list(order.static_order())[-1] == "view.js"  # raises CycleError on a cycle
    assert re.search(r"^export async function render\(", files["view.js"], re.M)
    # the entry imports nothing by path (anywidget hands it over as text): it loads view.js
    entry = widget_source("graphview.js")
    assert _imports(entry) == [] and '"view.js"' in entry and "_modules" in entry


def test_the_browser_gets_every_module_under_a_key_of_their_content():
    shipped = graph_modules()
    assert shipped["files"]["draw.js"] == (WIDGETS / "graph" / "draw.js").read_text()
    assert re.fullmatch(r"[0-9a-f]{16}", shipped["key"])
