"""Precision on seeded random weights, and the planted-outlier check: what int8, fp16 and bf16
cost ResNet-50, MobileNetV2 and a ViT, how fast they run, and whether the sensitivity ranking
finds a layer planted to break int8 (issue 18). A labelled check of the ranking with a known
culprit; what precision costs *trained* models, in dB and in their answer, without any plant,
is ``bench/precision_trained.py`` (issue 31).

Models: ``workbench.zoo`` ``resnet50`` (1x3x224x224), ``mobilenet_v2`` (1x3x64x64) and ``vit``
(1x3x32x32); seeded random weights, nothing downloaded. Each is exported to ONNX
(``wb.export``, TorchScript exporter, opset 17) and converted to ncnn (``wb.to_ncnn(model)``;
``to_ncnn(onnx artifact)`` if that raises ConversionError), in a temporary workspace.
MobileNetV2 runs with its 10 residual branches at half amplitude (``condition``: each
residual block's last BatchNorm, reduce_1x1's, weight and bias x0.5; deterministic), in every
row (fp32, int8 on both backends, fp16, bf16, the plant's copy); the float model's noise
gain is printed before and after. Why: the zoo's seeded MobileNetV2 turns a 40 dB input
perturbation into 4.8 dB at its logits (25.5 dB at half amplitude). No block collapses it:
each of the 16 blocks after the stem loses ~1.5 dB (mean of 3 noise seeds: 29.6 dB after the
stem, the input's own level, as its mean counts in the 40 dB and its variation holds -8.4 dB
of its power; 17.6 after layer.5, 11.2 after layer.10, 4.4 after layer.15; at half amplitude
22-25 dB from layer.2 to the pooler). The 10 random residual branches added at full
amplitude are most of it: the same model on uniform noise, the distribution its BatchNorm
statistics were set on, still ends at 8.1 dB; BatchNorm re-estimated on the bench's images,
3.3 dB; a 128 or 224 input (a 4x4 / 7x7 last map instead of 2x2), 11.4 / 15.4 dB. Residual
branches that start small are how deep residual nets are made well-conditioned at
initialisation (zero-init residual: Goyal et al. 2017, torchvision's ``zero_init_residual``);
a trained MobileNetV2 keeps most of a 40 dB SNR.

Calibration: ``--samples`` (default 64) smooth synthetic images, seeded: uniform noise at 1/8
of the input size, upsampled bilinearly to it (not real photographs; nothing here may be
downloaded). ONNX Runtime int8 is ``wb.quantize(onx, samples)``: static QDQ, MinMax,
per-channel weights; ncnn int8 is ``wb.quantize(nc, samples)``: KL table (ncnn2table's
default), ncnn2int8's format, in figure 1; figure 2 uses MinMax for both (below).

1. Accuracy beside speed (``wb.precision_table``): final-output SNR against torch fp32 on one
   held-out smooth image (seed 2; calibration: seed 1; the zoo's example input is uniform
   noise, whose activations overrun ranges calibrated on smooth images), and the latency
   ratio against the same backend's fp32 (median of ``--repeat`` interleaved plain runs in
   this process, ``--threads`` threads for every backend) for ORT int8 (QDQ), ncnn int8,
   ncnn fp16 native, ncnn fp16 storage emulated as on ARM (``NcnnRunner(nc,
   precision="fp16", emulate="arm-fp16")``; storage only, not timed) and ncnn bf16. Printed,
   no target.
2. Sensitivity finds the culprit: in a copy of the model, one tensor gets an outlier channel
   with the float function unchanged (``plant_outlier``): a norm layer's (BatchNorm2d, a ReLU
   may follow; or LayerNorm) output channel is scaled so its largest |activation| is 100x
   the largest of every other channel on the held-out image (in the tensor the readers read:
   after the ReLU), and the Conv2d / Linear layers reading it divide that input channel back.
   The readers must be layers whose input the backend's int8 rounds: every Conv and Linear
   for ONNX Runtime and for ncnn (a Linear on 2-D input is an ncnn InnerProduct, on 3-D input
   a Gemm, whose input ncnn quantizes row by row at run time). Sites are tried from the middle of the model outward,
   one-reader sites first; a site is taken when the float output moves by < 1e-4 of its range
   (so the readers found are all there are: a residual add reading it fails the check); the
   output says which norm of how many it is. Only int8 sees the outlier: one scale for the
   tensor spends its levels on that channel and the others, which carry the signal the
   readers use, fall within a level or two of zero (unless the calibration clips the outlier
   channel instead, as KL may). The copy is exported, converted and quantized again (same
   samples), ``rep = wb.compare(copy, [int8], (x,), mode="both")``; targets, for ORT and ncnn
   each, both calibrated with MinMax (``method="minmax"``, also for the exclude= re-run): the
   issue's scenario is one scale per tensor whose levels go to the outlier, which is what
   MinMax does on either backend. ncnn's default, KL, searches a clip threshold and clips
   the 100x channel instead (on ResNet-50 the plant then cost int8 only 26.5 -> 22.2 dB,
   leaving no 10 dB to recover): that is itself an answer for the user (KL calibration
   handles an outlier channel by clipping it), so ncnn's KL row is printed beside the MinMax
   ones, for information, no target. Each row prints the plant's cost, int8's final SNR
   without the plant (same method, same samples) minus with it, for information: below 10
   dB there are not 10 dB to recover, so a gain >= 10 dB comes partly from the other layers
   excluded (said in a note; on ResNet-50 MinMax's cost was 9.3 dB ORT, 7.5 ncnn on image 2,
   7.7-10.3 and 7.1-8.8 on images 2-9 one by one). Then: ``rep.sensitive(1)``
   is that layer (its module, or a module it covers, is the conv, the norm or the ReLU after
   it: one fused layer; or a reader the plant divided the channel back in, whose weights
   for it are now 1/100: planted too, and marked "(reader)"), and
   ``wb.quantize(..., exclude=rep.sensitive(3))`` raises the final-output SNR by >= 10 dB
   over full int8 (a model with fewer than 4 int8 layers: the largest k that leaves one in
   int8, said in the figure). A miss says which layer ranked first, where the culprit ranked,
   and the SNRs. The ranking is ``wb.compare`` on one held-out image (seed 2); the SNRs of
   the culprit figures are over ``EVAL_IMAGES`` (8) held-out images (seed 2, the first is
   that one): each output's signal and noise power summed over the 8, one SNR. One image's
   figure was not enough: on MobileNetV2's 10 logits it varies by image (ORT, the same int8
   models on images 2-17 one by one: gain 7.1-15.2 dB, median 10.4; two int8 models with
   the same ranges, one conv kept float, differed by -5.6 to +3.5 dB on images 2-9), on
   ResNet-50's 1000 by ~1 dB.
   Beside it, each float model's own sensitivity (``noise_gain``): its output SNR when its
   input gets Gaussian noise at 40 and 60 dB SNR. A model that loses ~35 dB there (the zoo's
   seeded MobileNetV2, before ``condition``) loses as much of int8's rounding, so its int8
   SNR is a few dB whatever the quantizer does, and no plant can cost it 10 dB more.
3. Calibration + quantization time of ResNet-50 (``Artifact.seconds`` of wb.quantize: reading
   the samples, calibrating, writing, the check run) for ORT and ncnn: target < 60 s on 2 cores.

The machine is shared (other work runs on it): the load average is printed at the start and the
end. It is a report, not a test: the exit status is 0 whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/precision.py [--models resnet50,mobilenet_v2,vit]
          [--samples 64] [--repeat 10] [--threads 1] [--skip-culprit]
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from _common import engine_state, print_figures, print_table  # bench/ is on sys.path

MODELS = ("resnet50", "mobilenet_v2", "vit")
OUTLIER = 100.0  # the planted channel's RMS over the others' mean
GAIN_DB = 10.0  # excluding the top 3 must raise the final SNR by this much
QUANT_SECONDS = 60.0  # ResNet-50 calibration + quantization
TOP_K = 3


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# -- inputs ---------------------------------------------------------------------------------------
def smooth_images(shape: tuple[int, ...], n: int, seed: int = 0) -> list[Any]:
    """``n`` seeded images of ``shape`` (1xCxHxW): noise at 1/8 the size, bilinear up, in [0, 1]."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    _, c, h, w = shape
    out = []
    for _ in range(n):
        low = torch.rand(1, c, max(2, h // 8), max(2, w // 8), generator=g)
        out.append(F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False))
    return out


# -- building -------------------------------------------------------------------------------------
@dataclass
class Built:
    onx: Any
    nc: Any
    nc_note: str
    q_ort: Any
    q_nc: Any  # KL (ncnn2table's default): figure 1's ncnn int8 row
    q_nc_minmax: Any = None  # MinMax: the culprit figure's ncnn row (what ORT's row uses)


def build(model: Any, x: tuple, samples: list[Any], ws: Any, minmax: bool = True) -> Built:
    import workbench as wb

    onx = wb.export(model, x, workspace=ws, exporter="torchscript", opset=17)
    note = ""
    try:
        nc = wb.to_ncnn(model, x, workspace=ws)
    except wb.ConversionError as e:
        note = f"to_ncnn(model) failed ({str(e).splitlines()[0][:120]}); ncnn from the ONNX"
        nc = wb.to_ncnn(onx, workspace=ws)
    q_ort = wb.quantize(onx, samples, progress=False)
    q_nc = wb.quantize(nc, samples, progress=False)
    q_mm = wb.quantize(nc, samples, method="minmax", progress=False) if minmax else None
    return Built(onx, nc, note, q_ort, q_nc, q_mm)


# -- MobileNetV2's conditioning -------------------------------------------------------------------
RESIDUAL_SCALE = 0.5  # the seeded MobileNetV2's residual branches, as the bench runs it


def condition(name: str, model: Any) -> str:
    """The bench's MobileNetV2: each residual block's branch scaled by RESIDUAL_SCALE (its
    last BatchNorm's, reduce_1x1's, weight and bias; deterministic, no new random draw).
    The zoo's seeded model adds each of its 10 residual branches at full amplitude: a random
    branch is a fresh random function of its input, and 10 of them in a row turn a 40 dB
    input perturbation into ~5 dB at the logits (no single block collapses: ~1.5-2 dB lost
    per block). Starting residual branches small is how deep residual nets are made
    well-conditioned at initialisation (zero-init residual: Goyal et al. 2017, torchvision's
    ``zero_init_residual``); a trained one is. Every row of the model (fp32, int8 on both
    backends, fp16, bf16, the plant's copy) runs this model. Other models: unchanged.
    Returns what was done ('' for none)."""
    import torch

    if name != "mobilenet_v2":
        return ""
    blocks = [n for n, m in model.named_modules() if getattr(m, "use_residual", False)]
    mods = dict(model.named_modules())
    with torch.no_grad():
        for n in blocks:
            bn = mods[n].reduce_1x1.normalization
            bn.weight *= RESIDUAL_SCALE
            bn.bias *= RESIDUAL_SCALE
    return (f"{len(blocks)} residual branches scaled x{RESIDUAL_SCALE} (their reduce_1x1 "
            "BatchNorm's weight and bias)")


EVAL_IMAGES = 8  # held-out images the culprit figures' SNRs are measured over


def final_snr(model: Any, art: Any, x: tuple | list[tuple]) -> float:
    """The worst final output's SNR of ``art`` against torch on ``x`` (one input tuple), or
    over a list of them: each output's signal and noise power summed over every input, as
    one SNR (a figure from one image's 10 logits moves by several dB from image to image)."""
    import numpy as np

    from workbench.precision.snr import snr_db
    from workbench.runtime import TorchRunner, runner_for

    sets = x if isinstance(x, list) else [x]
    torch_r, runner = TorchRunner(model), runner_for(art)
    refs, gots = [], []
    for args in sets:
        refs.append(list(torch_r.run(tuple(t.clone() for t in args)).values()))
        gots.append(list(runner.run(tuple(t.numpy() for t in args)).values()))
    return min(snr_db(np.concatenate([np.ravel(r[i]) for r in refs]),
                      np.concatenate([np.ravel(g[i]) for g in gots]))
               for i in range(len(refs[0])))


NOISE_DB = (40.0, 60.0)  # input perturbations for noise_gain


def noise_gain(model: Any, x: tuple, db: float, seeds: int = 3) -> float:
    """The float model's own sensitivity: the mean final-output SNR (vs its clean output)
    when its input gets seeded Gaussian noise at ``db`` SNR. A model that turns a 40 dB
    perturbation into a few dB at its output turns int8's rounding (each layer's at 30-40 dB)
    into as little, whatever the quantizer does."""
    import torch

    from workbench.precision.snr import snr_db

    with torch.no_grad():
        clean = model(*[t.clone() for t in x]).numpy()
        out = []
        for seed in range(seeds):
            g = torch.Generator().manual_seed(seed)
            noisy = []
            for t in x:
                n = torch.randn(t.shape, generator=g)
                noisy.append(t + n * t.pow(2).mean().sqrt() / n.pow(2).mean().sqrt()
                             * 10 ** (-db / 20))
            out.append(snr_db(clean, model(*noisy).numpy()))
    return sum(out) / len(out)


# -- the planted outlier --------------------------------------------------------------------------
@dataclass
class Plant:
    module: str  # the norm layer whose output channel was scaled up
    producer: str  # the Conv2d / Linear before it (the norm itself when there is none)
    channel: int
    factor: float
    ratio: float  # the channel's max |activation| over the largest other channel's, after
    # the layers that divide it back (with the norm / activation fused into each)
    readers: list[str] = field(default_factory=list)
    drift: float = 0.0  # max |output change| / max |output| of the float model
    # the modules whose output holds the outlier: the producer, the norm, a ReLU after it
    # (ONNX and ncnn fuse them into one layer)
    carriers: list[str] = field(default_factory=list)
    rms_ratio: float = 0.0  # the channel's RMS over the others' mean RMS
    where: str = ""  # "norm k of n" in call order


def _execution_order(model: Any, x: tuple) -> list[str]:
    """The leaf modules in call order."""
    import torch

    names = {m: n for n, m in model.named_modules()}
    order: list[str] = []

    def hook(mod: Any, args: Any) -> None:
        order.append(names[mod])

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_pre_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            model(*[t.clone() for t in x])
    finally:
        for h in handles:
            h.remove()
    return order


def _channel_peaks(model: Any, module: str, x: tuple) -> tuple[Any, Any]:
    """Per channel of ``module``'s output (the tensor int8 rounds when it is the one the
    readers read): max |activation| and RMS on ``x``."""
    import torch

    mod = dict(model.named_modules())[module]
    got: dict[str, Any] = {}

    def hook(_m: Any, _i: Any, out: Any) -> None:
        got.setdefault("out", out.detach())

    h = mod.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(*[t.clone() for t in x])
    finally:
        h.remove()
    out = got["out"]
    axis = 1 if out.dim() == 4 else out.dim() - 1  # NCHW convs; (..., C) Linears
    dims = [d for d in range(out.dim()) if d != axis]
    return out.abs().amax(dim=dims), out.pow(2).mean(dim=dims).sqrt()


def _sites(model: Any, order: list[str]) -> list[tuple[str, str, list[str]]]:
    """(norm, carrier, readers) candidates: an affine BatchNorm2d (``carrier`` the ReLU
    after it, when one follows: the tensor the readers read) or LayerNorm, and the run of
    Conv2d (groups 1) / Linear modules right after it that take its channels; whether they
    are its only readers the float check decides (``plant_outlier``). Both backends' int8
    rounds these readers' inputs: ONNX Runtime's QDQ every Conv and MatMul/Gemm input; this
    workbench's ncnn writer (ncnn2int8's format for Convolution, ConvolutionDepthWise,
    InnerProduct, Gemm and MultiHeadAttention) a Conv2d's, a Linear's on 2-D input (pnnx makes
    it an InnerProduct) and on 3-D input (an ncnn Gemm: its input quantized row by row at
    run time)."""
    from torch import nn

    mods = dict(model.named_modules())
    seq = list(dict.fromkeys(order))
    out = []
    for i, name in enumerate(seq):
        m = mods[name]
        if isinstance(m, nn.BatchNorm2d) and m.affine:
            c = m.num_features
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine and m.weight.dim() == 1:
            c = m.normalized_shape[-1]
        else:
            continue
        j, carrier = i + 1, name
        if j < len(seq) and isinstance(mods[seq[j]], nn.ReLU) and isinstance(m, nn.BatchNorm2d):
            carrier = seq[j]
            j += 1
        readers = []
        while j < len(seq):
            r = mods[seq[j]]
            if isinstance(r, nn.Conv2d) and r.groups == 1 and r.in_channels == c or \
                    isinstance(r, nn.Linear) and r.in_features == c:
                readers.append(seq[j])
                j += 1
            else:
                break
        if readers:
            out.append((name, carrier, readers))
    return out


def plant_outlier(model: Any, x: tuple, backend: str) -> tuple[Any, Plant]:
    """A copy of ``model`` whose float function is unchanged but one mid-network tensor
    carries an outlier channel: a norm layer's output channel (its affine weight and bias)
    scaled so that channel's largest |activation| is 100x the largest of every other
    channel (the tensor the readers read: after the ReLU when one follows), and the layers
    reading it divide that input channel back (a ReLU between commutes with a positive
    scale). Only int8 sees it: one scale for the tensor spends its levels on that channel,
    the others (which carry the signal the readers use) fall within a level or two of zero,
    unless a calibration clips the outlier channel instead. The readers must be layers whose
    input ``backend``'s int8 rounds (``_sites``). Sites are tried from the middle of the
    model outward, those with one reader first; a site is taken when the float output moves
    by < 1e-4 of its range (the readers found are all there are)."""
    import torch
    from torch import nn

    order = _execution_order(model, x)
    sites = _sites(model, order)
    if not sites:
        raise RuntimeError(f"no norm layer whose readers {backend}'s int8 rounds can divide "
                           "an outlier back")
    ref = model(*[t.clone() for t in x]).detach()
    all_norms = [n for n in dict.fromkeys(order) if isinstance(
        dict(model.named_modules())[n], (nn.BatchNorm2d, nn.LayerNorm))]
    mid = (len(all_norms) - 1) / 2  # the middle of the model, not of the sites found
    ranked = sorted(range(len(sites)), key=lambda i: (
        len(sites[i][2]) > 1, abs(all_norms.index(sites[i][0]) - mid)))
    for i in ranked:
        target, carrier, readers = sites[i]
        m = copy.deepcopy(model)
        mods = dict(m.named_modules())
        peak, _ = _channel_peaks(m, carrier, x)
        c = int(torch.argmax(peak))
        factor = OUTLIER * float(torch.cat([peak[:c], peak[c + 1:]]).max()) / float(peak[c])
        with torch.no_grad():
            mods[target].weight[c] *= factor
            mods[target].bias[c] *= factor
            for r in readers:
                mods[r].weight[:, c] /= factor
            got = m(*[t.clone() for t in x])
        drift = float((got - ref).abs().max() / ref.abs().max())
        if drift > 1e-4:
            continue
        peak, rms = _channel_peaks(m, carrier, x)
        ratio = float(peak[c]) / float(torch.cat([peak[:c], peak[c + 1:]]).max())
        rms_ratio = float(rms[c]) / float(torch.cat([rms[:c], rms[c + 1:]]).mean())
        k = order.index(target)
        before = order[k - 1] if k else target
        producer = before if isinstance(mods[before], (nn.Conv2d, nn.Linear)) else target
        carriers = list(dict.fromkeys([producer, target, carrier]))
        # each reader's layer: the conv and the norm / activation modules right after it
        # (fused into it by ONNX and ncnn; its record may name the last of them)
        fused = []
        for r in readers:
            j = order.index(r) + 1
            while j < len(order) and isinstance(mods[order[j]], (
                    nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.Hardtanh)):
                fused.append(order[j])
                j += 1
        where = all_norms.index(target) + 1
        return m, Plant(target, producer, c, factor, ratio, [*readers, *fused], drift,
                        carriers, rms_ratio, f"norm {where} of {len(all_norms)}")
    raise RuntimeError(f"none of {len(sites)} norm layers can carry an outlier with the float "
                       "output unchanged")


@dataclass
class Culprit:
    backend: str
    rank: int | None  # 1-based rank of the first record covering the planted module
    top: list[tuple[str, str, float | None, float]]  # (reference, node, final dB, isolated dB)
    full_db: float
    excluded_db: float | None  # wb.quantize(..., exclude=rep.sensitive(3)); None: it raised
    excluded: list[str]
    seconds: float
    covered_by: str = ""
    error: str = ""  # what wb.quantize(exclude=rep.sensitive(3)) raised
    k: int = TOP_K  # the k of the excluded figure (< TOP_K when TOP_K left no int8 layer)
    # the culprit's own entry: (final dB, isolated dB)
    hit_db: tuple[float | None, float | None] = (None, None)
    plant: Plant | None = None
    method: str = "minmax"  # the calibration of the int8 model and of its exclude= re-run
    clean_db: float | None = None  # the same int8 (same method) of the model without the plant
    target: bool = True  # False: printed for information (ncnn's KL row), no target

    @property
    def cost_db(self) -> float | None:
        """What the plant costs int8: its SNR without the plant minus with it."""
        return None if self.clean_db is None else self.clean_db - self.full_db


def _carries(rec: Any, plant: Plant) -> bool:
    """The record of the planted layer: its module (or a module it covers) is one whose
    output holds the outlier (the conv, the norm, a ReLU after it: one fused layer)."""
    from workbench.comparison.align import call_module

    return any(call_module(n) in plant.carriers for n in (rec.reference, *rec.covers))


def _reads(rec: Any, plant: Plant) -> bool:
    """The record of a layer the plant divided the outlier back in (its weights for that
    input channel are 1/100 of what they were: planted too, and int8 rounds them)."""
    from workbench.comparison.align import call_module

    return any(call_module(n) in plant.readers for n in (rec.reference, *rec.covers))


def culprit_run(model: Any, x: tuple, evals: list[tuple], q: Any, parent: Any,
                samples: list[Any], backend: str, plant: Plant, method: str,
                clean_db: float | None, target: bool) -> Culprit:
    import workbench as wb

    t0 = time.perf_counter()
    rep = wb.compare(model, [q], x, mode="both", progress=False)
    sens = rep.sensitivity(progress=False)
    rank = next((i + 1 for i, s in enumerate(sens) if _carries(s.record, plant)
                 or _reads(s.record, plant)), None)
    top = [(s.record.reference, s.record.node, s.final_snr_db, s.isolated_snr_db)
           for s in sens[:TOP_K]]
    how, hit_db = "", (None, None)
    if rank:
        hit = sens[rank - 1]
        hit_db = (hit.final_snr_db, hit.isolated_snr_db)
        how = hit.record.reference + (f" (via {', '.join(hit.via)})" if hit.via else "") + (
            "" if _carries(hit.record, plant) else " (a reader: its weights divided back)")
    c = Culprit(backend, rank, top, final_snr(model, q, evals), None, [], 0.0, how, plant=plant,
                hit_db=hit_db, method=method, clean_db=clean_db, target=target)
    # top 3; when keeping them float leaves no layer in int8 (a model with fewer int8
    # layers: quantize refuses a model it would not quantize), the largest k that does not
    for k in range(TOP_K, 0, -1):
        try:
            qx = wb.quantize(parent, samples, method=method, exclude=rep.sensitive(k),
                             progress=False)
        except wb.InputError as e:
            if "would run in int8" not in e.message or k == 1:
                raise
            c.error = c.error or f"{type(e).__name__}: {e.message.splitlines()[0][:240]}"
            continue
        c.excluded_db, c.excluded, c.k = (final_snr(model, qx, evals),
                                          list(qx.params["exclude"]), k)
        break
    c.seconds = time.perf_counter() - t0
    return c


# -- the run --------------------------------------------------------------------------------------
@dataclass
class ModelResult:
    name: str
    table: Any = None
    quant_seconds: dict[str, float] = field(default_factory=dict)
    plants: list[Plant] = field(default_factory=list)
    culprits: list[Culprit] = field(default_factory=list)
    noise_gain: dict[float, float] = field(default_factory=dict)
    # backend: (median isolated SNR of its int8 layers, layers, layers >= 20 dB)
    layer_snr: dict[str, tuple[float, int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    conditioning: str = ""  # what ``condition`` did to the zoo's model ('' nothing)
    zoo_noise_gain: dict[float, float] = field(default_factory=dict)  # before it


def run_model(name: str, args: argparse.Namespace, root: str) -> ModelResult:
    import workbench as wb
    from workbench import zoo
    from workbench.runtime import NcnnRunner

    res = ModelResult(name)
    model, example = zoo.get(name)
    samples = smooth_images(tuple(example[0].shape), args.samples, seed=1)
    # measured on a held-out image of the calibration's kind: the zoo's example input is
    # uniform noise, whose activations overrun ranges calibrated on smooth images
    x = tuple(smooth_images(tuple(example[0].shape), 1, seed=2))
    # the culprit figures' SNRs: over EVAL_IMAGES held-out images (x is the first)
    evals = [(im,) for im in smooth_images(tuple(example[0].shape), EVAL_IMAGES, seed=2)]
    zoo_gain = {db: noise_gain(model, x, db) for db in NOISE_DB}
    res.conditioning = condition(name, model)
    res.noise_gain = {db: noise_gain(model, x, db) for db in NOISE_DB} \
        if res.conditioning else zoo_gain
    if res.conditioning:
        res.zoo_noise_gain = zoo_gain
        print(f"[{name}] the zoo's model, input perturbed at " + ", ".join(
            f"{db:.0f} dB SNR -> output {v:.1f} dB" for db, v in zoo_gain.items())
            + f"; the bench runs it with {res.conditioning}", flush=True)
    print(f"[{name}] float model, input perturbed at " + ", ".join(
        f"{db:.0f} dB SNR -> output {v:.1f} dB" for db, v in res.noise_gain.items()),
        flush=True)
    ws = wb.Workspace(os.path.join(root, name))
    t0 = time.perf_counter()
    b = build(model, x, samples, ws)
    if b.nc_note:
        res.notes.append(f"{name}: {b.nc_note}")
    res.quant_seconds = {"onnxruntime": b.q_ort.seconds, "ncnn": b.q_nc.seconds}
    print(f"[{name}] built in {time.perf_counter() - t0:.0f} s (quantize: ORT "
          f"{b.q_ort.seconds:.1f} s, ncnn {b.q_nc.seconds:.1f} s KL, "
          f"{b.q_nc_minmax.seconds:.1f} s MinMax); load {load()}", flush=True)
    # the int8 SNR of the model without the plant, per culprit row's calibration
    clean = {("onnxruntime", "minmax"): final_snr(model, b.q_ort, evals),
             ("ncnn", "minmax"): final_snr(model, b.q_nc_minmax, evals),
             ("ncnn", "kl"): final_snr(model, b.q_nc, evals)}
    cands = [b.onx, b.q_ort, b.nc, b.q_nc, NcnnRunner(b.nc, precision="fp16"),
             NcnnRunner(b.nc, precision="fp16", emulate="arm-fp16"),
             NcnnRunner(b.nc, precision="bf16")]
    res.table = wb.precision_table(model, cands, x, repeat=args.repeat, warmup=2,
                                   threads=args.threads, progress=False)
    print(res.table, flush=True)
    if res.noise_gain[NOISE_DB[0]] < 20:  # the model amplifies noise: what each layer costs
        rep = wb.compare(model, [b.q_ort, b.q_nc], x, mode="isolated", progress=False)
        for backend, cand in zip(("onnxruntime", "ncnn"), rep.alignments, strict=True):
            # as the sensitivity ranking pairs them (a QDQ tensor as its float parent's)
            snrs = sorted(t.isolated_snr_db for t in rep.sensitivity(cand, progress=False)
                          if t.final_snr_db is not None)
            if snrs:
                res.layer_snr[backend] = (snrs[len(snrs) // 2], len(snrs),
                                          sum(v >= 20 for v in snrs))
        print(f"[{name}] int8 layers' own (isolated) SNR: " + ", ".join(
            f"{k} median {v[0]:.1f} dB, {v[2]} of {v[1]} >= 20 dB"
            for k, v in res.layer_snr.items()), flush=True)
    if args.skip_culprit:
        return res
    built: dict[tuple[str, int], tuple[Any, Built]] = {}
    plants: dict[str, tuple[Any, Plant]] = {}
    # the targets are on MinMax, both backends (one scale per tensor, spent on the outlier:
    # the scenario); ncnn's KL (ncnn2table's default) beside it, for information
    for backend, method, target in (("onnxruntime", "minmax", True), ("ncnn", "minmax", True),
                                    ("ncnn", "kl", False)):
        try:
            if backend not in plants:
                plants[backend] = plant_outlier(model, x, backend)
                plant = plants[backend][1]
                res.plants.append(plant)
                print(f"[{name}] {backend}: outlier planted in {plant.module} ({plant.where}) "
                      f"channel {plant.channel}, read by {plant.readers} (x{plant.factor:.1f}: "
                      f"max |activation| {plant.ratio:.1f}x the largest other channel's, RMS "
                      f"{plant.rms_ratio:.1f}x the others' mean)", flush=True)
            m2, plant = plants[backend]
            key = (plant.module, plant.channel)
            if key not in built:
                ws2 = wb.Workspace(os.path.join(root, f"{name}-outlier-{len(built)}"))
                built[key] = (m2, build(m2, x, samples, ws2))
            m2, b2 = built[key]
            q, parent = (b2.q_ort, b2.onx) if backend == "onnxruntime" else (
                b2.q_nc_minmax if method == "minmax" else b2.q_nc, b2.nc)
            c = culprit_run(m2, x, evals, q, parent, samples, backend, plant, method,
                            clean[(backend, method)], target)
        except Exception as e:  # noqa: BLE001 - a report: say what failed, go on
            res.errors.append(f"{name} {backend} {method} culprit: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:300]}")
            traceback.print_exc()
            continue
        res.culprits.append(c)
        print(f"[{name}] {backend} {method}: plant's cost: int8 {_fmt(c.clean_db)} dB without "
              f"it -> {c.full_db:.1f} dB with it (it costs {_fmt(c.cost_db)} dB); culprit "
              f"rank {c.rank}, top {c.top}, SNR full {c.full_db:.1f} dB -> excluded top {c.k} "
              f"{_fmt(c.excluded_db)} dB {c.error} ({c.seconds:.0f} s)", flush=True)
    return res


def _fmt(v: float | None, f: str = "{:.1f}") -> str:
    return "-" if v is None else ("inf" if math.isinf(v) else f.format(v))


def report(results: list[ModelResult], args: argparse.Namespace, load_start: str) -> None:
    rows = [["model", "candidate", "SNR vs torch dB", "dB vs fp32", "latency ms",
             "speed-up vs fp32", "note"]]
    for r in results:
        if r.table is None:
            continue
        for row in r.table.rows:
            rows.append([r.name, row.label, _fmt(row.snr_db), _fmt(row.snr_delta_db, "{:+.1f}"),
                         _fmt(row.latency_ms, "{:.2f}"), _fmt(row.speedup, "{:.2f}x"),
                         ("bit-identical to fp32" if "bit-identical" in row.note else
                          "emulated, not timed" if row.latency_ms is None else "")])
    print("\naccuracy and speed (no target; final outputs on a held-out smooth image, "
          f"{args.threads} thread(s) per backend, median of {args.repeat} interleaved runs)")
    print_table(rows)

    figures = [["figure", "target", "measured", "result"]]
    passed: list[str] = []
    failed: list[str] = []
    missing: list[str] = []
    notes: list[str] = []

    def add(label: str, target: str, measured: str, ok: bool | None) -> None:
        result = "n/a" if ok is None else "PASS" if ok else "FAIL"
        figures.append([label, target, measured, result])
        (missing if ok is None else passed if ok else failed).append(label)

    def info(label: str, measured: str) -> None:
        """A row printed for information: no target, not counted in the summary."""
        figures.append([label, "(information)", measured, "info"])

    for r in results:
        for c in r.culprits:
            tag = f"{r.name} {c.backend} {c.method}"
            put = add if c.target else (lambda label, _t, measured, _ok: info(label, measured))
            # what the gain is worth: a plant that costs int8 < 10 dB leaves < 10 dB to
            # recover, and a gain >= 10 dB then comes partly from the other layers excluded
            info(f"{tag}: the plant's cost (int8 without -> with it)",
                 f"{_fmt(c.cost_db)} dB ({_fmt(c.clean_db)} -> {_fmt(c.full_db)})")
            if c.target and c.cost_db is not None and c.cost_db < GAIN_DB:
                notes.append(f"  {tag}: the plant costs int8 only {_fmt(c.cost_db)} dB: part "
                             f"of the gain comes from the other {c.k - 1} layer(s) excluded "
                             f"(excluded {_fmt(c.excluded_db)} dB against "
                             f"{_fmt(c.clean_db)} dB for int8 without the plant)")
            put(f"{tag}: culprit ranked first", "rank 1",
                (f"rank {c.rank}" + (" (reader)" if "a reader" in c.covered_by else ""))
                if c.rank else "not ranked", c.rank == 1)
            gain = None if c.excluded_db is None else c.excluded_db - c.full_db
            put(f"{tag}: SNR gain, exclude=rep.sensitive({c.k})" + (
                f" (top {TOP_K} leaves no int8 layer)" if c.k != TOP_K else ""),
                f">= +{GAIN_DB:.0f} dB", "quantize raised" if gain is None else
                f"{gain:+.1f} dB ({_fmt(c.full_db)} -> {_fmt(c.excluded_db)})",
                gain is not None and gain >= GAIN_DB)
            if c.error:
                notes.append(f"  {tag}: wb.quantize(exclude=rep.sensitive({TOP_K})) raised "
                             f"{c.error}")
            if c.rank != 1 or gain is None or gain < GAIN_DB:
                first = c.top[0] if c.top else None
                notes.append(
                    f"  {tag}: planted {c.plant.module} (channel {c.plant.channel}; int8 SNR "
                    f"{_fmt(c.full_db)} dB with it, {_fmt(c.clean_db)} dB without); ranked "
                    f"first: {first[0] if first else '-'} (layer {first[1] if first else '-'}, "
                    f"final {_fmt(first[2] if first else None)} dB, isolated "
                    f"{_fmt(first[3] if first else None)} dB); culprit at rank "
                    f"{c.rank} ({c.covered_by or 'no record covers it'}; final "
                    f"{_fmt(c.hit_db[0])} dB, isolated {_fmt(c.hit_db[1])} dB); top {TOP_K}: "
                    f"{[t[0] for t in c.top]} -> excluded {c.excluded or '-'}; full int8 "
                    f"{_fmt(c.full_db)} dB, excluded {_fmt(c.excluded_db)} dB")
        for backend in ("onnxruntime", "ncnn"):
            if r.table is not None and not any(c.backend == backend and c.target
                                               for c in r.culprits):
                add(f"{r.name} {backend} minmax: culprit", "rank 1, +10 dB", "failed to run",
                    None)
    for r in results:
        if r.name == "resnet50":
            for backend, s in r.quant_seconds.items():
                add(f"resnet50 {backend}: calibration + quantization ({args.samples} samples)",
                    f"< {QUANT_SECONDS:.0f} s", f"{s:.1f} s", s < QUANT_SECONDS)
    for r in results:
        if r.zoo_noise_gain:
            notes.append(f"  {r.name}: the zoo's model, input perturbed with Gaussian noise at "
                         + ", ".join(f"{db:.0f} dB SNR -> output {v:.1f} dB"
                                     for db, v in r.zoo_noise_gain.items())
                         + f"; the bench runs it (every row) with {r.conditioning}")
        if r.noise_gain:
            notes.append(f"  {r.name}: the float model itself, input perturbed with Gaussian "
                         "noise at " + ", ".join(f"{db:.0f} dB SNR -> output {v:.1f} dB"
                                                 for db, v in r.noise_gain.items())
                         + (f" (it amplifies any perturbation by ~{40 - r.noise_gain[40.0]:.0f}"
                            " dB: int8's rounding too, whatever the quantizer does)"
                            if r.noise_gain.get(40.0, 99) < 20 else "")
                         + "".join(f"; {k} int8 layers' own (isolated) SNR median {v[0]:.1f}"
                                   f" dB ({v[2]} of {v[1]} >= 20 dB)"
                                   for k, v in r.layer_snr.items()))
        seen: set[str] = set()
        for c in r.culprits:
            p = c.plant
            if p is None or c.backend in seen:  # ncnn's KL row: the same plant
                continue
            seen.add(c.backend)
            notes.append(f"  {r.name} {c.backend}: the plant: {p.module} ({p.where}) channel "
                         f"{p.channel} x{p.factor:.1f} (max |activation| {p.ratio:.0f}x the "
                         f"largest other channel's, RMS {p.rms_ratio:.0f}x), read by "
                         f"{p.readers}, layers whose input {c.backend}'s int8 rounds"
                         + ("" if c.backend == "onnxruntime" else
                            " (Conv2d; Linear on 2-D input = InnerProduct, on 3-D input = "
                            "Gemm)"))
        notes.extend(f"  {n}" for n in r.notes)
        notes.extend(f"  ERROR {e}" for e in r.errors)
    print("\nfigures")
    print_figures(figures, passed, failed, missing,
                  ["notes:" if notes else "", *notes,
                   f"load average (1, 5, 15 min): start {load_start}, end {load()}; "
                   f"os.cpu_count()={os.cpu_count()}",
                   engine_state()])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-culprit", action="store_true")
    args = p.parse_args()
    if not 1 <= args.samples <= 64:
        sys.exit("--samples: 1 to 64 (the issue calibrates on <= 64)")
    load_start = load()
    print(f"bench/precision.py: models {args.models}; {args.samples} smooth synthetic "
          f"calibration images (seeded noise at 1/8 size, bilinear up; not photographs); "
          f"load average {load_start}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as root:
        for name in args.models.split(","):
            try:
                results.append(run_model(name, args, root))
            except Exception as e:  # noqa: BLE001 - a report: say what failed, go on
                traceback.print_exc()
                r = ModelResult(name)
                r.errors.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                results.append(r)
    report(results, args, load_start)


if __name__ == "__main__":
    main()
