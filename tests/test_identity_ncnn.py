"""An ncnn layer is tied to its module by what its damage leaves alone (workbench/comparison/
identity.py): a layer whose weights are replaced by noise is still its module's, measured
there, and named by ``first_divergence``; two layers of one shape are told apart by the names
pnnx gave their ops, or by their place in the graph, never swapped."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch
from torch import nn

import workbench as wb
from workbench.comparison.weights import ncnn_weight_modules
from workbench.ncnn_bin import walk_bin
from workbench.params import parse_ncnn_param
from workbench.runtime.ncnn_io import pnnx_param_for


class Chain(nn.Module):
    """A fused Conv+BN+ReLU stem, a conv of another shape, a pooled Linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.mid = nn.Conv2d(16, 32, 3, 1, 1)
        self.act = nn.ReLU()
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.act(self.mid(self.stem(x))).mean((2, 3)))


class Twins(nn.Module):
    """Two convs of one shape and equal weights (a deep copy) between a stem and a head;
    ``second`` is registered before ``first`` when ``reverse``, so that the module order
    is not the call order."""

    def __init__(self, reverse=False):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, 1, 1)
        one = nn.Conv2d(8, 8, 3, 1, 1)
        if reverse:
            self.second, self.first = copy.deepcopy(one), one
        else:
            self.first, self.second = one, copy.deepcopy(one)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = torch.relu(self.first(torch.relu(self.stem(x))))
        return self.head(torch.relu(self.second(y)))


def _converted(cls, tmp_path_factory, *args):
    torch.manual_seed(0)
    model = cls(*args).eval()
    for m in model.modules():  # statistics of its own, so that folding matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 16, 16)
    ws = wb.Workspace(tmp_path_factory.mktemp(cls.__name__.lower()) / "ws")
    return model, x, wb.to_ncnn(model, (x,), workspace=ws)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    return _converted(Chain, tmp_path_factory)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return _converted(Twins, tmp_path_factory)


@pytest.fixture(scope="module")
def twins_reversed(tmp_path_factory):
    return _converted(Twins, tmp_path_factory, True)


def damaged(art, out_dir, layer, strength=None, names=False, seed=0):
    """A copy of ``art``'s ncnn files with ``layer``'s weight damaged: a quarter of its
    values moved by ``strength`` times the weight's max times N(0, 1) (issue 36's damage at
    0.1), or all of them replaced by noise of that magnitude (``strength`` None); with the
    ``.pnnx.param`` beside it when ``names``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    param = out_dir / "model.ncnn.param"
    for suffix in (".param", ".bin"):
        shutil.copy(art.path.with_suffix(suffix), param.with_suffix(suffix))
    shutil.copy(art.path.with_name("model_ncnn.py"), out_dir / "model_ncnn.py")
    if names:
        shutil.copy(pnnx_param_for(art, art.path), out_dir / "model.pnnx.param")
    (blob,) = [b for b in walk_bin(parse_ncnn_param(param), param.with_suffix(".bin")).blobs
               if b.layer == layer and b.role == "weight"]
    data = np.memmap(param.with_suffix(".bin"), np.float32, "r+", blob.offset, (blob.count,))
    rng = np.random.default_rng(seed)
    top = np.abs(data).max()
    if strength is None:
        data[:] = top * rng.standard_normal(blob.count).astype(np.float32)
    else:
        idx = rng.choice(blob.count, max(1, blob.count // 4), replace=False)
        data[idx] += strength * top * rng.standard_normal(idx.size).astype(np.float32)
    data.flush()
    return param


def _weighted_layers(art):
    """The ncnn layers holding a weight, in graph order."""
    held = {b.layer for b in walk_bin(parse_ncnn_param(art.path),
                                      art.path.with_suffix(".bin")).blobs if b.role == "weight"}
    return [ly.name for ly in parse_ncnn_param(art.path).layers if ly.name in held]


def _named(rep):
    first = rep.first_divergence
    assert first is not None and not rep.ok, rep.summary()
    return {first.reference.split("#")[0], *first.covers}


@pytest.mark.parametrize("module, index", [("stem.0", 0), ("mid", 1)])
def test_a_layer_whose_weights_are_noise_stays_tied_and_is_named(chain, tmp_path, module,
                                                                 index):
    model, x, art = chain
    layer = _weighted_layers(art)[index]
    assert ncnn_weight_modules(art.path, model)[layer] == (module,)
    bad = damaged(art, tmp_path / "bad", layer)  # no .pnnx.param: the shape alone ties it
    assert ncnn_weight_modules(bad, model)[layer] == (module,)
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False)
    assert module in _named(rep), (rep.first_divergence, rep.summary())


def test_equal_twins_are_placed_by_their_order_in_the_graph(twins, tmp_path):
    """Equal shapes and equal values: only the order tells the copies apart (no names)."""
    model, x, art = twins
    stem, first, second, head = _weighted_layers(art)
    bad = damaged(art, tmp_path / "bad", second)
    assert ncnn_weight_modules(bad, model) == {stem: ("stem",), first: ("first",),
                                               second: ("second",), head: ("head",)}
    assert "second" in _named(wb.compare(model, [bad], (x,), mode="both", progress=False))


@pytest.mark.parametrize("which", ["first", "second"])
def test_names_pnnx_wrote_tell_twins_apart_where_the_module_order_would_swap_them(
        twins_reversed, tmp_path, which):
    """``second`` registered before ``first``: the module order says the other way round
    from the graph, and the values tie; pnnx's names for the two ops decide."""
    model, x, art = twins_reversed
    stem, first, second, head = _weighted_layers(art)
    layer = {"first": first, "second": second}[which]
    bad = damaged(art, tmp_path / "bad", layer, names=True)
    held = ncnn_weight_modules(bad, model, bad.with_name("model.pnnx.param"))
    assert (held[first], held[second]) == (("first",), ("second",))
    assert which in _named(wb.compare(model, [bad], (x,), mode="both", progress=False))
