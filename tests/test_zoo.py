"""The zoo through wb.to_ncnn: what each small transformers architecture does today, pinned.

An "ok" model converts, runs in ncnn and matches torch within its bound (measured values in
the comments, bounds ~10x above them); a failing one raises the pinned error naming what
ncnn cannot take. When an outcome changes, the test fails and the table is updated on purpose.
"""

from __future__ import annotations

import os

import pytest
import torch

import workbench as wb
from workbench import zoo

# before the zoo imports transformers (lazily, in its factories): never reach the Hub
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

FP16_BOUND = 5e-3  # fp16 arithmetic, measured 8e-5 .. 5.6e-4 on the "ok" models

EXPECTED: dict[str, tuple[str, object]] = {
    "resnet": ("ok", 2e-5),  # measured 2.4e-6
    "mobilenet_v2": ("ok", 1e-4),  # measured 9.1e-6
    "convnext": ("ok", 2e-6),  # measured 1.3e-7
    "vit": ("ok", 2e-5),  # measured 1.2e-6 (pnnx folds sdpa into MultiHeadAttention)
    # window partition reshapes to 6-D (1,1,4,1,4,32) and patch merging's x[:, 0::2, 0::2]
    # (a 2-axis strided slice): ncnn has no layer for either
    "swin": ("ConversionError", ("layer(s) ncnn cannot load", "Tensor.reshape", "Tensor.slice")),
    # measured 1.0e-6; pnnx folds the attention into MultiHeadAttention. (Before 10bcd45 the
    # runner misread pnnx's `torch.randint(10, (1, 16))` as rank 1 and the check failed.)
    "bert": ("ok", 1e-5),
}


@pytest.mark.parametrize("name, outcome, expect", [(n, *EXPECTED[n]) for n in EXPECTED],
                         ids=list(EXPECTED))
def test_zoo_model_to_ncnn_outcome_is_pinned(tmp_path, name, outcome, expect):
    model, inputs = zoo.ZOO[name]()
    ws = wb.Workspace(tmp_path / "ws")
    if outcome == "ok":
        art = wb.to_ncnn(model, inputs, workspace=ws)
        errors = [f"{d.code}: {d.message}" for d in art.diagnostics if d.level == "error"]
        assert art.ok, errors
        assert art.metrics["max_abs"] is not None and art.metrics["max_abs"] < expect
        assert art.metrics["max_abs_fp16"] is not None
        assert art.metrics["max_abs_fp16"] < FP16_BOUND
    else:
        assert outcome == "ConversionError"
        with pytest.raises(wb.ConversionError) as info:
            wb.to_ncnn(model, inputs, workspace=ws)
        for unsupported in expect:
            assert unsupported in info.value.message
        assert info.value.hint
        (kept,) = ws.artifacts  # the pnnx graph survives the failed ncnn step
        assert kept.format == "pnnx" and kept.id in info.value.message


def test_zoo_models_are_seeded_and_return_plain_tensors():
    (m1, (ids1,)), (m2, (ids2,)) = zoo.get("bert"), zoo.get("bert")
    assert ids1.dtype == torch.int64 and list(ids1.shape) == [1, 16]
    assert torch.equal(ids1, ids2) and not m1.training
    with torch.no_grad():
        out1, out2 = m1(ids1), m2(ids2)
    assert all(type(t) is torch.Tensor for t in out1)
    assert all(torch.equal(a, b) for a, b in zip(out1, out2, strict=True))


def test_get_unknown_name_lists_the_zoo():
    with pytest.raises(wb.InputError, match="no zoo model named 'resnet18'") as info:
        zoo.get("resnet18")
    assert all(name in info.value.message for name in [*zoo.ZOO, "resnet50"])
