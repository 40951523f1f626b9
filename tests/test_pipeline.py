"""wb.Pipeline: every stage in order, one result, failures kept apart from what was written."""

from __future__ import annotations

import torch
import trap_models as tm

import workbench as wb


def test_pipeline_runs_every_stage(ws, sr_model):
    model, x = sr_model
    result = wb.Pipeline(model, x, workspace=ws, simplify={"backend": "onnxsim"}).run(
        progress=False)
    assert result.ok and list(result.artifacts) == ["export", "simplify", "raise", "ncnn"]
    assert result.artifacts["simplify"].parent is result.artifacts["export"]
    assert result.artifacts["raise"].parent is result.artifacts["simplify"]
    assert result.artifacts["ncnn"].parent.format == "pnnx"
    # the ncnn summary counts every layer its .param holds (Input too, as a drawing of it
    # shows them) and knows its shapes from the pnnx graph (not float32[?])
    nc, onx = result.artifacts["ncnn"].graph, result.artifacts["export"].graph
    header = result.artifacts["ncnn"].path.read_text().splitlines()[1].split()
    assert nc.node_count == int(header[0]) == sum(nc.op_histogram.values())
    assert [t.shape for t in nc.inputs] == [t.shape for t in onx.inputs]
    assert [t.shape for t in nc.outputs] == [t.shape for t in onx.outputs]
    assert "?" not in str(nc.inputs[0]) + str(nc.outputs[0])
    rows = result.rows()
    assert [r["stage"] for r in rows] == ["export", "simplify", "raise", "ncnn fp32", "ncnn fp16"]
    assert all(r["max_abs_vs_torch"] < 1e-4 for r in rows[:2] + rows[3:4])
    fp16 = rows[4]["max_abs_vs_torch"]  # None when ncnn ran no layer in fp16 on this CPU
    assert (fp16 is None) is bool(result.artifacts["ncnn"].diagnostics_with("fp16-not-exercised"))
    assert fp16 is None or fp16 < 1e-2  # fp16 storage and arithmetic
    assert "ncnn fp16" in result.table()
    rep = result.report
    assert set(rep.aligned_fraction.values()) == {1.0} and rep.ok
    assert [c.name.split()[0] for c in rep.candidates] == ["onnxruntime", "ncnn"]
    assert "op by op:" in result.table()


def test_pipeline_stops_at_a_failed_stage_and_keeps_the_error(ws):
    result = wb.Pipeline(tm.Asinh(), (torch.rand(2),), workspace=ws,
                         export={"opset": 9}).run(progress=False)
    assert not result.ok and list(result.errors) == ["export"]
    assert result.artifacts == {} and len(ws) == 0
    assert "aten::asinh" in result.table()


def test_pipeline_keeps_export_when_simplify_fails(ws, sr_model):
    model, x = sr_model

    def broken(m):
        raise ValueError("nope")

    result = wb.Pipeline(model, x, workspace=ws, simplify={"backend": broken}).run(progress=False)
    # simplify's failure is kept; ncnn does not need it and still runs
    # raising falls back to the export
    assert list(result.artifacts) == ["export", "raise", "ncnn"]
    assert list(result.errors) == ["simplify"]
    assert result.artifacts["raise"].parent is result.artifacts["export"]
    assert len(ws) == 4 and ws.verify() == []
    assert "simplify failed: simplify backend 'broken' failed" in result.table()


class _GeluNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x))


def test_pipeline_raises_lowered_ops_and_compares_the_raised_graph(ws):
    torch.manual_seed(0)
    model, x = _GeluNet().eval(), torch.randn(2, 8)
    result = wb.Pipeline(model, (x,), workspace=ws, export={"opset": 17}).run(progress=False)
    raised = result.artifacts["raise"]
    assert raised.graph.node_count < result.artifacts["simplify"].graph.node_count
    assert "Erf" not in raised.graph.op_histogram  # GELU's erf form folded
    onnx_candidate = result.report.candidates[0]  # the raised graph is the one compared
    assert onnx_candidate.path == raised.path and raised.id in onnx_candidate.name


def test_pipeline_can_skip_raising(ws, sr_model):
    model, x = sr_model
    result = wb.Pipeline(model, x, workspace=ws, raise_ops=False, ncnn=None).run(progress=False)
    assert "raise" not in result.artifacts and "raise" not in result.errors
