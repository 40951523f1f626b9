"""wb.compare given a Partition (issue 33, item 4): each part's artifacts op by op against the
part's torch span on the torch values at its boundary, the chain of parts against the whole
model in the report, and a damaged part named where it is, not in the parts after it."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from test_partition import _model, _x
from torch import nn

import workbench as wb
from workbench.comparison.partitioned import PartitionedReport


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    model, x = _model(), _x()
    parts = wb.partition(model, (x,), at=["feats", "head"],
                         workspace=tmp_path_factory.mktemp("cp") / "ws")
    return model, x, parts


def test_each_part_is_compared_op_by_op_and_the_chain_is_in_the_report(cut):
    model, x, parts = cut
    rep = wb.compare(model, [parts], (x,), mode="both", progress=False)
    assert isinstance(rep, PartitionedReport) and rep.ok, rep.summary()
    # the parts that took a backend: two parts x two backends, each aligned to its span
    names = [c.name for c in rep.candidates]
    assert len(names) == 4 and all(rep.aligned_fraction[n] == 1.0 for n in names)
    (check,) = rep.partitions
    assert set(check.reports) == {"part0", "part1"}
    assert check.parts[names[2]] == "part1" and names[2].endswith(parts.parts[1].onnx.id)
    assert [c.ran for c in check.chain.chains] == [("onnxruntime", "onnxruntime", "torch"),
                                                   ("ncnn", "ncnn", "torch")]
    text = rep.summary()
    assert "partition onnxruntime: chain onnxruntime -> onnxruntime -> torch" in text
    assert "partition part2 (head.0, head.1 -> output_0, output_1): onnxruntime: torch" in text
    # a tensor of a part's candidate is re-run against that part's span, not the whole model
    ref, got = rep.tensors(next(iter(rep.alignments[names[2]].pairs)), names[2])
    assert np.allclose(np.squeeze(ref), np.squeeze(got), atol=1e-5)
    assert "partitions" in rep.to_json()


def test_a_damaged_part_is_the_one_named_and_its_chain_fails(cut, tmp_path):
    model, x, parts = cut
    head = parts.parts[1]
    proto = onnx.load(str(head.onnx.path))
    for init in proto.graph.initializer:  # the score head's weights, scaled
        if init.name.startswith("model.cls") and init.name.endswith("weight"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    damaged = tmp_path / "damaged.onnx"
    onnx.save(proto, str(damaged))
    honest = head.artifacts["onnxruntime"]
    head.artifacts["onnxruntime"] = damaged
    try:
        rep = wb.compare(model, [parts], (x,), mode="both", progress=False)
    finally:
        head.artifacts["onnxruntime"] = honest
    assert not rep.ok
    first = rep.first_divergence
    assert first.candidate == "onnxruntime damaged.onnx" and first.reference == "model.cls"
    verdicts = rep.verdicts()
    assert [v.ok for n, v in verdicts.items() if n != first.candidate] == [True] * 3
    chains = {c.backend: c for c in rep.partitions[0].chain.chains}
    assert not chains["onnxruntime"].ok and chains["ncnn"].ok
    assert rep.partitions[0].chain.first_bad("onnxruntime").part == "part1"


def test_a_partition_beside_a_plain_candidate_and_a_bad_mode(ws):
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 3, padding=1), act=nn.ReLU(),
                                      head=nn.Conv2d(4, 2, 1))).eval()
    x = torch.rand(1, 3, 8, 8)
    onx = wb.export(model, (x,), workspace=ws)
    parts = wb.partition(model, (x,), at=["act"], workspace=ws, backends="onnxruntime")
    rep = wb.compare(model, [onx, parts], (x,), progress=False)
    assert rep.ok, rep.summary()
    assert [c.name for c in rep.candidates][0] == f"onnxruntime {onx.id}"
    assert len(rep.candidates) == 3 and rep.summary().count("partition part") == 2
    with pytest.raises(wb.InputError, match="mode='al' is not one of"):
        wb.compare(model, [parts], (x,), mode="al")
