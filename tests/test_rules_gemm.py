"""The Linear rule: x @ W + b -> Gemm on rank 2 (with the bias broadcast check), the Linear
function on a batch of rows (MatMul + Add, or onnxslim's Reshape + Gemm + Reshape)."""

from __future__ import annotations

import pytest
import raising_models as rm
import torch
from torch import nn

import workbench as wb
from workbench.stages.raising import RaiseReport


@pytest.fixture(scope="module")
def gws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("gemm"))


def _export(ws, model, x, simplify=False):
    torch.manual_seed(0)
    onx = wb.export(model.eval(), (x,), workspace=ws, opset=17)
    return wb.simplify(onx) if simplify else onx


def test_rank2_matmul_add_is_gemm(gws):
    torch.manual_seed(0)
    art = _export(gws, rm.Linear2d(), torch.rand(4, 16))
    assert {"MatMul", "Add"} <= set(art.graph.op_histogram)
    hi = wb.raise_ops(art, rules=["Linear"])
    assert hi.graph.op_histogram == {"Gemm": 1, "Relu": 1}
    assert RaiseReport.of(hi).firings[0].form == "standard"
    assert hi.metrics["rel_vs_parent"] <= 1e-5 and hi.metrics["max_abs"] < 1e-5
    fn = wb.raise_ops(art, rules=["Linear"], target="functions")
    assert fn.graph.op_histogram == {"pkg.workbench::Linear": 1, "Relu": 1}


class Rows(nn.Module):
    """nn.Linear on a [batch, tokens, features] input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x))


@pytest.mark.parametrize("simplify", [False, True], ids=["matmul_add", "onnxslim_reshapes"])
def test_a_batch_of_rows_is_the_linear_function(gws, simplify):
    art = _export(gws, Rows(), torch.rand(2, 5, 16), simplify)
    before = art.graph.op_histogram
    assert ("Gemm" in before and before["Reshape"] == 2) if simplify else "MatMul" in before
    hi = wb.raise_ops(art, rules=["Linear"])
    assert hi.graph.op_histogram == {"pkg.workbench::Linear": 1, "Tanh": 1}
    # Gemm takes rank 2 only: no standard op, so the function form, and the report says so
    assert any(d.code == "standard-op-cannot-express" for d in hi.diagnostics)
    assert hi.metrics["rel_vs_parent"] <= 1e-5


class BadBias(nn.Module):
    """x @ W + b where b is [3, 4, 8]: the sum broadcasts x up to rank 3, which Gemm cannot."""

    def __init__(self, shape: tuple = (3, 4, 8)) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))
        self.b = nn.Parameter(torch.randn(*shape))

    def forward(self, x):
        return x @ self.w + self.b


class TwoActivations(nn.Module):
    """x @ y^T + b: a product of two activations (attention scores), not a layer."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x @ (x * 2).t() + self.b


def test_a_per_row_bias_is_what_gemm_broadcasts(gws):
    """A [M, 1] bias broadcasts unidirectionally to [M, N]: Gemm takes it (the twin of the
    refused [3, 4, 8] bias below)."""
    hi = wb.raise_ops(_export(gws, BadBias((4, 1)), torch.rand(4, 16)), rules=["Linear"])
    assert hi.graph.op_histogram == {"Gemm": 1} and hi.metrics["rel_vs_parent"] <= 1e-5


@pytest.mark.parametrize("model", [BadBias(), TwoActivations()], ids=["bias", "activations"])
def test_look_alikes_are_refused(gws, model):
    art = _export(gws, model, torch.rand(4, 16))
    hi = wb.raise_ops(art, rules=["Linear"])
    assert RaiseReport.of(hi).counts == {}
    assert hi.graph.op_histogram == art.graph.op_histogram
