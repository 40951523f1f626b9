"""CompareView: a comparison's table (sortable, filterable, first divergence highlighted) and
its figures, inline in the notebook.

ipywidgets controls and an HTML table (``widgets/compare_table.js`` only draws it and sends
header clicks back): filtering and sorting run in Python on the report's records, so the view
and ``CompareView.rows`` always agree (and scripts can use the same).
"""

from __future__ import annotations

import graphlib
import html
import math
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from ..comparison import plots
from ..errors import InputError
from .figures import CSS_DPI, DENSITY, figure_html
from .widgetfiles import widget_source

__all__ = ["CSS_DPI", "DENSITY", "CompareTable", "CompareView", "compare_view", "figure_html",
           "shared_reference_order"]

SHOWN = ["candidate", "mode", "order", "name", "reference", "op_type", "max_abs", "noise_floor",
         "mean_abs", "max_rel", "cosine", "snr_db", "frac_over_tol", "min_tol", "tolerance",
         "passed"]
# noise_floor: beside the error, fp32's own rounding in the op the candidate computes (an fp32
# candidate's tolerance is a multiple of it, unless one was given); blank where a candidate has
# none (a low precision keeps its own rule). min_tol: the smallest atol that passes; tolerance:
# the bound that decided the row, at the tensor's largest |ref| (pass/fail is per element:
# atol + rtol*|ref|), so a failing row may show max_abs below it
SORTABLE = ["order", "max_abs", "noise_floor", "mean_abs", "max_rel", "cosine", "snr_db",
            "frac_over_tol", "min_tol", "op_type", "name", "reference", "candidate", "mode"]
# worst first on a header click
METRICS = {"max_abs", "noise_floor", "mean_abs", "max_rel", "frac_over_tol", "min_tol"}
# what a noise floor was derived from (noise_floor.py), as its cell's tooltip says it
FLOOR_BASIS = {"terms": "the rounding of the op's sums, from its weights and inputs",
               "exact": "an op that moves, selects or clamps: one rounding of its output",
               "smooth": "an activation's few ulps of its largest output",
               "fallback": "ulps of the largest output (an op whose terms are not known)"}
ALL = "(all)"
STYLE = """<style>
.wb-compare-table { border-collapse: collapse; font-size: 12px; }
.wb-compare-table th, .wb-compare-table td { padding: 2px 6px; border-bottom: 1px solid #e3e3e3;
  text-align: right; white-space: nowrap; }
.wb-compare-table th { position: sticky; top: 0; background: var(--jp-layout-color2, #f2f2f2); }
.wb-compare-table th[data-col] { cursor: pointer; text-decoration: underline dotted; }
.wb-compare-table td.wb-text { text-align: left; }
.wb-compare-table tr.wb-failed td { color: #a50f15; }
.wb-compare-table tr.wb-first-divergence td { background: #fde0dd; font-weight: 600; }
</style>"""


class CompareTable(anywidget.AnyWidget):
    """The table in the browser: ``html`` from Python; ``clicked`` is the header clicked."""

    _esm = traitlets.Unicode().tag(sync=True)
    html = traitlets.Unicode("").tag(sync=True)
    clicked = traitlets.Unicode("").tag(sync=True)  # "column|timestamp": each click differs

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(_esm=widget_source("compare_table.js"), **kwargs)


def shared_reference_order(rows: list[dict[str, Any]]) -> list[str]:
    """The reference (torch) names of ``rows`` in one topological order for every candidate.

    Alignment is monotone (a later candidate tensor never maps to an earlier module), so each
    candidate's references, in its own order, are a subsequence of torch's call order; their
    merge (graphlib's topological sort of "comes after" pairs) places a module at one x for
    all candidates. Should candidates disagree (a cycle), first appearance decides."""
    seqs: dict[str, list[str]] = {}
    for r in sorted(rows, key=lambda r: (str(r["candidate"]), r["order"])):
        ref = str(r.get("reference") or r["name"])
        seq = seqs.setdefault(str(r["candidate"]), [])
        if ref not in seq:
            seq.append(ref)
    first_seen = list(dict.fromkeys(ref for seq in seqs.values() for ref in seq))
    ts: graphlib.TopologicalSorter = graphlib.TopologicalSorter()
    for ref in first_seen:  # insertion order breaks ties: the first candidate's order first
        ts.add(ref)
    for seq in seqs.values():
        for a, b in zip(seq, seq[1:], strict=False):
            ts.add(b, a)
    try:
        return list(ts.static_order())
    except graphlib.CycleError:
        return first_seen


class CompareView(widgets.VBox):
    """The report's summary (once), a filterable and sortable table, and its figures; the
    error-along-the-graph plot has the reference modules on x, in one topological order
    shared by all candidates (shared_reference_order)."""

    def __init__(self, report: Any, metric: str = "max_abs", figures: bool = True,
                 summary: bool = True) -> None:
        if not hasattr(report, "records") or not hasattr(report, "first_divergence"):
            raise InputError(f"CompareView takes a CompareReport, got a {type(report).__name__}",
                             "CompareView(wb.compare(model, [onx], inputs))")
        if metric not in SORTABLE:
            raise InputError(f"metric={metric!r} is not a column of the table",
                             f"one of {', '.join(SORTABLE)}")
        self.report = report
        self.metric = metric
        self.all_rows = [_floor_or_none(r) for r in report.rows()]
        first = report.first_divergence
        self.first_key = (first.candidate, first.mode, first.name) if first else None
        ops = sorted({r["op_type"] for r in self.all_rows})
        cands = sorted({r["candidate"] for r in self.all_rows})
        modes = sorted({r["mode"] for r in self.all_rows})
        self.candidate_w = widgets.Dropdown(options=[ALL, *cands], description="candidate")
        self.mode_w = widgets.Dropdown(options=[ALL, *modes], description="mode")
        self.op_w = widgets.Dropdown(options=[ALL, *ops], description="op type")
        self.threshold_w = widgets.FloatText(value=0.0, description=f"{metric} \u2265",
                                             step=1e-4)
        self.failing_w = widgets.Checkbox(value=False, description="over tolerance only",
                                          indent=False)
        self.sort_w = widgets.Dropdown(options=SORTABLE, value="order", description="sort by")
        self.descending_w = widgets.Checkbox(value=False, description="descending",
                                             indent=False)
        self.count_w = widgets.HTML()
        # a fixed height the user can drag taller (compare_table.js makes the box resizable)
        self.table_w = CompareTable(layout=widgets.Layout(height="360px", overflow="auto"))
        self.table_w.add_class("wb-compare-view-table")
        self.table_w.observe(self._on_header, names="clicked")
        self.figures_w = widgets.HTML()
        self.figures_w.add_class("wb-compare-view-figures")
        for w in (self.candidate_w, self.mode_w, self.op_w, self.threshold_w, self.failing_w,
                  self.sort_w, self.descending_w):
            w.observe(lambda _c: self._refresh(), names="value")
        # the summary names each candidate's first divergence and NOT OK reasons already:
        # shown once (summary=False where the caller shows report.summary() itself)
        head = html.escape(report.summary())
        if not first and not report.ok and "NOT OK" not in head:
            why = "; ".join(f"{name}: {'; '.join(v.reasons) or 'a tensor fails'}"
                            for name, v in report.verdicts().items() if not v.ok)
            head += f"\n<b>NOT OK</b>: {html.escape(why)}"
        summary_w = widgets.HTML(f"<pre class='wb-compare-view-summary'>{head}</pre>")
        controls = widgets.VBox([
            widgets.HBox([self.candidate_w, self.mode_w, self.op_w]),
            widgets.HBox([self.threshold_w, self.failing_w, self.sort_w, self.descending_w]),
        ])
        super().__init__([summary_w] * summary + [controls, self.count_w, self.table_w,
                                                   self.figures_w])
        self.add_class("wb-compare-view")
        self.rows: list[dict[str, Any]] = []
        self.figures: list[Any] = []
        self.plot_order = shared_reference_order(self.all_rows)  # the plot's x, left to right
        self._refresh()
        if figures:
            self._draw_figures()

    # -- the same as the controls, from code --------------------------------------------------
    def filter(self, op_type: str | None = None, threshold: float | None = None,
               candidate: str | None = None, mode: str | None = None,
               failing: bool | None = None) -> list[dict[str, Any]]:
        """Set the filters (None leaves one as it is); returns the rows now shown."""
        for value, w, what in ((op_type, self.op_w, "op type"),
                               (candidate, self.candidate_w, "candidate"),
                               (mode, self.mode_w, "mode")):
            if value is not None:
                if value not in w.options:
                    raise InputError(f"{what} {value!r} is not in the report",
                                     f"one of {list(w.options)}")
                w.value = value
        if threshold is not None:
            if not isinstance(threshold, (int, float)) or not math.isfinite(threshold) \
                    or threshold < 0:
                raise InputError(f"threshold must be a finite number >= 0, got {threshold!r}",
                                 "threshold=1e-4 shows rows whose error is at least 1e-4")
            self.threshold_w.value = float(threshold)
        if failing is not None:
            self.failing_w.value = bool(failing)
        return self.rows

    def sort(self, column: str, descending: bool = False) -> list[dict[str, Any]]:
        """Sort the table by a column; returns the rows now shown."""
        if column not in SORTABLE:
            raise InputError(f"cannot sort by {column!r}", f"one of {', '.join(SORTABLE)}")
        self.descending_w.value = bool(descending)
        self.sort_w.value = column
        return self.rows

    def _on_header(self, change: dict) -> None:
        """A header click: sort by that column; the same column again flips the order."""
        column = change["new"].split("|")[0]
        if column not in SORTABLE:
            return
        if column == self.sort_w.value:
            self.descending_w.value = not self.descending_w.value
        else:
            self.sort(column, descending=column in METRICS)

    # -- drawing ------------------------------------------------------------------------------
    def _selected(self) -> list[dict[str, Any]]:
        out = []
        for r in self.all_rows:
            if self.candidate_w.value != ALL and r["candidate"] != self.candidate_w.value:
                continue
            if self.mode_w.value != ALL and r["mode"] != self.mode_w.value:
                continue
            if self.op_w.value != ALL and r["op_type"] != self.op_w.value:
                continue
            v = r.get(self.metric)
            if self.threshold_w.value > 0 and (v is None or v < self.threshold_w.value):
                continue
            if self.failing_w.value and r.get("passed"):
                continue
            out.append(r)
        col, desc = self.sort_w.value, self.descending_w.value

        def key(r: dict[str, Any]) -> tuple:
            v = r.get(col)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return (1, 0)  # missing values last, whichever the direction
            return (0, -v if desc and isinstance(v, (int, float)) else v)

        rows = sorted(out, key=key)
        if desc and rows and not isinstance(rows[0].get(col), (int, float)):
            present = [r for r in rows if r.get(col) is not None]
            rows = present[::-1] + [r for r in rows if r.get(col) is None]
        return rows

    def _refresh(self) -> None:
        self.rows = self._selected()
        arrow = "\u25bc" if self.descending_w.value else "\u25b2"
        head = "".join(
            (f'<th data-col="{c}" title="sort by {c}">' if c in SORTABLE else "<th>")
            + f"{c}{' ' + arrow if c == self.sort_w.value else ''}</th>" for c in SHOWN)
        body = []
        for r in self.rows:
            key = (r["candidate"], r["mode"], r["name"])
            cls = " ".join(c for c in ("wb-first-divergence" if key == self.first_key else "",
                                       "" if r.get("passed") else "wb-failed") if c)
            cells = "".join(_cell(r, c) for c in SHOWN)
            body.append(f'<tr class="{cls}" data-name="{html.escape(r["name"])}">{cells}</tr>')
        self.table_w.html = (f'{STYLE}<table class="wb-compare-table"><thead><tr>{head}</tr>'
                              f"</thead><tbody>{''.join(body)}</tbody></table>")
        self.count_w.value = f"{len(self.rows)} of {len(self.all_rows)} rows"

    def plot_rows(self) -> list[dict[str, Any]]:
        """The rows as plotted: ``order`` is the reference's place in ``plot_order``."""
        x = {ref: i for i, ref in enumerate(self.plot_order)}
        return [{**r, "order": x[str(r.get("reference") or r["name"])]} for r in self.all_rows]

    def _draw_figures(self) -> None:
        # report.plot, but on the shared x (each candidate's own order would put one module
        # at different places)
        first = self.report.first_divergence
        rows = self.plot_rows()
        mode = "accumulated" if any(r["mode"] == "accumulated" for r in rows) else "isolated"
        self.figures = [plots.error_along_graph(rows, metric=self.metric,
                                                highlight=first.name if first else None),
                        plots.error_by_op_type(self.all_rows, metric=self.metric, mode=mode)]
        for fig in self.figures:  # as wide as a notebook's output (labels stay their size)
            w_in, h_in = fig.get_size_inches()
            if w_in > MAX_WIDTH_IN:
                fig.set_size_inches(MAX_WIDTH_IN, h_in)
        self.figures_w.value = "".join(figure_html(fig) for fig in self.figures)


MAX_WIDTH_IN = 10.0  # 960 CSS px: a JupyterLab output's width beside the file browser


def compare_view(report: Any, metric: str = "max_abs", figures: bool = True,
                 summary: bool = True) -> CompareView:
    """The comparison inline: ``wb.ui.compare_view(report)``."""
    return CompareView(report, metric=metric, figures=figures, summary=summary)


def _floor_or_none(row: dict[str, Any]) -> dict[str, Any]:
    """The row with ``noise_floor`` None where its candidate has no floor (``floor_basis``
    empty: a low precision's per-element rule decided it), so the cell is blank and sorts
    last, not as a floor of 0."""
    return row if row.get("floor_basis") else {**row, "noise_floor": None}


def _cell(row: dict[str, Any], column: str) -> str:
    """One table cell: text left-aligned; a noise floor says in its tooltip what it was
    derived from."""
    text = html.escape(_fmt(row.get(column)))
    if column in ("candidate", "mode", "name", "reference", "op_type"):
        return f'<td class="wb-text">{text}</td>'
    if column == "noise_floor" and row.get("noise_floor") is not None:
        basis = str(row.get("floor_basis"))
        why = html.escape(FLOOR_BASIS.get(basis, basis), quote=True)
        return f'<td class="wb-floor" title="fp32 noise floor: {why}">{text}</td>'
    return f"<td>{text}</td>"


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)

