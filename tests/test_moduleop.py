"""wb.export(moduleop=...): a named nn.Module kept as one op (an ONNX local function)."""

from __future__ import annotations

import onnx
import pytest
import raising_models as rm
import torch

import workbench as wb


@pytest.fixture(scope="module")
def focus_net():
    torch.manual_seed(0)
    return rm.FocusNet().eval(), (torch.rand(1, 3, 16, 16),)


@pytest.fixture(scope="module")
def mod_ws(tmp_path_factory):
    return wb.Workspace(tmp_path_factory.mktemp("moduleop") / "ws")


@pytest.mark.parametrize("spec", [rm.Focus, "Focus", "raising_models.Focus", ["Focus"]])
def test_focus_is_one_node(focus_net, mod_ws, spec):
    model, args = focus_net
    onx = wb.export(model, args, workspace=mod_ws, opset=17, moduleop=spec)
    hist = onx.graph.op_histogram
    assert hist.get("raising_models::Focus") == 1, hist
    assert "Slice" not in hist and "Concat" not in hist  # inside the function body only
    proto = onnx.load(str(onx.path))
    (fn,) = proto.functions
    assert fn.name == "Focus" and [n.op_type for n in fn.node].count("Slice") >= 4
    assert onx.params["moduleop"] == ["Focus"]
    assert onx.ok and onx.metrics["max_abs"] < 1e-5  # ONNX Runtime runs the function
    # torch's function extraction leaves hooks on every module; the next export would fail
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_without_moduleop_the_focus_is_lowered(focus_net, mod_ws):
    model, args = focus_net
    onx = wb.export(model, args, workspace=mod_ws, opset=17)
    assert onx.graph.op_histogram["Slice"] >= 4 and not onx.graph.functions
    assert onx.params["moduleop"] == []


def test_unknown_name_lists_the_classes(focus_net, mod_ws):
    model, args = focus_net
    with pytest.raises(wb.InputError, match="Fokus.*FocusNet.*Focus, SiLU|Focus.*SiLU") as e:
        wb.export(model, args, workspace=mod_ws, moduleop="Fokus")
    assert "Conv2d" in str(e.value) and e.value.hint


def test_dynamo_route_groups_the_module_from_its_scopes(mod_ws):
    """The dynamo exporter has no export_modules_as_functions: the nodes it records under the
    module's scope are folded into one call afterwards, the same local function."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(rm.FocusNet(), rm.Focus(8, 4)).eval()  # two Focus calls
    onx = wb.export(model, (torch.rand(1, 3, 16, 16),), workspace=mod_ws, exporter="dynamo",
                    opset=18, moduleop=rm.Focus)
    hist = onx.graph.op_histogram
    assert hist == {"raising_models::Focus": 2, "Sigmoid": 1, "Mul": 1}, hist
    proto = onnx.load(str(onx.path))
    assert len(proto.functions) == 2
    for fn in proto.functions:
        ops = [n.op_type for n in fn.node]
        assert fn.name == "Focus" and ops.count("Slice") >= 4 and "Conv" in ops
        assert len(fn.input) == 3  # x and the conv's weight and bias; slice bounds inside
    assert onx.ok and onx.metrics["max_abs"] < 1e-5 and onx.params["moduleop"] == ["Focus"]


@pytest.mark.parametrize("kwargs, match", [
    ({"opset": 13}, "opset >= 15"),
    ({"moduleop": [3]}, "class names"),
    ({"moduleop": rm.FocusNet}, "the exported model itself"),
    ({"moduleop": int}, "nn.Module classes"),
])
def test_bad_moduleop_is_refused(focus_net, mod_ws, kwargs, match):
    model, args = focus_net
    kwargs = {"moduleop": rm.Focus, **kwargs}
    before = list(mod_ws.path.iterdir()) if mod_ws.path.exists() else []
    with pytest.raises(wb.InputError, match=match):
        wb.export(model, args, workspace=mod_ws, **kwargs)
    assert (list(mod_ws.path.iterdir()) if mod_ws.path.exists() else []) == before
