"""Partition (wb.mark, wb.partition, wb.extract, wb.compare_parts): a detector-shaped model
cut before its NMS tail, each part exported and converted on its own with its boundary
tensors named, the tail left in torch, the chain and each part checked against torch."""

from __future__ import annotations

import copy
import re

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.runtime import NcnnRunner, OrtRunner


class Detector(nn.Module):
    """A backbone, a box/score head, and an NMS-shaped tail (a Python loop over scores)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.box = nn.Conv2d(16, 4, 1)
        self.cls = nn.Conv2d(16, 3, 1)
        self.unused = nn.Linear(2, 2)

    def forward(self, x):
        f = wb.mark(self.backbone(x), "feats")
        boxes = self.box(f).flatten(2).transpose(1, 2)
        scores = self.cls(f).flatten(2).transpose(1, 2).sigmoid()
        boxes, scores = wb.mark((boxes, scores), "head")
        best, _ = scores[0].max(1)
        keep = best > 0.5
        b, s = boxes[0][keep], best[keep]
        out: list[int] = []
        for i in s.argsort(descending=True).tolist():
            if all((b[i] - b[j]).abs().sum() > 0.5 for j in out):
                out.append(i)
        idx = torch.tensor(out, dtype=torch.long)
        return b[idx], s[idx]


class Skip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        a = wb.mark(self.c1(x), "a")
        return self.c2(a) + x  # x crosses the cut at "a"


def _model(cls=Detector):
    torch.manual_seed(0)
    return cls().eval()


def _x(seed=0):
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _same(got, ref, atol=1e-5):
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), r.detach().numpy(), atol=atol)


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    model, x = _model(), _x()
    parts = wb.partition(model, (x,), at=["feats", "head"],
                         workspace=tmp_path_factory.mktemp("p") / "ws")
    return model, x, parts


def test_mark_is_the_identity_outside_a_partition(ws):
    model, x = _model(), _x()
    f = torch.ones(2)
    assert wb.mark(f, "f") is f
    art = wb.export(model.backbone, (x,), workspace=ws)
    assert "Identity" not in art.graph.op_histogram


def test_each_part_has_its_artifacts_and_named_boundaries(cut):
    model, x, parts = cut
    p0, p1, tail = parts.parts
    assert parts.cuts == [["feats"], ["head.0", "head.1"]]
    assert (p0.inputs, p0.outputs) == (["input"], ["feats"])
    assert (p1.inputs, p1.outputs) == (["feats"], ["head.0", "head.1"])
    for part in (p0, p1):
        assert set(part.artifacts) == {"onnxruntime", "ncnn"}
        graph = onnx.load(str(part.onnx.path)).graph
        assert [i.name for i in graph.input] == part.inputs
        assert [o.name for o in graph.output] == part.outputs
        assert part.ncnn.ok and part.ncnn.metrics["max_abs"] < 1e-4
    # the head alone, in each backend, on the torch value at its input boundary
    feats = model.backbone(x).detach()
    with torch.no_grad():
        ref = [t for t in (model.box(feats).flatten(2).transpose(1, 2),
                           model.cls(feats).flatten(2).transpose(1, 2).sigmoid())]
    _same(list(OrtRunner(p1.onnx).run({"feats": feats.numpy()}).values()), ref)
    _same(list(NcnnRunner(p1.ncnn).run((feats,)).values()), ref, atol=1e-4)
    # the NMS tail: its trace froze a loop and branches over scores, so it stays in torch
    assert tail.artifacts == {} and set(tail.in_torch) == {"onnxruntime", "ncnn"}
    assert "tracer-" in tail.in_torch["onnxruntime"]
    # pnnx crashes on it: the reason names the part, its span and what to do, pnnx's beside
    why = tail.in_torch["ncnn"]
    assert re.match(r"pnnx (crashed|failed) converting the ONNX export of part2 \(from cut "
                    r"head\.0, head\.1 to the model's outputs output_0, output_1\)", why), why
    assert "such tails usually stay in torch" in why and "keep_in_torch=[2]" in why
    assert re.search(r"\(raw: ConversionError: pnnx (was killed by signal|exited)", why)


def test_the_chain_runs_as_the_whole_model_on_other_inputs(cut):
    model, _, parts = cut
    x = _x(seed=3)
    with torch.no_grad():
        ref = model(x)
    for backend in ("onnxruntime", "ncnn"):
        _same(parts.run((x,), backend), ref, atol=1e-4)
    assert [p.runs_on("ncnn") for p in parts.parts] == ["ncnn", "ncnn", "torch"]


def test_compare_parts_checks_the_chain_and_each_part(cut):
    model, x, parts = cut
    rep = wb.compare_parts(model, parts, (x,))
    assert rep.ok, rep.summary()
    assert [(c.backend, c.ran) for c in rep.chains] == [
        ("onnxruntime", ("onnxruntime", "onnxruntime", "torch")),
        ("ncnn", ("ncnn", "ncnn", "torch"))]
    assert len(rep.parts) == 6 and "chain" in rep.summary()
    # a part that computes wrongly is the one named, not the parts after it
    head = parts.parts[1]
    honest = head.run
    head.run = lambda v, b="onnxruntime": [a + 0.1 for a in honest(v, b)]
    try:
        bad = wb.compare_parts(model, parts, (x,))
    finally:
        del head.run
    assert not bad.ok and bad.first_bad("onnxruntime").part == "part1"
    assert next(p for p in bad.parts if p.part == "part2" and p.backend == "ncnn").ok


@pytest.mark.parametrize("cut, exporter", [("backbone", "torchscript"), ("feats", "dynamo")])
def test_cuts_by_module_name_and_keep_in_torch(ws, cut, exporter):
    model, x = _model(), _x()
    parts = wb.partition(model, (x,), at=[cut], workspace=ws, backends="onnxruntime",
                         keep_in_torch=[1], exporter=exporter)
    head, tail = parts.parts
    assert head.outputs == [cut] and tail.in_torch == {"onnxruntime": "keep_in_torch"}
    assert head.onnx.params["exporter"] == exporter
    with torch.no_grad():
        _same(parts.run((x,)), model(x))


def test_bad_cuts_are_named_and_leave_the_model_as_it_was(ws):
    model, x = _model(), _x()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        before = model(x)
    with pytest.raises(wb.InputError) as e:
        wb.partition(model, (x,), at=["feets"], workspace=ws)
    assert "no wb.mark('feets') is reached" in e.value.message
    assert "did you mean 'feats'?" in e.value.hint
    with pytest.raises(wb.InputError, match="'unused' is never called"):
        wb.partition(model, (x,), at=["unused"], workspace=ws)
    with pytest.raises(wb.InputError, match="not in the order forward"):
        wb.partition(model, (x,), at=["head", "feats"], workspace=ws)
    with pytest.raises(wb.InputError, match="named in more than one cut"):
        wb.partition(model, (x,), at=["feats", ["feats", "head"]], workspace=ws)
    with pytest.raises(wb.InputError) as e:
        wb.partition(_model(Skip), (x,), at=["a"], workspace=ws)
    assert "do not cover a path from the inputs to the outputs" in e.value.message
    assert "part1's output(s) ['output']" in e.value.message
    assert ws.artifacts == []
    assert all(not m._forward_hooks for m in model.modules())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        _same(model(x), before, atol=0)


def _onnx_head(ws):
    """The detector without its tail, exported: its ONNX tensor names to cut at."""
    model = _model()

    class NoTail(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            f = self.m.backbone(x)
            return self.m.box(f), self.m.cls(f).sigmoid()

    art = wb.export(NoTail().eval(), (_x(),), workspace=ws, output_names=["boxes", "scores"])
    relu = [n for n in onnx.load(str(art.path)).graph.node if n.op_type == "Relu"][-1]
    return NoTail().eval(), art, relu.output[0]


def test_extract_by_tensor_names_converts_on_its_own(ws):
    model, art, feats = _onnx_head(ws)
    head = wb.extract(art, [feats], ["scores"])
    assert head.stage == "extract" and head.parent is art and head.ok
    assert [i.name for i in head.graph.inputs] == [feats]
    nc = wb.to_ncnn(head)  # the stored example values go with it
    assert nc.ok and nc.metrics["max_abs"] < 1e-4
    with pytest.raises(wb.InputError, match="no tensor 'scorse'") as e:
        wb.extract(art, [feats], ["scorse"])
    assert "did you mean 'scores'?" in e.value.hint
    with pytest.raises(wb.InputError, match="does not cover a path") as e:
        wb.extract(art, [feats], ["scores", "boxes", "input"])
    with pytest.raises(wb.InputError, match="needs 'input', a graph input"):
        wb.extract(art, ["scores"], [feats])


def test_partition_of_an_onnx_model_by_tensor_names(ws):
    model, art, feats = _onnx_head(ws)
    parts = wb.partition(art, at=[feats], backends=("onnxruntime", "ncnn"))
    assert [p.outputs for p in parts.parts] == [[feats], ["boxes", "scores"]]
    assert all(set(p.artifacts) == {"onnxruntime", "ncnn"} for p in parts.parts)
    rep = wb.compare_parts(model, parts, (_x(seed=5),), atol=1e-4)
    assert rep.ok, rep.summary()


def test_boundary_names_are_identifiers_no_other_boundary_takes():
    from workbench.stages.partition_parts import boundary_names

    got = boundary_names(["1", "a b", "input", "feats", "cut_1", "x" * 200, "head.0"],
                         ["input", "output"])
    assert got == {"1": "cut_1_2", "a b": "cut_a_b", "input": "cut_input", "feats": "feats",
                   "cut_1": "cut_1", "x" * 200: "cut_" + "x" * 112, "head.0": "head.0"}


def _seq():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 4, 1)).eval()


def test_a_sequential_cut_at_digit_names_runs_on_every_backend(ws):
    # nn.Sequential's children are "0", "1"...: TorchScript's exporter refuses "1" as a
    # tensor name, so the artifacts call it cut_1 and the part maps it back
    model, x = _seq(), _x()
    parts = wb.partition(model, (x,), at=["1", "3"], workspace=ws)
    p0, p1, p2 = parts.parts
    assert parts.cuts == [["1"], ["3"]]
    assert (p0.outputs, p1.inputs, p1.outputs, p2.inputs) == (
        ["cut_1"], ["cut_1"], ["cut_3"], ["cut_3"])
    assert p1.names == {"cut_1": "1", "cut_3": "3"} and p0.names == {"cut_1": "1"}
    for part in parts.parts:
        assert set(part.artifacts) == {"onnxruntime", "ncnn"}, part.in_torch
        graph = onnx.load(str(part.onnx.path)).graph
        assert [i.name for i in graph.input] == part.inputs
        assert [o.name for o in graph.output] == part.outputs
    assert "part1: cut_1 (cut '1') -> cut_3 (cut '3')" in parts.summary()
    with torch.no_grad():
        for backend in ("onnxruntime", "ncnn"):
            _same(parts.run((_x(seed=2),), backend), [model(_x(seed=2))], atol=1e-4)
    assert wb.compare_parts(model, parts, (x,)).ok


def test_a_part_kept_in_torch_by_our_naming_says_so(ws, monkeypatch):
    # were a boundary name ever refused again, the part would stay in torch for a reason
    # that is the workbench's: never silently
    from workbench.stages import partition_parts

    monkeypatch.setattr(partition_parts, "valid_boundary_name", lambda name: True)
    with pytest.warns(UserWarning, match="refused the boundary name"):
        parts = wb.partition(_seq(), (_x(),), at=["1"], workspace=ws, backends="onnxruntime")
    why = parts.parts[0].in_torch["onnxruntime"]
    assert "the exporter refused the boundary name(s) 1 that the workbench gave part0" in why
    assert "the workbench's naming, not for your model" in why and "Invalid name" in why


class Trained(nn.Module):
    """A BatchNorm and a Dropout: what train mode changes."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.drop, self.c2 = nn.Dropout(0.5), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        mid = wb.mark(torch.relu(self.bn(self.c1(x))), "mid")
        return self.c2(self.drop(mid))


def _state(model):
    return {"modes": [m.training for m in model.modules()],
            "grad": [p.requires_grad for p in model.parameters()],
            "hooks": [(dict(m._forward_hooks), dict(m._forward_pre_hooks))
                      for m in model.modules()],
            "tensors": {k: v.clone() for k, v in model.state_dict().items()}}


def _assert_state(model, before):
    after = _state(model)
    assert after["modes"] == before["modes"] and after["grad"] == before["grad"]
    assert after["hooks"] == before["hooks"]
    assert all(torch.equal(after["tensors"][k], v) for k, v in before["tensors"].items())


def test_the_model_is_left_as_it_was_on_success_and_on_failure(ws):
    torch.manual_seed(0)
    model = Trained().train()  # training, with one submodule in eval mode
    model.c2.eval()
    model.c1.bias.requires_grad_(False)
    calls = []
    handle = model.c2.register_forward_hook(lambda *a: calls.append(1))
    model.bn.register_forward_pre_hook(lambda *a: None)
    before, x = _state(model), _x()
    parts = wb.partition(model, (x,), at=["mid"], workspace=ws, backends="onnxruntime")
    _assert_state(model, before)
    # the parts ran the model in eval mode (no batch statistics, no dropout) and still do,
    # whatever mode the model is in
    assert all(set(p.artifacts) == {"onnxruntime"} for p in parts.parts)
    ref = copy.deepcopy(model).eval()(x)
    _same(parts.run((x,), "onnxruntime"), [ref], atol=1e-4)
    _same(parts.run((x,), "torch"), [ref], atol=1e-5)
    assert wb.compare_parts(model, parts, (x,)).ok
    _assert_state(model, before)
    # a failure before the spans are built, and one after
    with pytest.raises(wb.InputError, match="no wb.mark"):
        wb.partition(model, (x,), at=["mdi"], workspace=ws)
    _assert_state(model, before)
    skip = _model(Skip).train()
    skip_before = _state(skip)
    with pytest.raises(wb.InputError, match="do not cover a path"):
        wb.partition(skip, (x,), at=["a"], workspace=ws)
    _assert_state(skip, skip_before)
    handle.remove()  # the user's handle still removes the user's hook
    assert not model.c2._forward_hooks
