"""wb.prune: structured pruning shrinks what the backends get, unstructured only zeroes
weights in files that stay dense; the model given is never changed; bad input is named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import workbench as wb
from workbench.errors import InputError


class Block(nn.Module):
    """A residual block: c2's output channels must stay those of its input (the add)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), \
            nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.c2(torch.relu(self.bn(self.c1(x)))))


class TinyNet(nn.Module):
    """Stem, two residual blocks, a concat of two branches, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.b1, self.b2 = Block(64), Block(64)
        self.down = nn.Conv2d(64, 128, 3, stride=2, padding=1)
        self.side = nn.Conv2d(64, 64, 1)
        self.head = nn.Linear(192, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b2(self.b1(torch.relu(self.stem(x))))
        y = torch.cat([self.down(x), nn.functional.avg_pool2d(self.side(x), 2)], 1)
        return self.head(y.mean((2, 3)))


def tiny() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyNet().eval(), torch.rand(1, 3, 16, 16)


def snapshot(model: nn.Module) -> dict:
    return {"state": {k: v.clone() for k, v in model.state_dict().items()},
            "training": [m.training for m in model.modules()],
            "grad": [p.requires_grad for p in model.parameters()],
            "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                         for m in model.modules())}


def assert_unchanged(model: nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["state"].keys() == before["state"].keys()
    for k, v in before["state"].items():
        assert torch.equal(after["state"][k], v), k
    assert after["training"] == before["training"]
    assert after["grad"] == before["grad"] and after["hooks"] == before["hooks"]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Both methods at 50% on the same tiny net, measured on both backends."""
    model, x = tiny()
    before = snapshot(model)
    ws = wb.Workspace(tmp_path_factory.mktemp("prune"))
    steps: list = []
    out = {m: wb.prune(model, 0.5, m, example_inputs=(x,), workspace=ws, repeat=3, warmup=1,
                       progress=steps.append) for m in ("l1-structured", "l1-unstructured")}
    return {"model": model, "x": x, "before": before, "steps": steps, **out}


def test_progress_names_each_long_step(pruned):
    phases = [s.phase for s in pruned["steps"]]
    for phase in ("l1-structured 50%", "export pruned", "ncnn pruned", "timing"):
        assert phase in phases
    assert pruned["steps"][-1].done == pruned["steps"][-1].total == 7


def test_structured_shrinks_parameters_onnx_and_ncnn_bin_by_about_the_amount(pruned):
    rep = pruned["l1-structured"].report
    assert not rep.errors, rep.errors
    # widths of 64 in steps of 8: 48 of 64 kept in both dimensions removes 43.75%, the
    # closest to 50% (40 of 64: 61%); round_to=None meets it exactly (test below)
    assert abs(rep.weights_pruned - 0.5) < 0.07
    for fig in (rep.params, rep.macs, rep.onnx_bytes, rep.ncnn_bin_bytes):
        assert 0.4 < fig.ratio < 0.6, rep
    assert rep.ort_ms is not None and rep.ncnn_ms is not None
    assert rep.onnx_nodes.ratio == 1.0  # the same graph, narrower
    m = pruned["l1-structured"].model  # round_to=8 by default: packed widths
    assert all(c % 8 == 0 for c in (m.stem.out_channels, m.down.out_channels,
                                     m.side.out_channels, m.b1.c1.out_channels))


def test_latency_is_timed_by_cpu_time_in_turns_after_each_model_settles(pruned):
    # how, not how fast (the ratio of two identical models is bench/prune_figures.py's
    # check): one thread -> the calling thread's CPU time, the order rotating, every model
    # run TURN times a turn, its fastest run the figure; the wall clock kept beside it
    from workbench.stages.prune_measure import TURN

    rep = pruned["l1-unstructured"].report
    t = rep.timing
    assert (t.clock, t.rounds, t.turn) == ("cpu", 3, TURN) and t.runs == 3 * 4 * TURN
    assert len(t.warmup_runs) == 4 and min(t.warmup_runs) >= 3  # warmup=1, settled on 3
    assert set(t.spread) == set(t.wall_ms) == {"ort_ms", "ncnn_ms"}
    assert 0 <= t.preempted <= t.runs
    assert "the calling thread's CPU time per run" in rep.text()


def test_round_to_none_prunes_the_exact_amount():
    model, x = tiny()
    for amount in (0.3, 0.5):
        rep = wb.prune(model, amount, example_inputs=(x,), round_to=None, backends=(),
                       progress=False).report
        assert abs(rep.weights_pruned - amount) <= 0.015 and rep.round_to is None
        assert abs(rep.params.ratio - (1 - amount)) < 0.03
        assert "round_to=8 keeps them packed" in repr(rep)


def test_unstructured_zeroes_the_weights_and_leaves_the_files_dense(pruned):
    res = pruned["l1-unstructured"]
    rep = res.report
    assert not rep.errors, rep.errors
    assert rep.params.ratio == 1.0
    assert abs(rep.onnx_bytes.ratio - 1.0) < 0.03 and abs(rep.ncnn_bin_bytes.ratio - 1.0) < 0.03
    weights = [m.weight for m in res.model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert abs(zeros - 0.5) < 0.01 and abs(rep.weights_pruned - 0.5) < 0.01
    assert not any("_orig" in k or "_mask" in k for k in res.model.state_dict())  # removed
    onx = onnx.load(str(rep.artifacts["onnx pruned"].path))
    convs = [numpy_helper.to_array(t) for t in onx.graph.initializer if t.dims and len(t.dims) == 4]
    assert convs and all(np.mean(w == 0) > 0.45 for w in convs)  # the zeros are in the file
    text = repr(res)
    assert "stay where they were" in text and "Only structured pruning" in text


def test_residual_adds_and_concats_stay_consistent(pruned):
    res, x = pruned["l1-structured"], pruned["x"]
    m = res.model
    assert m.stem.out_channels < 64
    assert m.b1.c2.out_channels == m.b2.c2.out_channels == m.stem.out_channels  # the adds
    assert m.head.in_features == m.down.out_channels + m.side.out_channels  # the concat
    assert m.head.out_features == 10 and res.report.output_layers == ["head"]
    assert m(x).shape == (1, 10)
    assert {"onnx pruned", "ncnn pruned"} <= set(res.report.artifacts)  # exported, converted


def test_the_model_given_is_unchanged(pruned):
    assert_unchanged(pruned["model"], pruned["before"])
    assert pruned["l1-structured"].model is not pruned["model"]


def test_a_model_in_training_mode_keeps_its_batchnorm_statistics():
    model, x = tiny()
    model.train()
    before = snapshot(model)
    res = wb.prune(model, 0.3, example_inputs=x, backends=(), progress=False)
    assert_unchanged(model, before)
    assert res.model.training and res.report.onnx_bytes is None


def test_ignored_layers_are_left_whole():
    model, x = tiny()
    res = wb.prune(model, 0.5, example_inputs=(x,), ignored_layers=[model.side, "down"],
                   backends=(), progress=False)
    assert res.model.side.out_channels == 64 and res.model.down.out_channels == 128
    assert res.model.stem.out_channels < 64 and res.report.ignored == ["down", "side"]


@pytest.mark.parametrize("amount", [-0.1, 1.0, 1.5, "0.5", True])
def test_amount_outside_0_1_is_refused(amount):
    model, x = tiny()
    before = snapshot(model)
    with pytest.raises(InputError, match=r"amount=.* outside \[0, 1\)"):
        wb.prune(model, amount, example_inputs=(x,), backends=(), progress=False)
    assert_unchanged(model, before)


def test_an_unknown_method_suggests_the_close_name():
    model, x = tiny()
    with pytest.raises(InputError, match="l1-structred") as err:
        wb.prune(model, 0.5, "l1-structred", example_inputs=(x,), backends=(), progress=False)
    assert "did you mean method='l1-structured'" in err.value.hint


class NoGrad(nn.Module):
    """Its forward runs under no_grad: autograd records nothing to trace."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.fc = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Linear(8, 4)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.b(self.a(x)).mean((2, 3)))


class FixedReshape(nn.Module):
    """A reshape to a Python number that no pruned width can meet."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Linear(16 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.a(x).reshape(1, 1024))


@pytest.mark.parametrize(("cls", "words"), [(NoGrad, "could not be traced by torch-pruning"),
                                            (FixedReshape, "could not keep its channels")])
def test_a_model_torch_pruning_cannot_trace_is_named(cls, words):
    torch.manual_seed(0)
    model = cls()
    before = snapshot(model)
    with pytest.raises(InputError, match=words) as err:
        wb.prune(model, 0.5, example_inputs=(torch.rand(1, 3, 8, 8),), backends=(),
                 progress=False)
    assert cls.__name__ in err.value.message and "ignored_layers" in err.value.hint
    assert_unchanged(model, before)


def test_ignored_layers_not_in_the_model_are_named():
    model, x = tiny()
    before = snapshot(model)
    with pytest.raises(InputError, match="ignored_layers: 'stemm' is not a layer") as err:
        wb.prune(model, 0.5, example_inputs=(x,), ignored_layers=["stemm"], backends=(),
                 progress=False)
    assert "'stem'" in err.value.hint
    with pytest.raises(InputError, match="ignored_layers: Conv2d is not a layer"):
        wb.prune(model, 0.5, example_inputs=(x,), ignored_layers=[nn.Conv2d(3, 3, 1)],
                 backends=(), progress=False)
    assert_unchanged(model, before)


def test_missing_or_wrong_example_inputs_are_named():
    model, x = tiny()
    with pytest.raises(InputError, match="example_inputs is missing"):
        wb.prune(model, 0.5, backends=(), progress=False)
    with pytest.raises(InputError, match="fails on example_inputs"):
        wb.prune(model, 0.5, example_inputs=(torch.rand(1, 4, 8, 8),), backends=(),
                 progress=False)
