"""Stage panels and the pipeline widget, headless: ``panel.run()`` is what Run calls.

The expensive runs (a whole pipeline on the default model) happen once per module. "Show
code" is checked the honest way: the code is exec'd in a fresh namespace holding only
``model`` and ``inputs``, and what it makes is compared with what the panel made.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import workbench as wb
from workbench.ui.panels import (
    ComparePanel,
    CustomOpsPanel,
    ExportPanel,
    NcnnPanel,
    RaisePanel,
    SimplifyPanel,
    error_html,
)


@pytest.fixture(scope="module")
def model_inputs():
    return wb.default_model()


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("ui") / "ws")


@pytest.fixture(scope="module")
def pipeline(model_inputs, ws):
    model, inputs = model_inputs
    pipe = wb.ui.Pipeline(model, inputs, workspace=ws, compare={"mode": "accumulated"})
    pipe.run()
    return pipe


def _exec(code: str, model_inputs) -> dict:
    model, inputs = model_inputs
    ns = {"model": model, "inputs": inputs}
    exec(compile(code, "<panel code>", "exec"), ns)
    return ns


def _same_artifact(a, b) -> None:
    """Equivalent: same stage and format, same graph and the same stage parameters."""
    assert (a.stage, a.format) == (b.stage, b.format)
    assert a.id != b.id  # a new artifact, not the panel's
    assert a.graph.op_histogram == b.graph.op_histogram
    assert [str(t) for t in a.graph.inputs] == [str(t) for t in b.graph.inputs]
    skip = {"command"}  # pnnx's command line names its temp folder
    assert {k: v for k, v in a.params.items() if k not in skip} == \
        {k: v for k, v in b.params.items() if k not in skip}


def test_import_stays_lazy() -> None:
    probe = ("import sys, workbench, workbench.ui\n"
             "print([m for m in ('ipywidgets', 'jupyter_server', 'torch', 'IPython') "
             "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    assert wb.ui.Pipeline is not None and "netron" in dir(wb.ui)


def test_pipeline_runs_every_stage_and_chains_artifacts(pipeline) -> None:
    assert not pipeline.errors, {s: str(e) for s, e in pipeline.errors.items()}
    arts = pipeline.artifacts
    assert {"export", "simplify", "ncnn"} <= set(arts)
    assert arts["simplify"].parent.id == arts["export"].id
    last_onnx = arts.get("raise", arts["simplify"])
    if "raise" in arts:
        assert arts["raise"].parent.id == arts["simplify"].id
    # compare checked the newest ONNX model and the ncnn model
    assert [c.id for c in pipeline.panels["compare"].candidates] == [last_onnx.id,
                                                                     arts["ncnn"].id]
    report = pipeline.report
    assert report is not None and report.ok, report.summary()
    assert set(report.aligned_fraction) and all(f > 0.5 for f in report.aligned_fraction.values())
    # the summary table and every panel's status say what happened
    table = pipeline.table.value
    for stage in ("export", "simplify", "ncnn", "compare"):
        assert f"wb-row-{stage}" in table
        assert "done in" in pipeline.panels[stage].status.value
    assert arts["export"].id in table and "failed" not in table
    assert pipeline.progress.value == pipeline.progress.max
    assert "all stages done" in pipeline.status.value


def test_panel_shows_summary_node_counts_diagnostics_and_preview(pipeline) -> None:
    sim = pipeline.panels["simplify"]
    art = sim.artifact
    html = sim.result_html.value
    assert art.summary() in html
    assert f"nodes: {art.parent.graph.node_count} &rarr; {art.graph.node_count}" in html
    assert "wb-diagnostics" in html or "no diagnostics" in html
    assert sim.progress.bar_style == "success"
    (preview,) = sim.preview.children  # GraphView once it exists, else the op histogram
    if type(preview).__name__ == "HTML":
        for op, n in art.graph.op_histogram.items():
            assert f"<code>{op}</code>" in preview.value and f"</div> {n}</td>" in preview.value
    ncnn = pipeline.panels["ncnn"]
    assert "max_abs_fp16" in ncnn.result_html.value  # ncnn's fp32 and fp16 figures
    assert "pnnx graph" in ncnn.result_html.value
    cmp_panel = pipeline.panels["compare"]
    assert pipeline.report.summary().splitlines()[0] in cmp_panel.result_html.value
    # the sortable, filterable table
    assert type(cmp_panel.preview.children[0]).__name__ == "CompareView"
    # the graph coloured by accumulated error
    *_, picker, box = cmp_panel.preview.children
    assert list(picker.options) == [c.name for c in pipeline.report.candidates]
    (view,) = box.children
    assert type(view).__name__ == "GraphView" and view.color_by == "accumulated"
    assert any(v is not None and v > 0 for v in view.values)
    picker.value = picker.options[-1]  # the ncnn model's graph
    assert box.children[0] is not view and type(box.children[0]).__name__ == "GraphView"


def test_show_code_reproduces_the_export(model_inputs, ws) -> None:
    model, inputs = model_inputs
    panel = ExportPanel(model, inputs, workspace=ws, opset=16)
    batch_box, batch_name = panel.axes[0][0]
    batch_box.value = True
    batch_name.value = "n"
    assert panel.code_html.layout.display == "none"
    panel.code_toggle.value = True
    assert panel.code_html.layout.display == ""
    shown = panel.code_html.value
    assert "opset=16" in shown and "{0: &#x27;n&#x27;}" in shown
    panel.opset.value = 17  # the code follows the controls
    assert "opset=17" in panel.code_html.value
    art = panel.run()
    assert panel.error is None and art is not None
    assert art.graph.inputs[0].dynamic_dims == {0: "n"}
    ns = _exec(panel.code(), model_inputs)
    _same_artifact(ns["onx"], art)


def test_show_code_reproduces_simplify_and_ncnn(pipeline, model_inputs) -> None:
    sim = pipeline.panels["simplify"]
    sim.backend.value = "onnxsim"
    code = sim.code()
    assert f"ws.get({sim.source.id!r})" in code and "backend='onnxsim'" in code
    fresh = _exec(code, model_inputs)["sim"]
    art = sim.run()
    assert sim.error is None
    _same_artifact(fresh, art)
    ncnn = pipeline.panels["ncnn"]
    fresh_nc = _exec(ncnn.code(), model_inputs)["nc"]
    _same_artifact(fresh_nc, ncnn.artifact)
    assert fresh_nc.metrics["max_abs"] == pytest.approx(ncnn.artifact.metrics["max_abs"],
                                                        abs=1e-6)


def test_pipeline_code_runs_the_whole_chain(pipeline, model_inputs) -> None:
    code = pipeline.code()
    for call in ("wb.export(model, inputs", "wb.simplify(onx", "wb.to_ncnn(", "wb.compare(model"):
        assert call in code
    ns = _exec(code, model_inputs)
    rep = ns["rep"]
    assert rep.ok and set(rep.aligned_fraction.values()) == \
        set(pipeline.report.aligned_fraction.values())
    _same_artifact(ns["onx"], pipeline.artifacts["export"])


def test_bad_settings_show_the_error_and_hint_in_the_panel(model_inputs, ws) -> None:
    model, inputs = model_inputs
    panel = ExportPanel(model, inputs, workspace=ws, opset=3)
    panel.run_button.click()  # the button callback: nothing escapes it
    assert isinstance(panel.error, wb.InputError)
    html = panel.result_html.value
    assert "opset=3" in html and "wb-hint" in html and panel.error.hint.split(";")[0] in html
    assert panel.progress.bar_style == "danger" and "failed" in panel.status.value
    assert not panel.run_button.disabled
    assert panel.run() is None  # run() itself returns None, never raises
    assert panel.preview.children == () and panel.netron_button.disabled
    # an axis name that is not an identifier
    panel.opset.value = 17
    panel.axes[0][2][0].value = True
    panel.axes[0][2][1].value = "2 h"
    assert panel.run() is None and "not an identifier" in panel.result_html.value
    # stages with nothing to work on, and an unreadable tolerance
    sim = SimplifyPanel(workspace=ws)
    assert sim.run() is None and isinstance(sim.error, wb.InputError)
    assert "run the export panel first" in sim.result_html.value
    cmp_panel = ComparePanel(model, inputs, [], workspace=ws)
    cmp_panel.tolerance.value = "tight"
    assert cmp_panel.run() is None and "not a number" in cmp_panel.result_html.value
    nc = NcnnPanel(source=None, workspace=ws)
    assert nc.run() is None and "no ONNX model yet" in nc.result_html.value


def test_unexpected_errors_are_shown_too() -> None:
    try:
        raise KeyError("boom")
    except KeyError as e:
        html = error_html(e)
    assert "KeyError" in html and "boom" in html and "wb-hint" in html


def test_raise_panel_rules_and_code(pipeline, model_inputs) -> None:
    if "raise" not in pipeline.panels:
        pytest.skip("this workbench has no raising stage")
    panel: RaisePanel = pipeline.panels["raise"]
    every = list(panel.rules.options)
    assert every and panel.settings()["rules"] is None
    panel.rules.value = tuple(every[:1])
    assert panel.settings()["rules"] == every[:1]
    assert f"rules={every[:1]!r}" in panel.code()
    art = panel.run()
    assert panel.error is None and art.stage == "raise"
    _same_artifact(_exec(panel.code(), model_inputs)["hi"], art)
    panel.rules.value = ()
    assert panel.run() is None and "no raising rule" in panel.result_html.value


def test_custom_ops_panel_registers_the_op_export_asked_for(ws) -> None:
    import torch

    if not hasattr(wb, "register_symbolic"):
        pytest.skip("this workbench has no custom-ops stage")

    class Asinh(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.asinh(x) * 2

    export = ExportPanel(Asinh(), (torch.rand(2, 5),), workspace=ws, opset=9)
    custom = CustomOpsPanel(workspace=ws, export_panel=export)
    try:
        assert export.run() is None and isinstance(export.error, wb.ExportError)
        # the failing op, and the registration the error suggests, fill the custom-ops panel
        assert custom.op.value == "aten::asinh" and custom.onnx_op.value == "Asinh"
        assert custom.opset.value == 9
        assert custom.code().strip().endswith(
            "wb.register_symbolic('aten::asinh', lambda g, *args: g.op('Asinh', *args), "
            "opset=9)")
        art = custom.run()  # registers, then exports again
        assert custom.error is None, custom.result_html.value
        assert art is export.artifact and art.graph.op_histogram.get("Asinh") == 1
        assert art.ok and "registered" in custom.result_html.value
        assert "aten::asinh (opset 9)" in custom.registered.value
    finally:
        wb.unregister("aten::asinh")
    custom.op.value = "asinh"
    assert custom.run() is None and "qualified name" in custom.result_html.value


def test_netron_button_registers_the_result(pipeline, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    panel = pipeline.panels["ncnn"]
    assert not panel.netron_button.disabled
    view = panel.show_netron()
    assert set(view.files) == {"model.ncnn.param", "model.ncnn.bin"}
    entry = json.loads((tmp_path / "workbench-netron" / f"{view.key}.json").read_text())
    assert entry["main"] == "model.ncnn.param"
    assert f"workbench/netron/{view.key}/" in view.html()
    pnnx = wb.ui.netron(panel.artifact.parent)  # the pnnx graph, with its own weights
    assert set(pnnx.files) == {"model.pnnx.param", "model.pnnx.bin"} and pnnx.key != view.key


def test_pipeline_stops_after_a_failed_export_and_says_so(ws) -> None:
    import torch

    class Asinh(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.asinh(x)

    pipe = wb.ui.Pipeline(Asinh(), (torch.rand(2, 5),), workspace=ws, export={"opset": 9})
    pipe.run_all_button.click()  # what the button does: nothing escapes it
    assert set(pipe.errors) == {"export"} and isinstance(pipe.errors["export"], wb.ExportError)
    assert pipe.artifacts == {} and pipe.report is None
    assert pipe.panels["simplify"].result is None and pipe.panels["simplify"].error is None
    assert "failed: export" in pipe.status.value and pipe.progress.bar_style == "danger"
    assert "wb-row-export" in pipe.table.value and "failed" in pipe.table.value
    export_html = pipe.panels["export"].result_html.value
    assert "aten::asinh" in export_html and "wb-hint" in export_html
    if "custom_ops" in pipe.panels:  # the export error filled the custom-ops tab
        assert pipe.panels["custom_ops"].op.value == "aten::asinh"


def test_a_stage_made_from_an_older_input_is_stale_left_out_of_compare_and_run_again(
        model_inputs, tmp_path) -> None:
    model, inputs = model_inputs
    pipe = wb.ui.Pipeline(model, inputs, workspace=tmp_path / "ws",
                          compare={"mode": "accumulated"}, ncnn={"from_": "onnx"})
    p = pipe.panels
    for stage in ("export", "simplify", "raise"):
        p[stage].run()
    assert pipe.stale() == {} and [c.id for c in p["compare"].candidates] == \
        [p["raise"].artifact.id]
    old_simplify, old_raise = p["simplify"].artifact, p["raise"].artifact
    p["export"].run()  # the quickstart's re-run: a new export, then a new simplify
    assert set(pipe.stale()) == {"simplify", "raise"}  # raise through its lineage
    p["simplify"].run()
    stale = pipe.stale()
    assert stale == {"raise": f"made from {old_simplify.id}, simplify is now "
                              f"{p['simplify'].artifact.id}"}
    # marked in the table and in the raise panel; compare checks the new simplify instead
    assert "wb-stale" in pipe.table.value and f"made from {old_simplify.id}" in pipe.table.value
    assert "stale" in p["raise"].stale_html.value and p["simplify"].stale_html.value == ""
    assert [c.id for c in p["compare"].candidates] == [p["simplify"].artifact.id]
    assert f"not compared: {old_raise.id}" in p["compare"].candidates_html.value
    assert "stale: raise (Run all runs them again)" in pipe.status.value
    # Run all runs the stale stage again (and every other): nothing stale after it
    pipe.run_all_button.click()
    assert not pipe.errors and pipe.stale() == {}
    new_raise = p["raise"].artifact
    assert new_raise.id != old_raise.id and new_raise.parent.id == p["simplify"].artifact.id
    assert "wb-stale" not in pipe.table.value and p["raise"].stale_html.value == ""
    assert p["ncnn"].artifact.parent.parent.id == new_raise.id  # pnnx from the raised ONNX
    assert [c.id for c in pipe.panels["compare"].compared] == [new_raise.id,
                                                              p["ncnn"].artifact.id]
    # int8 from that ncnn model, then a new ncnn model: the int8 one and the comparison
    # are stale; Run all quantizes again (from the new ncnn model) and compares it too
    p["quantize"].backend.value = "ncnn"
    p["quantize"].samples.value = 2
    assert p["quantize"].run() is not None, p["quantize"].result_html.value
    p["ncnn"].run()
    assert set(pipe.stale()) == {"quantize", "compare"}
    pipe.run()
    q8 = p["quantize"].artifact
    assert pipe.stale() == {} and not pipe.errors
    assert q8.parent.id == p["ncnn"].artifact.id and q8.id in [c.id for c in p["compare"].compared]


def test_progress_within_pnnx_and_quantization_names_phases_and_counts(model_inputs, ws) -> None:
    from workbench.progress import Step
    from workbench.stages.ncnn import PNNX_PASSES
    from workbench.ui.panels import QuantizePanel

    model, inputs = model_inputs
    seen: list[Step] = []
    nc = wb.to_ncnn(model, inputs, workspace=ws, progress=seen.append)
    pnnx = list(dict.fromkeys(s.phase for s in seen if s.phase.startswith("pnnx ")))
    assert pnnx == [f"pnnx pass_{p}" for p in PNNX_PASSES]  # each pass pnnx announced
    done = [s.done for s in seen]
    assert done == sorted(done) and done[-1] == seen[-1].total == 2 + len(PNNX_PASSES)
    # the panel's bar counts the same steps and its status names each phase as it comes
    panel = NcnnPanel(model, inputs, workspace=ws)
    statuses: list[str] = []
    panel.status.observe(lambda c: statuses.append(c["new"]), names="value")
    assert panel.run() is not None and panel.error is None
    assert any("pnnx pass_level2 (4/9)" in s for s in statuses), statuses
    assert panel.progress.max == panel.progress.value == 9
    quant = QuantizePanel(model, inputs, source=nc, workspace=ws, samples=2)
    quant.status.observe(lambda c: statuses.append(c["new"]), names="value")
    assert quant.run() is not None, quant.result_html.value
    assert any("calibrating on 2 samples (kl)" in s for s in statuses), statuses
    assert any("checking the int8 model" in s for s in statuses)
    # compare: capturing, then each candidate's aligned tensors measured, counted
    seen.clear()
    rep = wb.compare(model, [nc], inputs, progress=seen.append)
    aligned = len(rep.alignments[rep.candidates[0].name].pairs)
    assert [s.phase for s in seen][0] == "torch: capturing every tensor"
    assert any(f"measuring {aligned} aligned tensors of " in s.phase for s in seen)
    assert seen[-1].done == seen[-1].total == 2
    cmp_panel = ComparePanel(model, inputs, [nc], workspace=ws, mode="accumulated")
    cmp_panel.status.observe(lambda c: statuses.append(c["new"]), names="value")
    assert cmp_panel.run() is not None and cmp_panel.progress.max == 2
    assert any(f"measuring {aligned} aligned tensors" in s for s in statuses)


def test_custom_ops_panel_declares_an_op_of_your_own_with_wb_custom_op(ws) -> None:
    import torch

    class Twice(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.wbpanel.twice(x) + 1

    export = ExportPanel(Twice(), (torch.rand(2, 3),), workspace=ws)
    custom = CustomOpsPanel(workspace=ws, export_panel=export)
    try:
        assert export.run() is None  # torch.ops has no wbpanel.twice yet
        # the op the export error names fills the panel, as a @wb.custom_op declaration
        assert custom.kind.value == "custom_op" and custom.op.value == "wbpanel::twice"
        assert "@wb.custom_op('wbpanel::twice', mutates_args=())" in custom.declaration.value
        custom.declaration.value = custom.declaration.value.replace("return x.clone()",
                                                                    "return 2 * x")
        code = custom.code()
        assert code.startswith("import workbench as wb") and "return 2 * x" in code
        art = custom.run()  # declares the op, then exports again
        assert custom.error is None, custom.result_html.value
        assert art is export.artifact and art.graph.op_histogram.get("wbpanel::twice") == 1
        assert art.ok and art.metrics["max_abs"] < 1e-6  # ONNX Runtime ran the torch code
        assert "wbpanel::twice" in custom.registered.value
    finally:
        wb.unregister("wbpanel::twice")
    custom.declaration.value = "@wb.custom_op('wbpanel::twice')\ndef twice(x:\n"
    assert custom.run() is None and "does not parse" in custom.result_html.value
    custom.declaration.value = "x = 1  # wbpanel::twice named, nothing declared\n"
    assert custom.run() is None and "declared no op &#x27;wbpanel::twice" in custom.result_html.value
    custom.kind.value = "symbolic"  # the register_symbolic form wants an ONNX op type
    custom.op.value, custom.onnx_op.value = "aten::asinh", "asinh"
    assert custom.run() is None and "not an ONNX op type" in custom.result_html.value


def test_show_code_keeps_the_workspace_path_as_the_user_wrote_it(model_inputs, tmp_path,
                                                                  monkeypatch) -> None:
    model, inputs = model_inputs
    monkeypatch.chdir(tmp_path)
    pipe = wb.ui.Pipeline(model, inputs, workspace="runs/rel")
    for code in (pipe.code(), pipe.panels["simplify"].code(), pipe.panels["ncnn"].code(),
                 pipe.panels["compare"].code()):
        assert "ws = wb.Workspace('runs/rel')" in code and str(tmp_path) not in code
    # a Workspace object below the working directory: relative to it; an absolute path stays
    assert "wb.Workspace('runs/obj')" in ExportPanel(
        model, inputs, workspace=wb.Workspace("runs/obj")).code()
    absolute = str(tmp_path / "abs")
    assert f"wb.Workspace({absolute!r})" in ExportPanel(model, inputs, workspace=absolute).code()


def _png_size(data: bytes) -> tuple[int, int]:
    import struct

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_compare_view_figures_at_screen_density_table_resizable(pipeline) -> None:
    import base64
    import re

    from workbench.ui.compareview import CSS_DPI, DENSITY, CompareView

    view = CompareView(pipeline.report, summary=False)
    imgs = re.findall(r"<img src='data:image/png;base64,([^']+)' width='(\d+)' height='(\d+)'",
                      view.figures_w.value)
    assert len(imgs) == len(view.figures) == 2
    for (data, width, height), fig in zip(imgs, view.figures, strict=True):
        w_in, h_in = fig.get_size_inches()
        # shown at the figure's own size (text at its point size), drawn at 2x for the screen
        assert (int(width), int(height)) == (round(w_in * CSS_DPI), round(h_in * CSS_DPI))
        assert int(width) <= 960  # within a notebook's output, not wider
        assert _png_size(base64.b64decode(data)) == (round(w_in * CSS_DPI * DENSITY),
                                                     round(h_in * CSS_DPI * DENSITY))
    assert "max-width:none" in view.figures_w.value and "overflow-x:auto" in view.figures_w.value
    assert view.table_w.layout.height == "360px" and view.table_w.layout.max_height is None
    assert 'el.style.resize = "vertical"' in view.table_w._esm


def test_many_op_labels_do_not_overlap_and_the_colourbar_keeps_off_the_title() -> None:
    import numpy as np

    from workbench.comparison import plots

    rows = [{"candidate": c, "mode": "accumulated", "order": i, "name": f"/n{i}",
             "reference": f"blocks.{i // 10}.attn.layer_{i}", "op_type": "MatMul",
             "max_abs": 10.0 ** -(i % 7), "passed": True, "tolerance": 1e-4}
            for c in ("onnxruntime a", "ncnn b") for i in range(400)]
    fig = plots.error_along_graph(rows)
    fig.canvas.draw()
    ax = fig.axes[0]
    boxes = sorted((t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()),
                   key=lambda b: b.x0)
    assert 10 <= len(boxes) <= 60  # thinned, not 400
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False))  # none overlap
    rng = np.random.default_rng(0)
    a = rng.normal(size=(1, 4, 32, 32)).astype("float32")
    fig = plots.diff_heatmap(a, a + rng.normal(scale=1e-5, size=a.shape).astype("float32"))
    fig.canvas.draw()
    ax, bar = fig.axes
    title = ax.title.get_window_extent()
    assert title.x0 >= 0 and title.x1 <= fig.bbox.width  # the whole title on the figure
    assert not title.overlaps(bar.get_tightbbox())  # the colour bar and its ticks keep off it


def test_ui_pipeline_spells_raise_ops_as_wb_pipeline_does(tmp_path):
    """One spelling per option: ``raise_ops=`` as ``wb.Pipeline``; the old ``raise_=`` still
    works, with a DeprecationWarning, and both at once is a hinted error."""
    model, x = wb.default_model()
    pipe = wb.ui.Pipeline(model, x, workspace=tmp_path / "a", raise_ops={"target": "functions"})
    assert pipe.panels["raise"].target.value == "functions"
    with pytest.warns(DeprecationWarning, match="raise_ops"):
        old = wb.ui.Pipeline(model, x, workspace=tmp_path / "b", raise_={"target": "functions"})
    assert old.panels["raise"].target.value == "functions"
    with pytest.raises(wb.InputError, match="both raise_ops= and raise_="), \
            pytest.warns(DeprecationWarning):
        wb.ui.Pipeline(model, x, workspace=tmp_path / "c", raise_ops={}, raise_={})
