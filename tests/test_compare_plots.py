"""Comparison plots: each returns a headless Figure whose content says what the records say."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.figure import Figure

from workbench.comparison import plots
from workbench.errors import InputError

N_OPS = 30
OP_TYPES = ("Conv", "Relu", "Add", "Sigmoid", "MatMul")
TOL = {"onnxruntime": 1e-4, "ncnn fp16": 1e-2}


def make_records(n_ops: int = N_OPS) -> list[dict]:
    """Two candidates x two modes; error grows along the graph; a zero, a None, an inf."""
    rng = np.random.default_rng(1)
    rows = []
    for cand, base in (("onnxruntime", 1e-6), ("ncnn fp16", 1e-3)):
        for mode in ("accumulated", "isolated"):
            for i in range(n_ops):
                growth = 1.25 ** i if mode == "accumulated" else 1.0
                v = float(base * growth * rng.uniform(0.5, 2.0))
                name = f"/body.{i}/out" if cand == "onnxruntime" else f"blob{i}"
                rows.append({
                    "candidate": cand, "mode": mode, "order": i, "name": name,
                    "reference": f"body.{i}.op", "op_type": OP_TYPES[i % len(OP_TYPES)],
                    "max_abs": v, "mean_abs": v / 4, "max_rel": v * 10,
                    "cosine": 1 - v, "snr_db": -20 * math.log10(v),
                    "tolerance": TOL[cand], "passed": v <= TOL[cand],
                })
    by = {(r["candidate"], r["mode"], r["order"]): r for r in rows}
    by["onnxruntime", "accumulated", 0].update(max_abs=0.0, passed=True)
    by["onnxruntime", "isolated", 5].update(max_abs=None, passed=None)
    by["ncnn fp16", "accumulated", 20].update(max_abs=math.inf, snr_db=math.inf, passed=False)
    by["ncnn fp16", "isolated", 7].update(max_abs=math.nan)
    return rows


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return make_records()


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def positive_floor(records, key="max_abs") -> float:
    vals = [r[key] for r in records if r[key] is not None and 0 < r[key] < math.inf]
    return min(vals) / 10


# --------------------------------------------------------------------------- along the graph


def test_along_graph_one_line_per_candidate_and_mode_log_y(records):
    fig = plots.error_along_graph(records, tolerance=1e-3)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    lines = lines_by_label(ax)
    styles = {lab: lines[lab].get_linestyle() for lab in (
        "onnxruntime (accumulated)", "onnxruntime (isolated)",
        "ncnn fp16 (accumulated)", "ncnn fp16 (isolated)")}
    assert styles == {"onnxruntime (accumulated)": "-", "onnxruntime (isolated)": "--",
                      "ncnn fp16 (accumulated)": "-", "ncnn fp16 (isolated)": "--"}
    # the two modes of a candidate share its colour, candidates differ
    assert lines["onnxruntime (accumulated)"].get_color() == \
        lines["onnxruntime (isolated)"].get_color() != lines["ncnn fp16 (isolated)"].get_color()
    # every op is drawn, none dropped: zeros, None, NaN and inf included
    for lab in styles:
        np.testing.assert_array_equal(lines[lab].get_xdata(), np.arange(N_OPS))
        assert np.all(np.isfinite(np.asarray(lines[lab].get_ydata(), dtype=float)))
    assert ax.get_legend() is not None
    assert ax.get_xlabel() and ax.get_ylabel().startswith("max |ref − cand|")
    assert "along the graph" in ax.get_title()


def test_along_graph_zero_none_inf_drawn_at_floor_and_ceiling_and_marked(records):
    ax = plots.error_along_graph(records).axes[0]
    lines = lines_by_label(ax)
    floor = positive_floor(records)
    acc = lines["onnxruntime (accumulated)"]
    assert acc.get_ydata()[0] == pytest.approx(floor)
    zero = next(v for k, v in lines.items() if k.startswith("0, drawn at"))
    assert list(zero.get_xdata()) == [0] and zero.get_ydata()[0] == pytest.approx(floor)
    missing = next(v for k, v in lines.items() if k.startswith("None / NaN"))
    assert sorted(missing.get_xdata()) == [5, 7]
    np.testing.assert_allclose(missing.get_ydata(), floor)
    high = next(v for k, v in lines.items() if k.startswith("∞"))
    assert list(high.get_xdata()) == [20]
    top = max(r["max_abs"] for r in records if r["max_abs"] and math.isfinite(r["max_abs"]))
    assert high.get_ydata()[0] == pytest.approx(top * 10)
    assert lines["ncnn fp16 (accumulated)"].get_ydata()[20] == pytest.approx(top * 10)


def test_along_graph_failing_points_marked_red_x(records):
    ax = plots.error_along_graph(records).axes[0]
    fail = lines_by_label(ax)["failed tolerance"]
    assert fail.get_marker() == "x" and fail.get_color() == "red"
    expected = sorted((r["order"], r["candidate"], r["mode"]) for r in records
                      if r["passed"] is False)
    assert len(fail.get_xdata()) == len(expected) > 0
    assert sorted(fail.get_xdata()) == sorted(o for o, _, _ in expected)
    assert str(len(expected)) + " failing points" in ax.get_title()


def test_along_graph_tolerance_line_at_given_value(records):
    ax = plots.error_along_graph(records, tolerance=1e-3).axes[0]
    tol = lines_by_label(ax)["tolerance 0.001"]
    assert list(tol.get_ydata()) == [1e-3, 1e-3]
    assert not any(lab.startswith("tolerance (") for lab in lines_by_label(ax))


def test_along_graph_per_point_tolerance_from_records_when_none_given(records):
    lines = lines_by_label(plots.error_along_graph(records).axes[0])
    for cand, tol in TOL.items():
        marks = lines[f"tolerance ({cand})"]
        assert marks.get_marker() == "_"
        np.testing.assert_array_equal(marks.get_xdata(), np.arange(N_OPS))
        np.testing.assert_allclose(marks.get_ydata(), tol)


def test_along_graph_tick_labels_are_reference_names_for_small_graphs(records):
    ax = plots.error_along_graph(records).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"body.{i}.op" for i in range(N_OPS)]
    assert list(ax.get_xticks()) == list(range(N_OPS))


def test_along_graph_large_graph_labels_every_kth():
    ax = plots.error_along_graph(make_records(100)).axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert 20 <= len(labels) <= 40
    step = int(ax.get_xticks()[1] - ax.get_xticks()[0])
    assert labels == [f"body.{i}.op" for i in range(0, 100, step)]
    assert {*ax.get_xticks(), *ax.get_xticks(minor=True)} == set(range(100))  # every op ticked


def test_along_graph_highlight_annotated_with_its_name(records):
    name = "blob12"
    ax = plots.error_along_graph(records, highlight=name).axes[0]
    ring = lines_by_label(ax)[f"highlight: {name}"]
    assert sorted(ring.get_xdata()) == [12, 12]  # both modes of ncnn fp16
    notes = [t for t in ax.texts if name in t.get_text()]
    assert len(notes) == 1
    row = next(r for r in records if r["name"] == name and r["mode"] == "accumulated")
    assert notes[0].xy == pytest.approx((12, row["max_abs"]))
    assert "body.12.op" in notes[0].get_text()


def test_along_graph_candidates_filter(records):
    lines = lines_by_label(plots.error_along_graph(records, candidates=["ncnn fp16"]).axes[0])
    assert {k for k in lines if k.endswith(")") and not k.startswith("tolerance")} == \
        {"ncnn fp16 (accumulated)", "ncnn fp16 (isolated)"}


def test_along_graph_cosine_drawn_as_one_minus_cosine(records):
    ax = plots.error_along_graph(records, metric="cosine", candidates="onnxruntime").axes[0]
    assert ax.get_yscale() == "log" and "cosine" in ax.get_ylabel()
    want = [1 - r["cosine"] for r in records
            if r["candidate"] == "onnxruntime" and r["mode"] == "isolated"]
    np.testing.assert_allclose(lines_by_label(ax)["onnxruntime (isolated)"].get_ydata(), want,
                               rtol=1e-6)


def test_along_graph_snr_linear_in_db(records):
    ax = plots.error_along_graph(records, metric="snr_db").axes[0]
    assert ax.get_yscale() == "linear"
    assert "dB" in ax.get_ylabel()


def test_along_graph_worst_record_drawn_when_order_repeats(records):
    extra = dict(records[0], name="/body.0/out2", max_abs=0.5, passed=False)
    ax = plots.error_along_graph([*records, extra], candidates="onnxruntime").axes[0]
    assert lines_by_label(ax)["onnxruntime (accumulated)"].get_ydata()[0] == 0.5


# --------------------------------------------------------------------------- by op type


def test_by_op_type_boxes_grouped_by_candidate_worst_first(records):
    fig = plots.error_by_op_type(records)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    from matplotlib.patches import PathPatch

    boxes = [p for p in ax.patches if isinstance(p, PathPatch)]
    assert len(boxes) == len(OP_TYPES) * 2
    assert len(ax.collections) == len(OP_TYPES) * 2  # one strip of dots per box
    acc = [r for r in records if r["mode"] == "accumulated"]

    def worst(op):
        vals = [r["max_abs"] for r in acc if r["op_type"] == op and r["max_abs"] is not None]
        return max(vals)

    want = sorted(OP_TYPES, key=lambda op: -worst(op))
    got = [t.get_text().split(" (")[0] for t in ax.get_xticklabels()]
    assert got == want
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= set(TOL)
    assert "accumulated" in ax.get_title()


def test_by_op_type_isolated_mode_counts_dots(records):
    ax = plots.error_by_op_type(records, metric="mean_abs", mode="isolated").axes[0]
    n_dots = sum(len(c.get_offsets()) for c in ax.collections)
    iso = [r for r in records if r["mode"] == "isolated" and r["mean_abs"] is not None]
    assert n_dots == len(iso)
    assert "isolated" in ax.get_title()


def test_by_op_type_unknown_mode_is_input_error(records):
    with pytest.raises(InputError, match="modes present: accumulated, isolated"):
        plots.error_by_op_type(records, mode="both")


# --------------------------------------------------------------------------- one tensor


def arrays(seed: int = 0, shape=(1, 3, 8, 8)):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    b = a + rng.normal(0, 1e-3, shape).astype(np.float32)
    return a, b


def test_histogram_log_bins_zero_count_in_title_and_tolerance_line():
    a, b = arrays()
    b.reshape(-1)[:17] = a.reshape(-1)[:17]
    fig = plots.error_histogram(a, b, bins=30, tolerance=1e-3)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert "17 exactly zero" in ax.get_title() and f"over {a.size} elements" in ax.get_title()
    assert len(ax.patches) == 30
    assert sum(p.get_height() for p in ax.patches) == a.size - 17
    d = np.abs(a.astype(np.float64) - b)
    tol = next(line for line in ax.get_lines() if line.get_label().startswith("tolerance"))
    assert list(tol.get_xdata()) == [1e-3, 1e-3]
    assert f"{int((d > 1e-3).sum())} of {a.size} above" in tol.get_label()


def test_histogram_identical_arrays_all_zero():
    a, _ = arrays()
    ax = plots.error_histogram(a, a.copy()).axes[0]
    assert f"{a.size} exactly zero" in ax.get_title()
    assert len(ax.patches) == 0


@pytest.mark.parametrize("channel", [0, 2])
def test_heatmap_image_is_abs_diff_of_channel(channel):
    a, b = arrays()
    fig = plots.diff_heatmap(a, b[0], channel=channel)  # batch axis on one side only
    assert len(fig.axes) == 2  # the image and its colour bar
    ax = fig.axes[0]
    assert len(ax.images) == 1
    want = np.abs(a.astype(np.float64) - b)[0, channel]
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), want)
    assert f"channel {channel}" in ax.get_title()
    assert "|ref − cand|" in fig.axes[1].get_ylabel()


def test_heatmap_2d_as_is_and_1d_as_row():
    a, b = arrays(shape=(5, 7))
    img = plots.diff_heatmap(a, b).axes[0].images[0].get_array()
    np.testing.assert_array_equal(img, np.abs(a.astype(np.float64) - b))
    a, b = arrays(shape=(9,))
    img = plots.diff_heatmap(a, b).axes[0].images[0].get_array()
    assert img.shape == (1, 9)


def test_heatmap_channel_out_of_range_names_shape_and_range():
    a, b = arrays()
    with pytest.raises(InputError, match=r"channel 3 .*\(1, 3, 8, 8\).*0\.\.2") as e:
        plots.diff_heatmap(a, b, channel=3)
    assert e.value.hint
    with pytest.raises(InputError, match=r"0\.\.2"):
        plots.diff_heatmap(a, b, channel=-1)


def test_scatter_subsamples_seeded_with_identity_line():
    a, b = arrays(shape=(1, 4, 64, 64))  # 16384 elements
    ax = plots.ref_vs_cand_scatter(a, b, max_points=5000, seed=3).axes[0]
    offsets = ax.collections[0].get_offsets()
    assert len(offsets) == 5000
    again = plots.ref_vs_cand_scatter(a, b, max_points=5000, seed=3).axes[0]
    np.testing.assert_array_equal(again.collections[0].get_offsets(), offsets)
    ident = lines_by_label(ax)["y = x"]
    assert np.array_equal(ident.get_xdata(), ident.get_ydata())
    assert ax.get_aspect() == 1.0
    assert "5000 of 16384" in ax.get_title()


def test_scatter_small_tensor_shows_every_value():
    a, b = arrays()
    ax = plots.ref_vs_cand_scatter(a[0], b).axes[0]
    offsets = ax.collections[0].get_offsets()
    assert len(offsets) == a.size
    np.testing.assert_allclose(offsets[:, 0], a.ravel())


# --------------------------------------------------------------------------- bad input


def test_empty_records_is_input_error_with_hint():
    for fn in (plots.error_along_graph, plots.error_by_op_type):
        with pytest.raises(InputError, match="empty") as e:
            fn([])
        assert e.value.hint


@pytest.mark.parametrize("fn", [plots.error_histogram, plots.diff_heatmap,
                                plots.ref_vs_cand_scatter])
def test_shape_mismatch_names_both_shapes(fn):
    a, _ = arrays()
    b = np.zeros((3, 8, 9), np.float32)
    with pytest.raises(InputError, match=r"\[1, 3, 8, 8\].*\[3, 8, 9\]") as e:
        fn(a, b)
    assert "transpose" in e.value.hint


def test_bad_record_arguments_are_input_errors(records):
    with pytest.raises(InputError, match="no key 'order'"):
        plots.error_along_graph([{"candidate": "x", "mode": "accumulated", "max_abs": 1.0}])
    with pytest.raises(InputError, match="metric 'l2'.*max_abs"):
        plots.error_along_graph(records, metric="l2")
    with pytest.raises(InputError, match="'tflite'.*onnxruntime"):
        plots.error_along_graph(records, candidates=["tflite"])
    with pytest.raises(InputError, match="highlight 'nope'"):
        plots.error_along_graph(records, highlight="nope")
    with pytest.raises(InputError, match="list of dicts"):
        plots.error_along_graph(records[0])


# --------------------------------------------------------------------------- headless


def test_all_figures_save_png_headless_and_leave_no_pyplot_figures(records, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    a, b = arrays()
    figs = {
        "graph": plots.error_along_graph(records, highlight="blob12"),
        "optype": plots.error_by_op_type(records),
        "hist": plots.error_histogram(a, b, tolerance=1e-3),
        "heat": plots.diff_heatmap(a, b, channel=1),
        "scatter": plots.ref_vs_cand_scatter(a, b),
    }
    for name, fig in figs.items():
        path = tmp_path / f"{name}.png"
        fig.savefig(path, dpi=60)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
    assert plt.get_fignums() == before


def test_import_does_not_pull_matplotlib():
    code = ("import sys, workbench.comparison.plots; "
            "print('matplotlib' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "False"


def test_figures_render_as_png_in_a_fresh_ipython_shell():
    # no pyplot and no %matplotlib inline: the figure must still display as an image
    code = """
import numpy as np
from IPython.core.interactiveshell import InteractiveShell
from matplotlib.figure import Figure
shell = InteractiveShell.instance()
before = shell.display_formatter.format(Figure())[0]
from workbench.comparison import plots
fig = plots.error_histogram(np.zeros(10, np.float32), np.ones(10, np.float32))
after = shell.display_formatter.format(fig)[0]
print("image/png" in before, "image/png" in after)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
