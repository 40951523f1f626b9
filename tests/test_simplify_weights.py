"""simplify(weights=...): the large weights lent out of the graph while the backend works
(stages/simplify_weights.py) and given back after, numbers unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


def _mlp(tmp_path):
    import torch

    import workbench as wb

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(600, 600), torch.nn.ReLU(),
                                torch.nn.Linear(600, 8)).eval()  # 1.44 MB + 19 kB of weights
    return wb.export(model, torch.rand(2, 600), workspace=tmp_path / "ws")


def test_lend_and_give_back_round_trip(tmp_path):
    import onnx

    from workbench.stages.simplify_weights import give_back, lend, unfolded

    art = _mlp(tmp_path)
    model = onnx.load(str(art.path))
    before = {t.name: t.SerializeToString() for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input]
    lent = lend(model)
    assert len(lent.tensors) == 1 and lent.nbytes == 600 * 600 * 4
    (name,) = lent.tensors
    assert name not in {t.name for t in model.graph.initializer}
    assert name in [i.name for i in model.graph.input]  # a typed input of its shape
    shape = [d.dim_value for d in next(i for i in model.graph.input if i.name == name)
             .type.tensor_type.shape.dim]
    assert shape == list(lent.tensors[name].dims)
    assert give_back(model, lent) == 1
    assert [i.name for i in model.graph.input] == inputs
    assert {t.name: t.SerializeToString() for t in model.graph.initializer} == before
    assert unfolded(model, lent) == 0  # the Gemm reads the input too


def test_simplify_with_weights_outside_keeps_the_numbers(tmp_path):
    import workbench as wb

    art = _mlp(tmp_path)
    out = wb.simplify(art, weights="outside")
    codes = [d.code for d in out.diagnostics]
    assert "simplify-weights-outside" in codes
    assert out.params["weights"] == "outside"
    assert out.metrics["max_abs_vs_parent"] <= 1e-5
    inside = wb.simplify(art, weights="inside")
    assert "simplify-weights-outside" not in [d.code for d in inside.diagnostics]
    assert inside.params["weights"] == "inside"
    assert out.metrics["nodes_after"] == inside.metrics["nodes_after"]


def test_a_bad_weights_choice_is_refused(tmp_path):
    import workbench as wb
    from workbench.errors import InputError

    art = _mlp(tmp_path)
    with pytest.raises(InputError, match="weights='all' is not one of"):
        wb.simplify(art, weights="all")


CHILD = textwrap.dedent("""
    import json, resource, sys
    import torch
    import workbench as wb
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4000, 4000)).eval()  # 64 MB
    art = wb.export(model, torch.rand(1, 4000), workspace=sys.argv[1])
    with open("/proc/self/status") as f:
        vm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    # room for simplify's own check (3x the file) but not for the backend's peak (8x)
    resource.setrlimit(resource.RLIMIT_AS, (vm + (400 << 20), resource.RLIM_INFINITY))
    out = wb.simplify(art)
    print(json.dumps({"weights": out.params["weights"],
                      "codes": [d.code for d in out.diagnostics],
                      "err": out.metrics["max_abs_vs_parent"]}))
""")


def test_auto_lends_weights_out_when_the_backend_would_not_fit(tmp_path):
    run = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "ws")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["weights"] == "outside", got
    assert "simplify-weights-outside" in got["codes"]
    assert got["err"] <= 1e-5
