"""to_ncnn sets ncnn's GELU to the tanh form (0=1) where pnnx wrote the erf form for a
model's tanh GELU (transformers' gelu_new), and only where the outputs say so."""

from __future__ import annotations

import re

import torch
from torch import nn
from transformers.activations import NewGELUActivation

import workbench as wb


class TwoActs(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(16, 16), nn.Linear(16, 4), act

    def forward(self, x):
        return self.act(self.fc2(self.act(self.fc1(x))))


def _gelu_lines(nc):
    return [ln for ln in nc.path.read_text().splitlines() if ln.startswith("GELU")]


def test_a_tanh_gelu_written_in_erf_form_is_set_to_tanh_and_said(tmp_path):
    torch.manual_seed(0)
    model, x = TwoActs(NewGELUActivation()).eval(), torch.randn(1, 8, 16) * 3
    nc = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    lines = _gelu_lines(nc)
    assert len(lines) == 2 and all(ln.endswith(" 0=1") for ln in lines)
    (d,) = [d for d in nc.diagnostics if d.code == "ncnn-gelu-tanh"]
    assert d.level == "warning" and "pnnx wrote 2 GELU layer(s)" in d.message
    figures = re.search(r"were (\S+) off the reference, (\S+) with 0=1", d.message)
    before, after = float(figures[1]), float(figures[2])
    assert before > 1e-4 and after < before / 10  # both figures, as measured
    assert nc.metrics["max_abs"] < 1e-5  # the kept model is the fixed one
    assert not [d for d in nc.diagnostics if d.code == "ncnn-numeric-mismatch"]


def test_an_erf_gelu_is_left_as_pnnx_wrote_it(tmp_path):
    torch.manual_seed(0)
    model, x = TwoActs(nn.GELU()).eval(), torch.randn(1, 8, 16) * 3
    nc = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    assert _gelu_lines(nc) and not any("0=1" in ln for ln in _gelu_lines(nc))
    assert not [d for d in nc.diagnostics if d.code == "ncnn-gelu-tanh"]
    assert nc.metrics["max_abs"] < 1e-5
