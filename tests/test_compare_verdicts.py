"""wb.compare's verdicts on models shaped like those nobody here wrote: a pair that cannot
be measured does not lose the comparison, nothing compared is never "ok", a model writing
into its input changes nobody's tensors, each call of a module is its own record, and a
step inside a module (a MatMul before its bias, a layer scale folded into a Linear) is not
measured against the module's output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn
from torch.nn import functional as F  # noqa: N812

import workbench as wb
from workbench.comparison.metrics import TensorMetrics, Tolerance
from workbench.comparison.noise_floor import FACTOR, fallback_floor
from workbench.comparison.verdict import measure_pair
from workbench.runtime import TorchRunner


def _perturb(path, out, initializer, *, scale=0.1, seed=0):
    """A copy of the ONNX model with one weight perturbed: 10% noise on a quarter of it."""
    m = onnx.load(str(path))
    w = next(t for t in m.graph.initializer if t.name == initializer)
    arr = numpy_helper.to_array(w).copy()
    rng = np.random.default_rng(seed)
    hit = rng.random(arr.shape) < 0.25
    arr[hit] += scale * np.abs(arr).max() * rng.standard_normal(int(hit.sum()))
    w.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), w.name))
    onnx.save(m, str(out))
    return out


# -- a pair that cannot be measured ----------------------------------------------------------
class WindowPartition(nn.Module):
    """Swin-style: a 7x7 window partition goes through a rank-6 view and permute."""

    def __init__(self, c=24):
        super().__init__()
        self.proj = nn.Linear(c, c)
        self.fc = nn.Linear(c, c)

    def forward(self, x):
        b, h, w, c = x.shape
        x = self.proj(x).view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5)
        return self.fc(x.reshape(-1, 7, 7, c))


def test_measure_pair_takes_other_ranks_of_one_tensor_and_names_what_it_cannot():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 7, 7, 768)).astype(np.float32)
    m = measure_pair(ref, ref.reshape(1, 1, 1, 7, 7, 768), Tolerance())
    assert isinstance(m, TensorMetrics) and m.passed and m.max_abs == 0.0
    merged = measure_pair(ref, ref.reshape(49, 768), Tolerance())  # a Gemm's 2-D output
    assert isinstance(merged, TensorMetrics) and merged.max_abs == 0.0
    why = measure_pair(ref[0, 0], ref[0, 0].T.copy()[:6], Tolerance())
    assert isinstance(why, str) and "shapes differ" in why and "[7, 768]" in why
    assert isinstance(measure_pair(ref, ref.reshape(1, 7, 768, 7), Tolerance()), str)


def test_rank6_against_rank4_does_not_abort_the_comparison(tmp_path):
    torch.manual_seed(0)
    model, x = WindowPartition().eval(), torch.randn(1, 7, 7, 24)
    onx = wb.export(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    ranks = {len(np.shape(v)) for v in
             wb.runtime.OrtRunner(onx).run((x,), capture="all").values()}
    assert 6 in ranks and 4 in ranks
    rep = wb.compare(model, [onx], (x,), mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    reshaped = [r for r in rep.records if "axes of size 1 differ" in r.relation]
    assert reshaped, [(r.name, r.reference, r.relation) for r in rep.records]
    assert all(r.metrics.passed for r in reshaped)
    assert "[1, 1, 1, 7, 7, 24]" in reshaped[0].relation or "[1, 7, 7, 24]" in reshaped[0].relation


def test_a_swin_transformer_compares_clean_through_its_window_partitions(tmp_path):
    """transformers' Swin (zoo, seeded): window partitions pair rank-6 with rank-4 tensors,
    and the shifted windows add a mask of -100 to the attention scores, a step within 5%
    of the mask itself: measured as one shape, and the step not taken for the mask."""
    from workbench import zoo

    model, x = zoo.get("swin")
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [onx], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    assert any("axes of size 1 differ" in r.relation for r in rep.records)
    (name,) = rep.aligned_fraction
    assert rep.aligned_fraction[name] == 1.0 and not rep.unmeasured[name]
    scores = [t for t in rep.attributed[name] if "blocks.1/attention/Add_1_output_0" in t]
    assert scores, "the masked scores are a step inside the attention"


# -- nothing compared ---------------------------------------------------------------------------
class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.conv(x))


def test_a_candidate_from_another_model_is_not_ok_and_the_summary_says_why(tmp_path):
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(1, 3, 8, 8)
    other = nn.Sequential(nn.Conv2d(3, 5, 3), nn.Sigmoid(), nn.Conv2d(5, 6, 1)).eval()
    onx = wb.export(other, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [onx], (x,), mode="both", progress=False)
    (name,) = rep.aligned_fraction
    assert rep.aligned_fraction[name] == 0.0 and not rep.records
    assert not rep.ok and rep.first_divergence is None
    assert "all within tolerance" not in rep.summary()
    assert "NOT OK: nothing compared (0 of 3 tensors aligned)" in rep.summary()
    assert not rep.verdicts()[name].ok


def test_a_candidate_whose_run_fails_is_not_ok_and_the_others_are_still_compared(tmp_path):
    """ncnn's SDPA on a transformers GPT-2 corrupted the heap and killed the worker: the
    whole comparison was lost with it, the ONNX candidate's records too. Here an ncnn model
    fails in a layer; it comes first and last (the last is captured while the one before
    it is measured)."""
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(1, 3, 8, 8)
    ws = wb.Workspace(tmp_path / "ws")
    onx, nc = wb.export(model, (x,), workspace=ws), wb.to_ncnn(model, (x,), workspace=ws)
    # the same model with a Reshape after its conv to a size ncnn cannot allocate: it
    # refuses to run it (an NcnnRunError naming the layer)
    broken = tmp_path / "broken.ncnn.param"
    lines = nc.path.read_text().splitlines()
    layers, blobs = map(int, lines[1].split())
    lines[1] = f"{layers + 1} {blobs + 1}"
    conv = next(i for i, ln in enumerate(lines) if ln.startswith("Convolution"))
    fields = lines[conv].split()
    top = fields[5]
    fields[5] = "mid"
    lines[conv] = " ".join(fields)
    lines.insert(conv + 1, f"Reshape broken 1 1 mid {top} 0=100000 1=100000 2=1000")
    broken.write_text("\n".join(lines) + "\n")
    (tmp_path / "broken.ncnn.bin").write_bytes((nc.dir / "model.ncnn.bin").read_bytes())
    (tmp_path / "broken_ncnn.py").write_text((nc.dir / "model_ncnn.py").read_text())
    for mode in ("accumulated", "both"):
        rep = wb.compare(model, [broken, onx, broken], (x,), mode=mode, progress=False)
        first, good, last = (c.name for c in rep.candidates)
        assert set(rep.failed) == {first, last}
        assert "layer broken (Reshape) failed" in rep.failed[last]  # the layer is named
        verdicts = rep.verdicts()
        assert verdicts[good].ok and rep.aligned_fraction[good] == 1.0
        assert not verdicts[first].ok and not verdicts[last].ok and not rep.ok
        assert verdicts[last].reasons == [f"its run failed: {rep.failed[last]}"]
        lines = rep.summary().splitlines()
        assert lines[0].startswith(f"{first}: not aligned; NOT OK: its run failed: ")
        assert "all within tolerance" in lines[1] and "NOT OK" not in lines[1]
        assert {r.candidate for r in rep.records} == {good}
        with pytest.raises(wb.InputError, match="did not run"):
            rep.tensors(next(iter(rep.alignments[good].pairs)), last)


class _AbortWhenUnpickled:
    """Shipped as a runner's custom ops: the worker unpickles it while it builds the twin
    and dies of SIGABRT there, before any run (what ncnn's SDPA left behind on Qwen2: a
    corrupted heap that killed the worker at the next runner's creation)."""

    def __reduce__(self):
        import os

        return os.abort, ()


def test_a_worker_dying_while_building_a_candidate_lists_it_failed_not_raises(
        tmp_path, fresh_worker):
    """compare asked each candidate for its inputs before capturing: a worker that died
    while building the twin raised BackendCrashed out of wb.compare and the whole comparison
    was lost. Now that candidate is listed in report.failed and the others are compared."""
    import pickle

    from workbench.runtime import OrtRunner

    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(1, 3, 8, 8)
    onx = wb.export(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    dying = OrtRunner(onx)
    dying._remote.custom_ops = pickle.dumps(_AbortWhenUnpickled())
    # isolated mode captures one candidate after the other: the good one is done before
    # the dying one takes the shared worker down
    rep = wb.compare(model, [onx, dying], (x,), mode="isolated", progress=False)
    good, bad = (c.name for c in rep.candidates)
    assert set(rep.failed) == {bad} and "SIGABRT" in rep.failed[bad]
    assert rep.verdicts()[good].ok and not rep.verdicts()[bad].ok and not rep.ok
    assert {r.candidate for r in rep.records} == {good}


def test_a_graph_without_nodes_is_not_ok(tmp_path):
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(1, 3, 8, 8)
    value = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])
    empty = helper.make_model(helper.make_graph([], "empty", [value], [value]),
                              opset_imports=[helper.make_opsetid("", 17)])
    empty.ir_version = 8
    onnx.save(empty, tmp_path / "empty.onnx")
    rep = wb.compare(model, [tmp_path / "empty.onnx"], (x,), progress=False)
    assert not rep.ok and not rep.records
    assert "NOT OK: nothing compared (no float tensor to align)" in rep.summary()


def test_too_little_explained_is_not_ok_though_what_was_compared_passes(tmp_path):
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(1, 3, 8, 8)
    onx = wb.export(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [onx], (x,), progress=False)
    assert rep.ok and "all within tolerance" in rep.summary()
    strict = wb.compare(model, [onx], (x,), progress=False, min_explained=1.01)
    assert all(r.metrics.passed for r in strict.records) and not strict.ok
    assert "NOT OK: only 100% of 2 tensors aligned or attributed (threshold 101%)" in \
        strict.summary()
    assert "all within tolerance" not in strict.summary()
    assert "what was compared is within tolerance" in strict.summary()
    with pytest.raises(wb.InputError, match="min_explained"):
        wb.compare(model, [onx], (x,), progress=False, min_explained="half")


class PoolsTooWide(nn.Module):
    """Three convs, then an average pool whose kernel (16, ceil mode) covers the whole 2x2
    map, as transformers' EfficientNet pooler does: torch averages it; ncnn's Pooling leaves
    the map as it is, so the model returns 16 values where torch returns 4."""

    def __init__(self, kernel: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.conv3 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.pool = nn.AvgPool2d(kernel, ceil_mode=True)

    def forward(self, x):
        return self.pool(self.conv3(self.conv2(self.conv1(x)))).flatten(1)


@pytest.mark.parametrize("mode", ["accumulated", "isolated"])
def test_an_output_that_is_not_torch_s_is_not_ok_though_the_rest_passes(tmp_path, mode):
    torch.manual_seed(0)
    x = torch.rand(1, 3, 4, 4)
    for kernel, wrong in ((16, True), (2, False)):  # a 2x2 kernel: ncnn pools like torch
        model = PoolsTooWide(kernel).eval()
        # converted for two sizes: with a map of unknown size to_ncnn cannot write the wide
        # kernel as the whole-map pooling it is (ncnn-global-pool), so ncnn's output stays wrong
        nc = wb.to_ncnn(model, (x,), inputs2=(torch.rand(1, 3, 6, 6),),
                        workspace=wb.Workspace(tmp_path / f"ws{kernel}"))
        rep = wb.compare(model, [nc], (x,), mode=mode, progress=False)
        (verdict,) = rep.verdicts().values()
        assert rep.ok is not wrong and verdict.explained >= 0.5
        if wrong:
            assert all(r.metrics.passed for r in rep.records) and rep.first_divergence is None
            (reason,) = verdict.reasons
            assert reason.startswith("its output 'out0' is not torch's: matches no reference "
                                     "tensor (candidate [1, 16], torch's output_0 [1, 4])")
            assert "(Pooling)" in reason and "aligned to conv3" in reason
            assert "all within tolerance" not in rep.summary()


class Amplify(nn.Module):
    def forward(self, x):
        return x * 100.0


def test_an_error_within_tolerance_that_grows_past_it_is_said_not_blamed_on_an_op(tmp_path):
    """Each op within tolerance on its own inputs (isolated), the accumulated error over it
    later: no op is named, and the summary says where the accumulated error first exceeds
    tolerance (it said "over tolerance only where not exactly related"). A tolerance the
    caller gives (the former default, over the whole tensor): by fp32's noise floor the
    drifted weight is a divergence of its own, and error carried in is its inputs'."""
    torch.manual_seed(0)
    lin = nn.Linear(32, 32)
    with torch.no_grad():
        lin.weight.mul_(0.01)
        lin.bias.mul_(0.01)
    model, x = nn.Sequential(lin, Amplify(), nn.LayerNorm(32)).eval(), torch.randn(1, 32)
    onx = wb.export(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    m = onnx.load(str(onx.path))
    (w,) = [t for t in m.graph.initializer if len(t.dims) == 2]
    a = numpy_helper.to_array(w)
    noise = np.random.default_rng(0).standard_normal(a.shape)
    w.CopyFrom(numpy_helper.from_array((a * (1 + 0.002 * noise)).astype(np.float32), w.name))
    onnx.save(m, tmp_path / "drifted.onnx")
    by_floor = wb.compare(model, [tmp_path / "drifted.onnx"], (x,), mode="both",
                          progress=False)
    assert by_floor.first_divergence.reference == "0"  # 0.2% of a weight: not fp32 rounding
    rep = wb.compare(model, [tmp_path / "drifted.onnx"], (x,), mode="both", progress=False,
                     tolerance=(1e-4, 1e-3))
    iso = [r for r in rep.records if r.mode == "isolated"]
    assert iso and all(r.metrics.passed for r in iso)
    assert not rep.ok and rep.first_divergence is None
    assert "no op over tolerance on its own (isolated); the accumulated error first exceeds " \
           "it at 1 (Mul" in rep.summary()
    # the one op whose own error stands out is named as where it comes from, not a divergence
    (source,) = rep.error_sources().values()
    assert source.reference == "0" and source.mode == "isolated" and source.metrics.passed
    assert "; it comes from 0 (" in rep.summary()


def _drifted(path, out, scales):
    """A copy with each 2-D weight (in graph order) drifted by its relative ``scales[k]``."""
    m = onnx.load(str(path))
    weights = [t for t in m.graph.initializer if len(t.dims) == 2]
    assert len(weights) == len(scales)
    for k, (w, scale) in enumerate(zip(weights, scales, strict=True)):
        a = numpy_helper.to_array(w)
        noise = np.random.default_rng(k).standard_normal(a.shape)
        w.CopyFrom(numpy_helper.from_array((a * (1 + scale * noise)).astype(np.float32),
                                           w.name))
    onnx.save(m, str(out))
    return out


def test_no_error_source_is_named_when_no_op_stands_out(tmp_path):
    """Two Linears drifted to the same share of their tolerance (0.4), then x100: the
    accumulated error breaks tolerance, each op passes on its own, and neither Linear holds
    most of the error: none is named. The tolerance is the caller's (the former default, over
    the whole tensor): by fp32's noise floor each drift is a divergence of its own."""
    torch.manual_seed(0)
    lins = [nn.Linear(32, 32) for _ in range(2)]
    with torch.no_grad():
        for lin in lins:
            lin.weight.mul_(0.1)
            lin.bias.mul_(0.1)
    model, x = nn.Sequential(*lins, Amplify(), nn.LayerNorm(32)).eval(), torch.randn(1, 32)
    onx = wb.export(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    bad = _drifted(onx.path, tmp_path / "drifted.onnx", (0.0005, 0.004))
    shares = [r.metrics.max_abs / r.metrics.tolerance for r in wb.compare(
        model, [bad], (x,), mode="isolated", progress=False, tolerance=(1e-4, 1e-3)).records
        if r.op_type == "Gemm"]
    assert len(shares) == 2 and max(shares) < 3 * min(shares), shares
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False, tolerance=(1e-4, 1e-3))
    assert all(r.metrics.passed for r in rep.records if r.mode == "isolated"), rep.summary()
    assert not rep.ok and rep.first_divergence is None
    assert rep.error_sources() == {} and "comes from" not in rep.summary()
    clean = wb.compare(model, [onx], (x,), mode="both", progress=False)
    assert clean.ok and clean.error_sources() == {}


# -- a model that writes into its input ---------------------------------------------------------
class WritesInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        x.mul_(2.0)  # in place, into the caller's tensor
        return self.conv(x)


def test_a_model_writing_into_its_input_changes_no_callers_tensor(tmp_path):
    torch.manual_seed(0)
    model, x = WritesInput().eval(), torch.randn(1, 3, 8, 8)
    before = x.clone()
    onx = wb.export(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    assert torch.equal(x, before), "export changed the caller's input"
    assert not [d for d in onx.diagnostics if d.code == "numeric-mismatch"]

    arr = x.numpy().copy()
    arr_before = arr.copy()
    out = TorchRunner(model).run((arr,))["output_0"]
    assert np.array_equal(arr, arr_before), "TorchRunner changed the caller's array"
    with torch.no_grad():
        want = model.conv(before * 2.0).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)

    # the reference and two ONNX Runtime candidates, each on its own copy of the input
    rep = wb.compare(model, [onx, wb.runtime.OrtRunner(onx, isolated=False)], (x,),
                     mode="both", progress=False)
    assert torch.equal(x, before), "compare changed the caller's input"
    assert rep.ok and rep.first_divergence is None, rep.summary()
    assert max(r.metrics.max_abs for r in rep.records) < 1e-5


# -- a module called twice ----------------------------------------------------------------------
class ReusedRelu(nn.Module):
    """One self.relu after two convolutions, as torchvision's ResNet blocks do."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        return self.fc(torch.flatten(self.pool(x), 1))


@pytest.fixture(scope="module")
def reused(tmp_path_factory):
    torch.manual_seed(0)
    model, x = ReusedRelu().eval(), torch.randn(1, 3, 16, 16)
    ws = wb.Workspace(tmp_path_factory.mktemp("reused") / "ws")
    return model, x, wb.export(model, (x,), workspace=ws)


def test_each_call_of_a_module_is_its_own_record(reused):
    model, x, onx = reused
    got = TorchRunner(model).run((x,), capture="all")
    assert [n for n in got if n.startswith("relu")] == ["relu", "relu#1"]
    with torch.no_grad():
        first = model.relu(model.conv1(x))
        second = model.relu(model.conv2(first))
    np.testing.assert_array_equal(got["relu"], first.numpy())
    np.testing.assert_array_equal(got["relu#1"], second.numpy())

    rep = wb.compare(model, [onx], (x,), mode="both", progress=False)
    (name,) = rep.aligned_fraction
    assert rep.aligned_fraction[name] == 1.0 and rep.ok, rep.summary()
    pairs = rep.alignments[name].pairs
    relus = [n.output[0] for n in onnx.load(str(onx.path)).graph.node if n.op_type == "Relu"]
    assert [pairs[r] for r in relus] == ["relu", "relu#1"]


def test_a_damaged_second_conv_is_blamed_on_it_alone(reused, tmp_path):
    model, x, onx = reused
    bad = _perturb(onx.path, tmp_path / "bad.onnx", "conv2.weight", scale=0.5)
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False)
    first = rep.first_divergence
    assert first.reference == "conv2" and first.op_type == "Conv" and first.mode == "isolated"
    failing = [r.reference for r in rep.records if r.mode == "isolated"
               and not r.metrics.passed]
    assert failing == ["conv2"], failing  # no second culprit after it
    acc = {r.reference for r in rep.records if r.mode == "accumulated"}
    assert {"relu", "relu#1", "pool"} <= acc


# -- folded bias, folded scale ------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, d, heads=4):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape

        def split(y):
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        a = nn.functional.scaled_dot_product_attention(
            split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        return self.out_proj(a.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-norm transformer block with a layer-scale multiply after its MLP."""

    def __init__(self, d=32):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), Attention(d)
        self.norm2, self.fc1, self.act = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.rand(d) * 0.5 + 0.1)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.gamma * self.fc2(self.act(self.fc1(self.norm2(x))))


class Encoder(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.blocks = nn.Sequential(Block(d), Block(d))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        return self.head(self.blocks(x).mean(1))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    torch.manual_seed(0)
    with torch.no_grad():
        model = Encoder().eval()
        for p in model.parameters():  # biases big enough that leaving one out shows
            if p.dim() == 1:
                p.add_(torch.rand_like(p) * 0.5)
    x = torch.randn(1, 8, 32)
    ws = wb.Workspace(tmp_path_factory.mktemp("encoder") / "ws")
    onx = wb.export(model, (x,), workspace=ws)
    sim = wb.simplify(onx)
    return model, x, onx, sim, wb.raise_ops(sim)


def test_a_step_before_the_bias_is_not_measured_against_the_linear(encoder):
    model, x, onx, sim, hi = encoder
    rep = wb.compare(model, [onx, sim, hi], (x,), mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    plain, simplified, raised = (c.name for c in rep.candidates)
    # the exported MatMul before its bias Add: a step inside the Linear, never its output
    assert rep.attributed[plain]["/blocks/blocks.0/fc1/MatMul_output_0"] == "blocks.0.fc1"
    for cand in (simplified, raised):
        pairs = rep.alignments[cand].pairs
        # the Linear's input reshaped for a Gemm is named for the Linear, but is its input
        pre = "/blocks/blocks.0/attn/q_proj/MatMul_output_0_pre_reshape_out"
        assert pairs[pre] == "blocks.0.norm1", (cand, pairs.get(pre))
        for tensor, ref in pairs.items():
            scope = tensor.rsplit("/", 1)[0].replace("/blocks/blocks.", "blocks.").replace(
                "/", ".")
            if "pre_reshape" in tensor or tensor.endswith("/MatMul_output_0"):
                assert ref != scope, (cand, tensor, ref)
        assert rep.aligned_fraction[cand] >= 0.95
        assert rep.verdicts()[cand].explained == 1.0


def test_a_layer_scale_folded_into_a_linear_is_no_divergence(encoder):
    model, x, onx, sim, hi = encoder
    gammas = {n for n, _ in model.named_parameters() if n.endswith("gamma")}
    graph = onnx.load(str(sim.path)).graph
    assert not any(i in gammas for n in graph.node for i in n.input)  # folded away
    rep = wb.compare(model, [sim, hi], (x,), mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    for cand in rep.candidates:
        rec = next(r for r in rep.records if r.candidate == cand.name
                   and r.name == "/blocks/blocks.0/fc2/Add_output_0" and r.mode == "accumulated")
        assert rec.reference == "blocks.0/Tensor.mul_0"
        assert rec.relation.startswith("equal up to folding")
        assert rec.covers == ("blocks.0.fc2", "blocks.0/Tensor.mul_0")
        assert rec.metrics.max_abs < 1e-5


def test_a_fault_under_a_folded_bias_is_still_named(encoder, tmp_path):
    """The folding relations must not hide a real fault: q_proj's weight perturbed in the
    simplified graph is named there."""
    model, x, onx, sim, hi = encoder
    weight = next(i for n in onnx.load(str(sim.path)).graph.node if n.op_type == "Gemm"
                  for i in n.input[1:2] if "blocks.0/attn/q_proj" in i)
    bad = _perturb(sim.path, tmp_path / "bad.onnx", weight)
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.reference == "blocks.0.attn.q_proj", rep.summary()
    # the Gemm that holds the weight, not the reshaped input named for the Linear
    assert first.mode == "isolated" and first.op_type == "Gemm" and first.relation == "equal"
    failing = {r.reference for r in rep.records if r.mode == "isolated"
               and not r.metrics.passed}
    assert failing == {"blocks.0.attn.q_proj"}, failing


def test_a_fault_in_a_linear_with_a_folded_scale_is_named_there(encoder, tmp_path):
    model, x, onx, sim, hi = encoder
    weight = next(i for n in onnx.load(str(sim.path)).graph.node if n.op_type == "Gemm"
                  for i in n.input[1:2] if "blocks.0/fc2" in i)
    bad = _perturb(sim.path, tmp_path / "bad.onnx", weight)
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.mode == "isolated", rep.summary()
    # the Linear itself, or the folded op that covers it
    assert "blocks.0.fc2" in (first.reference, *first.covers), (first.reference, first.covers)
    assert first.name == "/blocks/blocks.0/fc2/Add_output_0"


# -- a graph that runs ops in another order than torch ------------------------------------------
def test_a_shortcut_run_first_is_still_aligned_and_a_fault_after_it_named(tmp_path):
    """transformers' ResNet (zoo, seeded), simplified: the downsampling shortcut conv comes
    before the branch torch ran first, so a named module call can lie behind the order
    matched so far. Every tensor aligned; a weight perturbed in the branch named there (or
    by the BatchNorm folded into that conv, which covers it)."""
    from workbench import zoo

    model, x = zoo.get("resnet")
    sim = wb.simplify(wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws")))
    rep = wb.compare(model, [sim], x, mode="both", progress=False)
    (name,) = rep.aligned_fraction
    assert rep.aligned_fraction[name] == 1.0 and rep.ok, (rep.summary(), rep.unaligned)
    graph = onnx.load(str(sim.path)).graph
    block = "/model/resnet/encoder/stages.1/layers.0/"
    convs = [n for n in graph.node if n.op_type == "Conv" and n.output[0].startswith(block)]
    assert "shortcut" in convs[1].output[0]  # the shortcut runs second, torch runs it last
    branch = next(n for n in convs if "layer.1/" in n.output[0])
    bad = _perturb(sim.path, tmp_path / "bad.onnx", branch.input[1])
    rep = wb.compare(model, [bad], x, mode="both", progress=False)
    first = rep.first_divergence
    module = "model.resnet.encoder.stages.1.layers.0.layer.1.convolution"
    assert first is not None and first.name == branch.output[0], rep.summary()
    assert module in (first.reference, *first.covers)


def test_convnext_layer_scale_folded_into_a_linear_is_aligned_with_its_relation(tmp_path):
    """transformers' ConvNeXt (zoo, seeded), simplified: each block's layer scale is folded
    into pwconv2 (a Gemm on [H*W, C] between two Reshapes): aligned to the multiply it
    folded, with the modules it covers, no alarm. With the zoo's own layer scales (ones)
    the Gemm's [H*W, C] output is pwconv2's [1, H, W, C] with its leading axes merged."""
    from workbench import zoo

    layer = "model.convnext.encoder.stages.0.layers.0"
    for scaled in (True, False):
        model, x = zoo.get("convnext")
        torch.manual_seed(0)
        with torch.no_grad():  # the zoo's layer scales are 1: values worth folding
            for n, p in model.named_parameters():
                if scaled and n.endswith("layer_scale_parameter"):
                    p.copy_(torch.rand_like(p) * 0.5 + 0.1)
        ws = wb.Workspace(tmp_path / f"ws{scaled}")
        sim = wb.simplify(wb.export(model, x, workspace=ws))
        rep = wb.compare(model, [sim], x, mode="both", progress=False)
        (name,) = rep.aligned_fraction
        assert rep.aligned_fraction[name] == 1.0 and rep.ok, (rep.summary(), rep.unaligned)
        recs = {r.name.split("encoder/")[-1]: r for r in rep.records if r.mode == "isolated"}
        if scaled:
            rec = recs["stages.0/layers.0/pwconv2/Add_output_0"]
            assert rec.reference == f"{layer}/Tensor.mul_0"
            assert rec.covers == (f"{layer}.pwconv2", f"{layer}/Tensor.mul_0")
            assert rec.relation.startswith("equal up to folding")
        else:
            rec = recs["stages.0/layers.0/pwconv2/MatMul_output_0_gemm_out"]
            assert rec.reference == f"{layer}.pwconv2"
            assert "leading axes merged: reference [1, 16, 16, 16], candidate [256, 16]" in \
                rec.relation


def _hf(name):
    """transformers architectures with small configs, seeded, that onnxslim folds a
    constant multiply into a Linear for: BEiT's layer scale (``lambda_1 * x``, applied by
    the layer two levels above o_proj) and Segformer's SDPA scale (into q_proj's weights)."""
    import transformers as T

    from workbench.zoo import _wrap

    torch.manual_seed(0)
    if name == "squeezebert":
        model = T.SqueezeBertModel(T.SqueezeBertConfig(
            vocab_size=100, embedding_size=32, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, q_groups=2, k_groups=2, v_groups=2,
            post_attention_groups=2, intermediate_groups=2, output_groups=2))
        return _wrap(model, "last_hidden_state"), (torch.randint(0, 100, (1, 12)),)
    if name == "dinov2":
        model = T.Dinov2Model(T.Dinov2Config(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=1,
            num_attention_heads=4, mlp_ratio=2, initializer_range=0.2))
        return _wrap(model, "last_hidden_state"), (torch.rand(1, 3, 32, 32),)
    if name == "focalnet":
        model = T.FocalNetModel(T.FocalNetConfig(
            image_size=64, embed_dim=16, depths=[1, 1], hidden_sizes=[16, 32],
            initializer_range=0.2))
        return _wrap(model, "pooler_output"), (torch.rand(1, 3, 64, 64),)
    if name == "beit":
        model = T.BeitModel(T.BeitConfig(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=1,
            num_attention_heads=4, intermediate_size=128, initializer_range=0.2),
            add_pooling_layer=False)
        return _wrap(model, "last_hidden_state"), (torch.rand(1, 3, 32, 32),)
    if name == "gpt_neox":
        model = T.GPTNeoXModel(T.GPTNeoXConfig(
            hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
            vocab_size=100, max_position_embeddings=64, rotary_pct=0.5,
            initializer_range=0.2, use_cache=False))
        return _wrap(model, "last_hidden_state"), (
            torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(1)),)
    model = T.SegformerModel(T.SegformerConfig(
        num_encoder_blocks=1, depths=[1], sr_ratios=[2], hidden_sizes=[16],
        num_attention_heads=[1], patch_sizes=[7], strides=[4], mlp_ratios=[2],
        initializer_range=0.2))
    return _wrap(model, "last_hidden_state"), (torch.rand(1, 3, 64, 64),)


def test_partial_sums_of_a_sum_added_in_another_order_are_steps_not_unexplained(tmp_path):
    """FocalNet's modulation sums its focal levels (ctx_all = ctx_all + ctx * gate, level by
    level); pnnx adds them up in another order, so ncnn holds a partial sum torch never
    computed. On a sample it looked like the whole sum (left unexplained as "another state
    of it"); it is a step of the modulation, read only by the add that equals torch's sum."""
    model, x = _hf("focalnet")
    nc = wb.to_ncnn(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [nc], x, progress=False)
    (al,) = rep.alignments.values()
    assert rep.ok and al.fraction == 1.0, al.unaligned
    steps = {n: m for n, m in al.attributed.items() if m.endswith("modulation")}
    assert steps and not any("on a sample only" in r for r in al.unaligned.values())


def test_a_layer_scale_two_levels_above_the_linear_is_no_divergence(tmp_path):
    """BEiT, simplified: o_proj's Gemm holds lambda_1 * o_proj (o_proj, then the layer's
    dropout, then the multiply in the layer). It was aligned to o_proj as "equal" and
    reported a 4.4 divergence on a clean model."""
    model, x = _hf("beit")
    sim = wb.simplify(wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws")))
    rep = wb.compare(model, [sim], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    rec = next(r for r in rep.records if r.mode == "accumulated"
               and r.name == "/model/layers.0/attention/o_proj/Add_output_0")
    assert rec.reference == "model.layers.0/Tensor.mul_0"
    assert rec.relation.startswith("equal up to folding")
    assert "model.layers.0.attention.o_proj" in rec.covers


def test_a_linear_named_for_the_layer_scale_removed_after_it_is_the_linear(tmp_path):
    """DINOv2, simplified: layer_scale2 multiplies by ones (its initial value), so onnxslim
    removes it and fc2's MatMul writes layer_scale2's output name; fc2 has no tensor of its
    own. A damaged fc2 was named at layer_scale2 (a later module). The node is still named
    for fc2 ('.../mlp/fc2/MatMul'): it is fc2's output, and a damaged fc2 is named there."""
    model, x = _hf("dinov2")
    layer = "model.encoder.layer.0"
    sim = wb.simplify(wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws")))
    node = next(n for n in onnx.load(str(sim.path)).graph.node
                if n.op_type == "MatMul" and n.output[0].startswith("/model/encoder/layer.0/"
                                                                    "layer_scale2/"))
    assert node.name == "/model/encoder/layer.0/mlp/fc2/MatMul"
    rep = wb.compare(model, [sim], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    rec = next(r for r in rep.records if r.name == node.output[0])
    assert (rec.reference, rec.relation) == (f"{layer}.mlp.fc2", "equal")
    bad = _perturb(sim.path, tmp_path / "bad.onnx", node.input[1])
    rep = wb.compare(model, [bad], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.name == node.output[0], rep.summary()
    assert first.reference == f"{layer}.mlp.fc2", rep.summary()
    # nodes without names (another tool wrote the file): the output's name is all there is,
    # and the MatMul named for layer_scale2 covers fc2, the weighted module before it
    m = onnx.load(str(bad))
    for n in m.graph.node:
        n.name = ""
    onnx.save(m, str(tmp_path / "nameless.onnx"))
    rep = wb.compare(model, [tmp_path / "nameless.onnx"], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.name == node.output[0], rep.summary()
    assert first.covers == (f"{layer}.mlp.fc2", f"{layer}.layer_scale2"), first.covers


def test_a_linear_whose_bias_and_unit_scale_were_removed_is_the_linear(tmp_path):
    """FocalNet, simplified: fc2's bias is zero and its `gamma_2 * x` multiplies by 1.0;
    onnxslim removes both, and the MatMul, still named '.../mlp/fc2/MatMul', writes the
    layer's '/layers.0/Mul_1_output_0'. It was taken for a step of the layer: a damaged
    fc2 was attributed, not measured, and named at the residual Add after it."""
    model, x = _hf("focalnet")
    sim = wb.simplify(wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws")))
    layer = "model.encoder.stages.1.layers.0"
    node = next(n for n in onnx.load(str(sim.path)).graph.node if n.op_type == "MatMul"
                and n.name == "/model/encoder/stages.1/layers.0/mlp/fc2/MatMul")
    assert node.output[0] == "/model/encoder/stages.1/layers.0/Mul_1_output_0"
    rep = wb.compare(model, [sim], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    rec = next(r for r in rep.records if r.name == node.output[0])
    assert rec.reference == f"{layer}.mlp.fc2" and rec.relation == "equal", rec
    bad = _perturb(sim.path, tmp_path / "bad.onnx", node.input[1])
    rep = wb.compare(model, [bad], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.name == node.output[0], rep.summary()
    assert first.reference == f"{layer}.mlp.fc2", rep.summary()


def test_scopes_without_the_layer_index_name_the_listed_modules(tmp_path):
    """SqueezeBERT's exported scopes drop the ModuleList index ('/model/encoder/attention/
    query_1/Conv' is layer 1's query). Its nodes had no module: a clean 2-layer model showed
    a false divergence of 0.0275 (layer 0's LayerNorm output aligned by value to the
    encoder's last permute, and every later tensor lost), and a damaged second query was
    named at a later Softmax. The k-th scope of a path is the list's k-th module now."""
    model, x = _hf("squeezebert")
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    query = "model.encoder.layers.1.attention.query"
    node = next(n for n in onnx.load(str(onx.path)).graph.node
                if n.op_type == "Conv" and f"{query}.weight" in n.input)
    assert "layers.1" not in node.output[0]  # the scope does not say which layer
    rep = wb.compare(model, [onx], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    al = rep.alignments[rep.candidates[0].name]
    assert al.pairs[node.output[0]] == query and al.fraction == 1.0
    assert al.pairs["/model/encoder/post_attention/layernorm_1/Transpose_1_output_0"] == \
        "model.encoder.layers.1.post_attention.layernorm"
    bad = _perturb(onx.path, tmp_path / "bad.onnx", f"{query}.weight")
    rep = wb.compare(model, [bad], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.reference == query, rep.summary()
    # simplified, q's and k's Transposes come after all three Reshapes: an inferred module
    # (attention) pins a tensor only to its own output, not to its one call left in reach
    # (q's permute measured against k's: a false 7.05)
    sim = wb.simplify(onx)
    rep = wb.compare(model, [sim], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()


def test_a_node_whose_name_has_no_scope_is_tied_to_the_module_whose_weight_it_reads(
        tmp_path):
    """Value names without a scope (another exporter, a renaming tool): a Conv reading
    'conv2.weight' is conv2's, so that its damaged weight is named there."""
    model, x = wb.default_model()
    onx = wb.export(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    m = onnx.load(str(onx.path))
    conv = next(n for n in m.graph.node if "conv2.weight" in n.input)
    old, new = conv.output[0], "v17"
    for n in m.graph.node:
        n.input[:] = [new if i == old else i for i in n.input]
    conv.output[0], conv.name = new, "n17"
    onnx.save(m, str(tmp_path / "renamed.onnx"))
    rep = wb.compare(model, [tmp_path / "renamed.onnx"], x, progress=False)
    assert rep.ok and rep.alignments[rep.candidates[0].name].pairs[new] == "conv2"
    bad = _perturb(tmp_path / "renamed.onnx", tmp_path / "bad.onnx", "conv2.weight")
    first = wb.compare(model, [bad], x, mode="both", progress=False).first_divergence
    assert first is not None and first.name == new and first.reference == "conv2"


@pytest.fixture(scope="module")
def segformer(tmp_path_factory):
    model, x = _hf("segformer")
    ws = wb.Workspace(tmp_path_factory.mktemp("segformer") / "ws")
    return model, x, wb.simplify(wb.export(model, x, workspace=ws))


Q_GEMM = "/model/stages.0/blocks.0/attention/q_proj/MatMul_output_0_gemm_out"


def test_an_attention_scale_folded_into_q_proj_is_measured_scaled(segformer):
    """Segformer, simplified: onnxslim folds SDPA's scale (0.5 on q and on k, for 16-wide
    heads) into q_proj's weights; torch has no tensor of the product. It was measured
    against q_proj unscaled: max abs 1.08 on a clean model, a false first divergence."""
    model, x, sim = segformer
    rep = wb.compare(model, [sim], x, mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    (cand,) = rep.candidates
    al = rep.alignments[cand.name]
    assert al.pairs[Q_GEMM] == "model.stages.0.blocks.0.attention.q_proj"
    assert al.scales[Q_GEMM] == 0.5
    assert "scale folded in: x0.5" in al.relation(Q_GEMM)
    for mode in ("accumulated", "isolated"):
        rec = next(r for r in rep.records if r.mode == mode and r.name == Q_GEMM)
        assert rec.metrics.passed and rec.metrics.max_abs < 1e-5, (mode, rec.metrics)
    # what tensors() hands out is what was measured: the reference times the scale
    ref, got = rep.tensors(Q_GEMM)
    q = TorchRunner(model).run(x, capture="all")["model.stages.0.blocks.0.attention.q_proj"]
    np.testing.assert_allclose(ref, 0.5 * q, rtol=1e-6)
    assert np.abs(np.asarray(got).reshape(np.shape(ref)) - ref).max() < 1e-5


def test_a_fault_in_q_proj_under_a_folded_scale_is_named_there(segformer, tmp_path):
    """The scale relation must not hide a damaged q_proj: a perturbed weight is no multiple
    of the reference, so the Gemm stays pinned to q_proj and fails there."""
    model, x, sim = segformer
    weight = next(n.input[1] for n in onnx.load(str(sim.path)).graph.node
                  if n.output[0] == Q_GEMM)
    bad = _perturb(sim.path, tmp_path / "bad.onnx", weight)
    rep = wb.compare(model, [bad], x, mode="both", progress=False)
    first = rep.first_divergence
    assert first is not None and first.name == Q_GEMM, rep.summary()
    assert first.reference == "model.stages.0.blocks.0.attention.q_proj"
    assert first.relation == "equal"
    assert Q_GEMM not in rep.alignments[first.candidate].scales


# -- a Fourier transform's rounding spreads over every bin -------------------------------------
class Spectrum(nn.Module):
    """PNNX corpus test_torch_stft's third output: a 512-point STFT of 1000 samples."""

    def forward(self, y):
        out = torch.stft(y, n_fft=512, window=torch.hamming_window(256), win_length=256,
                         hop_length=128, center=True, pad_mode="constant", onesided=True,
                         return_complex=True)
        return torch.view_as_real(out)


def test_a_fourier_transform_is_within_tolerance_of_the_whole_spectrum(tmp_path):
    """ncnn's DFT against torch's FFT: fp32 rounding of 512-term sums errs ~1e-4 to 1e-3 in
    every bin, so a bin near zero fails atol 1e-4 + rtol 1e-3 of its own |ref| though the
    error is ~3e-6 of the spectrum's largest bin. The tensor is judged whole: its noise floor
    (the layer's terms not read: a fallback from the spectrum's largest bin); a caller's
    per_op_tolerance for the op judges it instead, against the whole tensor too."""
    torch.manual_seed(0)
    y = torch.rand(1000)
    model = Spectrum().eval()
    nc = wb.to_ncnn(model, (y,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [nc], (y,), progress=False)
    spectral = [r for r in rep.records if r.op_type == "Spectrogram"]
    assert spectral, [(r.name, r.op_type) for r in rep.records]
    m = spectral[0].metrics
    big = float(np.abs(rep.reference.run((y,))["output_0"]).max())
    assert m.max_abs > 1e-4  # the case this is about: over atol where a bin is near 0
    assert m.max_abs < 1e-5 * big  # and fp32 rounding of the whole spectrum
    assert m.floor_basis == "fallback"
    assert m.tolerance == pytest.approx(FACTOR * fallback_floor(m.ref_absmax), rel=1e-6)
    assert m.passed and rep.ok, rep.summary()
    strict = wb.compare(model, [nc], (y,), progress=False,
                        per_op_tolerance={"Spectrogram": (1e-4, 0.0)})
    assert not strict.ok
    assert not next(r for r in strict.records if r.op_type == "Spectrogram").metrics.passed


class LogSigmoids(nn.Module):
    """PNNX corpus test_F_logsigmoid: ncnn runs F.logsigmoid as Sigmoid then Log, and the
    first one's Sigmoid follows another branch's records (max_pool2d), so no rule of order
    places it."""

    def forward(self, x, q):
        x, q = x * 2 - 1, F.max_pool2d(q * 2 - 1, 1)
        return F.logsigmoid(x), F.logsigmoid(q)


def test_a_nameless_step_read_only_by_one_call_is_attributed_to_it(tmp_path):
    """A tensor no torch record equals, with no name or weights to tie it to a module, read
    only by one call's output (the Sigmoid inside F.logsigmoid) is a step of that call."""
    torch.manual_seed(0)
    args = (torch.rand(16), torch.rand(2, 7, 9, 11))
    model = LogSigmoids().eval()
    nc = wb.to_ncnn(model, args, workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [nc], args, progress=False)
    al = rep.alignments[rep.candidates[0].name]
    assert not rep.unaligned[rep.candidates[0].name], rep.unaligned
    assert sorted(al.attributed.values()) == ["F.logsigmoid_0", "F.logsigmoid_1"], \
        al.attributed
    assert rep.ok, rep.summary()


class StatePassed(nn.Module):
    """PNNX corpus test_nn_RNN: one multi-layer RNN's final state is the next one's initial
    state; ncnn slices it per layer, and the last layer's output is a model output."""

    def __init__(self):
        super().__init__()
        self.a = nn.RNN(input_size=8, hidden_size=16, num_layers=2, bidirectional=True)
        self.b = nn.RNN(input_size=8, hidden_size=16, num_layers=2, bidirectional=True)
        self.c = nn.RNN(input_size=8, hidden_size=16, num_layers=2, bidirectional=True)

    def forward(self, x):
        x = x.permute(1, 0, 2)
        ya, h = self.a(x)
        yb, h = self.b(x, h)
        yc, _ = self.c(x, h)
        return ya.permute(1, 0, 2), yb.permute(1, 0, 2), yc.permute(1, 0, 2)


def test_an_initial_state_slice_read_by_a_layer_whose_output_is_a_model_output(tmp_path):
    """The slice of the state the last layer reads: that layer's other top (its state) is
    a step of the module, so the layer is, though its output pairs with the model's."""
    torch.manual_seed(0)
    args = (torch.rand(1, 10, 8),)
    model = StatePassed().eval()
    nc = wb.to_ncnn(model, args, workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [nc], args, progress=False)
    name = rep.candidates[0].name
    assert not rep.unaligned[name], rep.unaligned
    assert "b" in rep.alignments[name].attributed.values()
    assert rep.ok, rep.summary()


class _TokenBlock(nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear on tokens (ncnn Gemms), one LayerNorm channel
    planted 100x with the first Linear's weights divided back: float unchanged, int8 not."""

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.act = nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU()
        self.fc2 = nn.Linear(64, 32)
        with torch.no_grad():
            self.ln.weight[2] *= 100
            self.ln.bias[2] *= 100
            self.fc1.weight[:, 2] /= 100

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(self.ln(x))))


def test_a_layer_after_an_unaligned_step_is_isolated_through_the_aligned_blob_before_it(
        tmp_path):
    # ncnn int8: the GELU output no longer matches torch's (not aligned), so fc2's only
    # bottom cannot be fed; fc2 ran on the int8 model's own values and its "isolated" error
    # was fc1's accumulated one (a false second culprit). Fed through fc1's aligned output,
    # fc2's isolated error is its own: what ncnn gives on torch's GELU output.
    from workbench.params import parse_ncnn_param
    from workbench.precision.snr import snr_db
    from workbench.runtime import NcnnRunner

    torch.manual_seed(0)
    model, x = _TokenBlock().eval(), torch.randn(1, 10, 32)
    art = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    samples = [(torch.randn(1, 10, 32).numpy(),) for _ in range(4)]
    q = wb.quantize(art, samples, backend="ncnn", progress=False)
    rep = wb.compare(model, [q], (x,), mode="both", progress=False)
    snr = {(r.mode, r.reference): r.metrics.snr_db for r in rep.records}
    assert snr[("accumulated", "fc1")] < 20 and snr[("isolated", "fc1")] < 20  # the plant
    assert snr[("isolated", "fc2")] > snr[("accumulated", "fc2")] + 15
    ref = TorchRunner(model).run((x,), capture="all")
    gelu_blob = next(ly.tops[0] for ly in parse_ncnn_param(q.path).layers
                     if ly.type == "GELU")
    fc2_blob = next(r.name for r in rep.records if r.reference == "fc2")
    direct = NcnnRunner(q, isolated=False).run_blobs({gelu_blob: np.asarray(ref["act"])[0]},
                                                      [fc2_blob])[fc2_blob]
    want = snr_db(np.asarray(ref["fc2"])[0], np.asarray(direct).reshape(10, 32))
    assert abs(snr[("isolated", "fc2")] - want) < 1.0, (snr, want)
    assert rep.sensitive(1)[0].reference == "fc1"


def test_an_sdpa_reading_a_byte_mask_is_the_first_divergence_and_the_note_says_why(tmp_path):
    """GPT-NeoX in ncnn: pnnx stores the boolean causal mask as bytes, ncnn's SDPA reads it
    as float (runtime/ncnn_masks.py) and computes garbage. Its output matched no torch
    tensor by value, was attributed to the next module, and the divergence was named at
    the attention's output projection (dense), whose weights are fine. The SDPA is now
    pinned to torch's F.scaled_dot_product_attention call and named first, and the note
    names the mask and the fix."""
    model, x = _hf("gpt_neox")
    nc = wb.to_ncnn(model, x, workspace=wb.Workspace(tmp_path / "ws"))
    assert nc.diagnostics_with("ncnn-sdpa-byte-mask")
    # accumulated: an isolated run of this candidate crashes as often as not (the SDPA
    # reads past the mask's end), and is then listed as unmeasured
    rep = wb.compare(model, [nc], x, progress=False)
    assert not rep.ok
    div = rep.first_divergence
    assert div.reference == "model.layers.0.attention/F.scaled_dot_product_attention_0"
    assert div.op_type == "SDPA"
    summary = rep.summary()
    assert "(SDPA) takes its mask from" in summary and "attn_implementation" in summary
    # with the eager attention the mask is float: no note, and no divergence
    model.model.config._attn_implementation = "eager"  # read at each forward
    nc2 = wb.to_ncnn(model, x, workspace=wb.Workspace(tmp_path / "ws2"))
    rep2 = wb.compare(model, [nc2], x, progress=False)
    assert rep2.ok and "takes its mask" not in rep2.summary(), rep2.summary()


def test_a_lowered_module_computing_wrongly_is_named_not_the_linear_after_it(tmp_path):
    """A module ncnn runs as several layers (here x - 0.1 * pow(x, 3), pow garbage for
    negative bases) between two Linears: its steps matched nothing and went to the next
    Linear, whose 'isolated' error then came from them. The last step is now pinned to
    the one torch record between the Linears (the module), which is named; the Linear
    after it passes in isolation. The huge values on a few elements are a divergence,
    not "an earlier state of a tensor written in place" (no state equals torch's)."""
    from test_ncnn import _Cubic

    torch.manual_seed(0)
    x = torch.randn(1, 8, 16)
    model = nn.Sequential(nn.Linear(16, 32), _Cubic(False), nn.Linear(32, 16)).eval()
    nc = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [nc], (x,), mode="both", progress=False)
    assert not rep.ok
    for mode in ("accumulated", "isolated"):
        div = rep.first_divergence_in(mode) if hasattr(rep, "first_divergence_in") else next(
            r for r in rep.records if r.mode == mode and not r.metrics.passed)
        assert div.reference == "1", (mode, rep.summary())
    linear = next(r for r in rep.records if r.mode == "isolated" and r.reference == "2"
                  and r.op_type == "Gemm")
    assert linear.metrics.passed
    assert "(BinaryOp pow, exponent 3.0) met" in rep.summary()


class _AbsNorm(nn.Module):
    """x / mean|x|, scaled: ncnn runs it as UnaryOp abs, Reduction, BinaryOps."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        return self.weight * x / (x.abs().mean(-1, keepdim=True) + 1e-3)


def test_an_identity_between_two_aligned_tensors_takes_no_step_of_the_next_call(tmp_path):
    """T5's dropout after the embedding, then its RMSNorm lowered to steps: the one torch
    record between the aligned Linear and the aligned norm is the dropout, equal to the
    Linear's output. Pinning the norm's first step (abs) to it was a false divergence
    (0.73 on a clean model); an identity record takes no step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), _AbsNorm(), nn.Linear(16, 4))
    model.eval()
    x = torch.randn(1, 6, 8)
    nc = wb.to_ncnn(model, (x,), workspace=wb.Workspace(tmp_path / "ws"))
    rep = wb.compare(model, [nc], (x,), mode="both", progress=False)
    assert rep.ok and rep.first_divergence is None, rep.summary()
    (al,) = rep.alignments.values()
    assert not any("pinned by place" in r for r in al.relations.values())


class _ConvGroupNorm(nn.Module):
    """HuBERT's feature extractor head: a Conv1d, a per-channel GroupNorm, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 10, stride=5, bias=False)
        self.norm = nn.GroupNorm(8, 8)
        self.act = nn.GELU()
        self.out = nn.Conv1d(8, 8, 3)

    def forward(self, x):
        return self.out(self.act(self.norm(self.conv(x[:, None]))))


def test_a_conv_named_for_the_norm_reshape_folded_into_it_is_the_convs(tmp_path):
    """onnxslim folds the GroupNorm's Reshape into the Conv before it and names the Conv's
    output '/norm/Reshape_output_0': the Conv read as a step of the norm, attributed, and
    a damaged conv weight was named at the norm's InstanceNormalization. A Conv is its
    weight's module (conv.weight -> conv), whatever its output is called."""
    import numpy as np
    from onnx import numpy_helper

    torch.manual_seed(0)
    model, x = _ConvGroupNorm().eval(), torch.randn(1, 400)
    sim = wb.simplify(wb.export(model, (x,), workspace=wb.Workspace(tmp_path / "ws")))
    proto = onnx.load(str(sim.path))
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    assert conv.output[0] == "/norm/Reshape_output_0"  # the renaming this guards against
    clean = wb.compare(model, [sim], (x,), mode="both", progress=False)
    assert clean.ok and clean.first_divergence is None, clean.summary()
    (al,) = clean.alignments.values()
    assert al.pairs[conv.output[0]] == "conv"
    w = next(t for t in proto.graph.initializer if t.name == "conv.weight")
    arr = numpy_helper.to_array(w).copy()
    arr.reshape(-1)[::4] *= 1.5
    w.CopyFrom(numpy_helper.from_array(arr, "conv.weight"))
    bad = tmp_path / "bad.onnx"
    onnx.save(proto, str(bad))
    rep = wb.compare(model, [bad], (x,), mode="both", progress=False)
    assert rep.first_divergence is not None and rep.first_divergence.reference == "conv", \
        rep.summary()
    assert np.isfinite(rep.first_divergence.metrics.max_abs)
