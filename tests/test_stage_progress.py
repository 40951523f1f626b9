"""export, simplify and raise_ops say where they are: a callable ``progress=`` hears every
phase by name, in order, and the count reaches the total (issue 34: a 0.5B decoder's export
takes minutes; the notebook panel and the CLI bar show these phases)."""

from __future__ import annotations

import torch
from torch import nn

import workbench as wb


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(self.fc(x)))


def _heard(fn, *args, **kw):
    steps = []
    art = fn(*args, progress=steps.append, **kw)
    return art, steps


def test_export_simplify_and_raise_report_their_phases(ws):
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    onx, steps = _heard(wb.export, _Net().eval(), (x,), workspace=ws)
    phases = list(dict.fromkeys(s.phase for s in steps))  # each in order, once
    assert onx.ok and {s.stage for s in steps} == {"export"}
    assert phases[0].startswith("running the model in torch")
    assert any(p.startswith("exporting (torch.onnx.export, torchscript, opset 17)")
               for p in phases)
    assert phases.index(next(p for p in phases if p.startswith("exporting"))) < phases.index(
        "checking numerics with onnxruntime against torch")
    assert steps[-1].done == steps[-1].total == 5

    sim, steps = _heard(wb.simplify, onx)
    phases = list(dict.fromkeys(s.phase for s in steps))  # each in order, once
    assert sim.ok and phases[1] == "simplifying (onnxslim)"
    assert "checking numerics with onnxruntime: the simplified model" in phases
    assert steps[-1].done == steps[-1].total

    hi, steps = _heard(wb.raise_ops, sim)
    assert hi.ok and any(s.phase.startswith("raising (") for s in steps)
    assert steps[-1].done == steps[-1].total == 4


def test_progress_false_is_silent_and_true_draws_a_bar(ws, capsys):
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    wb.export(_Net().eval(), (x,), workspace=ws, progress=False)
    assert "export" not in capsys.readouterr().err
    wb.export(_Net().eval(), (x,), workspace=ws, progress=True)
    assert "export" in capsys.readouterr().err  # tqdm's line on stderr
