"""wb.export with the TorchScript exporter on ops it lacks or writes wrong (torch 2.13):
aten::diff (no conversion at any opset) and the cumsum of a bool tensor (a CumSum of bools,
which onnxruntime refuses). transformers' decoder masks use both."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.runtime import OrtRunner


def _registered(name: str, opset: int) -> bool:
    from torch.onnx._internal.torchscript_exporter.registration import registry

    return registry.is_registered_op(name, opset)


class Diffs(nn.Module):
    """torch.diff with prepend, with append and n=2, and over bools (xor)."""

    def forward(self, x, mask):
        a = torch.diff(x, prepend=x[:, :1] - 1, dim=-1)
        b = torch.diff(x, n=2, dim=0, append=x[-2:])
        return a, b, torch.diff(mask, dim=1).float()


def test_diff_exports_and_runs_as_torch_computes_it(ws):
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    mask = torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) > 0.5
    art = wb.export(Diffs(), (x, mask), workspace=ws)
    assert art.ok and art.metrics["max_abs"] == 0.0
    ops = art.graph.op_histogram
    assert ops["Sub"] >= 3 and ops["Xor"] == 1 and ops["Concat"] >= 2
    got = OrtRunner(art).run((x, mask))
    for out, ref in zip(got.values(), Diffs()(x, mask), strict=True):
        np.testing.assert_array_equal(out, ref.numpy())
    # lent for the call only: torch's registry is as it was
    assert not _registered("aten::diff", 17)


def test_a_users_own_diff_conversion_wins(ws):
    marks = []

    def mine(g, self, n, dim, prepend, append):
        marks.append(1)
        return g.op("Identity", self)

    wb.register_symbolic("aten::diff", mine, opset=17)
    try:
        art = wb.export(Diffs(), (torch.randn(3, 7), torch.rand(4, 5) > 0.5), workspace=ws)
    finally:
        wb.customops.unregister("aten::diff")
    assert marks and "Xor" not in art.graph.op_histogram
    assert not art.ok  # Identity is not a diff: the numeric check says so
    assert not _registered("aten::diff", 17)


class BoolCumsum(nn.Module):
    def forward(self, x):
        return (x > 0).cumsum(-1).float() * x + torch.cumsum(x < 0, dim=0).float()


class FloatCumsum(nn.Module):
    def forward(self, x):
        return x.cumsum(-1) + torch.cumsum(x, 0, dtype=torch.float64).float()


def _cumsum_input_types(path) -> list[int]:
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    return [types.get(n.input[0]) for n in model.graph.node if n.op_type == "CumSum"]


def test_the_cumsum_of_a_bool_tensor_exported_as_written_gets_a_cast_and_runs(ws):
    """rewrite=False (and the dynamo exporter's route): the file is repaired after export."""
    x = torch.randn(2, 9, generator=torch.Generator().manual_seed(0))
    art = wb.export(BoolCumsum(), (x,), workspace=ws, rewrite=False)
    assert "bool-cumsum-cast" in [d.code for d in art.diagnostics]
    assert art.ok and art.metrics["max_abs"] == 0.0, art.diagnostics
    nodes = onnx.load(str(art.path)).graph.node
    casts = [n.output[0] for n in nodes if n.op_type == "Cast"
             and n.output[0].endswith("_as_int64")]
    assert sorted(n.input[0] for n in nodes if n.op_type == "CumSum") == sorted(casts)
    assert len(casts) == 2
    (out,) = OrtRunner(art).run((x,)).values()
    np.testing.assert_array_equal(out, BoolCumsum()(x).numpy())


def test_the_shipped_rewriter_makes_torch_write_a_valid_bool_cumsum(ws):
    """With the rewriters on (the default) torch writes a Cast to int64 itself: the file is
    valid as the exporter wrote it and the repair finds nothing to do."""
    from workbench.stages.torchscript_gaps import cast_bool_cumsum

    x = torch.randn(2, 9, generator=torch.Generator().manual_seed(0))
    art = wb.export(BoolCumsum(), (x,), workspace=ws)
    assert art.ok and art.metrics["max_abs"] == 0.0, art.diagnostics
    assert "bool-cumsum-cast" not in [d.code for d in art.diagnostics]
    assert {r.name: r.calls for r in art.rewrites} == {
        "workbench.tensor_bool_cumsum": 1, "workbench.bool_cumsum": 1}
    assert _cumsum_input_types(art.path) == [onnx.TensorProto.INT64] * 2
    model, diags = onnx.load(str(art.path)), []
    assert not cast_bool_cumsum(model, diags) and not diags
    (out,) = OrtRunner(art).run((x,)).values()
    np.testing.assert_array_equal(out, BoolCumsum()(x).numpy())


def test_a_cumsum_of_other_types_is_left_to_torch_and_not_recorded(ws):
    x = torch.randn(2, 9, generator=torch.Generator().manual_seed(0))
    art = wb.export(FloatCumsum(), (x,), workspace=ws)
    assert art.ok and art.rewrites == [], art.rewrites
    assert "Cast" not in art.graph.op_histogram or all(
        not n.output[0].endswith("_as_int64") for n in onnx.load(str(art.path)).graph.node)


class InputCumsum(nn.Module):
    def forward(self, mask):
        return mask.cumsum(-1)


def test_a_bool_graph_input_summed_as_written_is_repaired(ws):
    """A CumSum reading a bool graph input: its type is known without inference, and fixed."""
    mask = torch.rand(2, 7, generator=torch.Generator().manual_seed(0)) > 0.5
    art = wb.export(InputCumsum(), (mask,), workspace=ws, rewrite=False)
    assert "bool-cumsum-cast" in [d.code for d in art.diagnostics]
    assert art.ok and _cumsum_input_types(art.path) == [onnx.TensorProto.INT64]
    (out,) = OrtRunner(art).run((mask,)).values()
    np.testing.assert_array_equal(out, mask.cumsum(-1).numpy())


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_transformers_decoders_export_and_compare_clean(ws, name):
    """Their masks use torch.diff and a bool cumsum: the export failed on aten::diff, and
    with diff alone onnxruntime refused the model."""
    import transformers as T  # noqa: N812

    from workbench.zoo import _wrap

    torch.manual_seed(0)
    if name == "llama":
        config = T.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, vocab_size=50,
                               max_position_embeddings=32, use_cache=False)
        model = T.LlamaModel(config)
    else:
        config = T.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=32,
                              use_cache=False, bos_token_id=0, eos_token_id=0)
        model = T.GPT2Model(config)
    model = _wrap(model, "last_hidden_state")
    ids = (torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(1)),)
    art = wb.export(model, ids, workspace=ws)
    assert art.ok and art.metrics["max_abs"] < 1e-4, art.diagnostics
    # the shipped rewriters: torch writes valid ONNX, nothing is repaired afterwards
    assert "bool-cumsum-cast" not in [d.code for d in art.diagnostics]
    assert "workbench.tensor_bool_cumsum" in [r.name for r in art.rewrites]
    rep = wb.compare(model, [art], ids, progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
