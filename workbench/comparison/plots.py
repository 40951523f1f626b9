"""Plots of op-by-op comparison errors: along the graph, by op type, and inside one tensor
(tensorplots.py; the figure helpers are in figures.py).

Every function builds a ``matplotlib.figure.Figure`` with the object-oriented API (no pyplot),
so it works headless, leaks no global figures, and displays itself as a Jupyter cell's value.
matplotlib and numpy are imported inside the functions to keep ``import workbench`` fast.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.errors import InputError

from .figures import _RECORDS_HINT, _new_figure, _num
from .tensorplots import diff_heatmap, error_histogram, ref_vs_cand_scatter

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "diff_heatmap",
    "error_along_graph",
    "error_by_op_type",
    "error_histogram",
    "ref_vs_cand_scatter",
]

METRICS = ("max_abs", "mean_abs", "max_rel", "cosine", "snr_db")
MODES = ("accumulated", "isolated")
# Candidate colours: matplotlib's default cycle without red ("C3"), which marks failures.
_COLOURS = ("C0", "C1", "C2", "C4", "C5", "C6", "C7", "C8", "C9")
_FAIL = {"color": "red", "marker": "x", "markersize": 8, "markeredgewidth": 2, "linestyle": ""}
_MAX_TICK_LABELS = 40

# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class _Metric:
    """How one metric is drawn: the value plotted, the axis scale and label, which way is worse."""

    key: str
    label: str
    log: bool = True
    higher_is_worse: bool = True

    def value(self, row: Mapping[str, Any]) -> float:
        """The plotted value of a record (NaN when missing); cosine becomes 1 - cosine."""
        v = _num(row.get(self.key))
        return 1.0 - v if self.key == "cosine" and not math.isnan(v) else v

    def transform(self, threshold: float) -> float:
        return 1.0 - threshold if self.key == "cosine" else threshold

    def severity(self, v: float) -> float:
        """Larger is worse; missing values are the least bad."""
        if math.isnan(v):
            return -math.inf
        return v if self.higher_is_worse else -v


_METRIC_VIEWS = {
    "max_abs": _Metric("max_abs", "max |ref − cand| (tensor units)"),
    "mean_abs": _Metric("mean_abs", "mean |ref − cand| (tensor units)"),
    "max_rel": _Metric("max_rel", "max |ref − cand| / |ref| (ratio)"),
    "cosine": _Metric("cosine", "1 − cosine similarity (0 = same direction)"),
    "snr_db": _Metric("snr_db", "SNR (dB, higher is better)", log=False, higher_is_worse=False),
}


def _metric_view(rows: Sequence[Mapping[str, Any]], metric: str) -> _Metric:
    if not isinstance(metric, str) or not any(metric in r for r in rows):
        known = sorted({k for r in rows for k, v in r.items()
                        if isinstance(v, int | float) and not isinstance(v, bool)} - {"order"})
        raise InputError(f"metric {metric!r} is not a key of the records; "
                         f"numeric keys there: {', '.join(known) or 'none'}",
                         hint=f"Use one of {', '.join(METRICS)}.")
    return _METRIC_VIEWS.get(metric, _Metric(metric, metric))


class _Scale:
    """Where values off a log axis (0, None, NaN, inf) are drawn: at a floor or a ceiling."""

    def __init__(self, metric: _Metric, values: Iterable[float]) -> None:
        self.metric = metric
        vals = [v for v in values if math.isfinite(v) and (v > 0 or not metric.log)]
        if metric.log:
            self.floor = min(vals) / 10 if vals else 1e-12
            self.ceiling = max(max(vals) * 10 if vals else 1.0, self.floor * 100)
        else:
            lo, hi = (min(vals), max(vals)) if vals else (0.0, 0.0)
            pad = 0.15 * (hi - lo) or 5.0
            self.floor, self.ceiling = lo - pad, hi + pad

    def place(self, v: float) -> tuple[float, str]:
        """(y to draw at, kind) where kind is ok, low (0 / −inf), missing or high (inf)."""
        if math.isnan(v):
            return self.floor, "missing"
        if v == math.inf:
            return self.ceiling, "high"
        if v == -math.inf or (self.metric.log and v <= 0):
            return self.floor, "low"
        return v, "ok"

    def legend(self, kind: str) -> str:
        low = "0" if self.metric.log else "−∞"
        return {"low": f"{low}, drawn at {self.floor:.1e}" if self.metric.log
                else f"{low}, drawn at the bottom",
                "missing": "None / NaN, drawn at the bottom",
                "high": "∞, drawn at the top"}[kind]


_KIND_STYLE = {
    "low": {"marker": "v", "color": "0.25", "markersize": 7, "linestyle": ""},
    "missing": {"marker": "o", "markerfacecolor": "none", "color": "0.45", "markersize": 8,
                "linestyle": ""},
    "high": {"marker": "^", "color": "0.25", "markersize": 7, "linestyle": ""},
}


# --------------------------------------------------------------------------- inputs


def _records(records: Any, need: Sequence[str]) -> list[Mapping[str, Any]]:
    """The records as a list of mappings with the needed keys, or an InputError saying why not."""
    if records is None:
        raise InputError("records is None: there is nothing to plot", hint=_RECORDS_HINT)
    if hasattr(records, "to_dict") and not isinstance(records, Mapping):  # a pandas DataFrame
        records = records.to_dict("records")
    if isinstance(records, Mapping | str | bytes):
        raise InputError(f"records must be a list of dicts, got a {type(records).__name__}",
                         hint=_RECORDS_HINT)
    rows = list(records)
    if not rows:
        raise InputError("records is empty: there is nothing to plot",
                         hint="No tensor was aligned, or the list was filtered to nothing. "
                              "Check the report's aligned fraction, then pass its records.")
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise InputError(f"records[{i}] is a {type(r).__name__}, expected a dict",
                             hint=_RECORDS_HINT)
        missing = [k for k in need if k not in r]
        if missing:
            raise InputError(f"records[{i}] has no key {', '.join(map(repr, missing))}; "
                             f"it has {', '.join(map(str, r))}", hint=_RECORDS_HINT)
    return rows


def _order(row: Mapping[str, Any], i: int) -> int:
    try:
        return int(row["order"])
    except (TypeError, ValueError):
        raise InputError(f"records[{i}]['order'] must be an int, got {row['order']!r}",
                         hint=_RECORDS_HINT) from None


def _select_candidates(rows: list[Mapping[str, Any]],
                       candidates: Sequence[str] | str | None) -> list[Mapping[str, Any]]:
    if candidates is None:
        return rows
    wanted = [candidates] if isinstance(candidates, str) else [str(c) for c in candidates]
    present = list(dict.fromkeys(str(r["candidate"]) for r in rows))
    unknown = [c for c in wanted if c not in present]
    if unknown or not wanted:
        raise InputError(f"candidates {unknown or wanted!r} not in the records; "
                         f"present: {', '.join(present)}",
                         hint="Pass candidate names exactly as the records spell them, or None "
                              "for all.")
    return [r for r in rows if str(r["candidate"]) in wanted]


def _short(text: str, width: int = 40) -> str:
    """Middle-elided text, so long module paths stay readable as tick labels."""
    if len(text) <= width:
        return text
    keep = (width - 1) // 2
    return f"{text[:keep]}…{text[-(width - 1 - keep):]}"


# --------------------------------------------------------------------------- along the graph


def error_along_graph(records: Sequence[Mapping[str, Any]], metric: str = "max_abs",
                      tolerance: float | None = None,
                      candidates: Sequence[str] | str | None = None,
                      highlight: str | None = None) -> Figure:
    """The error of each op along the topological order, one line per candidate and mode.

    x is the op's ``order``, labelled with its reference (PyTorch) name; y is ``metric`` on a
    log scale (cosine is drawn as 1 − cosine; snr_db on a linear scale). Accumulated error is
    solid, isolated dashed. Zeros and missing values are drawn at a floor and infinities at a
    ceiling, each with its own marker, so no op drops out; failing records get a red x. With
    ``tolerance`` a horizontal line is drawn at it; without, for max_abs, each record's own
    ``tolerance`` and, an fp32 candidate's, its ``noise_floor`` (the tolerance is 4x it). ``highlight`` names a record (e.g. the first divergence) to circle and label.
    When several records share a candidate, mode and order, the worst one is drawn.
    """
    rows = _records(records, ("candidate", "mode", "order"))
    view = _metric_view(rows, metric)
    rows = _select_candidates(rows, candidates)
    if tolerance is not None:
        tol_y = view.transform(_num(tolerance))
        if not math.isfinite(tol_y) or (view.log and tol_y <= 0):
            raise InputError(f"tolerance {tolerance!r} cannot be drawn on the {metric} axis",
                             hint="Give a finite tolerance in the metric's units (for cosine, a "
                                  "similarity below 1).")
    series, ref_names = _series(rows, view)
    scale = _Scale(view, (view.value(r) for r in rows))
    cand_names = list(dict.fromkeys(c for c, _ in series))
    colour = {c: _COLOURS[i % len(_COLOURS)] for i, c in enumerate(cand_names)}
    orders = sorted(ref_names)
    fig, ax = _new_figure(min(max(8.0, 0.32 * min(len(orders), _MAX_TICK_LABELS) + 4), 20), 5.5)
    special, failed = _lines(ax, series, scale, cand_names, colour)
    if tolerance is not None:
        ax.axhline(tol_y, color="0.2", linestyle="-.", linewidth=1.2,
                   label=f"tolerance {tolerance:g}")
    elif metric == "max_abs":
        _bounds(ax, series, cand_names, colour)
    if failed:
        ax.plot(*zip(*failed, strict=True), **_FAIL, label="failed tolerance")
    for kind, pts in special.items():  # over the red x: "this one is 0 / None / inf" matters
        if pts:
            ax.plot(*zip(*pts, strict=True), **_KIND_STYLE[kind], label=scale.legend(kind),
                    zorder=4)
    if highlight is not None:
        _highlight(ax, rows, view, scale, highlight)
    _graph_axes(ax, view, orders, ref_names, len(failed))
    return fig


# {(candidate, mode): {order: {"v": value, "row": the record drawn, "failed": any failed}}}
_Series = dict[tuple[str, str], dict[int, dict[str, Any]]]


def _series(rows: Sequence[Mapping[str, Any]], view: _Metric) -> tuple[_Series, dict[int, str]]:
    """One point per (candidate, mode, order): the worst record, failing if any record
    there failed; and each order's reference name (the first record's)."""
    series: _Series = {}
    ref_names: dict[int, str] = {}
    for i, r in enumerate(rows):
        order, v = _order(r, i), view.value(r)
        key = (str(r["candidate"]), str(r["mode"]))
        pts = series.setdefault(key, {})
        cur = pts.get(order)
        if cur is None or view.severity(v) > view.severity(cur["v"]):
            pts[order] = {"v": v, "row": r, "failed": (cur or {}).get("failed", False)}
        pts[order]["failed"] |= r.get("passed") is False
        ref_names.setdefault(order, str(r.get("reference") or r.get("name") or order))
    return series, ref_names


def _lines(ax: Axes, series: _Series, scale: _Scale, cand_names: list[str],
           colour: dict[str, str]
           ) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[int, float]]]:
    """A line per candidate and mode (isolated dashed), candidates in order, accumulated
    first; returns the points drawn off the axis by kind, and the failing points."""
    mode_rank = {m: i for i, m in enumerate(MODES)}
    keys = sorted(series, key=lambda k: (cand_names.index(k[0]), mode_rank.get(k[1], 9), k[1]))
    special: dict[str, list[tuple[int, float]]] = {"low": [], "missing": [], "high": []}
    failed: list[tuple[int, float]] = []
    for cand, mode in keys:
        pts = series[(cand, mode)]
        xs = sorted(pts)
        ys = []
        for x in xs:
            y, kind = scale.place(pts[x]["v"])
            ys.append(y)
            if kind != "ok":
                special[kind].append((x, y))
            if pts[x]["failed"]:
                failed.append((x, y))
        ax.plot(xs, ys, color=colour[cand], linestyle="--" if mode == "isolated" else "-",
                marker=".", markersize=5, linewidth=1.4, label=f"{cand} ({mode})")
    return special, failed


def _graph_axes(ax: Axes, view: _Metric, orders: list[int], ref_names: dict[int, str],
                n_failed: int) -> None:
    """Scale, ticks (a label every few ops past _MAX_TICK_LABELS), labels, title, legend."""
    if view.log:
        ax.set_yscale("log")
    step = max(1, math.ceil(len(orders) / _MAX_TICK_LABELS))
    ticks = orders[::step]
    ax.set_xticks(ticks, [_short(ref_names[x]) for x in ticks], rotation=90, fontsize=8)
    if step > 1:
        ax.set_xticks(orders, minor=True)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.set_xlabel("op (reference module, in topological order)"
                  + (f"; a label every {step} ops" if step > 1 else ""))
    ax.set_ylabel(view.label)
    ax.set_title(f"{view.label.split(' (')[0]} per op along the graph: {len(orders)} ops, "
                 f"{n_failed} failing point{'s' * (n_failed != 1)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


# each record's own bounds on the max_abs axis: its tolerance (what decided it) and, for an
# fp32 candidate, the noise floor that tolerance is a multiple of (noise_floor.py)
_BOUNDS = (("tolerance", "tolerance", {"marker": "_", "markersize": 10, "markeredgewidth": 2.5,
                                       "alpha": 0.45}),
           ("noise_floor", "noise floor", {"marker": "2", "markersize": 7,
                                           "markeredgewidth": 1.2, "alpha": 0.6}))


def _bounds(ax: Axes, series: _Series, cand_names: list[str], colour: dict[str, str]) -> None:
    """Each candidate's per-record tolerance and noise floor, as markers at each op (the
    first mode's where both modes have one: the bound is the op's, not the mode's, for a
    tolerance given; the floor of the accumulated run carries its inputs' error)."""
    for cand in cand_names:
        for key, label, style in _BOUNDS:
            found: dict[int, float] = {}
            for (c, _), pts in series.items():
                for x, p in pts.items():
                    t = _num(p["row"].get(key))
                    if c == cand and math.isfinite(t) and t > 0:
                        found.setdefault(x, t)
            if found:
                xs = sorted(found)
                ax.plot(xs, [found[x] for x in xs], color=colour[cand], linestyle="",
                        label=f"{label} ({cand})", **style)


def _highlight(ax: Axes, rows: Sequence[Mapping[str, Any]], view: _Metric, scale: _Scale,
               name: str) -> None:
    """Circle every record called ``name`` (or with that reference) and label the first."""
    hits = [r for r in rows if str(r.get("name")) == name]
    hits = hits or [r for r in rows if str(r.get("reference")) == name]
    if not hits:
        some = list(dict.fromkeys(str(r.get("name")) for r in rows))[:8]
        raise InputError(f"highlight {name!r} is not the name or reference of any record",
                         hint=f"Pass a record's name, e.g. one of {', '.join(some)}.")
    hits.sort(key=lambda r: r.get("mode") != "accumulated")
    pts = [(int(r["order"]), scale.place(view.value(r))[0]) for r in hits]
    ax.plot(*zip(*pts, strict=True), linestyle="", marker="o", markersize=15,
            markerfacecolor="none", markeredgecolor="black", markeredgewidth=1.5,
            label=f"highlight: {_short(name, 30)}")
    first = hits[0]
    text = str(first.get("name", name))
    ref = first.get("reference")
    if ref and str(ref) != text:
        text += f"\n({ref})"
    v = view.value(first)
    text += f"\n{first['candidate']} {first['mode']}: {view.key} = {v:.3g}"
    ax.annotate(text, xy=pts[0], xytext=(18, 28), textcoords="offset points", fontsize=8,
                arrowprops={"arrowstyle": "->", "color": "black"},
                bbox={"boxstyle": "round,pad=0.3", "fc": "lightyellow", "ec": "0.5"},
                annotation_clip=False)


# --------------------------------------------------------------------------- by op type


def error_by_op_type(records: Sequence[Mapping[str, Any]], metric: str = "max_abs",
                     mode: str = "accumulated") -> Figure:
    """Per op type, a box of ``metric`` across its tensors, one box per candidate, worst first.

    Boxes sit side by side inside each op type, coloured by candidate, with every tensor drawn
    as a dot over the box and failing ones as a red x. The y axis is log (snr_db linear);
    zeros sit at a floor and infinities at a ceiling, missing values are left out.
    """
    rows = _records(records, ("candidate", "mode", "op_type"))
    view = _metric_view(rows, metric)
    present = sorted({str(r["mode"]) for r in rows})
    rows = [r for r in rows if str(r["mode"]) == mode]
    if not rows:
        raise InputError(f"no records with mode {mode!r}; modes present: {', '.join(present)}",
                         hint=f"Pass mode= one of {', '.join(present)}.")
    scale = _Scale(view, (view.value(r) for r in rows))
    groups = _groups(rows, view, scale)
    if not groups:
        raise InputError(f"every {mode} record has {metric} missing (None or NaN)",
                         hint=f"Pick another metric: one of {', '.join(METRICS)}.")
    cand_names = list(dict.fromkeys(str(r["candidate"]) for r in rows))
    colour = {c: _COLOURS[i % len(_COLOURS)] for i, c in enumerate(cand_names)}

    def worst(op: str) -> float:
        return max(view.severity(y) for ys in groups[op].values() for y, _ in ys)

    op_types = sorted(groups, key=lambda op: (-worst(op), op))
    fig, ax = _new_figure(min(max(7.0, 0.45 * len(op_types) * len(cand_names) + 3), 20), 5.0)
    fails = _boxes(ax, groups, op_types, cand_names, colour)
    if fails:
        ax.plot(*zip(*fails, strict=True), **_FAIL, zorder=4)
    if view.log:
        ax.set_yscale("log")
    counts = [max(len(v) for v in groups[op].values()) for op in op_types]
    ax.set_xticks(range(len(op_types)), [f"{_short(op, 24)} ({n})"
                                         for op, n in zip(op_types, counts, strict=True)],
                  rotation=45 if len(op_types) > 6 else 0, ha="right" if len(op_types) > 6
                  else "center", fontsize=9)
    ax.set_xlim(-0.6, len(op_types) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_xlabel("op type (tensors per candidate), worst first")
    ax.set_ylabel(view.label)
    ax.set_title(f"{view.label.split(' (')[0]} by op type, {mode} error")
    _candidate_legend(ax, cand_names, colour, bool(fails))
    return fig


# {op type: {candidate: [(y drawn, failed), ...]}}
_Groups = dict[str, dict[str, list[tuple[float, bool]]]]


def _groups(rows: Sequence[Mapping[str, Any]], view: _Metric, scale: _Scale) -> _Groups:
    """Each record's placed value by op type and candidate (missing values left out)."""
    groups: _Groups = {}
    for r in rows:
        v = view.value(r)
        if math.isnan(v):
            continue
        y, _ = scale.place(v)
        per_cand = groups.setdefault(str(r["op_type"]), {})
        per_cand.setdefault(str(r["candidate"]), []).append((y, r.get("passed") is False))
    return groups


def _boxes(ax: Axes, groups: _Groups, op_types: list[str], cand_names: list[str],
           colour: dict[str, str]) -> list[tuple[float, float]]:
    """A box per op type and candidate, side by side, every tensor a jittered dot over it;
    returns the failing dots' places."""
    import numpy as np

    width = 0.8 / len(cand_names)
    rng = np.random.default_rng(0)
    fails: list[tuple[float, float]] = []
    for i, op in enumerate(op_types):
        for j, cand in enumerate(cand_names):
            pts = groups[op].get(cand)
            if not pts:
                continue
            pos = i - 0.4 + width * (j + 0.5)
            ys = [y for y, _ in pts]
            box = ax.boxplot([ys], positions=[pos], widths=width * 0.8, patch_artist=True,
                             showfliers=False, manage_ticks=False,
                             medianprops={"color": "black"})
            for patch in box["boxes"]:
                patch.set_facecolor(colour[cand])
                patch.set_alpha(0.35)
            xs = pos + rng.uniform(-width * 0.25, width * 0.25, size=len(ys))
            ax.scatter(xs, ys, s=12, color=colour[cand], zorder=3, linewidths=0)
            fails += [(x, y) for x, (y, f) in zip(xs, pts, strict=True) if f]
    return fails


def _candidate_legend(ax: Axes, cand_names: list[str], colour: dict[str, str],
                      fails: bool) -> None:
    """A patch per candidate's colour, and the failed marker when any failed."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colour[c], alpha=0.5, label=c) for c in cand_names]
    if fails:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], **_FAIL, label="failed tolerance"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
