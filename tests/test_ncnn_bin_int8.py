"""The .bin walk sizes int8 layers (``8=int8_scale_term``): the weight scales, the input
scale and, above 100, the output scale after each int8 Convolution, ConvolutionDepthWise
and InnerProduct, so an int8 model's .bin is checked to the byte. Each layout is held
against ncnn's own ``load_model``: a DataReader written here serves the file and counts the
bytes ncnn reads."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import ncnn
import numpy as np
import pytest
import torch
from test_precision_ncnn import SmallNet

import workbench as wb
from workbench.ncnn_bin import FP32_TAG, blob_specs, walk_bin
from workbench.params import parse_ncnn_param
from workbench.precision.ncnn_calibration import calibration_table
from workbench.precision.ncnn_int8 import write_int8_model
from workbench.runtime import NcnnRunner
from workbench.runtime.ncnn_model import check_model_files

_CAPSULE_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_CAPSULE_POINTER.restype = ctypes.c_void_p
_CAPSULE_POINTER.argtypes = [ctypes.py_object, ctypes.c_char_p]


class CountingReader(ncnn.DataReader):
    """Serves ``data`` to ncnn's Net.load_model and counts the bytes it reads (pybind11
    hands ``read`` the C buffer as a capsule)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data, self.pos = data, 0

    def scan(self, fmt, p):  # only load_param scans text
        return 0

    def read(self, buf, size):
        chunk = self.data[self.pos:self.pos + size]
        ctypes.memmove(_CAPSULE_POINTER(buf, None), chunk, len(chunk))
        self.pos += len(chunk)
        return len(chunk)


def ncnn_reads(param: Path, data: bytes) -> tuple[int, int]:
    """(ncnn's load_model return, bytes it read) for ``param`` with weights ``data``."""
    net = ncnn.Net()
    assert net.load_param(str(param)) == 0
    reader = CountingReader(data)
    return net.load_model(reader), reader.pos


def _bin(param):
    return Path(param).with_name(Path(param).name[: -len(".param")] + ".bin")


@pytest.fixture(scope="module")
def int8_models(tmp_path_factory):
    """SmallNet (conv, Split to a depthwise and a 1x1 conv, strided conv, Linear) in int8:
    requantized (8=102 on the first conv), not, with a layer kept in float, and with its
    float weights stored as fp16 (as ncnn2int8 writes)."""
    root = tmp_path_factory.mktemp("int8bin")
    torch.manual_seed(0)
    small = SmallNet().eval()
    xs = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    art = wb.to_ncnn(small, (xs,), workspace=wb.Workspace(root / "ws"))
    rng = np.random.default_rng(0)
    table = calibration_table(art, [(rng.random((1, 3, 16, 16), dtype=np.float32),)
                                    for _ in range(2)], "minmax", progress=False)
    out = {}
    for name, kw in {"requantized": {}, "plain": {"requantize": False},
                     "kept": {"keep_float": ["conv_4"]},
                     "fp16": {"float_storage": "fp16"}}.items():
        out[name] = write_int8_model(art, None, table, root / name / "m.ncnn.param", **kw)
    return xs, table, out


@pytest.mark.parametrize("which", ["requantized", "plain", "kept", "fp16"])
def test_the_walk_ends_at_the_end_of_an_int8_bin_where_ncnn_stops_reading(int8_models,
                                                                          which):
    xs, table, models = int8_models
    m = models[which]
    p = parse_ncnn_param(m.param)
    layout = walk_bin(p, m.bin)
    size = m.bin.stat().st_size
    assert layout.complete and layout.end == layout.size == size
    ret, read = ncnn_reads(m.param, m.bin.read_bytes())
    assert (ret, read) == (0, size)
    by_layer = {}
    for b in layout.blobs:
        by_layer.setdefault(b.layer, {})[b.role] = b
    for la in p.layers:
        term = int(la.params.get(8, 0))
        if not term:
            assert not {"weight_scales", "input_scale"} & set(by_layer.get(la.name, {}))
            continue
        blobs = by_layer[la.name]
        assert blobs["weight"].storage == "int8"
        groups = int(la.params.get(7, 1)) if la.type == "ConvolutionDepthWise" else int(
            la.params[0])
        assert blobs["weight_scales"].count == groups
        assert blobs["input_scale"].count == 1
        assert ("output_scale" in blobs) == (term > 100)
        # the table's scales are where the walk places them
        at = blobs["weight_scales"].offset
        np.testing.assert_array_equal(np.fromfile(m.bin, "<f4", groups, offset=at),
                                      np.asarray(table.weight_scales[la.name], "<f4"))
        np.testing.assert_array_equal(
            np.fromfile(m.bin, "<f4", 1, offset=blobs["input_scale"].offset),
            np.asarray(table.blob_scales[la.name][:1], "<f4"))
    assert sum(int(la.params.get(8, 0)) > 100 for la in p.layers) == len(m.requantized)
    NcnnRunner(m.param, isolated=False).run((xs.numpy(),))  # no false refusal


def test_an_int8_bin_a_float_longer_or_shorter_is_refused(int8_models, tmp_path):
    _, _, models = int8_models
    m = models["requantized"]
    for f in m.param.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    param, data = tmp_path / m.param.name, m.bin.read_bytes()
    check_model_files(param, _bin(param))
    last = walk_bin(parse_ncnn_param(param), _bin(param)).blobs[-1]
    assert (last.layer, last.role) == ("linear_6", "input_scale")
    for damaged, why in ((data + b"\0" * 4, f"read exactly {len(data)}.*longer"),
                         (data[:-4], "linear_6 \\(InnerProduct\\) input_scale needs bytes")):
        _bin(param).write_bytes(damaged)
        with pytest.raises(wb.ModelFileError, match=why):
            check_model_files(param, _bin(param))


# -- every int8 term, held against ncnn's load_model ---------------------------------------

# (layer line, what it reads): terms the int8 writer does not write, and the recurrent and
# Embed layers' int8 scales
_LAYERS = {
    "conv term 1": "Convolution c 1 1 in0 out0 0=4 1=3 5=1 6=108 8=1",
    "conv term 101": "Convolution c 1 1 in0 out0 0=4 1=3 5=0 6=108 8=101",
    "dw term 2": "ConvolutionDepthWise c 1 1 in0 out0 0=3 1=3 5=1 6=27 7=3 8=2",
    "dw term 102": "ConvolutionDepthWise c 1 1 in0 out0 0=3 1=3 5=1 6=27 7=3 8=102",
    "dw term 101": "ConvolutionDepthWise c 1 1 in0 out0 0=3 1=3 5=0 6=27 7=3 8=101",
    "fc term 102 (no output scale)": "InnerProduct c 1 1 in0 out0 0=5 1=1 2=15 8=102",
    "conv1d ignores 8": "Convolution1D c 1 1 in0 out0 0=4 1=3 5=1 6=36 8=2",
    "embed int8": "Embed c 1 1 in0 out0 0=4 1=10 2=1 3=40 18=1",
    "lstm int8": "LSTM c 1 1 in0 out0 0=4 1=192 2=2 8=2",
    "gru int8": "GRU c 1 1 in0 out0 0=4 1=48 2=0 8=1",
    "rnn int8": "RNN c 1 1 in0 out0 0=4 1=12 8=1",
    # 18=quantize_term (int8 below 100): the raw scales after the weights
    "gemm int8, B constant": "Gemm c 1 1 in0 out0 4=0 5=1 6=0 7=0 8=4 9=6 18=1",
    "gemm int8, A constant, C": "Gemm c 1 1 in0 out0 4=1 5=0 6=1 7=3 8=0 9=6 10=1 18=2",
    "mha int8": "MultiHeadAttention c 1 1 in0 out0 0=4 1=1 2=16 18=1",
}


def sized_as_ncnn_reads(line: str, tmp_path: Path) -> tuple[list, Path, bytes]:
    """(blob_specs, .param, weights) of one layer after an Input, the weights laid out as the
    specs say (fp32 under flag 0, which ncnn quantizes at load for an int8 layer; raw fp32;
    raw int8 padded to 4 bytes), held against what ncnn's load_model reads of them."""
    param = tmp_path / "one.ncnn.param"
    param.write_text(f"7767517\n2 2\nInput in0 0 1 in0\n{line}\n")
    specs = blob_specs(parse_ncnn_param(param).layers[1])
    assert specs is not None, line
    data = b"".join(np.ones(count, "i1").tobytes() + b"\0" * (-count % 4) if how == "int8"
                    else (FP32_TAG.to_bytes(4, "little") if how else b"")
                    + np.ones(count, "<f4").tobytes() for _, count, how in specs)
    ret, read = ncnn_reads(param, data + b"\0" * 64)  # room to read past the layout
    assert ret == 0 and read == len(data), (line, specs, read)
    return specs, param, data


@pytest.mark.parametrize("name", list(_LAYERS))
def test_each_int8_term_is_sized_as_ncnn_reads_it(name, tmp_path):
    specs, _, _ = sized_as_ncnn_reads(_LAYERS[name], tmp_path)
    roles = [r for r, _, _ in specs]
    if "term 102" in name or "term 101" in name:
        assert ("output_scale" in roles) == name.startswith(("conv", "dw"))


def test_block_quantized_attention_and_gemm_are_left_unsized_not_guessed(tmp_path):
    # 18 >= 100 is weight_bits*100 + format + block size: packed weights, block scales
    param = tmp_path / "q.ncnn.param"
    param.write_text("7767517\n3 3\nInput in0 0 1 in0\n"
                     "Gemm g 1 1 in0 a 4=0 5=1 6=0 7=0 8=4 9=6 18=801\n"
                     "MultiHeadAttention m 1 1 a out0 0=4 1=1 2=16 18=801\n")
    _, gemm, mha = parse_ncnn_param(param).layers
    assert blob_specs(gemm) is None and blob_specs(mha) is None
    gemm.params[18], mha.params[18] = "2", "2"  # int8: sized with its scales
    assert [r for r, _, _ in blob_specs(gemm)] == ["B", "B_scale"]
    assert [r for r, _, _ in blob_specs(mha)][-4:] == ["q_scales", "k_scales", "v_scales",
                                                       "out_scale"]
    gemm.params.pop(18)
    assert [r for r, _, _ in blob_specs(gemm)] == ["B"]


# Layers sized beyond int8: each held against ncnn's own load_model, as above. MemoryData's
# 21 is ModelBin's element type (3: raw int8, padded to 4 bytes, as pnnx writes an SDPA mask).
_OTHER_LAYERS = {
    "memorydata tagged": "MemoryData c 0 1 out0 0=3 1=2 21=0",
    "memorydata raw fp32": "MemoryData c 0 1 out0 0=3 1=2",
    "memorydata raw int8 5": "MemoryData c 0 1 out0 0=5 21=3",
    "memorydata raw int8 4x3x2": "MemoryData c 0 1 out0 0=4 1=3 2=2 21=3",
    "padding per-channel": "Padding c 1 1 in0 out0 0=1 1=1 2=1 3=1 6=3",
    "padding": "Padding c 1 1 in0 out0 0=1 1=1 2=1 3=1",
    "quantize": "Quantize c 1 1 in0 out0 0=4",
    "dequantize with bias": "Dequantize c 1 1 in0 out0 0=4 1=4",
    "requantize with bias": "Requantize c 1 1 in0 out0 0=4 1=1 2=4",
    "deformable conv with bias": "DeformableConv2D c 1 1 in0 out0 0=4 1=3 5=1 6=108",
    "sdpa": "SDPA c 3 1 in0 in0 in0 out0",
    "rotary embed": "RotaryEmbed c 3 1 in0 in0 in0 out0",
    "glu": "GLU c 1 1 in0 out0",
}


@pytest.mark.parametrize("name", list(_OTHER_LAYERS))
def test_each_layer_s_blobs_are_sized_as_ncnn_reads_them(name, tmp_path):
    _, param, data = sized_as_ncnn_reads(_OTHER_LAYERS[name], tmp_path)
    bin_path = tmp_path / "one.ncnn.bin"
    bin_path.write_bytes(data)
    layout = walk_bin(parse_ncnn_param(param), bin_path)
    assert layout.complete and layout.end == len(data)
    if "int8" in name:
        assert [b.storage for b in layout.blobs] == ["int8-raw"]


def test_a_memorydata_of_a_type_ncnn_cannot_load_is_left_unsized(tmp_path):
    param = tmp_path / "one.ncnn.param"
    param.write_text("7767517\n1 1\nMemoryData c 0 1 out0 0=3 21=2\n")  # raw fp16
    assert blob_specs(parse_ncnn_param(param).layers[0]) is None
    assert ncnn_reads(param, b"\0" * 64)[0] != 0  # ncnn: "load type 2 not implemented"
