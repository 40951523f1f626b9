"""ncnn storage emulation: NcnnRunner(art, precision="fp16", emulate="arm-fp16") rounds every
weight and every blob between layers to fp16 (bf16 likewise), so what fp16 storage costs on
an ARM phone shows on x86, where ncnn's own fp16 run computes in fp32. Real ncnn, real torch;
the figures are printed (-s)."""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.errors import InputError
from workbench.ncnn_bin import walk_bin
from workbench.precision.ncnn_calibration import calibration_table
from workbench.precision.ncnn_int8 import write_int8_model
from workbench.runtime import NcnnRunner
from workbench.runtime.ncnn_emulate import round_bf16, round_fp16


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    model, (x,) = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("emulate") / "ws")
    return model, x, wb.to_ncnn(model, (x,), workspace=ws)


def _snr(out, ref):
    err = ((out.astype(np.float64) - ref) ** 2).sum()
    return math.inf if err == 0 else 10 * math.log10(float((ref.astype(np.float64) ** 2).sum())
                                                     / float(err))


def _leftovers():
    return {f for f in os.listdir(tempfile.gettempdir()) if f.startswith("wb-emulated-")}


def test_emulated_storage_costs_what_fp16_and_bf16_store_on_the_default_model(default):
    model, x, art = default
    ref = model(x).detach().numpy()
    runs = {}
    for label, precision, emulate in (("fp32", "fp32", None), ("fp16 native", "fp16", None),
                                      ("fp16 emulated arm-fp16", "fp16", "arm-fp16"),
                                      ("bf16 native", "bf16", None),
                                      ("bf16 emulated", "bf16", "bf16")):
        runs[label] = NcnnRunner(art, precision=precision, emulate=emulate,
                                 isolated=False).run((x,))["out0"]
    print("\nfinal output vs torch fp32 (default model, 1x3x64x64 -> 1x3x192x192):")
    for label, out in runs.items():
        print(f"  ncnn {label:<24} max abs {np.abs(out - ref).max():.3e}  "
              f"SNR {_snr(out, ref):6.2f} dB")
    fp32, arm, bf16 = runs["fp32"], runs["fp16 emulated arm-fp16"], runs["bf16 emulated"]
    assert not np.array_equal(arm, fp32)  # the emulated run really is another run
    assert np.abs(arm - ref).max() > 10 * np.abs(fp32 - ref).max()
    assert np.array_equal(round_fp16(arm), arm)  # the output as fp16 stores it
    assert np.array_equal(round_bf16(bf16), bf16)
    # fp16 keeps 3 more mantissa bits than bf16: about 18 dB, never less than 10
    assert 50 < _snr(arm, ref) and _snr(bf16, ref) + 10 < _snr(arm, ref)
    # the worker twin emulates the same (emulate= reaches it)
    worker = NcnnRunner(art, precision="fp16", emulate="arm-fp16").run((x,))["out0"]
    np.testing.assert_array_equal(worker, arm)


def test_capture_all_returns_every_blob_as_stored(default):
    _, x, art = default
    native = NcnnRunner(art, isolated=False).run((x,), capture="all")
    before = _leftovers()
    for precision, emulate, rounded in (("fp16", "arm-fp16", round_fp16),
                                        ("bf16", "bf16", round_bf16)):
        runner = NcnnRunner(art, precision=precision, emulate=emulate, isolated=False)
        got = runner.run((x,), capture="all")
        assert list(got) == list(native)  # out0 first, then every blob, in ncnn's order
        for name, value in got.items():
            assert value.shape == native[name].shape, name
            np.testing.assert_array_equal(rounded(value), value, err_msg=name)
            assert not np.array_equal(value, native[name]), name
        layout = walk_bin(runner._graph, runner.bin)
        assert runner.emulation.weights == len(layout.blobs) and not runner.emulation.unrounded
        diag = runner.emulation.diagnostic
        assert diag.code == "ncnn-storage-emulated" and diag.level == "info"
        assert "Not emulated: fp16 accumulation" in diag.message and "int8" in diag.message
    assert _leftovers() == before  # the rounded weights' copy is gone once ncnn read it


def test_a_layer_runs_on_rounded_weights_and_its_output_is_rounded(default):
    model, x, art = default
    runner = NcnnRunner(art, precision="fp16", emulate="arm-fp16", isolated=False)
    stored = runner.run((x,), capture="all")
    # conv1 + ReLU (ncnn's blob "2") from the stored interpolation (blob "1"), fed alone
    got = runner.run_blobs({"1": stored["1"]}, ["2"])["2"]
    np.testing.assert_array_equal(got, stored["2"])
    with pytest.raises(InputError, match="blob 'in0' .* model input and was not fed"):
        runner.run_blobs({"2": stored["2"]}, ["1"])  # "1" is made from the input
    inp = torch.from_numpy(stored["1"])[None]
    conv = model.conv1

    def torch_conv(w, b):
        return round_fp16(torch.relu(nn.functional.conv2d(inp, w, b, padding=4))[0].detach()
                          .numpy())

    w16 = torch.from_numpy(round_fp16(conv.weight.detach().numpy()))
    b16 = torch.from_numpy(round_fp16(conv.bias.detach().numpy()))
    with_rounded = torch_conv(w16, b16)
    with_fp32 = torch_conv(conv.weight, conv.bias)
    same_rounded = float(np.mean(with_rounded == got))
    same_fp32 = float(np.mean(with_fp32 == got))
    print(f"\nconv1 outputs equal to torch's with fp16 weights: {same_rounded:.4f}, "
          f"with fp32 weights: {same_fp32:.4f}")
    # summation order may flip a rounding now and then; the weights ncnn used are fp16's
    assert same_rounded > 0.99 and same_rounded > same_fp32 + 0.02
    np.testing.assert_allclose(got, with_rounded, rtol=2 ** -10, atol=1e-6)


def test_compare_measures_the_emulated_candidate_op_by_op(default):
    model, x, art = default
    rep = wb.compare(model, [NcnnRunner(art, precision="fp16", emulate="arm-fp16"),
                             NcnnRunner(art)], (x,), mode="both", progress=False)
    print("\n" + rep.summary())
    emulated, fp32 = list(rep.aligned_fraction)
    assert rep.aligned_fraction[emulated] == 1.0 and not rep.unmeasured[emulated]
    rows = {(r["candidate"], r["mode"], r["name"]): r for r in rep.rows()}
    for (cand, mode, name), row in rows.items():
        if cand == emulated:  # every op costs fp16 storage: far above fp32's error
            assert row["snr_db"] < rows[(fp32, mode, name)]["snr_db"] - 20, (mode, name)
    assert {mode for cand, mode, _ in rows if cand == emulated} == {"accumulated", "isolated"}


class Lookup(nn.Module):
    """An index input (an embedding) then a Linear: the indices must not be rounded."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(3000, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(idx))


def test_integer_inputs_stay_integers(tmp_path):
    torch.manual_seed(0)
    model = Lookup().eval()
    idx = torch.tensor([[2999, 2049, 1, 0, 1025]])
    art = wb.to_ncnn(model, (idx,), workspace=wb.Workspace(tmp_path / "ws"))
    got = NcnnRunner(art, precision="fp16", emulate="arm-fp16", isolated=False).run(
        (idx,), capture="all")
    rows = got[next(n for n in got if n not in ("out0", "in0"))]  # the Embed's output
    want = round_fp16(model.emb.weight.detach().numpy()[idx[0].numpy()])
    np.testing.assert_array_equal(rows.reshape(want.shape), want)  # the rows indexed
    np.testing.assert_allclose(got["out0"], model(idx).detach().numpy(), atol=5e-3)


def test_emulate_refuses_what_it_cannot_emulate(default, tmp_path):
    _, x, art = default
    cases = [
        (dict(precision="fp32", emulate="arm-fp16"),
         "emulates fp16 storage, but precision='fp32'", "precision='fp16', emulate='arm-fp16'"),
        (dict(precision="fp16", emulate="bf16"),
         "emulates bf16 storage, but precision='fp16'", "precision='bf16', emulate='bf16'"),
        (dict(precision="fp16", emulate="fp8"), "emulate='fp8' is not one of", "arm-fp16"),
        (dict(precision="fp16", emulate="ARM-FP16"), "not one of", "emulate='arm-fp16'"),
    ]
    for kwargs, message, hint in cases:
        with pytest.raises(InputError, match=message.replace("(", r"\(")) as e:
            NcnnRunner(art, **kwargs)
        assert hint in e.value.hint, kwargs
    table = calibration_table(art, [(x.numpy(),)], "minmax", isolated=False, progress=False)
    q = write_int8_model(art, None, table, tmp_path / "q" / "m.ncnn.param")
    with pytest.raises(InputError, match=r"holds int8 weights \(convrelu_0 \(Convolution\)") \
            as e:
        NcnnRunner(q.param, precision="fp16", emulate="arm-fp16")
    assert "does not emulate int8" in e.value.hint and "parent" in e.value.hint
    NcnnRunner(q.param, isolated=False).run((x,))  # the int8 model itself still runs


def test_weights_stored_in_fp16_are_rounded_to_bf16_as_fp32(default, tmp_path):
    from workbench.params import parse_ncnn_param
    from workbench.runtime.ncnn_emulate import Emulation, rounded_bin

    model, x, _ = default
    art = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"), fp16=True)
    graph = parse_ncnn_param(art.path)
    bin_path = art.path.with_name(art.path.name[: -len(".param")] + ".bin")
    src = walk_bin(graph, bin_path)
    assert {b.storage for b in src.blobs} == {"float16", "float32"}
    arm = rounded_bin(graph, bin_path, Emulation("arm-fp16"))
    raw = bin_path.read_bytes()
    assert len(arm) == len(raw)
    for b in src.blobs:  # fp16 weights already are what ARM stores; fp32 ones (biases) not
        at = slice(b.offset, b.offset + (2 if b.storage == "float16" else 4) * b.count)
        if b.storage == "float16":
            assert arm[at] == raw[at]
        else:
            np.testing.assert_array_equal(np.frombuffer(arm[at], "<f4"),
                                          round_fp16(np.frombuffer(raw[at], "<f4")))
    emulation = Emulation("bf16")
    data = rounded_bin(graph, bin_path, emulation)
    out = tmp_path / "bf16.ncnn.bin"
    out.write_bytes(data)
    layout = walk_bin(graph, out)
    assert layout.complete and layout.end == len(data) and emulation.weights == len(src.blobs)
    for a, b in zip(src.blobs, layout.blobs, strict=True):
        assert b.storage == "float32" and (a.layer, a.role, a.count) == (b.layer, b.role, b.count)
        dtype = "<f2" if a.storage == "float16" else "<f4"
        want = round_bf16(np.fromfile(bin_path, dtype, a.count, offset=a.offset)
                          .astype(np.float32))
        np.testing.assert_array_equal(np.fromfile(out, "<f4", b.count, offset=b.offset), want)
    runs = NcnnRunner(art, precision="bf16", emulate="bf16", isolated=False).run((x,))
    assert np.array_equal(round_bf16(runs["out0"]), runs["out0"])


def test_weights_after_a_layer_the_walk_cannot_size_are_copied_and_said(tmp_path):
    from workbench.params import parse_ncnn_param
    from workbench.runtime.ncnn_emulate import Emulation, rounded_bin

    param = tmp_path / "m.ncnn.param"
    param.write_text("7767517\n4 4\nInput in0 0 1 in0\n"
                     "Convolution c1 1 1 in0 a 0=2 1=1 5=1 6=6\n"
                     "MyLayer mine 1 1 a b\n"
                     "Convolution c2 1 1 b out0 0=2 1=1 5=0 6=4\n")
    values = np.random.default_rng(0).standard_normal(8 + 4).astype("<f4")
    head = (0).to_bytes(4, "little") + values[:6].tobytes() + values[6:8].tobytes()
    tail = (0).to_bytes(4, "little") + values[8:].tobytes()
    (tmp_path / "m.ncnn.bin").write_bytes(head + tail)
    emulation = Emulation("arm-fp16")
    data = rounded_bin(parse_ncnn_param(param), tmp_path / "m.ncnn.bin", emulation)
    np.testing.assert_array_equal(np.frombuffer(data, "<f4", 8, 4), round_fp16(values[:8]))
    assert data[len(head):] == tail  # past MyLayer nothing can be placed: left as it was
    assert (emulation.weights, emulation.unrounded) == (2, "mine (MyLayer)")
    diag = emulation.diagnostic
    assert diag.level == "warning" and diag.code == "ncnn-storage-emulated-partly"
    assert "from layer mine (MyLayer) on were not rounded" in diag.message
