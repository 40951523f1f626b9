"""ncnn layers carry no module names: a damaged weight must still be blamed on its module.

Each ncnn layer is tied to the modules whose weights it holds (workbench/comparison/weights.py),
so a layer whose output no longer matches any torch tensor (the fault) stays aligned to its
module, a fused layer reports the modules it covers, and an SE block's 1x1 conv that ncnn
runs as an InnerProduct on [C] pairs with torch's [1, C, 1, 1]."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import workbench as wb
from workbench.comparison.weights import ncnn_weight_modules
from workbench.ncnn_bin import walk_bin
from workbench.params import parse_ncnn_param


class SENet(nn.Module):
    """Conv+BN+ReLU6 stem (one fused ncnn layer), a squeeze-excite block (1x1 convs on
    [1, C, 1, 1]: ncnn InnerProducts on [C]), a head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU6())
        self.conv = nn.Conv2d(16, 32, 3, 1, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.act, self.fc2 = nn.Conv2d(32, 8, 1), nn.ReLU(), nn.Conv2d(8, 32, 1)
        self.gate = nn.Hardsigmoid()
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        y = self.conv(self.stem(x))
        y = y * self.gate(self.fc2(self.act(self.fc1(self.pool(y)))))
        return self.head(y.mean((2, 3)))


class MHANet(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        h = self.inp(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head(a + h)


def _seeded(cls, *shape):
    torch.manual_seed(0)
    model = cls().eval()
    for m in model.modules():  # BatchNorm with statistics of its own, so folding matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return model, torch.randn(*shape)


def _damaged(art, out_dir, layer, role="weight", seed=0, fraction=0.25, scale=0.1):
    """A copy of an ncnn model with one weight blob of ``layer`` perturbed in its .bin."""
    out_dir.mkdir(parents=True, exist_ok=True)
    param = out_dir / "model.ncnn.param"
    shutil.copy(art.path, param)
    shutil.copy(art.path.with_suffix(".bin"), param.with_suffix(".bin"))
    shutil.copy(art.path.with_name("model_ncnn.py"), out_dir / "model_ncnn.py")
    layout = walk_bin(parse_ncnn_param(param), param.with_suffix(".bin"))
    (blob,) = [b for b in layout.blobs if b.layer == layer and b.role == role]
    assert blob.storage == "float32"
    data = np.memmap(param.with_suffix(".bin"), np.float32, "r+", blob.offset, (blob.count,))
    rng = np.random.default_rng(seed)
    idx = rng.choice(blob.count, max(1, int(blob.count * fraction)), replace=False)
    data[idx] += scale * np.abs(data).max() * rng.standard_normal(idx.size).astype(np.float32)
    data.flush()
    return param


@pytest.fixture(scope="module")
def senet(tmp_path_factory):
    model, x = _seeded(SENet, 1, 3, 32, 32)
    ws = wb.Workspace(tmp_path_factory.mktemp("senet") / "ws")
    return model, x, wb.to_ncnn(model, (x,), workspace=ws)


def _converted_and_compared(model, x, tmp_path):
    """(ncnn artifact, report in mode "both", the candidate's name, its Alignment)."""
    art = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [art], (x,), mode="both", progress=False)
    (name,) = rep.aligned_fraction
    return art, rep, name, rep.alignments[name]


def _layers_holding(art, model):
    held = ncnn_weight_modules(art.path, model)
    return {mods[0]: layer for layer, mods in held.items() if len(mods) == 1}


def test_each_weighted_ncnn_layer_is_tied_to_its_module_by_its_weights(senet):
    model, x, art = senet
    held = ncnn_weight_modules(art.path, model)
    types = {ly.name: ly.type for ly in parse_ncnn_param(art.path).layers}
    # the BatchNorm folded into the stem conv (weights scaled per output channel) and its
    # ReLU6 fused: still stem.0's; the SE convs as InnerProducts; the head as a Gemm/IP
    assert sorted(mods for mods in held.values()) == sorted(
        [("stem.0",), ("conv",), ("fc1",), ("fc2",), ("head",)])
    assert {types[layer] for layer, mods in held.items() if mods in [("fc1",), ("fc2",)]} \
        == {"InnerProduct"}


def test_clean_ncnn_se_net_aligns_every_tensor_and_passes(senet):
    model, x, art = senet
    rep = wb.compare(model, [art], (x,), mode="both", progress=False)
    (name,) = rep.aligned_fraction
    assert rep.ok and rep.first_divergence is None, rep.summary()
    refs = {r.reference for r in rep.records}
    assert {"fc1", "fc2"} & refs or {"act", "gate"} & refs  # the SE's [C] tensors paired
    al = rep.alignments[name]
    assert not [n for n, why in al.unaligned.items() if "no reference tensor" in why], \
        al.unaligned


@pytest.mark.parametrize("module", ["stem.0", "conv", "fc1"])
def test_a_damaged_ncnn_weight_is_blamed_on_its_module(senet, tmp_path, module):
    model, x, art = senet
    layer = _layers_holding(art, model)[module]
    bad = _damaged(art, tmp_path / "bad", layer)
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and not rep.ok
    named = {first.reference.split("#")[0], *first.covers}
    assert module in named, (module, first.reference, first.covers, rep.summary())
    if module == "stem.0":  # the fused Conv+BN+ReLU6 says what it covers
        assert {"stem.0", "stem.1", "stem.2"} <= set(first.covers)


@pytest.fixture(scope="module")
def mha(tmp_path_factory):
    model, x = _seeded(MHANet, 1, 8, 16)
    ws = wb.Workspace(tmp_path_factory.mktemp("mha") / "ws")
    art = wb.to_ncnn(model, (x,), workspace=ws)
    assert "MultiHeadAttention" in {ly.type for ly in parse_ncnn_param(art.path).layers}
    return model, x, art


def test_a_fused_ncnn_attention_covers_its_projections(mha):
    model, x, art = mha
    rep = wb.compare(model, [art], (x,), mode="both", progress=False)
    assert rep.ok, rep.summary()
    types = {ly.tops[0]: ly.type for ly in parse_ncnn_param(art.path).layers}
    (rec,) = [r for r in rep.records if r.mode == "isolated"
              and types.get(r.name) == "MultiHeadAttention"]
    assert {"attn", "attn.out_proj"} <= set(rec.covers), rec.covers


@pytest.mark.parametrize("role", ["q_weight", "v_weight", "out_weight"])
def test_a_fault_inside_a_fused_ncnn_attention_is_named_at_it(mha, tmp_path, role):
    model, x, art = mha
    (layer,) = [ly.name for ly in parse_ncnn_param(art.path).layers
                if ly.type == "MultiHeadAttention"]
    bad = _damaged(art, tmp_path / "bad", layer, role, scale=0.3)
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and "attn" in first.covers, (first, rep.summary())
    assert first.op_type == "MultiHeadAttention"


class LayerNorm2d(nn.Module):
    """A channels-first LayerNorm as ConvNeXt writes it: permute, layer_norm, permute back
    inside one leaf module (torch records only its output; ncnn runs three layers)."""

    def __init__(self, c):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.rand(c))

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, x.shape[-1:], self.weight, self.bias)
        return x.permute(0, 3, 1, 2)


class Downsample(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.norm = nn.Conv2d(3, 16, 3, 1, 1), LayerNorm2d(16)
        self.conv2, self.head = nn.Conv2d(16, 24, 2, 2), nn.Linear(24, 5)

    def forward(self, x):
        return self.head(self.conv2(self.norm(self.conv1(x))).mean((2, 3)))


def test_steps_of_a_leaf_module_ncnn_runs_as_several_layers_are_attributed_to_it(tmp_path):
    model, x = _seeded(Downsample, 1, 3, 16, 16)
    art, rep, name, al = _converted_and_compared(model, x, tmp_path)
    assert rep.ok and not al.unaligned, (al.unaligned, rep.summary())
    assert al.attributed and set(al.attributed.values()) == {"norm"}, al.attributed
    assert rep.aligned_fraction[name] == 1.0
    # a damaged conv after the attributed steps is still named where it is
    layer = _layers_holding(art, model)["conv2"]
    bad = _damaged(art, tmp_path / "bad", layer, scale=0.3)
    first = wb.compare(model, [bad], (x,), mode="both", progress=False).first_divergence
    assert first is not None and first.reference == "conv2", first


class Batched(nn.Module):
    def __init__(self):
        super().__init__()
        self.pad = nn.ZeroPad2d((1, 2, 0, 1))
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.pad(x) - 0.1)


def test_inner_blobs_of_a_batched_input_are_captured_whole_and_aligned(tmp_path):
    """pnnx feeds a batch-2 input with batch_index=0; ncnn's inner Mats then hold n=2
    items, and numpy's view of a Mat shows the first only: captured with the batch axis."""
    from workbench.runtime import NcnnRunner

    torch.manual_seed(0)
    model, x = Batched().eval(), torch.randn(2, 4, 6, 6)
    art = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    got = NcnnRunner(art).run((x,), capture="all")
    inner = [n for n, v in got.items() if n not in ("in0", "out0")]
    assert inner and all(np.shape(got[n])[0] == 2 for n in inner), \
        {n: np.shape(v) for n, v in got.items()}
    rep = wb.compare(model, [art], (x,), mode="both", progress=False)
    (name,) = rep.aligned_fraction
    assert rep.aligned_fraction[name] == 1.0 and rep.ok, rep.summary()
    assert not rep.unmeasured[name], rep.unmeasured


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 12, num_layers=3, batch_first=True)
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y)


def test_a_multi_layer_lstm_is_one_module_and_a_fault_in_any_layer_is_named_there(tmp_path):
    """torch runs the three layers as one call, ncnn as three LSTM layers: the first two
    (and the states of the last) are steps inside the module, attributed to it; the last
    layer's output is the module's, pinned by its weights."""
    model, x = _seeded(Seq, 1, 6, 8)
    art, rep, name, al = _converted_and_compared(model, x, tmp_path)
    assert rep.ok and not al.unaligned, (al.unaligned, rep.summary())
    assert set(al.attributed.values()) == {"lstm"}
    lstms = [ly.name for ly in parse_ncnn_param(art.path).layers if ly.type == "LSTM"]
    assert len(lstms) == 3
    for layer in (lstms[0], lstms[2]):
        bad = _damaged(art, tmp_path / f"bad-{layer}", layer, "weight_xc", scale=0.3)
        first = wb.compare(model, [bad], (x,), mode="both", progress=False).first_divergence
        assert first is not None and first.reference.startswith("lstm"), (layer, first)


class Rolled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 1, 1)

    def forward(self, x):
        return torch.roll(self.conv(x), shifts=(1, 2), dims=(2, 3))


def test_glue_read_only_by_one_call_is_attributed_to_it(tmp_path):
    """ncnn runs torch.roll as Slices and Concats; the Slices have no torch counterpart and
    are read only by the Concats that make the roll: attributed to torch.roll_0."""
    model, x = _seeded(Rolled, 1, 3, 8, 8)
    art, rep, name, al = _converted_and_compared(model, x, tmp_path)
    assert rep.ok and not al.unaligned, (al.unaligned, rep.summary())
    assert al.attributed and set(al.attributed.values()) == {"torch.roll_0"}, al.attributed


class Shuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 8, 1)

    def forward(self, x):
        x = self.conv(x)
        b, c, h, w = x.shape
        x = x.reshape(b * c // 2, 2, h * w).permute(1, 0, 2).reshape(2, -1, c // 2, h, w)
        return x[0] + 1, x[1] * 2


def test_the_same_elements_in_another_shape_align_by_value(tmp_path):
    """pnnx fuses the reshape-permute-reshape into one ShuffleChannel whose [8, h, w] output
    holds torch's [2, 1, 4, h, w] elements in order: aligned by value, not left unexplained
    beside the same-shaped conv output it differs from."""
    model, x = _seeded(Shuffle, 1, 6, 5, 6)
    art, rep, name, al = _converted_and_compared(model, x, tmp_path)
    types = {ly.tops[0]: ly.type for ly in parse_ncnn_param(art.path).layers if ly.tops}
    shuffled = [t for t, k in types.items() if k == "ShuffleChannel"]
    assert shuffled and all(t in al.pairs for t in shuffled), (al.unaligned, types)
    assert rep.ok and not al.unaligned, rep.summary()


class Batch2Layouts(nn.Module):
    """A batch-2 convolution whose transposed outputs ncnn holds as batch-2 blobs in layouts
    torch never holds (the PNNX corpus's test_torch_transpose): [2, 4, 7, 5] for torch's
    [2, 4, 5, 7] with its last axes swapped, before a flatten."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.conv2 = nn.Conv2d(3, 4, 1)

    def forward(self, w):
        a = torch.transpose(self.conv(w), 0, 1)
        a = torch.flatten(torch.transpose(a, 2, 3), start_dim=0, end_dim=1)
        b = torch.relu(torch.transpose(self.conv2(w), 0, 3))
        return a, b


def test_a_blob_in_another_layout_is_aligned_and_measured_in_it(tmp_path):
    model, x = _seeded(Batch2Layouts, 2, 3, 5, 7)
    art, rep, name, al = _converted_and_compared(model, x, tmp_path)
    assert al.layouts and not al.unaligned, (al.unaligned, al.pairs)
    for blob, axes in al.layouts.items():
        assert al.relation(blob).startswith("equal up to a layout"), al.relations
        assert sorted(axes) == [0, 1, 2, 3]
        recs = [r for r in rep.records if r.name == blob]
        assert {r.mode for r in recs} == {"accumulated", "isolated"}, recs  # measured, both
        assert all(r.metrics.max_abs < 1e-5 and r.exact for r in recs)
    # an isolated run returns a batched output as ncnn holds it: put back as captured
    assert rep.ok and rep.first_divergence is None and not rep.unmeasured[name], rep.summary()
    ref, cand = rep.tensors(next(iter(al.layouts)), name)
    assert np.shape(ref) == np.shape(cand)  # in the layout it was measured in


class InPlace(nn.Module):
    """Slice assignments (pnnx: one CopyTo each): the states of x between them are all the
    shape of x, and a sample of elements may miss where they differ."""

    def forward(self, x):
        x = x.clone()
        xx = x[1]
        x[..., 1] = x[..., -1] * 3
        x[:, :, 3, :2] = x[:, :, 3, :2].exp()
        xx[2:4, ...] += 1
        x[:, :, :, :] = x[:, :, :, :] / 2
        return x


def test_states_of_a_tensor_written_in_place_are_not_a_false_divergence(tmp_path):
    """Was a false isolated divergence (max abs 2.83 at Tensor.__getitem___1): run_blobs fed
    ncnn Mats over numpy's buffers, whose channel step (285 floats for [18,15,19,1]) is not
    the aligned one ncnn's Squeeze assumes; fed Mats are now cloned."""
    torch.manual_seed(0)
    model, x = InPlace().eval(), torch.rand(18, 15, 19, 20)
    art = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [art], (x,), mode="both", progress=False)
    (name,) = rep.aligned_fraction
    assert rep.first_divergence is None and rep.ok, rep.summary()
    al = rep.alignments[name]
    # each state an assignment leaves x in is a torch record (Tensor.__setitem___k)
    assert any(r.startswith("Tensor.__setitem__") for r in al.pairs.values()), al.pairs
    # blobs sharing one reference tensor (a Crop and its Squeeze) equal it on every element,
    # not on a sample only: another state of x would be unaligned with the reason
    shared = [c for c, r in al.pairs.items() if list(al.pairs.values()).count(r) > 1]
    for c in shared:
        ref, cand = rep.tensors(c, name)
        assert np.allclose(np.reshape(cand, np.shape(ref)), ref, atol=1e-5), (c, al.pairs[c])


class SliceAssign(nn.Module):
    """A batch-2 tensor written by slice assignments (the PNNX corpus's
    test_Tensor_slice_copy, its q): each state ncnn's CopyTo writes is a torch state too."""

    def forward(self, q):
        q = F.max_pool2d(q, 1).clone()
        q[:, 1:2, :, :] = q[:, 0:1, :, :] + 1
        q[:, :, 1:5, 2:6] = q[:, :, 1:5, 7:11] * 2
        return q


def test_slice_assignment_states_are_aligned_and_a_batched_blob_is_fed_whole(tmp_path):
    torch.manual_seed(0)
    model, x = SliceAssign().eval(), torch.rand(2, 3, 6, 12)
    # the reference records each state an assignment leaves q in, not the later one
    got = wb.compare(model, [wb.export(model, (x,), workspace=tmp_path / "onnx")], (x,),
                     progress=False).reference.run((x,), capture="all")
    q = F.max_pool2d(x, 1).clone()
    q[:, 1:2] = q[:, 0:1] + 1
    np.testing.assert_array_equal(got["Tensor.__setitem___0"], q.numpy())
    art, rep, name, al = _converted_and_compared(model, x, tmp_path)
    states = [c for c, r in al.pairs.items() if r.startswith("Tensor.__setitem__")]
    assert states and not al.unaligned, (al.unaligned, al.pairs)
    # isolated: the state feeding a Split is fed as the blob the capture saw (batch 2)
    assert rep.ok and not rep.unmeasured[name] and rep.isolated_available[name], rep.summary()
