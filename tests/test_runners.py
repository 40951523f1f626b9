"""TorchRunner capture='all' (leaf modules + named functional calls) and runner_for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.runtime import OrtRunner, TorchRunner, runner_for


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.conv(x)) + x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(Block(), Block())

    def forward(self, x):
        return torch.cat([self.blocks(x), x], 1).mean(dim=(2, 3))


def test_capture_all_names_leaf_modules_and_functional_calls():
    x = torch.randn(1, 3, 8, 8)
    got = TorchRunner(Net()).run((x,), capture="all")
    assert list(got) == ["blocks.0.conv", "blocks.0.act", "blocks.0/Tensor.add_0",
                         "blocks.1.conv", "blocks.1.act", "blocks.1/Tensor.add_0",
                         "torch.cat_0", "Tensor.mean_0", "output_0"]
    net = Net()
    with torch.no_grad():
        conv0 = net.blocks[0].conv(x)
        block0 = net.blocks[0](x)
    # the conv output is kept as it was, before the in-place ReLU overwrote it
    np.testing.assert_allclose(got["blocks.0.conv"], conv0.numpy(), rtol=1e-6)
    assert (got["blocks.0.conv"] < 0).any() and (got["blocks.0.act"] >= 0).all()
    np.testing.assert_allclose(got["blocks.0/Tensor.add_0"], block0.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got["Tensor.mean_0"], got["output_0"])


def test_capture_all_leaves_no_hooks_and_restores_training_mode():
    net = Net().train()
    TorchRunner(net).run((torch.randn(1, 3, 8, 8),), capture="all")
    assert net.training
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    from torch.nn.modules import module

    assert not module._global_forward_hooks and not module._global_forward_pre_hooks


def test_outputs_only_matches_the_model():
    net, x = Net(), torch.randn(2, 3, 8, 8)
    out = TorchRunner(net, output_names=["y"]).run({"x": x})
    with torch.no_grad():
        np.testing.assert_array_equal(out["y"], net(x).numpy())


def test_default_model_capture_names_the_upsample():
    model, x = wb.default_model()
    got = TorchRunner(model).run(x, capture="all")
    assert list(got)[:3] == ["F.interpolate_0", "conv1", "relu1"]
    assert got["F.interpolate_0"].shape == (1, 3, 192, 192)


def test_bad_capture_and_bad_model():
    with pytest.raises(wb.InputError, match="capture='everything' is not one of"):
        TorchRunner(Net()).run((torch.randn(1, 3, 8, 8),), capture="everything")
    with pytest.raises(wb.InputError, match="needs an nn.Module, got str"):
        TorchRunner("net.pt")


def test_runner_for_picks_the_backend(tmp_path):
    model, x = wb.default_model()
    onx = wb.export(model, x, workspace=tmp_path / "ws")
    assert isinstance(runner_for(model), TorchRunner)
    assert isinstance(runner_for(onx), OrtRunner)
    assert isinstance(runner_for(str(onx.path)), OrtRunner)
    with pytest.raises(wb.InputError, match="no runner for a int"):
        runner_for(3)


def test_forward_with_star_args_gets_every_input():
    class Star(nn.Module):
        def forward(self, *args):
            return args[0] * 2 + args[1]

    a, b = torch.rand(3), torch.rand(3)
    out = TorchRunner(Star()).run((a, b), capture="all")
    np.testing.assert_allclose(out["output_0"], (a * 2 + b).numpy())


def test_capture_results_the_caller_holds_are_never_overwritten():
    runner = TorchRunner(Net())
    x1, x2 = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)
    first = runner.run((x1,), capture="all")
    kept = {k: v.copy() for k, v in first.items()}
    second = runner.run((x2,), capture="all")
    for k in kept:
        np.testing.assert_array_equal(first[k], kept[k])
        assert not np.shares_memory(first[k], second[k])


class InPlace(nn.Module):
    """Every way an op writes a tensor the recorder already holds."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 1)
        self.same = nn.Identity()
        self.act = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = self.act(self.same(self.conv(x)))  # conv and same hold the pre-ReLU values
        z = self.conv2(y)
        z += y  # Tensor.__iadd__
        z[:, :2].mul_(-1)  # through a view
        w = torch.sigmoid(z)
        torch.mul(w, 3.0, out=w)  # out=
        w[0, 0] = 0.0  # __setitem__
        return w


def _inplace_reference(net, x):
    with torch.no_grad():
        conv = net.conv(x)
        act = torch.relu(conv)
        conv2 = net.conv2(act)
        z = conv2 + act
        view = z[:, :2].clone()
        z2 = z.clone()
        z2[:, :2] *= -1
        w = torch.sigmoid(z2)
        w3 = w * 3.0
        out = w3.clone()
        out[0, 0] = 0.0
    return {"conv": conv, "same": conv, "act": act, "conv2": conv2, "Tensor.add__0": z,
            "Tensor.__getitem___0": view, "Tensor.mul__0": -view, "torch.sigmoid_0": w,
            "torch.mul_0": w3, "output_0": out}


def test_in_place_writes_do_not_change_what_was_recorded():
    net, x = InPlace(), torch.randn(1, 3, 5, 5)
    got = TorchRunner(net).run((x,), capture="all")
    for name, want in _inplace_reference(net, x).items():
        np.testing.assert_allclose(got[name], want.numpy(), rtol=1e-6, atol=1e-6, err_msg=name)
    assert (got["conv"] < 0).any() and got["same"] is got["conv"]


def test_an_in_place_call_that_writes_nothing_keeps_one_copy():
    class Drop(nn.Module):  # in eval mode, Dropout(inplace=True) returns its input unwritten
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.drop = nn.Conv2d(3, 3, 1), nn.Dropout(0.5, inplace=True)
            self.same, self.act = nn.Identity(), nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.same(self.drop(self.conv(x))))

    net, x = Drop(), torch.randn(1, 3, 4, 4)
    got = TorchRunner(net).run((x,), capture="all")
    with torch.no_grad():
        conv = net.conv(x).numpy()
    for name in ("conv", "drop", "same"):
        np.testing.assert_array_equal(got[name], conv, err_msg=name)
    assert got["same"] is got["drop"] and (got["conv"] < 0).any()
    np.testing.assert_array_equal(got["act"], np.maximum(conv, 0))


def test_a_leaf_that_writes_its_input_without_saying_so_is_still_right():
    class Doubler(nn.Module):  # a leaf: the recorder does not look inside it
        def forward(self, x):
            return x.mul_(2.0)

    class Net2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.twice = nn.Conv2d(3, 3, 1), Doubler()

        def forward(self, x):
            return self.twice(self.conv(x)) + 1

    net, x = Net2(), torch.randn(1, 3, 4, 4)
    got = TorchRunner(net).run((x,), capture="all")
    with torch.no_grad():
        conv = net.conv(x).numpy()
    np.testing.assert_allclose(got["conv"], conv, rtol=1e-6)
    np.testing.assert_allclose(got["twice"], conv * 2, rtol=1e-6)
    np.testing.assert_allclose(got["output_0"], conv * 2 + 1, rtol=1e-6)


class Unseen(nn.Module):
    """Writes its conv output where no TorchFunctionMode sees it (as C++ code could)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        y = self.conv(x)
        with torch._C.DisableTorchFunction():
            y.add_(100.0)
        return y * 2


def test_a_write_the_recorder_cannot_see_falls_back_to_copies_that_are_reused():
    net, runner = Unseen(), None
    runner = TorchRunner(net)
    x1, x2 = torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4)
    first = runner.run((x1,), capture="all")
    with torch.no_grad():
        np.testing.assert_allclose(first["conv"], net.conv(x1).numpy(), rtol=1e-6)
    kept = {k: v.copy() for k, v in first.items()}
    second = runner.run((x2,), capture="all")
    for k in kept:  # the caller still holds `first`: the second run did not write into it
        np.testing.assert_array_equal(first[k], kept[k])
        assert first[k] is not second[k]
    ids = {k: id(v) for k, v in second.items() if k != "output_0"}
    del first, second
    third = runner.run((x1,), capture="all")
    assert runner._pool  # the copying pass ran
    assert all(id(third[k]) in ids.values() for k in ids)  # freed buffers were reused
    for k in kept:
        np.testing.assert_allclose(third[k], kept[k], rtol=1e-6)


def test_an_unchanged_tensor_seen_twice_is_recorded_once():
    class Passthrough(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)
            self.same = nn.Identity()

        def forward(self, x):
            return self.same(self.conv(x))

    got = TorchRunner(Passthrough()).run((torch.randn(1, 3, 4, 4),), capture="all")
    assert got["same"] is got["conv"]


def test_in_process_runner_describes_its_model_once(tmp_path, monkeypatch):
    import workbench.runtime.ort_runner as graph  # the summarize the runner calls

    model, x = wb.default_model()
    r = OrtRunner(wb.export(model, x, workspace=tmp_path / "ws"), isolated=False)
    calls = []
    real = graph.summarize
    monkeypatch.setattr(graph, "summarize", lambda p: calls.append(p) or real(p))
    for _ in range(3):
        r.run(x)
    assert len(calls) == 1  # feed() checks every run against one description


def test_describe_is_one_typed_model_io_for_every_backend(tmp_path):
    from workbench.runtime.base import ModelIO, TensorSpec

    model, x = wb.default_model()
    onx = wb.export(model, x, workspace=tmp_path / "ws")
    for isolated in (False, True):  # the worker's twin answers with the same type
        io = OrtRunner(onx, isolated=isolated).describe()
        assert isinstance(io, ModelIO) and io.blobs == ()
        assert io.inputs == (TensorSpec("input", "float32", tuple(x[0].shape)),)
        assert len(io.outputs) == 1
    import inspect

    forward = list(inspect.signature(model.forward).parameters)
    assert TorchRunner(model).describe() == ModelIO(inputs=tuple(map(TensorSpec, forward)))


def test_an_ort_runner_runs_the_session_its_factory_makes(tmp_path):
    import onnxruntime as ort

    model, x = wb.default_model()
    onx = wb.export(model, x, workspace=tmp_path / "ws")
    made = []

    def factory():
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        made.append(ort.InferenceSession(str(onx.path), so, providers=["CPUExecutionProvider"]))
        return made[-1]

    r = OrtRunner(onx, session_factory=factory)
    assert not r.isolated  # a session cannot travel to the worker: it runs here
    got = r.run(x)
    r.run(x)
    assert len(made) == 1 and r.session is made[0]  # built once, on first use
    want = OrtRunner(onx, isolated=False).run(x)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    with pytest.raises(wb.InputError, match="session_factory must be callable, got str"):
        OrtRunner(onx, session_factory="model.onnx")


def test_a_model_that_raises_while_capturing_leaves_no_global_hooks():
    from torch.nn.modules import module

    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)

        def forward(self, x):
            return self.conv(x)[:, :, :, :, 0]  # one index too many

    with pytest.raises(wb.InputError, match="Bad rejected the inputs .*IndexError") as e:
        TorchRunner(Bad()).run((torch.randn(1, 3, 4, 4),), capture="all")
    assert isinstance(e.value.__cause__, IndexError)  # the model's own error, kept
    assert not module._global_forward_hooks and not module._global_forward_pre_hooks


class Residual(nn.Module):
    """``y += ...`` on a recorded tensor, the way transformers' ResNet adds its shortcut."""

    def __init__(self, other: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.conv2 = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 1)
        self.other = other

    def forward(self, x):
        y = self.conv(x)
        alias, head = y, y[:, :1]
        if self.other == "conv2":
            y += self.conv2(x)  # y is alone on its memory but for the view `head`
        elif self.other == "float64":  # promotes out of place, not in place
            y += torch.ones(1, 1, 1, 1, dtype=torch.float64)
        else:  # broadcasts to 2x3x4x4 out of place; in place it is an error
            y += torch.ones(2, 3, 4, 4)
        return alias * 1, head * 1


class ResidualNoView(Residual):
    def forward(self, x):
        y = self.conv(x)
        alias = y
        y += self.conv2(x)  # nothing else on y's memory
        return alias * 1


def test_an_in_place_add_on_a_recorded_tensor_keeps_the_record_and_what_aliases_see():
    x = torch.randn(1, 3, 4, 4)
    for net in (Residual("conv2"), ResidualNoView("conv2")):
        got = TorchRunner(net).run((x,), capture="all")
        with torch.no_grad():
            conv, conv2 = net.conv(x).numpy(), net.conv2(x).numpy()
        np.testing.assert_allclose(got["conv"], conv, rtol=1e-6, err_msg=type(net).__name__)
        # the model's own references (the same object, a view) see the write
        np.testing.assert_allclose(got["output_0"], conv + conv2, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["Tensor.add__0"], conv + conv2, rtol=1e-6, atol=1e-6)
        if "output_1" in got:
            np.testing.assert_allclose(got["output_1"], (conv + conv2)[:, :1], rtol=1e-6,
                                       atol=1e-6)
        assert not np.shares_memory(got["conv"], got["Tensor.add__0"])


def test_an_in_place_add_keeps_in_place_dtype_and_errors():
    x = torch.randn(1, 3, 4, 4)
    net = Residual("float64")
    got = TorchRunner(net).run((x,), capture="all")
    with torch.no_grad():
        conv = net.conv(x).numpy()
    assert got["output_0"].dtype == np.float32  # in place keeps y's dtype
    np.testing.assert_allclose(got["output_0"], conv + 1, rtol=1e-6)
    np.testing.assert_allclose(got["output_1"], (conv + 1)[:, :1], rtol=1e-6)
    np.testing.assert_allclose(got["conv"], conv, rtol=1e-6)
    with pytest.raises(wb.InputError, match="doesn't match the broadcast shape") as e:
        TorchRunner(Residual("broadcast")).run((x,), capture="all")
    assert isinstance(e.value.__cause__, RuntimeError)


def test_recorded_names_are_those_of_named_modules():
    from workbench.runtime.torch_runner import _module_names

    shared = nn.Conv2d(3, 3, 1)
    net = nn.Sequential(nn.Sequential(shared, nn.ReLU()), shared, nn.Identity())
    net.register_module("gone", None)
    net[0].register_module("empty", nn.Sequential())  # no children: a leaf
    containers, leaves = _module_names(net)
    assert {**containers, **leaves} == {m: n for n, m in net.named_modules()}
    assert set(leaves) == {m for n, m in net.named_modules() if n and not list(m.children())}
    assert leaves[shared] == "0.0"  # registered twice: the first name


@pytest.mark.parametrize("bad, message", [
    (torch.randn(1, 4, 8, 8), "rejected the inputs ([0] float32[1x4x8x8]): RuntimeError"),
    (torch.randn(1, 3, 8, 8).double(), "rejected the inputs ([0] float64[1x3x8x8])"),
    ({"nope": torch.randn(1, 3, 8, 8)}, "unknown name(s) ['nope']; forward() takes ['input']"),
    ({}, "an empty dict"),
])
def test_torch_runner_bad_inputs_are_hinted_errors_not_torch_s(bad, message):
    from workbench.runtime import TorchRunner

    with pytest.raises(wb.InputError) as e:
        TorchRunner(torch.nn.Conv2d(3, 4, 3)).run(bad)
    assert message in e.value.message and e.value.hint


class ClampsAView(nn.Module):
    """PNNX corpus test_Tensor_slice_copy: an in-place op on a slice writes into x."""

    def forward(self, x):
        x = x.clone()
        x[:, 1:3].clamp_(0, 0.5)
        y = x * 2
        x[:, 0].zero_()
        return y


def test_an_inplace_op_on_a_view_records_the_state_it_leaves_the_viewed_tensor_in():
    """ncnn writes x[:, 1:3].clamp_() back with a CopyTo: the state of x after it is a
    record (as x[:, 1:3] = ... is), held apart from the later write into x."""
    torch.manual_seed(0)
    x = torch.rand(2, 4)
    got = TorchRunner(ClampsAView().eval()).run((x,), capture="all")
    states = [k for k in got if "__setitem__" in k]
    assert len(states) == 2, list(got)
    first = x.clone()
    first[:, 1:3].clamp_(0, 0.5)
    second = first.clone()
    second[:, 0] = 0
    np.testing.assert_array_equal(got[states[0]], first.numpy())
    np.testing.assert_array_equal(got[states[1]], second.numpy())


def test_ort_threads_spin_only_while_a_run_lasts(tmp_path):
    """Two intra-op threads: they spin during a run (no futex wake per op), and stop when it
    returns, leaving the CPU to whatever runs next. Spinning on after a run took ~40 ms of
    CPU in the next 50 ms; never spinning cost a context switch per op."""
    import resource
    import time

    model, x = wb.default_model()
    r = OrtRunner(wb.export(model, x, workspace=tmp_path / "ws"), isolated=False, num_threads=2)
    opts = r.session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert opts.get_session_config_entry("session.force_spinning_stop") == "1"
    for _ in range(3):
        r.run(x)
    idle = []
    for _ in range(5):
        r.run(x)
        before = time.process_time()
        time.sleep(0.05)
        idle.append(time.process_time() - before)
    assert sorted(idle)[2] < 0.01, idle  # the median: no thread kept spinning after the run
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for _ in range(4):  # capture="all" has a session of its own, with the same options
        r.run(x, capture="all")
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches
    ops = len(r._session_all().get_outputs())  # never spinning: ~38 switches for 7 ops
    assert switches < 2 * ops, switches  # not one per op and run
