"""Rewriters during export (wb.rewrite, wb.rewrite_module): applied only inside wb.export /
wb.to_ncnn when their conditions match, restored on return and on error, on the calling
thread only, recorded in the artifact, and refused when they change the numbers."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.runtime import OrtRunner


class Tiled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).repeat(1, 2, 1, 1) * 2


class Head(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class WithHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = Head()

    def forward(self, x):
        return self.head(self.fc(x))


@pytest.fixture
def registry():
    """Names registered by the test, unregistered afterwards whatever happened."""
    names: list[str] = []
    yield names
    for n in names:
        if n in {r.name for r in wb.rewriters()}:
            wb.unregister_rewriter(n)


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _repeat_by_cat(calls):
    def repeat_by_cat(self, *sizes):
        calls.append(sizes)
        out = self
        for d, r in enumerate(sizes):
            out = torch.cat([out] * r, d) if r > 1 else out
        return out
    return repeat_by_cat


def test_a_function_rewriter_applies_for_its_backend_only_and_is_recorded(ws, registry):
    calls: list = []
    wb.rewrite("torch.Tensor.repeat", backend="ncnn", name="cat_repeat")(_repeat_by_cat(calls))
    registry.append("cat_repeat")
    model, x = Tiled().eval(), _x(1, 3, 8, 8)
    ort = wb.export(model, (x,), workspace=ws)  # backend="onnxruntime": not applied
    assert not calls and "Tile" in ort.graph.op_histogram and ort.rewrites == []
    nc = wb.export(model, (x,), workspace=ws, backend="ncnn")
    assert calls and "Tile" not in nc.graph.op_histogram and nc.graph.op_histogram["Concat"]
    (rec,) = nc.rewrites
    assert (rec.name, rec.kind, rec.target, rec.backend, rec.calls) == (
        "cat_repeat", "function", "torch.Tensor.repeat", "ncnn", 1)
    assert "def repeat_by_cat" in rec.source
    assert nc.ok and nc.metrics["max_abs"] < 1e-5
    dyn = wb.export(model, (x,), workspace=ws, backend="ncnn", exporter="dynamo")
    assert [r.name for r in dyn.rewrites] == ["cat_repeat"] and dyn.ok
    assert "Tile" not in dyn.graph.op_histogram
    again = wb.Workspace(ws.path).get(nc.id)  # the record is in artifact.json
    assert again.rewrites == nc.rewrites
    # never leaking: the model as written afterwards, the attribute torch's own again
    assert "repeat" not in torch.Tensor.__dict__
    n = len(calls)
    model(x)
    assert len(calls) == n


def test_a_module_rewriter_replaces_forward_by_exporter_and_opset(ws, registry):
    @wb.rewrite_module(Head, backend="onnxruntime", exporter="torchscript", opset=(13, 17),
                       name="tanh_gelu_by_hand")
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))

    registry.append("tanh_gelu_by_hand")
    written = Head.__dict__["forward"]
    model, x = WithHead().eval(), _x(2, 8)
    art = wb.export(model, (x,), workspace=ws, opset=17)
    assert [(r.name, r.kind, r.calls) for r in art.rewrites] == [("tanh_gelu_by_hand",
                                                                  "module", 1)]
    assert "Gelu" not in art.graph.op_histogram and "Tanh" in art.graph.op_histogram
    assert art.metrics["max_abs"] < 1e-5
    assert wb.export(model, (x,), workspace=ws, opset=18, exporter="dynamo").rewrites == []
    assert wb.export(model, (x,), workspace=ws, opset=12).rewrites == []
    assert wb.export(model, (x,), workspace=ws, opset=17, rewrite=False).rewrites == []
    assert Head.__dict__["forward"] is written


def test_an_exception_mid_export_restores_everything(ws, registry):
    seen = []

    @wb.rewrite("torch.Tensor.repeat", backend="onnxruntime", name="fails_in_trace")
    def fails_in_trace(self, *sizes):
        seen.append(1)
        if torch.jit.is_tracing():
            raise RuntimeError("boom inside the exporter's trace")
        return self.repeat(*sizes)  # the original, inside its own rewriter

    registry.append("fails_in_trace")
    model, x = Tiled().eval(), _x(1, 3, 8, 8)
    before = {k: p.clone() for k, p in model.state_dict().items()}
    with pytest.raises(wb.ExportError, match="boom inside the exporter's trace"):
        wb.export(model, (x,), workspace=ws)
    assert "repeat" not in torch.Tensor.__dict__
    n = len(seen)
    out = model(x)
    assert len(seen) == n and out.shape == (1, 8, 8, 8)
    assert all(torch.equal(before[k], p) for k, p in model.state_dict().items())
    assert ws.artifacts == []


def test_other_threads_see_torch_as_written_during_an_export(ws, registry):
    inside, done = threading.Event(), threading.Event()
    other: dict = {}

    @wb.rewrite("torch.Tensor.repeat", backend="onnxruntime", name="waits_for_thread")
    def waits_for_thread(self, *sizes):
        if torch.jit.is_tracing():
            inside.set()
            done.wait(10)
        return torch.cat([self] * sizes[1], 1) if sizes[1] > 1 else self

    registry.append("waits_for_thread")

    def elsewhere():
        inside.wait(10)
        other["patched"] = "repeat" in torch.Tensor.__dict__
        other["result"] = torch.arange(3.0).repeat(2)  # 1-D: the rewriter would fail on it
        done.set()

    t = threading.Thread(target=elsewhere)
    t.start()
    art = wb.export(Tiled().eval(), (_x(1, 3, 8, 8),), workspace=ws)
    t.join(10)
    assert other["patched"]  # the thread ran while the rewriter was installed...
    assert other["result"].tolist() == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]  # ...and got torch's
    assert art.rewrites[0].calls == 1 and "repeat" not in torch.Tensor.__dict__


def test_a_rewriter_that_changes_the_numbers_is_named(ws, registry):
    @wb.rewrite("torch.Tensor.repeat", backend="onnxruntime", name="off_by_one")
    def off_by_one(self, *sizes):
        return torch.cat([self, self + 1], 1)

    @wb.rewrite_module(Head, backend="onnxruntime", name="exact_head")
    def exact(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    registry += ["off_by_one", "exact_head"]
    written = Head.__dict__["forward"]

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.head = Tiled(), Head()

        def forward(self, x):
            return self.head(self.a(x))

    with pytest.raises(wb.ExportError) as e:
        wb.export(Both().eval(), (_x(1, 3, 8, 8),), workspace=ws)
    assert "'off_by_one'" in e.value.message and "exact_head" not in e.value.message
    assert "changes the model's numbers" in e.value.message
    assert "wb.unregister_rewriter('off_by_one')" in e.value.hint
    assert "repeat" not in torch.Tensor.__dict__ and Head.__dict__["forward"] is written


def test_bad_rewriter_declarations_are_named(registry):
    with pytest.raises(wb.InputError) as e:
        wb.rewrite("torch.Tensor.repaet", backend="ncnn")
    assert "'torch.Tensor.repaet' does not exist" in e.value.message
    assert "did you mean 'torch.Tensor.repeat'?" in e.value.hint
    with pytest.raises(wb.InputError, match="no module 'torchh'"):
        wb.rewrite("torchh.diff")
    with pytest.raises(wb.InputError, match="backend='tensorrt'"):
        wb.rewrite("torch.diff", backend="tensorrt")
    with pytest.raises(wb.InputError, match="opset"):
        wb.rewrite("torch.diff", opset=(17, 13))
    with pytest.raises(wb.InputError, match="nn.Module subclass"):
        wb.rewrite_module(torch.diff)
    with pytest.raises(wb.InputError, match="built-in type"):
        wb.rewrite("torch.Generator.manual_seed")

    def one(self, *s):
        return self.repeat(*s)

    wb.rewrite("torch.Tensor.repeat", backend="ncnn", name="first")(one)
    registry.append("first")
    wb.rewrite("torch.Tensor.repeat", backend="ncnn", name="first")(one)  # a re-run cell
    wb.rewrite("torch.Tensor.repeat", backend="onnxruntime", name="other_backend")(one)
    registry.append("other_backend")
    with pytest.raises(wb.InputError) as e:
        wb.rewrite("torch.Tensor.repeat", backend="ncnn", name="second")(one)
    assert "two rewriters for torch.Tensor.repeat on ncnn" in e.value.message
    assert "'first'" in e.value.message and "unregister_rewriter('first')" in e.value.hint
    with pytest.raises(wb.InputError, match="no rewriter named 'frist'.*did you mean 'first'"):
        wb.unregister_rewriter("frist")


def test_rewriters_lists_all_three_kinds(registry):
    wb.register_symbolic("aten::asinh", lambda g, x: g.op("Asinh", x), opset=9)
    try:
        kinds = {(r.kind, r.target) for r in wb.rewriters()}
    finally:
        wb.customops.unregister("aten::asinh")
    assert ("symbolic", "aten::asinh") in kinds
    assert ("function", "torch.diff") in kinds and ("function", "torch.Tensor.repeat") in kinds


def test_a_symbolic_the_export_can_use_is_listed_with_it(ws):
    class Twice(nn.Module):
        def forward(self, x):
            return torch.asinh(x) + torch.asinh(2 * x)

    wb.register_symbolic("aten::asinh", lambda g, x: g.op("Asinh", x), opset=9)
    try:
        art = wb.export(Twice(), (_x(2, 5),), workspace=ws, opset=9)
        dyn = wb.export(Twice(), (_x(2, 5),), workspace=ws, exporter="dynamo")
        other = wb.export(nn.ReLU(), (_x(2, 5),), workspace=ws, opset=9)
    finally:
        wb.customops.unregister("aten::asinh")
    # the TorchScript exporter converted two nodes with it; dynamo's use is not counted
    assert [(r.kind, r.target, r.calls) for r in art.rewrites] == [
        ("symbolic", "aten::asinh", 2)]
    assert [(r.kind, r.calls) for r in dyn.rewrites] == [("symbolic", None)]
    assert other.rewrites == []  # usable, but not used
    from torch.onnx._internal.torchscript_exporter.registration import registry

    assert not registry.is_registered_op("aten::asinh", 9)  # torch's registry as it was


def test_show_code_writes_the_rewriters_before_the_export(ws, registry):
    from workbench.ui.panels.export import ExportPanel

    calls: list = []
    wb.rewrite("torch.Tensor.repeat", backend="onnxruntime", name="cat_repeat")(
        _repeat_by_cat(calls))
    registry.append("cat_repeat")
    panel = ExportPanel(Tiled().eval(), (_x(1, 3, 8, 8),), workspace=ws)
    assert "cat_repeat" not in panel.code()
    panel.run()
    code = panel.code()
    assert "#   cat_repeat  function torch.Tensor.repeat" in code
    assert "def repeat_by_cat(self, *sizes):" in code
    assert code.index("def repeat_by_cat") < code.index("wb.export(")


def test_the_rewritten_export_runs_in_onnxruntime_as_torch(ws, registry):
    calls: list = []
    wb.rewrite("torch.Tensor.repeat", backend="onnxruntime", name="cat_repeat")(
        _repeat_by_cat(calls))
    registry.append("cat_repeat")
    model, x = Tiled().eval(), _x(1, 3, 8, 8)
    art = wb.export(model, (x,), workspace=ws)
    (got,) = OrtRunner(art).run((x,)).values()
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-5)


class CountedDiff(nn.Module):
    """Counts its forwards; takes another path while traced when ``traced_scale`` is set."""

    def __init__(self, traced_scale: float = 1.0) -> None:
        super().__init__()
        self.calls, self.traced_scale = 0, traced_scale

    def forward(self, x):
        self.calls += 1
        y = torch.diff(x, dim=-1) * 2
        return y * self.traced_scale if torch.jit.is_tracing() else y


def test_the_rewriters_are_checked_on_the_traced_forward_without_running_the_model_again(ws):
    """A TorchScript export with a rewriter that fires runs the model twice (the reference,
    the trace), not three times: the trace's outputs are the rewritten model's."""
    model = CountedDiff().eval()
    art = wb.export(model, (_x(2, 9),), workspace=ws)
    assert art.ok and model.calls == 2
    assert [(r.name, r.calls) for r in art.rewrites] == [("workbench.diff", 1)]


def test_a_trace_that_differs_from_eager_does_not_blame_the_rewriter(ws):
    """The trace took another path (torch.jit.is_tracing()): the model is run with the
    rewriter eagerly, which agrees; the exported graph's difference is the numeric check's."""
    model = CountedDiff(traced_scale=3.0).eval()
    art = wb.export(model, (_x(2, 9),), workspace=ws)
    assert model.calls == 3 and [r.name for r in art.rewrites] == ["workbench.diff"]
    assert "numeric-mismatch" in [d.code for d in art.diagnostics]
