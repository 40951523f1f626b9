"""ncnn and pnnx .param parsers: real files written by the pnnx binary, checked against the
models that made them and against ncnn's own loader; and every kind of malformed file."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import ModelFileError
from workbench.graph import TensorInfo, summarize_ncnn, summarize_pnnx
from workbench.params import (
    NcnnLayer,
    PnnxAttr,
    parse_ncnn_param,
    parse_pnnx_param,
)
from workbench.stages.pnnx_command import pnnx_binary

# -- models with known structure, and the files pnnx writes for them ---------------------------


class SR(nn.Module):
    """Bicubic x3, then conv1 9x9 / relu1 / conv2 1x1 / relu2 / conv3 5x5."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 9, padding=4)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 4, 1)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(4, 3, 5, padding=2)

    def forward(self, x):
        x = F.interpolate(x, scale_factor=3.0, mode="bicubic", align_corners=False)
        return self.conv3(self.relu2(self.conv2(self.relu1(self.conv1(x)))))


class Rich(nn.Module):
    """Two branches joined by cat, a parameter (MemoryData), arithmetic (pnnx.Expression),
    chunk (a Slice with an array param), view, a Linear/LayerNorm/GELU head and three outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.branch_a = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.branch_b = nn.Sequential(nn.Conv2d(8, 8, 1), nn.Sigmoid())
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.head = nn.Sequential(nn.Linear(256, 32), nn.LayerNorm(32), nn.GELU(),
                                  nn.Linear(32, 10))
        self.scale = nn.Parameter(torch.rand(1, 16, 1, 1) + 0.5)

    def forward(self, x):
        y = self.stem(x)
        a = self.branch_a(y)
        b = self.branch_b(y)
        c = torch.cat((a, b), dim=1) * self.scale + a.mean() * 0.5 - 1
        u, v = torch.chunk(c, 2, dim=1)
        p = self.pool(torch.cat((v, u), dim=1))
        h = self.head(p.view(p.size(0), -1))
        return F.softmax(h, dim=1), F.normalize(h, dim=1), p


class Dyn(nn.Module):
    """Two inputs with dynamic axes (pnnx writes '?' dims), flatten -> an ncnn string param."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, z):
        y = F.interpolate(self.conv(x), scale_factor=2.0, mode="nearest")
        return y.flatten(2).transpose(1, 2) + z.sum()


def _convert(folder: Path, stem: str, model: nn.Module, args: tuple, shape: str,
             shape2: str | None = None) -> SimpleNamespace:
    torch.jit.trace(model.eval(), args).save(str(folder / f"{stem}.pt"))
    cmd = [str(pnnx_binary()), f"{stem}.pt", f"inputshape={shape}", "fp16=0"]
    if shape2:
        cmd.append(f"inputshape2={shape2}")
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return SimpleNamespace(model=model, ncnn=folder / f"{stem}.ncnn.param",
                           pnnx=folder / f"{stem}.pnnx.param", bin=folder / f"{stem}.ncnn.bin",
                           pnnx_bin=folder / f"{stem}.pnnx.bin")


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("pnnx-samples")
    torch.manual_seed(0)
    return SimpleNamespace(
        sr=_convert(folder, "sr", SR(), (torch.rand(1, 3, 32, 32),), "[1,3,32,32]f32"),
        rich=_convert(folder, "rich", Rich(), (torch.rand(1, 3, 64, 64),), "[1,3,64,64]f32"),
        dyn=_convert(folder, "dyn", Dyn(), (torch.rand(1, 3, 16, 16), torch.rand(2, 5)),
                     "[1,3,16,16]f32,[2,5]f32", "[1,3,24,32]f32,[3,5]f32"),
    )


def _header_counts(path: Path) -> tuple[int, int]:
    a, b = path.read_text().splitlines()[1].split()
    return int(a), int(b)


# -- ncnn ---------------------------------------------------------------------------------------


def test_ncnn_sr_layers_blobs_and_params(samples):
    p = parse_ncnn_param(samples.sr.ncnn)
    assert [la.type for la in p.layers] == ["Input", "Interp", "Convolution", "Convolution",
                                           "Convolution"]
    assert p.blobs == ["in0", "1", "2", "3", "out0"]
    assert p.inputs == ["in0"] and p.outputs == ["out0"]
    convs = [la for la in p.layers if la.type == "Convolution"]
    # 0 = num_output, 1 = kernel_w, 6 = weight_data_size: the model's conv1/conv2/conv3
    assert [(c.params[0], c.params[1], c.params[6]) for c in convs] == [
        ("8", "9", str(8 * 3 * 9 * 9)), ("4", "1", str(4 * 8)), ("3", "5", str(3 * 4 * 5 * 5))]
    interp = p.layers[1]
    assert (interp.bottoms, interp.tops) == (["in0"], ["1"])
    assert interp.params[1] == "3.0" and interp.line == 4
    assert len(p.layers) == _header_counts(samples.sr.ncnn)[0]
    assert not any(la.glue for la in p.layers)


@pytest.mark.parametrize("name", ["sr", "rich", "dyn"])
def test_ncnn_parse_agrees_with_ncnns_own_loader(samples, name):
    import ncnn

    path = getattr(samples, name).ncnn
    p = parse_ncnn_param(path)
    net = ncnn.Net()
    assert net.load_param(str(path)) == 0
    blobs = [b.name for b in net.blobs()]
    assert p.blobs == blobs
    assert [(la.type, la.name, la.bottoms, la.tops) for la in p.layers] == [
        (la.type, la.name, [blobs[i] for i in la.bottoms], [blobs[i] for i in la.tops])
        for la in net.layers()]
    assert p.inputs == list(net.input_names())
    assert p.outputs == list(net.output_names())
    assert (len(p.layers), len(p.blobs)) == _header_counts(path)


def test_ncnn_rich_glue_layers_arrays_and_outputs(samples):
    p = parse_ncnn_param(samples.rich.ncnn)
    hist = Counter(la.type for la in p.layers)
    assert {t: hist[t] for t in ("Convolution", "InnerProduct", "LayerNorm", "GELU", "Concat",
                                 "Slice", "Normalize", "Softmax", "MemoryData", "Input")} == {
        "Convolution": 3, "InnerProduct": 2, "LayerNorm": 1, "GELU": 1, "Concat": 2,
        "Slice": 1, "Normalize": 1, "Softmax": 1, "MemoryData": 1, "Input": 1}
    # a Split for each blob read twice: stem out, branch_a out, pool out, head out
    assert hist["Split"] == 4
    assert {la.type for la in p.glue_layers} == {"Split", "MemoryData"}
    assert all(la.glue == (la.type in ("Split", "MemoryData")) for la in p.layers)
    assert all(len(la.bottoms) == 1 and len(la.tops) == 2 for la in p.layers
               if la.type == "Split")
    assert all(len(c) <= 1 for c in p.consumers.values())  # ncnn: one reader per blob
    mem = p.layer("scale")
    assert mem.type == "MemoryData" and mem.bottoms == [] and mem.params[2] == "16"
    slice_ = next(la for la in p.layers if la.type == "Slice")
    assert slice_.params[-23300] == ["-233", "-233"]  # chunk(2): two equal parts
    assert sorted(p.outputs) == ["out0", "out1", "out2"]
    assert p.producers["out0"] == next(la.name for la in p.layers if la.type == "Softmax")
    assert p.consumers["in0"] == [p.layers[2].name]


def test_ncnn_quoted_string_params_are_kept_as_written(samples):
    p = parse_ncnn_param(samples.dyn.ncnn)
    assert p.inputs == ["in0", "in1"]
    reshape = next(la for la in p.layers if la.type == "Reshape")
    assert reshape.params[6].startswith('"') and reshape.params[6].endswith('"')


def test_ncnn_hand_written_params_strings_with_spaces_arrays_crlf(tmp_path):
    f = tmp_path / "m.ncnn.param"
    f.write_bytes(b"7767517\r\n3 3\r\n\r\nInput in0 0 1 in0 0=4 1=4 2=3\r\n"
                  b'Custom c 1 1 in0 a 0="x y, z" 1=1,2,3 -23301=2,0.5,1e-3\r\n'
                  b"Split s 1 1 a out0\r\n")
    p = parse_ncnn_param(f)
    c = p.layer("c")
    assert c.params == {0: '"x y, z"', 1: ["1", "2", "3"], -23301: ["0.5", "1e-3"]}
    assert c.line == 5 and p.inputs == ["in0"] and p.outputs == ["out0"]
    assert isinstance(c, NcnnLayer) and p.layer("s").glue


# -- pnnx ---------------------------------------------------------------------------------------


def test_pnnx_sr_ops_params_attrs_shapes(samples):
    p = parse_pnnx_param(samples.sr.pnnx)
    assert [o.type for o in p.ops] == ["pnnx.Input", "F.upsample", "nn.Conv2d", "nn.ReLU",
                                      "nn.Conv2d", "nn.ReLU", "nn.Conv2d", "pnnx.Output"]
    assert [o.name for o in p.ops][2:7] == ["conv1", "relu1", "conv2", "relu2", "conv3"]
    conv1 = p.op("conv1")
    assert conv1.params["kernel_size"] == "(9,9)" and conv1.params["padding_mode"] == "zeros"
    assert conv1.params["bias"] == "True" and conv1.params["out_channels"] == "8"
    assert conv1.attrs == {"weight": PnnxAttr((8, 3, 9, 9), "float32"),
                           "bias": PnnxAttr((8,), "float32")}
    up = p.ops[1]
    assert up.params["mode"] == "bicubic" and up.params["scale_factor"] == "(3.0,3.0)"
    assert up.input_names == {"input": up.inputs[0]}
    assert p.operands[p.inputs[0]].shape == (1, 3, 32, 32)
    assert p.operands[up.outputs[0]].shape == (1, 3, 96, 96)
    assert p.operands[p.outputs[0]].shape == (1, 3, 96, 96)
    assert p.operands[p.outputs[0]].dtype == "float32"
    assert (len(p.ops), len(p.operands)) == _header_counts(samples.sr.pnnx)


def test_pnnx_module_map_names_the_producing_module(samples):
    p = parse_pnnx_param(samples.sr.pnnx)
    conv1_out = p.op("conv1").outputs[0]
    assert p.module_map[conv1_out] == ("conv1", "conv1")
    assert p.operands[conv1_out].consumers == ["relu1"]
    up_out = p.ops[1].outputs[0]
    assert p.module_map[up_out] == (p.ops[1].name, None)  # F.* has no module
    assert p.module_map[p.inputs[0]] == ("pnnx_input_0", None)
    modules = dict(samples.sr.model.named_modules())
    assert {m for _, m in p.module_map.values() if m} == {n for n in modules if n}


def test_pnnx_rich_nested_modules_expression_multi_output(samples):
    p = parse_pnnx_param(samples.rich.pnnx)
    modules = dict(samples.rich.model.named_modules())
    with_module = [o for o in p.ops if o.module]
    assert {o.module for o in with_module} == {
        "stem", "branch_a.0", "branch_a.1", "branch_b.0", "branch_b.1", "pool",
        "head.0", "head.1", "head.2", "head.3"}
    for o in with_module:  # nn.X op named as the module, of that class
        assert o.type == "nn." + type(modules[o.module]).__name__
    assert all(o.module is None for o in p.ops if not o.type.startswith("nn."))
    expr = next(o for o in p.ops if o.type == "pnnx.Expression")
    assert expr.params["expr"].startswith("sub(add(mul(@0,@1)")
    chunk = next(o for o in p.ops if o.type == "torch.chunk")
    assert len(chunk.outputs) == 2 and chunk.params == {"chunks": "2", "dim": "1"}
    assert [p.operands[r].shape for r in chunk.outputs] == [(1, 8, 32, 32)] * 2
    attr = p.op("scale")
    assert attr.type == "pnnx.Attribute" and attr.attrs["data"] == PnnxAttr((1, 16, 1, 1),
                                                                           "float32")
    mean = next(o for o in p.ops if o.type == "torch.mean")
    assert p.operands[mean.outputs[0]].shape is None  # 0-d: pnnx writes no note
    # the three returned tensors, unpacked from the prim::TupleConstruct pnnx.Output reads
    assert [p.operands[r].producer for r in p.outputs][:2] == [
        next(o.name for o in p.ops if o.type == "F.softmax"),
        next(o.name for o in p.ops if o.type == "F.normalize")]
    assert [p.operands[r].shape for r in p.outputs] == [(1, 10), (1, 10), (1, 16, 4, 4)]
    assert p.module_map[p.outputs[2]] == ("pool", "pool")
    assert (len(p.ops), len(p.operands)) == _header_counts(samples.rich.pnnx)


def test_pnnx_dynamic_dims_are_none(samples):
    p = parse_pnnx_param(samples.dyn.pnnx)
    assert [p.operands[r].shape for r in p.inputs] == [(1, 3, None, None), (None, 5)]
    assert p.operands[p.op("conv").outputs[0]].shape == (1, 4, None, None)
    assert [p.operands[r].shape for r in p.outputs] == [(1, None, 4)]


# -- summaries ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sr", "rich", "dyn"])
def test_summary_node_counts_match_the_parsed_graphs(samples, name):
    s = getattr(samples, name)
    n, q = parse_ncnn_param(s.ncnn), parse_pnnx_param(s.pnnx)
    sn, sp = summarize_ncnn(s.ncnn), summarize_pnnx(s.pnnx)
    assert sn.format == "ncnn" and sp.format == "pnnx"
    # ncnn: every layer, Input too, as its header counts them and a drawing shows them
    assert sn.node_count == len(n.layers) == _header_counts(s.ncnn)[0] \
        == sum(sn.op_histogram.values()) and sn.op_histogram["Input"] == len(n.inputs)
    assert sp.node_count == len(q.ops) - len(q.inputs) - 1 == sum(sp.op_histogram.values())
    assert "pnnx.Output" not in sp.op_histogram
    assert sn.op_histogram.get("Split", 0) == sum(la.type == "Split" for la in n.layers)
    # shapes from the pnnx graph beside it (pnnx's own output folder), in order
    assert sn.inputs == [TensorInfo(b, t.shape, t.dtype) for b, t in zip(n.inputs, sp.inputs,
                                                                        strict=True)]
    assert [t.shape for t in sn.outputs] == [t.shape for t in sp.outputs]
    assert summarize_ncnn(parse_ncnn_param(s.ncnn)).inputs == [
        TensorInfo(b, None, "float32") for b in n.inputs]  # no pnnx graph: unknown
    assert [t.shape for t in sp.inputs] == [q.operands[r].shape for r in q.inputs]
    assert len(sp.outputs) == len(sn.outputs)  # pnnx's tuple unpacked as ncnn's outputs


def test_pnnx_summary_counts_weights_from_attribute_shapes(samples):
    s = summarize_pnnx(samples.rich.pnnx)
    params = list(samples.rich.model.parameters())
    assert s.initializer_count == len(params)
    assert s.initializer_bytes == 4 * sum(t.numel() for t in params)
    assert s.op_histogram["nn.Conv2d"] == 3 and s.op_histogram["pnnx.Attribute"] == 1
    assert s.outputs[2] == TensorInfo(s.outputs[2].name, (1, 16, 4, 4), "float32")
    sn = summarize_ncnn(samples.rich.ncnn)
    assert sn.op_histogram["Split"] == 4 and sn.op_histogram["MemoryData"] == 1


def test_params_module_imports_no_backend():
    probe = ("import sys, workbench.params; print(','.join(m for m in "
             "('torch', 'ncnn', 'onnx', 'pnnx', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ""


# -- malformed files ----------------------------------------------------------------------------


def _broken(tmp_path: Path, source: Path, edit) -> Path:
    lines = source.read_text().splitlines()
    out = tmp_path / source.name
    text = edit(lines)
    (out.write_text if isinstance(text, str) else out.write_bytes)(text)
    return out


def _fails(parse, path: Path, line: int, *fragments: str, hint: str) -> ModelFileError:
    with pytest.raises(ModelFileError) as info:
        parse(path)
    e = info.value
    assert str(path) in e.message and f"line {line}:" in e.message, e.message
    assert "expected" in e.message and "got" in e.message, e.message
    for frag in fragments:
        assert frag in e.message, (frag, e.message)
    assert hint in e.hint, e.hint
    return e


PARSERS = [pytest.param(parse_ncnn_param, "ncnn", id="ncnn"),
           pytest.param(parse_pnnx_param, "pnnx", id="pnnx")]


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_wrong_magic(samples, tmp_path, parse, fmt):
    f = _broken(tmp_path, getattr(samples.sr, fmt), lambda ls: "\n".join(["7767518"] + ls[1:]))
    _fails(parse, f, 1, "7767517", "'7767518'", hint="starts with the line 7767517")


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_empty_file(tmp_path, parse, fmt):
    f = tmp_path / f"x.{fmt}.param"
    f.write_text("")
    _fails(parse, f, 1, "an empty file", hint="7767517")


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_too_few_lines_for_the_declared_count(samples, tmp_path, parse, fmt):
    src = getattr(samples.sr, fmt)
    n = len(src.read_text().splitlines())
    f = _broken(tmp_path, src, lambda ls: "\n".join(ls[:-1]) + "\n")  # last line lost
    what = "layer" if fmt == "ncnn" else "op"
    _fails(parse, f, n, f"{n - 2} {what} lines", f"end of file after {n - 3}",
           hint="truncated")


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_more_lines_than_the_declared_count(samples, tmp_path, parse, fmt):
    def edit(ls):
        a, b = ls[1].split()
        return "\n".join([ls[0], f"{int(a) - 1} {b}"] + ls[2:])

    f = _broken(tmp_path, getattr(samples.sr, fmt), edit)
    n = len(f.read_text().splitlines())
    _fails(parse, f, n, "end of file after", "another", hint="count on line 2")


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_blob_or_operand_count_mismatch(samples, tmp_path, parse, fmt):
    def edit(ls):
        a, b = ls[1].split()
        return "\n".join([ls[0], f"{a} {int(b) + 1}"] + ls[2:])

    src = getattr(samples.rich, fmt)
    _, blobs = _header_counts(src)
    f = _broken(tmp_path, src, edit)
    _fails(parse, f, 2, f"expected {blobs + 1} ", f"got {blobs} distinct",
           hint="line 2 is '<")


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_second_line_not_two_counts(samples, tmp_path, parse, fmt):
    f = _broken(tmp_path, getattr(samples.sr, fmt), lambda ls: "\n".join([ls[0], "5"] + ls[2:]))
    _fails(parse, f, 2, "two counts", "'5'", hint="line 2")


@pytest.mark.parametrize(("parse", "fmt", "keep"), [
    pytest.param(parse_ncnn_param, "ncnn", 4, id="ncnn-in-names"),
    pytest.param(parse_pnnx_param, "pnnx", 5, id="pnnx-in-names"),
    pytest.param(parse_ncnn_param, "ncnn", 2, id="ncnn-in-counts"),
    pytest.param(parse_pnnx_param, "pnnx", 3, id="pnnx-in-counts"),
])
def test_truncated_line_in_names(samples, tmp_path, parse, fmt, keep):
    src = getattr(samples.sr, fmt)
    n = len(src.read_text().splitlines()) - 1  # the file ends inside its last-but-one line
    f = _broken(tmp_path, src, lambda ls: "\n".join(ls[:-2] + [" ".join(ls[-2].split()[:keep])]))
    frag = "name(s), then the end of the line" if keep > 3 else "field(s)"
    _fails(parse, f, n, frag, hint="truncated")


@pytest.mark.parametrize(("fmt", "cut", "frag"), [
    ("ncnn", "-23300=2,-233", "as many values as its count"),
    ("pnnx", "f32 #1=(1,16,", "like '#1="),
    ("pnnx", "@data=(1,16,", "like '@data="),
    ("pnnx", "output_size=(4,", "closing ')'"),
])
def test_truncated_line_mid_parameter(samples, tmp_path, fmt, cut, frag):
    src = getattr(samples.rich, fmt)
    text = src.read_text()
    at = text.index(cut) + len(cut)
    line = text[:at].count("\n") + 1
    f = tmp_path / src.name
    f.write_text(text[:at])
    parse = parse_ncnn_param if fmt == "ncnn" else parse_pnnx_param
    _fails(parse, f, line, frag, hint="truncated")


def test_ncnn_unclosed_quote(samples, tmp_path):
    src = samples.dyn.ncnn
    text = src.read_text()
    at = text.index('6="') + 5
    f = tmp_path / src.name
    f.write_text(text[:at])
    _fails(parse_ncnn_param, f, text[:at].count("\n") + 1, "closing '\"'", hint="truncated")


def test_ncnn_param_without_integer_id(samples, tmp_path):
    f = _broken(tmp_path, samples.sr.ncnn, lambda ls: "\n".join(ls[:-1] + [ls[-1] + " k=1"]))
    _fails(parse_ncnn_param, f, len(f.read_text().splitlines()), "integer id", "'k=1'",
           hint="'id=value'")


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_input_read_before_it_is_written(samples, tmp_path, parse, fmt):
    f = _broken(tmp_path, getattr(samples.sr, fmt),
                lambda ls: "\n".join(ls[:3] + [ls[4], ls[3]] + ls[5:]))
    _fails(parse, f, 4, "produced by an earlier line", hint="execution order")


@pytest.mark.parametrize(("parse", "fmt"), PARSERS)
def test_name_produced_twice(samples, tmp_path, parse, fmt):
    def edit(ls):
        a, b = ls[1].split()
        dup = ls[3].replace(ls[3].split()[1], "again", 1)
        return "\n".join([ls[0], f"{int(a) + 1} {b}"] + ls[2:4] + [dup] + ls[4:])

    f = _broken(tmp_path, getattr(samples.sr, fmt), edit)
    _fails(parse, f, 5, "a new", "already produced by", hint="exactly one line")


def test_pnnx_note_for_a_foreign_operand(samples, tmp_path):
    f = _broken(tmp_path, samples.sr.pnnx,
                lambda ls: "\n".join(ls[:3] + [ls[3] + " #99=(1)f32"] + ls[4:]))
    _fails(parse_pnnx_param, f, 4, "'#99=(1)f32'", "a shape note", hint="#note")


def test_pnnx_file_given_to_the_ncnn_parser_and_back(samples):
    _fails(parse_ncnn_param, samples.sr.pnnx, 3, "an ncnn layer type", "'pnnx.Input'",
           hint="parse_pnnx_param")
    _fails(parse_pnnx_param, samples.sr.ncnn, 3, "a pnnx op type", "'Input'",
           hint="parse_ncnn_param")


@pytest.mark.parametrize(("parse", "which", "hint"), [
    (parse_ncnn_param, "bin", "weights file"),
    (parse_pnnx_param, "pnnx_bin", "zip archive"),
])
def test_binary_files(samples, parse, which, hint):
    _fails(parse, getattr(samples.sr, which), 1, "binary data", "at offset", hint=hint)


def test_binary_ncnn_param(tmp_path):
    f = tmp_path / "m.param.bin"
    f.write_bytes((7767517).to_bytes(4, "little") + (5).to_bytes(4, "little") * 2)
    _fails(parse_ncnn_param, f, 1, "binary data", hint="ncnn2mem")


def test_binary_after_a_good_start(samples, tmp_path):
    f = _broken(tmp_path, samples.sr.ncnn, lambda ls: ("\n".join(ls[:4]) + "\n").encode()
                + b"Convolution \xff\xfe\x00")
    _fails(parse_ncnn_param, f, 5, "binary data", hint="weights file")


@pytest.mark.parametrize("parse", [parse_ncnn_param, parse_pnnx_param])
def test_missing_file_and_folder(tmp_path, parse):
    with pytest.raises(ModelFileError, match="does not exist") as info:
        parse(tmp_path / "nope.param")
    assert "nope.param" in info.value.message and info.value.hint
    with pytest.raises(ModelFileError, match="is a folder") as info:
        parse(tmp_path)
    assert info.value.hint
