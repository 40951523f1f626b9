"""A layer computing another formula than its module is named, with its size and its fix:
pnnx writes transformers' tanh GELU (gelu_new) as ncnn's erf GELU, 4.7e-4 off on ALBERT."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn
from transformers.activations import NewGELUActivation

import workbench as wb
from workbench.comparison.formulas import gelu_form


class Act(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = act

    def forward(self, x):
        return self.act(self.fc(x))


def _converted(tmp_path, act, name):
    torch.manual_seed(0)
    model, x = Act(act).eval(), torch.randn(1, 8, 16) * 3
    return model, x, wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / name))


def _with_gelu_param(nc, dest, edit):
    """A copy of the converted files whose GELU layer line is ``edit(line)`` (outside the
    artifact: its artifact.json is left behind, as its sha256 records would refuse the edit)."""
    dest.mkdir()
    for f in nc.dir.iterdir():
        if f.is_file() and f.name != "artifact.json":
            shutil.copy(f, dest / f.name)
    param = dest / nc.path.name
    param.write_text("\n".join(edit(ln) if ln.startswith("GELU") else ln
                               for ln in param.read_text().splitlines()) + "\n")
    return param


def test_the_form_of_a_gelu_module_is_measured_not_read_from_its_class():
    assert gelu_form(NewGELUActivation()) == "tanh"
    assert gelu_form(nn.GELU(approximate="tanh")) == "tanh"
    assert gelu_form(nn.GELU()) == "erf"
    assert gelu_form(nn.SiLU()) is None  # another activation
    assert gelu_form(nn.Linear(3, 3)) is None  # not elementwise: no form, no error


@pytest.mark.parametrize("mode", ["accumulated", "isolated"])
def test_a_tanh_gelu_converted_to_erf_is_named_and_the_fix_works(tmp_path, mode):
    model, x, nc = _converted(tmp_path, NewGELUActivation(), "new")
    # to_ncnn sets 0=1 itself (stages/ncnn_gelu.py); pnnx by hand writes the erf form
    assert next(ln for ln in nc.path.read_text().splitlines()
                if ln.startswith("GELU")).endswith(" 0=1")
    as_pnnx_wrote = _with_gelu_param(nc, tmp_path / "erf", lambda ln: ln[:-len(" 0=1")])
    rep = wb.compare(model, [as_pnnx_wrote], (x,), mode=mode, progress=False)
    (name,) = rep.notes
    note = rep.notes[name]
    assert "compute the erf form where act (NewGELUActivation) compute(s) the tanh form" \
        in note and "add 0=1 (fast_gelu)" in note and "up to 0.00047" in note
    assert rep.first_divergence.reference == "act"  # still a divergence: another function
    assert "NOTE: GELU layer(s) gelu_" in rep.summary()
    again = wb.compare(model, [nc], (x,), mode=mode, progress=False)
    assert again.ok and not again.notes and again.first_divergence is None


def test_an_erf_gelu_is_quiet_and_a_tanh_layer_for_it_is_named(tmp_path):
    model, x, nc = _converted(tmp_path, nn.GELU(), "erf")
    rep = wb.compare(model, [nc], (x,), progress=False)
    assert rep.ok and not rep.notes
    swapped = _with_gelu_param(nc, tmp_path / "swapped", lambda ln: ln + " 0=1")
    rep = wb.compare(model, [swapped], (x,), progress=False)
    (note,) = rep.notes.values()
    assert "compute the tanh form where act (GELU) compute(s) the erf form" in note
    assert "remove 0=1" in note
