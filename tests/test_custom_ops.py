"""Custom ops through export, ONNX Runtime, ncnn and wb.compare (issue 6).

Registrations are process-global: every op here has a test-only name and is unregistered
when its fixture or test ends, so other test files see none of them.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import workbench as wb  # noqa: E402
from workbench import customops as cops  # noqa: E402

ATOL = 1e-4


def _first(out: dict) -> np.ndarray:
    return next(iter(out.values()))


# -- route 1: an ATen op with no symbolic at the opset -----------------------------------------
class Asinh(torch.nn.Module):
    def forward(self, x):
        return torch.asinh(x) * 2


def _asinh_composed(g, x):
    """asinh(x) = log(x + sqrt(x*x + 1)), from ops older than Asinh."""
    one = g.op("Constant", value_t=torch.tensor(1.0))
    return g.op("Log", g.op("Add", x, g.op("Sqrt", g.op("Add", g.op("Mul", x, x), one))))


def test_asinh_opset9_fails_without_registration_and_matches_torch_with_it(tmp_path):
    x = torch.randn(2, 5)
    with pytest.raises(wb.ExportError) as err:
        wb.export(Asinh(), (x,), workspace=tmp_path / "none", opset=9)
    assert "aten::asinh" in err.value.message and "opset 9" in err.value.message
    assert 'wb.register_symbolic("aten::asinh", lambda g, self: g.op("Asinh", self), ' \
           'opset=9)' in err.value.hint
    try:
        wb.register_symbolic("aten::asinh", lambda g, x: g.op("Asinh", x), opset=9)
        onx = wb.export(Asinh(), (x,), workspace=tmp_path / "ts", opset=9)
        assert onx.graph.op_histogram.get("Asinh") == 1
        assert onx.metrics["max_abs"] < ATOL
        assert not [d for d in onx.diagnostics if d.level == "error"]
        # the same function serves the dynamo exporter (its torchlib has asinh, so the proof
        # that ours is used is a lowering of our own: no Asinh node, Log and Sqrt instead)
        wb.unregister("aten::asinh")
        wb.register_symbolic("aten::asinh", _asinh_composed, opset=9)
        for exporter, opset in (("dynamo", 18), ("torchscript", 9)):
            onx = wb.export(Asinh(), (x,), workspace=tmp_path / exporter, opset=opset,
                            exporter=exporter)
            hist = onx.graph.op_histogram
            assert "Asinh" not in hist and hist.get("Log") == 1 and hist.get("Sqrt") == 1
            got = _first(wb.runtime.OrtRunner(onx).run((x,)))
            np.testing.assert_allclose(got, Asinh()(x).numpy(), atol=ATOL)
    finally:
        wb.unregister("aten::asinh")
    assert cops.symbolic_opsets("aten::asinh") == []
    with pytest.raises(wb.ExportError, match="unsupported operator aten::asinh"):  # gone
        wb.export(Asinh(), (x,), workspace=tmp_path / "again", opset=9)


def test_an_onnxscript_function_serves_the_dynamo_exporter_alone(tmp_path):
    from onnxscript import opset18 as op

    def asinh_onnx(self):
        return op.Log(op.Add(self, op.Sqrt(op.Add(op.Mul(self, self), op.CastLike(1.0, self)))))

    x = torch.randn(4)
    try:
        wb.register_symbolic("aten::asinh", asinh_onnx, opset=18, exporter="dynamo")
        onx = wb.export(Asinh(), (x,), workspace=tmp_path, exporter="dynamo", opset=18)
        assert "Asinh" not in onx.graph.op_histogram and onx.graph.op_histogram.get("Log") == 1
        assert onx.metrics["max_abs"] < ATOL
        # the TorchScript exporter was not given it
        with pytest.raises(wb.ExportError, match="unsupported operator aten::asinh"):
            wb.export(Asinh(), (x,), workspace=tmp_path / "ts", opset=9)
    finally:
        wb.unregister("aten::asinh")


def test_symbolic_registered_for_a_higher_opset_is_named_in_the_error(tmp_path):
    try:
        wb.register_symbolic("aten::asinh", lambda g, x: g.op("Asinh", x), opset=11)
        with pytest.raises(wb.ExportError) as err:
            wb.export(Asinh(), (torch.randn(3),), workspace=tmp_path, opset=9)
        assert "registered at opset 11" in err.value.hint
        assert "opset=9" in err.value.hint and "aten::asinh" in err.value.message
    finally:
        wb.unregister("aten::asinh")


@pytest.mark.parametrize("call, expected", [
    (lambda: wb.register_symbolic("asinh", lambda g, x: x, opset=9), "namespace::op"),
    (lambda: wb.register_symbolic("aten::asinh", lambda x: x, opset=9), "first parameter"),
    (lambda: wb.register_symbolic("aten::asinh", "Asinh", opset=9), "must be callable"),
    (lambda: wb.register_symbolic("aten::no_such_op", lambda g, x: x, opset=9), "no op"),
    (lambda: wb.register_symbolic("aten::asinh", lambda g, x: x, opset=0), "opset=0"),
    (lambda: wb.register_symbolic("aten::asinh", lambda g, x: x, opset=9, exporter="tf"),
     "exporter='tf'"),
])
def test_register_symbolic_rejects_bad_input(call, expected):
    with pytest.raises(wb.InputError) as err:
        call()
    assert expected in str(err.value) and err.value.hint
    assert cops.symbolic_opsets("aten::asinh") == []


# -- route 2: an op of our own, everywhere -----------------------------------------------------
def _my_add(a: torch.Tensor, b: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    return alpha * a + b


class AddNet(torch.nn.Module):
    def __init__(self, op) -> None:
        super().__init__()
        self.op = op
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x, y):
        return self.head(torch.relu(self.op(self.conv(x), y, 3.0)))


@pytest.fixture(scope="module")
def my_add_case(tmp_path_factory):
    op = wb.custom_op("wbtest::my_add", _my_add, mutates_args=())
    torch.manual_seed(0)
    model = AddNet(op).eval()
    x, y = torch.randn(1, 3, 8, 8), torch.randn(1, 4, 8, 8)
    ws = wb.Workspace(tmp_path_factory.mktemp("my_add"))
    arts = {ex: wb.export(model, (x, y), workspace=ws, exporter=ex,
                          opset=17 if ex == "torchscript" else 18)
            for ex in ("torchscript", "dynamo")}
    yield model, (x, y), arts, ws
    wb.unregister("wbtest::my_add")


def test_my_add_exports_as_a_custom_domain_node_on_both_exporters(my_add_case):
    import onnx

    model, inputs, arts, _ = my_add_case
    ref = model(*inputs).detach().numpy()
    for exporter, art in arts.items():
        nodes = [n for n in onnx.load(art.path).graph.node if n.domain == "wbtest"]
        assert [n.op_type for n in nodes] == ["my_add"], exporter
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
        assert attrs == {"alpha": 3.0}, exporter
        # export's own check ran ONNX Runtime (in the worker) through the Python kernel
        assert art.metrics["max_abs"] < ATOL, exporter
        got = _first(wb.runtime.OrtRunner(art).run(inputs))
        np.testing.assert_allclose(got, ref, atol=ATOL)


def test_my_add_reaches_ncnn_as_a_named_custom_layer(my_add_case):
    from workbench.params import parse_ncnn_param

    model, inputs, arts, _ = my_add_case
    nc = wb.to_ncnn(arts["dynamo"])
    layers = [layer for layer in parse_ncnn_param(nc.path).layers
              if layer.type == "wbtest::my_add"]
    assert len(layers) == 1 and len(layers[0].bottoms) == 2
    assert "wbtest::my_add" in nc.parent.path.read_text()  # the pnnx graph names it too
    assert nc.metrics["max_abs"] < ATOL  # to_ncnn's own check, in the worker
    ref = model(*inputs).detach().numpy()
    for isolated in (True, False):
        got = _first(wb.runtime.NcnnRunner(nc, isolated=isolated).run(inputs))
        np.testing.assert_allclose(got.reshape(ref.shape), ref, atol=ATOL)


def test_compare_aligns_and_checks_the_custom_op_output(my_add_case):
    model, inputs, arts, ws = my_add_case
    nc = wb.to_ncnn(arts["torchscript"])
    rep = wb.compare(model, [arts["torchscript"], nc], inputs, progress=False)
    assert set(rep.aligned_fraction.values()) == {1.0}
    mine = [r for r in rep.records if "my_add" in str(r.reference)]
    assert {r.candidate for r in mine} == {c.name for c in rep.candidates}
    assert all(r.metrics.passed and r.metrics.max_abs < ATOL for r in mine)
    assert rep.ok


def test_a_native_ort_kernel_replaces_the_torch_code(tmp_path):

    def add_ort(a, b):
        return (a + b + 100.0).astype(np.float32)  # deliberately not the torch result

    op = wb.custom_op("wbtest::plus", lambda a, b: a + b, mutates_args=(),
                      schema="(Tensor a, Tensor b) -> Tensor", ort=add_ort)
    try:
        class Plus(torch.nn.Module):
            def forward(self, a, b):
                return op(a, b)

        a, b = torch.ones(2, 3), torch.ones(2, 3)
        onx = wb.export(Plus(), (a, b), workspace=tmp_path)
        assert any(d.code == "numeric-mismatch" for d in onx.diagnostics)
        got = _first(wb.runtime.OrtRunner(onx).run((a, b)))
        np.testing.assert_allclose(got, np.full((2, 3), 102.0))
    finally:
        wb.unregister("wbtest::plus")


def test_sessions_made_before_a_new_python_op_are_freed_without_a_crash(my_add_case):
    """onnxruntime-extensions crashes freeing a session made before a later Python-op
    registration; such sessions are pinned instead (crash-isolated here, in a subprocess)."""
    import subprocess
    import sys
    import textwrap

    _, _, arts, _ = my_add_case
    script = textwrap.dedent(f"""
        import gc, numpy as np, torch, workbench as wb
        from workbench.customops import ort as cops
        wb.custom_op("wbtest::my_add", lambda a, b, alpha=2.0: alpha * a + b,
                     schema="(Tensor a, Tensor b, float alpha=2.0) -> Tensor")
        r = wb.runtime.OrtRunner({str(arts["torchscript"].path)!r}, isolated=False)
        x = np.ones((1, 3, 8, 8), np.float32); y = np.ones((1, 4, 8, 8), np.float32)
        r.run((x, y)); r.run((x, y), capture="all")
        for i in range(40):  # other ops' kernels registered while the session lives
            cops._ort_op_type(f"other::op{{i}}", (1,), (1,), ())
        del r
        gc.collect()
        print("freed")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "freed" in run.stdout, run.stderr[-2000:]


def test_ops_that_cannot_reach_the_worker_run_in_process_with_a_warning(tmp_path):
    lock = threading.Lock()  # cannot be pickled: the kernel cannot travel to the worker

    def locked_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        with lock:
            return a + 2 * b

    op = wb.custom_op("wbtest::locked_add", locked_add, mutates_args=())
    try:
        class Net(torch.nn.Module):
            def forward(self, a, b):
                return op(a, b)

        a, b = torch.randn(2, 3), torch.randn(2, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            onx = wb.export(Net(), (a, b), workspace=tmp_path)
            runner = wb.runtime.OrtRunner(onx)
        assert not runner.isolated
        assert any(issubclass(w.category, cops.CustomOpWarning) for w in caught)
        np.testing.assert_allclose(_first(runner.run((a, b))), (a + 2 * b).numpy(), atol=ATOL)
    finally:
        wb.unregister("wbtest::locked_add")


# -- a deformable convolution written with torch ops -------------------------------------------
def _deform_conv(x: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor,
                 stride: list[int], padding: list[int], dilation: list[int]) -> torch.Tensor:
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    ys = (torch.arange(ho, dtype=x.dtype) * stride[0] - padding[0])[:, None]
    xs = (torch.arange(wo, dtype=x.dtype) * stride[1] - padding[1])[None, :]
    cols = []
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            py = ys + i * dilation[0] + offset[:, 2 * k]
            px = xs + j * dilation[1] + offset[:, 2 * k + 1]
            grid = torch.stack([2 * px / (w - 1) - 1, 2 * py / (h - 1) - 1], -1)
            cols.append(F.grid_sample(x, grid, align_corners=True))
    return torch.einsum("nckhw,ock->nohw", torch.stack(cols, 2), weight.flatten(2))


def test_deformable_conv_exports_to_a_custom_domain_and_runs_in_ort(tmp_path):
    import onnx

    op = wb.custom_op("wbtest::deform_conv", _deform_conv, mutates_args=())
    try:
        class Deform(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.offset = torch.nn.Conv2d(4, 18, 3, padding=1, stride=2)
                self.weight = torch.nn.Parameter(torch.randn(6, 4, 3, 3) * 0.1)

            def forward(self, x):
                return op(x, self.offset(x), self.weight, [2, 2], [1, 1], [1, 1])

        torch.manual_seed(0)
        model, x = Deform().eval(), torch.randn(1, 4, 9, 9)
        # zero offsets make it an ordinary convolution: the torch code is right
        plain = op(x, torch.zeros(1, 18, 5, 5), model.weight, [2, 2], [1, 1], [1, 1])
        np.testing.assert_allclose(plain.detach(), F.conv2d(x, model.weight.detach(), stride=2,
                                                            padding=1), atol=ATOL)
        onx = wb.export(model, (x,), workspace=tmp_path)
        node = next(n for n in onnx.load(onx.path).graph.node if n.domain == "wbtest")
        attrs = {a.name: list(a.ints) for a in node.attribute}
        assert (node.op_type, attrs) == ("deform_conv", {"stride": [2, 2], "padding": [1, 1],
                                                         "dilation": [1, 1]})
        got = _first(wb.runtime.OrtRunner(onx).run((x,)))
        ref = model(x).detach().numpy()
        assert got.shape == ref.shape == (1, 6, 5, 5)
        np.testing.assert_allclose(got, ref, atol=ATOL)
        # ncnn too: a layer whose output shape is none of its inputs', list attributes
        nc = wb.to_ncnn(onx)
        assert nc.graph.op_histogram.get("wbtest::deform_conv") == 1
        runner = wb.runtime.NcnnRunner(nc)
        got = _first(runner.run((x,)))
        np.testing.assert_allclose(got.reshape(ref.shape), ref, atol=ATOL)
        x2 = torch.randn(1, 4, 13, 13)  # the layer is not tied to the conversion's shape
        ref2 = model(x2).detach().numpy()
        np.testing.assert_allclose(_first(runner.run((x2,))).reshape(ref2.shape), ref2,
                                   atol=ATOL)
        # pnnx cannot load the Python op from TorchScript: the error says which route works
        with pytest.raises(wb.ConversionError) as err:
            wb.to_ncnn(model, (x,), workspace=tmp_path / "module")
        assert "wb.to_ncnn(wb.export(model, inputs))" in err.value.hint
    finally:
        wb.unregister("wbtest::deform_conv")


# -- route 3: autograd.Function with symbolic --------------------------------------------------
class NewInterpolate(torch.autograd.Function):
    """The tutorial's interpolate: the scale is a runtime tensor -> Resize with a scales input."""

    @staticmethod
    def symbolic(g, x, scales):
        empty_roi = g.op("Constant", value_t=torch.tensor([], dtype=torch.float32))
        return g.op("Resize", x, empty_roi, scales, mode_s="cubic", cubic_coeff_a_f=-0.75,
                    coordinate_transformation_mode_s="pytorch_half_pixel",
                    nearest_mode_s="floor")

    @staticmethod
    def forward(ctx, x, scales):
        return F.interpolate(x, scale_factor=scales.tolist()[-2:], mode="bicubic",
                             align_corners=False)


class MyAdd(torch.autograd.Function):
    @staticmethod
    def symbolic(g, a, b):
        two = g.op("Constant", value_t=torch.tensor(2.0))
        return g.op("Add", g.op("Mul", a, two), b)

    @staticmethod
    def forward(ctx, a, b):
        return 2 * a + b


class SuperRes(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x, scales):
        up = NewInterpolate.apply(x, scales)
        return self.conv2(MyAdd.apply(torch.relu(self.conv1(up)), self.conv1(up)))


def test_runtime_scale_interpolate_runs_at_two_scales_from_one_file(tmp_path):
    torch.manual_seed(0)
    model, x = SuperRes().eval(), torch.rand(1, 3, 6, 6)
    onx = wb.export(model, (x, torch.tensor([1.0, 1.0, 3.0, 3.0])), workspace=tmp_path,
                    input_names=["input", "scales"], dynamic_axes={"output": {2: "h", 3: "w"}})
    hist = onx.graph.op_histogram
    assert hist.get("Resize") == 1 and hist.get("Mul") == 1 and hist.get("Add") == 1
    runner = wb.runtime.OrtRunner(onx)
    for s in (2, 4):
        scales = torch.tensor([1.0, 1.0, s, s])
        got = _first(runner.run((x, scales)))
        ref = model(x, scales).detach().numpy()
        assert got.shape == (1, 3, 6 * s, 6 * s)
        np.testing.assert_allclose(got, ref, atol=ATOL)


# -- missing pieces say so ---------------------------------------------------------------------
def _custom_node_model(path, domain="nolib", op="frob"):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], domain=domain, name="frob_0")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(domain, 3)])
    onnx.save(model, str(path))
    return path


def test_custom_domain_node_without_ort_implementation_names_the_fix(tmp_path):
    path = _custom_node_model(tmp_path / "frob.onnx")
    for isolated in (True, False):
        with pytest.raises(wb.MissingOpError) as err:
            wb.runtime.OrtRunner(path, isolated=isolated).run((np.ones(2, np.float32),))
        assert "nolib::frob" in err.value.message and "opset 3" in err.value.message
        assert "'nolib'" in err.value.message
        assert '@wb.custom_op("nolib::frob", mutates_args=())' in err.value.hint


def test_ncnn_layer_without_registration_names_the_fix(my_add_case, tmp_path):
    import shutil

    _, inputs, arts, _ = my_add_case
    nc = wb.to_ncnn(arts["torchscript"])
    param = tmp_path / "model.ncnn.param"
    param.write_text(nc.path.read_text().replace("wbtest::my_add", "wbtest::gone"))
    shutil.copy(nc.dir / "model.ncnn.bin", tmp_path / "model.ncnn.bin")
    with pytest.raises(wb.MissingOpError) as err:
        wb.runtime.NcnnRunner(param).run(inputs)
    assert "wbtest::gone" in err.value.message
    assert '@wb.custom_op("wbtest::gone", mutates_args=())' in err.value.hint


def test_custom_op_refuses_a_name_torch_library_already_defined():
    @torch.library.custom_op("wbtest::library_op", mutates_args=())
    def library_op(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    with pytest.raises(cops.CustomOpError, match="torch already has an op") as err:
        wb.custom_op("wbtest::library_op", _my_add)
    assert "wb.register_symbolic('wbtest::library_op'" in err.value.hint
    assert torch.equal(library_op(torch.zeros(1)), torch.ones(1))  # left intact


def test_custom_op_rejects_bad_declarations():
    with pytest.raises(wb.InputError, match="namespace::op"):
        wb.custom_op("my_add", _my_add)
    with pytest.raises(wb.InputError, match="decorates a function"):
        wb.custom_op("wbtest::bad", 3)
    with pytest.raises(wb.InputError, match="ort=..."):
        wb.custom_op("wbtest::bad", _my_add, ort="numpy")
    with pytest.raises(wb.InputError, match="first parameter must be the graph"):
        wb.custom_op("wbtest::bad", _my_add, onnx=lambda a, b: a)

    def unannotated(a, b):
        return a + b

    with pytest.raises(cops.CustomOpError, match="rejected the declaration"):
        wb.custom_op("wbtest::bad", unannotated)

    def takes_dict(a: torch.Tensor, d: dict[str, int]) -> torch.Tensor:
        return a

    with pytest.raises((cops.CustomOpError,), match="wbtest::bad"):
        wb.custom_op("wbtest::bad", takes_dict)
    assert "wbtest::bad" not in cops.registered_ops()


def test_declaring_another_function_twice_fails_and_unregister_frees_the_name():
    wb.custom_op("wbtest::declared_twice", _my_add)
    try:
        # the same function again (a notebook cell run twice) replaces the declaration
        wb.custom_op("wbtest::declared_twice", _my_add)
        with pytest.raises(cops.CustomOpError, match="already declared") as err:
            wb.custom_op("wbtest::declared_twice", _deform_conv)
        assert "wb.unregister('wbtest::declared_twice')" in err.value.hint
    finally:
        wb.unregister("wbtest::declared_twice")
    op = wb.custom_op("wbtest::declared_twice", lambda a, b: a - b,
                      schema="(Tensor a, Tensor b) -> Tensor")
    try:
        assert torch.equal(op(torch.ones(2), torch.ones(2)), torch.zeros(2))
    finally:
        wb.unregister("wbtest::declared_twice")
