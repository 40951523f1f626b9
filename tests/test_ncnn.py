"""wb.to_ncnn through the pnnx binary, checked; NcnnRunner with its input checks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from torch import nn

import workbench as wb
from workbench.runtime import NcnnRunner, runner_for


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    model, x = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("ncnn") / "ws")
    return model, x, wb.to_ncnn(model, x, workspace=ws)


def test_module_converts_with_pnnx_parent_and_matches_torch(converted):
    _, _, art = converted
    assert art.format == "ncnn" and art.stage == "ncnn"
    assert {"model.ncnn.param", "model.ncnn.bin", "model_ncnn.py"} == set(art.files)
    pnnx_art = art.parent
    assert pnnx_art.format == "pnnx"
    assert {"model.pnnx.param", "model.pnnx.bin", "model_pnnx.py", "pnnx.log"} == set(
        pnnx_art.files)
    assert art.params["precision"] == "fp32" and art.params["fp16"] is False
    assert art.metrics["max_abs"] < 1e-4 and 0 < art.metrics["max_rel"] < 1
    # an fp16 figure only when ncnn's fp16 run differed from fp32; else a warning says why not
    not_run = art.diagnostics_with("fp16-not-exercised")
    assert art.metrics["fp16_exercised"] is not bool(not_run)
    assert (art.metrics["max_abs_fp16"] is None) is bool(not_run)
    if not_run:  # the hint names the way to see fp16 storage's cost on this machine
        assert "emulate='arm-fp16'" in not_run[0].hint
    assert art.ok and art.workspace.verify() == []
    # the generated code no longer points at the temporary folder pnnx ran in
    assert 'load_param("model.ncnn.param")' in (art.dir / "model_ncnn.py").read_text()


def test_runner_reads_batch_axes_and_captures_every_blob(converted):
    model, (x,), art = converted
    r = NcnnRunner(art)
    assert r.in_specs["in0"].batch_axis == 0 and r.out_specs["out0"].batch_axis == 0
    out = r.run((x,))["out0"]
    with torch.no_grad():
        np.testing.assert_allclose(out, model(x).numpy(), atol=1e-4)
    blobs = r.run({"in0": x}, capture="all")
    assert set(blobs) >= {"in0", "out0"} and len(blobs) > 3
    assert blobs["2"].shape == (64, 192, 192)  # an intermediate conv+relu blob
    assert isinstance(runner_for(art), NcnnRunner)


def test_runner_narrows_float64_instead_of_crashing(converted):
    model, (x,), art = converted
    out = NcnnRunner(art).run((x.double().numpy(),))["out0"]
    assert out.dtype == np.float32
    with torch.no_grad():
        np.testing.assert_allclose(out, model(x).numpy(), atol=1e-4)


@pytest.mark.parametrize("bad, message", [
    ((np.zeros(64, np.float32),), "expected rank 4"),
    ((np.zeros((1, 3, 8, 8), np.float32),) * 2, "takes 1 input"),
    ({"input": np.zeros((1, 3, 8, 8), np.float32)}, "unknown ['input'], missing ['in0']"),
    ((np.array(["a", "b"]),), "expected rank 4|not numeric"),
])
def test_runner_rejects_inputs_that_would_crash_ncnn(converted, bad, message):
    with pytest.raises(wb.InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        NcnnRunner(converted[2]).run(bad)


def test_runner_bad_construction(converted, tmp_path):
    with pytest.raises(wb.InputError, match="precision='int8' is not one of"):
        NcnnRunner(converted[2], precision="int8")
    with pytest.raises(wb.InputError, match="needs a .ncnn.param"):
        NcnnRunner(tmp_path / "model.onnx")
    with pytest.raises(wb.InputError, match="does not exist"):
        NcnnRunner(tmp_path / "m.ncnn.param")


def test_fp16_weights_are_recorded_and_cost_accuracy(converted):
    model, x, fp32 = converted
    art = wb.to_ncnn(model, x, workspace=fp32.workspace, fp16=True)
    assert art.params["precision"] == "fp16" and art.params["fp16"] is True
    assert art.files["model.ncnn.bin"]["bytes"] < fp32.files["model.ncnn.bin"]["bytes"]
    assert art.metrics["max_abs"] > fp32.metrics["max_abs"]


def test_onnx_artifact_converts_with_stored_example_inputs(tmp_path):
    model, x = wb.default_model()
    onx = wb.export(model, x, workspace=tmp_path / "ws")
    art = wb.to_ncnn(onx)
    assert art.parent.parent is onx and art.params["source"] == "onnx"
    assert art.metrics["max_abs"] < 1e-4


@pytest.mark.parametrize("fn, layer, logged", [
    (lambda x: torch.cumprod(x, dim=1), "torch.cumprod", None),
    (lambda x: x.reshape(1, 1, 2, 2, 3, 8).permute(0, 1, 3, 2, 4, 5).reshape(1, 3, 4, 8),
     "Tensor.reshape", "permute 6-rank tensor is not supported yet!"),
])
def test_layers_ncnn_cannot_load_fail_and_keep_the_pnnx_graph(tmp_path, fn, layer, logged):
    ws = wb.Workspace(tmp_path / "ws")
    with pytest.raises(wb.ConversionError) as info:
        wb.to_ncnn(Lambda(fn), (torch.rand(1, 3, 4, 8),), workspace=ws)
    assert "layer(s) ncnn cannot load" in info.value.message and layer in info.value.message
    assert info.value.hint
    (kept,) = ws.artifacts
    assert kept.format == "pnnx" and kept.id in info.value.message
    assert layer in kept.path.read_text()
    unsupported = [d.message for d in kept.diagnostics_with("pnnx-unsupported")]
    assert unsupported == ([f"pnnx: {logged}"] if logged else [])


def test_pnnx_crash_is_a_conversion_error_and_the_caller_lives(tmp_path):
    # this torch build has no LAPACK: pnnx aborts (SIGABRT) while running the traced module
    inv = Lambda(torch.linalg.inv)
    with pytest.raises(wb.ConversionError, match="pnnx was killed by signal 6") as info:
        wb.to_ncnn(inv, (torch.rand(1, 4, 4) + torch.eye(4),), workspace=tmp_path / "ws")
    assert "pnnx log (last lines)" in info.value.message
    assert torch.ones(1).item() == 1.0  # still here


def test_pnnx_failure_on_unknown_onnx_op_names_it(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Foo", ["r"], ["y"],
                                                                  domain="mylib")],
        "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", 1, [1, 3, 8, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("mylib", 1)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "custom.onnx")
    # pnnx segfaults on it (signal 11): a crash of the binary, not of the caller
    with pytest.raises(wb.ConversionError, match="pnnx (was killed by signal|exited)") as info:
        wb.to_ncnn(tmp_path / "custom.onnx", (torch.rand(1, 3, 8, 8),),
                   workspace=tmp_path / "ws")
    assert "Foo" in info.value.hint and "\x1b[" not in info.value.message


def test_bad_arguments(tmp_path):
    model, x = wb.default_model()
    with pytest.raises(wb.InputError, match="needs example inputs"):
        wb.to_ncnn(model, workspace=tmp_path / "ws")
    with pytest.raises(wb.InputError, match="optlevel=5"):
        wb.to_ncnn(model, x, optlevel=5, workspace=tmp_path / "ws")
    with pytest.raises(wb.ModelFileError):
        wb.to_ncnn(tmp_path / "missing.onnx", x, workspace=tmp_path / "ws")


def test_moduleop_keeps_the_module_as_one_op(tmp_path):
    import trap_models as tm

    ws = wb.Workspace(tmp_path / "ws")
    x = torch.rand(1, 3, 32, 32)
    with pytest.raises(wb.ConversionError, match=r"Tensor.slice \(Tensor.slice_"):
        wb.to_ncnn(tm.FocusNet(), (x,), workspace=ws)
    assert ws.artifacts[-1].graph.op_histogram["Tensor.slice"] == 4
    # kept as one op: ncnn then needs a custom layer named Focus, and says so
    with pytest.raises(wb.ConversionError, match=r"1 layer\(s\) ncnn cannot load: trap_models.Focus \(focus\)"):
        wb.to_ncnn(tm.FocusNet(), (x,), workspace=ws, moduleop=[tm.Focus])
    kept = ws.artifacts[-1]
    assert kept.params["moduleop"] == ["trap_models.Focus"]
    assert kept.graph.op_histogram == {"trap_models.Focus": 1, "nn.Conv2d": 1}


def test_moduleop_that_matches_nothing_is_reported(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    art = wb.to_ncnn(model, (torch.rand(1, 3, 8, 8),), workspace=tmp_path / "ws",
                     moduleop="models.Focus")
    (d,) = art.parent.diagnostics_with("moduleop-unmatched")
    assert "'models.Focus'" in d.message


def test_inputs2_makes_the_ncnn_model_dynamic(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    art = wb.to_ncnn(model, (torch.rand(1, 3, 32, 32),), workspace=tmp_path / "ws",
                     inputs2=(torch.rand(1, 3, 48, 64),))
    assert art.params["inputshape2"] == "[1,3,48,64]f32"
    assert art.parent.graph.inputs[0].shape == (1, 3, None, None)
    x = torch.rand(1, 3, 40, 24)
    out = NcnnRunner(art).run((x,))["out0"]
    with torch.no_grad():
        np.testing.assert_allclose(out, model(x).numpy(), atol=1e-5)


def test_unused_submodule_call_names_the_cause_of_the_pnnx_crash(tmp_path):
    import trap_models as tm

    with pytest.raises(wb.ConversionError) as info:
        wb.to_ncnn(tm.UnusedCall(), (torch.rand(1, 3, 8, 8),), workspace=tmp_path / "ws")
    assert "pnnx was killed by signal 11" in info.value.message
    assert "likely cause: forward() calls self.pool but never uses the result" in info.value.message
    assert "wb.to_ncnn(wb.export(model, inputs))" in info.value.hint
    # and the route the hint gives works
    onx = wb.export(tm.UnusedCall(), (torch.rand(1, 3, 8, 8),), workspace=tmp_path / "ws")
    assert wb.to_ncnn(onx).metrics["max_abs"] < 1e-5


def test_onnx_path_with_given_inputs_is_checked_against_onnxruntime(tmp_path):
    model, x = wb.default_model()
    onx = wb.export(model, x, workspace=tmp_path / "ws")
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(onx.path.read_bytes())  # no stored example inputs beside it
    art = wb.to_ncnn(bare, x, workspace=tmp_path / "ws")
    assert art.parent.parent.stage == "import"
    assert art.metrics["max_abs"] < 1e-4


def test_pnnx_s_own_reason_is_in_the_error_wherever_it_sits_in_the_log(tmp_path):
    class StepSlice(torch.nn.Module):
        def forward(self, x):
            return x[..., ::2] * 2

    with pytest.raises(wb.ConversionError) as e:
        wb.to_ncnn(StepSlice(), (torch.rand(1, 3, 8, 8),), workspace=tmp_path / "ws")
    assert "pnnx says: slice with step 2 is not supported" in e.value.message
    assert e.value.hint.startswith("pnnx: slice with step 2 is not supported")
    assert "unflatten" in e.value.hint


class _CountsCalls(nn.Module):
    """Scales by how often it has been called: pnnx's trace freezes the first call's factor,
    so ncnn computes x * 1 where torch's next call computes x * 2 (the same shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.conv(x) * float(self.calls)


def test_values_past_the_tolerance_with_the_right_shapes_are_an_error(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    art = wb.to_ncnn(_CountsCalls(), (x,), workspace=tmp_path / "ws")
    [d] = art.diagnostics_with("ncnn-numeric-mismatch")
    assert d.level == "error" and not art.ok
    assert "ncnn (fp32) differs from torch" in d.message and "wb.compare" in d.hint
    assert f"all outputs: max abs {art.metrics['max_abs']:.3g}" in d.message
    assert art.metrics["max_abs"] > 0.1
    assert not art.diagnostics_with("ncnn-shape-mismatch")
    assert art.workspace.verify() == []  # the converted model is kept to be examined


def test_tolerance_is_the_callers_and_recorded(converted, tmp_path):
    model, x, art = converted
    assert (art.params["atol"], art.params["rtol"]) == (1e-4, 1e-3)
    assert not art.diagnostics_with("ncnn-numeric-mismatch")
    # ncnn's fp32 convolutions round otherwise than torch's: nothing passes a zero tolerance
    assert art.metrics["max_abs"] > 0
    strict = wb.to_ncnn(model, x, workspace=tmp_path / "ws", atol=0.0, rtol=0.0)
    [d] = strict.diagnostics_with("ncnn-numeric-mismatch")
    assert "output 0: max abs" in d.message and "past 0 + 0 * its max |torch|" in d.message
    # fp16 weights are judged against the fp16 default (1e-2, 1e-2), not the fp32 one
    half = wb.to_ncnn(model, x, workspace=tmp_path / "ws", fp16=True)
    assert (half.params["atol"], half.params["rtol"]) == (1e-2, 1e-2)
    assert half.metrics["max_abs"] > art.metrics["max_abs"]  # the weights' rounding shows
    assert not half.diagnostics_with("ncnn-numeric-mismatch")


@pytest.mark.parametrize("kw", [{"atol": -1.0}, {"rtol": float("nan")}, {"atol": "1e-4"},
                                {"rtol": True}])
def test_a_bad_tolerance_is_refused_before_pnnx_runs(converted, tmp_path, kw):
    model, x, _ = converted
    with pytest.raises(wb.InputError, match=f"to_ncnn: {next(iter(kw))}=") as e:
        wb.to_ncnn(model, x, workspace=tmp_path / "ws", **kw)
    assert "finite non-negative" in str(e.value) and e.value.hint
    assert not (tmp_path / "ws").exists() or not list((tmp_path / "ws").rglob("*.param"))


class _LoudAndQuiet(_CountsCalls):
    """Two outputs three orders of magnitude apart; the quiet one's traced factor (the first
    call's) differs from torch's next call, the loud one is right."""

    def forward(self, x):
        self.calls += 1
        y = self.conv(x)
        return y * 1000.0, y * (0.01 * self.calls)


def test_each_output_is_judged_against_its_own_range(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    art = wb.to_ncnn(_LoudAndQuiet(), (x,), workspace=tmp_path / "ws")
    # the quiet output is off by its whole value, far under 1e-3 of the loud one's range
    [d] = art.diagnostics_with("ncnn-numeric-mismatch")
    assert "output 1: max abs" in d.message and not art.ok


def test_a_pool_kernel_larger_than_its_map_is_named_in_the_shape_mismatch(tmp_path):
    """transformers' EfficientNet pooler, AvgPool2d(hidden_dim, ceil_mode=True): torch
    averages the whole (smaller) map, ncnn returns it unpooled. At a fixed size to_ncnn
    writes it as ncnn's global pool (tests/test_conversion_hints.py); with a dynamic map
    (inputs2) it cannot, and the shape-mismatch error names the Pooling layer and what to
    write instead, not a size pnnx evaluated."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1),
                          nn.AvgPool2d(16, ceil_mode=True), nn.Flatten()).eval()
    x, x2 = torch.rand(1, 3, 4, 4), torch.rand(1, 3, 8, 8)
    art = wb.to_ncnn(model, (x,), inputs2=(x2,), workspace=wb.Workspace(tmp_path / "ws"))
    assert not art.diagnostics_with("ncnn-global-pool")
    (mismatch,) = [d for d in art.diagnostics if d.code == "ncnn-shape-mismatch"]
    assert "[1, 4] vs [1, 16]" in mismatch.message
    assert "(kernel 16x16 over a 2x2 input) returns its input unpooled" in mismatch.hint
    assert "AdaptiveAvgPool2d(1)" in mismatch.hint
    fixed = nn.Sequential(model[0], nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    ok = wb.to_ncnn(fixed, (x,), inputs2=(x2,), workspace=wb.Workspace(tmp_path / "ws2"))
    assert not [d for d in ok.diagnostics if d.level == "error"]


class _MaskedAttention(nn.Module):
    """One head pair of self-attention with a causal mask, boolean (as transformers' "sdpa"
    attention passes it) or additive float (0 / -inf)."""

    def __init__(self, boolean: bool) -> None:
        super().__init__()
        self.boolean = boolean
        self.q, self.o = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        n = x.shape[1]
        q = self.q(x).view(1, n, 2, 8).transpose(1, 2)
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        mask = keep if self.boolean else torch.zeros(n, n).masked_fill(~keep, float("-inf"))
        a = nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        return self.o(a.transpose(1, 2).reshape(1, n, 16))


def test_a_boolean_attention_mask_stored_as_bytes_is_named_before_the_run_it_crashes(tmp_path):
    """pnnx folds a boolean mask into a MemoryData of raw bytes (21=3); ncnn's SDPA reads
    its mask as float: the run crashes (or, on GPT-NeoX, computes garbage). to_ncnn names
    the SDPA and the MemoryData from the graph, and the failed run's hint points there.
    The same model with a float mask converts clean."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 16)
    art = wb.to_ncnn(_MaskedAttention(True).eval(), (x,), workspace=tmp_path / "ws")
    [mask] = art.diagnostics_with("ncnn-sdpa-byte-mask")
    sdpa = next(la for la in open(art.path) if la.startswith("SDPA")).split()[1]
    memory = next(la for la in open(art.path) if la.startswith("MemoryData")).split()[1]
    assert f"{sdpa} (SDPA) takes its mask from {memory} (MemoryData 6x6, 21=3" in mask.message
    assert "attn_implementation=\"eager\"" in mask.hint and "-inf" in mask.hint
    assert not art.ok
    failed = [d for d in art.diagnostics if d.code in ("ncnn-run-failed",
                                                       "ncnn-numeric-mismatch")]
    assert failed and all("likely cause: ncnn-sdpa-byte-mask" in d.hint for d in failed)
    fine = wb.to_ncnn(_MaskedAttention(False).eval(), (x,), workspace=tmp_path / "ws2")
    assert not [d for d in fine.diagnostics if d.level == "error"], [d.message for d in fine.diagnostics]
    assert fine.metrics["max_abs"] < 1e-5


def test_byte_masks_are_followed_through_splits(tmp_path):
    from workbench.params import parse_ncnn_param
    from workbench.runtime.ncnn_masks import byte_masks

    param = tmp_path / "m.param"
    param.write_text("7767517\n6 7\n"
                     "Input in0 0 1 q\n"
                     "MemoryData mask 0 1 m 0=5 1=5 21=3\n"
                     "MemoryData fmask 0 1 f 0=5 1=5\n"
                     "Split sp 1 2 m m0 m1\n"
                     "SDPA sdpa_a 4 1 q q q m1 a 5=1\n"
                     "SDPA sdpa_b 4 1 a a a f out0 5=1\n")
    [found] = byte_masks(parse_ncnn_param(param))
    assert (found.layer, found.source, found.shape) == ("sdpa_a", "mask", (5, 5))


def test_a_byte_mask_model_runs_in_the_worker_only_and_the_worker_is_replaced_after(tmp_path):
    """A byte-mask SDPA run may corrupt the heap without killing the process: in this
    process it is refused (named), in the worker it runs and the worker is replaced before
    the next call, so no later model runs in a damaged heap."""
    from workbench.errors import ModelFileError
    from workbench.runtime import worker as worker_mod

    torch.manual_seed(0)
    x = torch.randn(1, 6, 16)
    art = wb.to_ncnn(_MaskedAttention(True).eval(), (x,), workspace=tmp_path / "ws")
    with pytest.raises(ModelFileError, match=r"sdpa_\d+ \(SDPA\) takes its mask from .*not "
                       r"run in this process") as e:
        NcnnRunner(art, isolated=False).run((x,))
    assert "isolated=True" in e.value.hint
    good = _MaskedAttention(False).eval()
    runner = NcnnRunner(wb.to_ncnn(good, (x,), workspace=tmp_path / "ws2"))
    runner.run((x,))
    w = worker_mod.worker()
    before = w.pid
    try:  # a crash, or garbage: either may come
        NcnnRunner(art).run((x,))
    except wb.errors.BackendCrashed:
        pass
    out = runner.run((x,))["out0"]  # in a fresh worker, whatever the byte-mask run did
    assert w.pid != before
    with torch.no_grad():
        np.testing.assert_allclose(out, good(x).numpy(), atol=1e-5)


class _Cubic(nn.Module):
    """x - 0.1 x^3, as torch.pow (pnnx: BinaryOp pow, 2=3.0) or as a product."""

    def __init__(self, product: bool) -> None:
        super().__init__()
        self.product = product

    def forward(self, x):
        return x - 0.1 * (x * x * x if self.product else torch.pow(x, 3.0))


def test_a_pow_over_negative_bases_is_named_in_the_numeric_mismatch(tmp_path):
    """ncnn's vectorised pow is exp(y log x): a negative base gives garbage even for a
    whole exponent (GPT-2's gelu_new). The mismatch's hint names the pow layer, one
    measured case, and the fix; the same function as a product converts clean."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, 16)
    model = nn.Sequential(nn.Linear(16, 32), _Cubic(False), nn.Linear(32, 16)).eval()
    art = wb.to_ncnn(model, (x,), workspace=tmp_path / "ws")
    [fp32] = [d for d in art.diagnostics if d.code == "ncnn-numeric-mismatch"
              and "(fp32)" in d.message]
    pow_layer = next(la for la in open(art.path) if " 0=6 " in la).split()[1]
    assert f"{pow_layer} (BinaryOp pow, exponent 3.0) met " in fp32.hint
    assert "negative bases of 256: pow(-" in fp32.hint and "x * x * x" in fp32.hint
    product = nn.Sequential(model[0], _Cubic(True), model[2]).eval()
    fine = wb.to_ncnn(product, (x,), workspace=tmp_path / "ws2")
    assert not [d for d in fine.diagnostics if d.level == "error"], fine.diagnostics
