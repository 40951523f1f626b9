"""What the phone computes: ncnn's own aarch64 build under QEMU user mode (the ARM target of
``NcnnRunner``) beside this machine's ncnn, on an fp16 overflow probe, a ResNet-18-shaped and
a ViT-small-shaped model, and what the emulation costs (issue 32, "Benchmarks").

1. The overflow probe: a Linear(64, 1) with weights alternating +-250 and bias 1, fed a 1-D
   input of 64 x 250 (exact result 1; fp16 partial sums pass 65504). Run on x86 fp32, x86
   fp16, ARM fp32, ARM fp16 storage and ARM fp16 arithmetic (arm64-v8.2): inf/NaN only in
   the last. ``wb.compare(model, [x86 fp32, ARM fp16], (x,), mode="both")`` must name that
   layer as the first divergence; ``wb.ncnn_featmask(nc, rep.fp16_unsafe().layers,
   fp16_arithmetic=False)`` must give the exact 1 back on ARM fp16.
2. Accuracy, one table: output max abs and SNR against torch fp32 for x86 fp32, x86 fp16
   (what ncnn runs here when asked), x86 fp16 storage emulated (``emulate="arm-fp16"``),
   x86 bf16, ARM fp32, ARM fp16 storage, ARM fp16 arithmetic (arm64-v8.2), ARM bf16
   (arm64-v8.6), ARM int8 (arm64-v8.2) and x86 int8 (the same int8 model, from
   ``wb.quantize(nc, samples, backend="ncnn")``: KL, 8 seeded calibration images; both int8
   rows with fp32 elsewhere, so they differ only by ncnn's int8 kernels; a note says whether
   they are bit-identical), and beside them ARM int8 with ncnn's defaults elsewhere (fp16
   storage and arithmetic: what the phone runs). "ran as" is ``runner.flags.label``. Check: ARM fp32 within 1e-4 of x86 fp32, relative (max abs
   difference / max |x86 output|). An ARM fp16-arithmetic run with inf/NaN is compared op by
   op and ``rep.fp16_unsafe()`` printed.
3. Emulation cost, on the ResNet-18-shaped model: ARM capture="all" wall time / native x86
   capture="all" (fp32 and fp16), the first run on a fresh emulated worker (cold: QEMU,
   the aarch64 Python, ``import numpy, ncnn``, the model's load) and a second one (warm)
   apart; and ``wb.compare(model, [NcnnRunner(nc, precision="fp16", target="arm64-v8.2")],
   (x,), mode="both")``, cold and warm, each against the issue's 90 s on 2 cores, with where
   the time went (the worker's start and the twin's creation, the capture, the isolated
   passes, the rest: torch's capture, alignment, measuring) and the CPU time the emulated
   worker and this process used (wall time on a loaded machine is mostly waiting: the CPU
   says what the comparison needs).

Models (plain torch, seeded; nothing downloaded; torchvision is not installed):

- ``resnet18``: torchvision's ResNet-18 layout (7x7 stem, max pool, BasicBlocks 2-2-2-2 at
  64-128-256-512, average pool, 1000 logits), 1x3x224x224 (``--quick``: 64x64). Seeded
  weights are scaled as a trained network's are, not as an initialiser leaves them: every
  BatchNorm's statistics are estimated from the 8 calibration images (one train-mode pass,
  ``momentum=None``), so its output is normalised as in a trained net and pnnx's folding of
  it into the conv gives weights of a trained net's size (no folded 1/sqrt(1e-5) blow-ups);
  gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1^2), and each residual branch's last BatchNorm gamma
  x 0.3 (trained ResNets keep residual branches small; at full size the stream grows block
  by block); the head rescaled so the logits' std is 3 (max |logit| ~10, an ImageNet
  classifier's).
- ``vit``: ViT-small's widths (patch-16 conv embedding, hidden 384, 6 heads, MLP 1536 with
  GELU, a class token, learned position embeddings, pre-norm blocks with
  ``nn.MultiheadAttention``, final LayerNorm, 1000 logits from the class token), its 12
  blocks. Cut: the input, 112x112 (49 patches + class token) instead of 224x224 (196 + 1),
  so each emulated run takes under a minute, not several (``--quick``: depth 2, 64x64).
  Weights: Linear/conv N(0, 1/fan_in) (unit gain: activations neither shrink nor grow
  layer by layer), the q and k projections x2 (attention logits std ~2-3, a trained ViT's
  peaked attention rather than an initialiser's uniform one), position embeddings N(0, 1)
  and class token N(0, 1), two residual channels carried at +-30 by the patch embedding's
  bias (trained ViTs carry a few such outlier dimensions in their residual stream); the head
  rescaled to logits std 3.

Inputs: smooth seeded images (noise at 1/8 of the size, bilinear up), ImageNet-normalised;
the evaluated one (seed 2) is held out from the calibration images (seed 1).

Emulated time is not phone time: QEMU runs ncnn's ARM kernels 100-250x slower than native,
and its timing says nothing of a phone's. The machine is shared (2 cores): the load average
is printed beside every timing. A report, not a test: the exit status is 0 whatever the
figures say.

Run:  cd /work/main && .venv/bin/python bench/arm.py [--quick] [--models resnet18,vit]
          [--figures 1,2,3]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

from _common import engine_state, print_table  # bench/ is on sys.path

MODELS = ("resnet18", "vit")
V82, V86 = "arm64-v8.2", "arm64-v8.6"
REL_TOL = 1e-4  # ARM fp32 vs x86 fp32, max abs difference / max |x86 output|
COMPARE_SECONDS = 90.0  # the target for a ResNet-18-shaped compare on ARM fp16
CALIBRATION = 8
SEED = 0
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def check(ok: bool, label: str, passed: list[str], failed: list[str]) -> None:
    (passed if ok else failed).append(label)
    print(f"  {'PASS' if ok else 'FAIL'}: {label}")


# -- inputs -----------------------------------------------------------------------------------------
def images(size: int, n: int, seed: int) -> list[Any]:
    """``n`` seeded smooth images 1x3xSxS (noise at 1/8 the size, bilinear up), normalised."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    out = []
    for _ in range(n):
        low = torch.rand(1, 3, max(2, size // 8), max(2, size // 8), generator=g)
        img = F.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
        out.append((img - mean) / std)
    return out


# -- models -----------------------------------------------------------------------------------------
def resnet18(size: int, calibration: list[Any]) -> Any:
    """torchvision's ResNet-18 layout, seeded, its BatchNorms set from ``calibration``."""
    import torch
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            skip = x if self.downsample is None else self.downsample(x)
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + skip)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths, cin, layers = (64, 128, 256, 512), 64, []
            for i, w in enumerate(widths):
                layers.append(nn.Sequential(Basic(cin, w, 1 if i == 0 else 2), Basic(w, w, 1)))
                cin = w
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.fc = nn.Linear(512, 1000)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(SEED)
    model = ResNet18()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(0.1 * torch.randn(m.num_features, generator=g))
                if name.endswith("bn2"):  # a residual branch's last: small, as trained
                    m.weight.mul_(0.3)
                m.reset_running_stats()
                m.momentum = None  # cumulative: the statistics of the one pass below
        model.train()
        model(torch.cat(calibration))
        model.eval()
        _scale_head(model.fc, torch.flatten(nn.functional.adaptive_avg_pool2d(
            _features(model, torch.cat(calibration)), 1), 1))
    return model


def _features(model: Any, x: Any) -> Any:
    import torch

    x = model.maxpool(torch.relu(model.bn1(model.conv1(x))))
    return model.layer4(model.layer3(model.layer2(model.layer1(x))))


def _scale_head(fc: Any, feats: Any, std: float = 3.0) -> None:
    """Rescale a Linear head so its outputs on ``feats`` have standard deviation ``std``."""
    import torch

    with torch.no_grad():
        fc.bias.zero_()
        fc.weight.mul_(std / float(fc(feats).std()))


def vit_small(size: int, depth: int, calibration: list[Any]) -> Any:
    """ViT-small's widths (384 hidden, 6 heads, MLP 1536), ``depth`` pre-norm blocks."""
    import torch
    from torch import nn

    hidden, heads, mlp, patch = 384, 6, 1536, 16

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(hidden)
            self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
            self.norm2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, mlp)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(mlp, hidden)

        def forward(self, x: Any) -> Any:
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.fc2(self.act(self.fc1(self.norm2(x))))

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            tokens = (size // patch) ** 2 + 1
            self.patch_embed = nn.Conv2d(3, hidden, patch, patch)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden))
            self.pos_embed = nn.Parameter(torch.zeros(1, tokens, hidden))
            self.blocks = nn.Sequential(*[Block() for _ in range(depth)])
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, 1000)

        def tokens(self, img: Any) -> Any:
            x = self.patch_embed(img).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            return self.norm(self.blocks(x + self.pos_embed))

        def forward(self, img: Any) -> Any:
            return self.head(self.tokens(img)[:, 0])

    torch.manual_seed(SEED)
    model = ViT()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / math.sqrt(fan_in))
                m.bias.copy_(0.02 * torch.randn(m.bias.shape, generator=g))
            elif isinstance(m, nn.MultiheadAttention):
                w = torch.randn(m.in_proj_weight.shape, generator=g) / math.sqrt(hidden)
                w[: 2 * hidden] *= 2.0  # q and k: a trained ViT's peaked attention
                m.in_proj_weight.copy_(w)
                m.in_proj_bias.zero_()
                m.out_proj.weight.copy_(torch.randn(m.out_proj.weight.shape, generator=g)
                                        / math.sqrt(hidden))
                m.out_proj.bias.zero_()
        model.cls_token.copy_(torch.randn(model.cls_token.shape, generator=g))
        model.pos_embed.copy_(torch.randn(model.pos_embed.shape, generator=g))
        model.patch_embed.bias[:2] = torch.tensor([30.0, -30.0])  # outlier channels
        model.eval()
        _scale_head(model.head, model.tokens(torch.cat(calibration))[:, 0])
    return model


# -- figures ----------------------------------------------------------------------------------------
def out_stats(ref: Any, got: Any) -> dict[str, Any]:
    """max abs and SNR (dB) of ``got`` against ``ref``, and how many values are inf/NaN."""
    import numpy as np

    a = np.asarray(ref, np.float64).reshape(-1)
    b = np.asarray(got, np.float64).reshape(-1)
    bad = int((~np.isfinite(b)).sum())
    if bad:
        return {"max_abs": math.inf, "snr": -math.inf, "bad": bad, "n": b.size}
    noise = float(((a - b) ** 2).sum())
    snr = math.inf if noise == 0 else 10 * math.log10(float((a ** 2).sum()) / noise)
    return {"max_abs": float(np.abs(a - b).max()), "snr": snr, "bad": 0, "n": b.size}


def probe_figure(root: str, passed: list[str], failed: list[str]) -> None:
    import numpy as np
    import torch
    from torch import nn

    import workbench as wb
    from workbench.runtime import NcnnRunner

    print("\n1. The overflow probe: Linear(64, 1), weights +-250, bias 1, input 64 x 250 "
          "(1-D); exact output 1")
    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 1)

        def forward(self, x: Any) -> Any:
            return self.fc(x)

    model = Probe().eval()
    with torch.no_grad():
        w = torch.full((1, 64), 250.0)
        w[0, 1::2] = -250.0
        model.fc.weight.copy_(w)
        model.fc.bias.fill_(1.0)
    x = torch.full((64,), 250.0)
    nc = wb.to_ncnn(model, (x,), workspace=wb.Workspace(os.path.join(root, "probe")))
    runs = [("x86 fp32", NcnnRunner(nc)), ("x86 fp16", NcnnRunner(nc, precision="fp16")),
            ("ARM fp32", NcnnRunner(nc, target=V82)),
            ("ARM fp16 storage", NcnnRunner(nc, precision="fp16-storage", target=V82)),
            ("ARM fp16 arithmetic", NcnnRunner(nc, precision="fp16", target=V82))]
    rows = [["run", "target", "ran as", "output", "seconds"]]
    got = {}
    for label, r in runs:
        t0 = time.perf_counter()
        got[label] = float(np.asarray(r.run((x,))["out0"]).reshape(-1)[0])
        rows.append([label, r.target or "x86 (this machine)", r.flags.label,
                     repr(got[label]), f"{time.perf_counter() - t0:.1f}"])
    print_table(rows)
    last = runs[-1][0]
    check(all(got[k] == 1.0 for k, _ in runs[:-1]) and not math.isfinite(got[last]),
          "inf/NaN on ARM fp16 arithmetic only; exactly 1 on the other four", passed, failed)

    arm = runs[-1][1]
    rep = wb.compare(model, [runs[0][1], arm], (x,), mode="both", progress=False)
    first = rep.first_divergence
    name = next(c.name for c in rep.candidates if c.runner is arm)
    print("  rep.first_divergence: " + ("None" if first is None else
          f"node {first.node!r} ({first.op_type}), module {first.reference!r}, candidate "
          f"{first.candidate!r}"))
    line = next((ln for ln in rep.summary().splitlines() if ln.startswith(name)), "")
    print(f"  summary: {line}")
    risks = rep.fp16_unsafe()
    print("  " + risks.summary().replace("\n", "\n  "))
    check(first is not None and first.candidate == name and risks.layers == [first.node],
          "the first divergence is the ARM fp16 candidate's layer, and fp16_unsafe() lists "
          "exactly it", passed, failed)
    fixed = wb.ncnn_featmask(nc, risks.layers, fp16_arithmetic=False)
    r = NcnnRunner(fixed, precision="fp16", target=V82)
    value = float(np.asarray(r.run((x,))["out0"]).reshape(-1)[0])
    print(f"  wb.ncnn_featmask(nc, {risks.layers}, fp16_arithmetic=False), run on ARM "
          f"fp16 arithmetic (arm64-v8.2; 31=1 on those layers): {value!r}")
    check(value == 1.0, "the feature-mask fix gives the exact value on ARM fp16", passed,
          failed)


def build(name: str, quick: bool, root: str) -> tuple[Any, Any, list[Any], Any, Any, str]:
    """(model, x, calibration, nc, int8 nc, what was cut) for ``name``."""
    import workbench as wb

    if name == "resnet18":
        size = 64 if quick else 224
        cut = f"1x3x{size}x{size}" + (" (--quick; full: 224)" if quick else "")
    else:
        size, depth = (64, 2) if quick else (112, 12)
        cut = f"depth {depth} of 12, 1x3x{size}x{size} ({(size // 16) ** 2} patches + class)"
    calibration = images(size, CALIBRATION, seed=1)
    x = images(size, 1, seed=2)[0]
    model = resnet18(size, calibration) if name == "resnet18" else \
        vit_small(size, depth, calibration)
    ws = wb.Workspace(os.path.join(root, name))
    nc = wb.to_ncnn(model, (x,), workspace=ws)
    q8 = wb.quantize(nc, calibration, backend="ncnn", progress=False)
    return model, x, calibration, nc, q8, cut


def candidates(nc: Any, q8: Any) -> list[tuple[str, Any]]:
    from workbench.runtime import NcnnRunner

    return [("x86 fp32", NcnnRunner(nc)),
            ("x86 fp16", NcnnRunner(nc, precision="fp16")),
            ("x86 emulate='arm-fp16'", NcnnRunner(nc, precision="fp16", emulate="arm-fp16")),
            ("x86 bf16", NcnnRunner(nc, precision="bf16")),
            ("ARM fp32", NcnnRunner(nc, target=V82)),
            ("ARM fp16 storage", NcnnRunner(nc, precision="fp16-storage", target=V82)),
            ("ARM fp16 arithmetic", NcnnRunner(nc, precision="fp16", target=V82)),
            ("ARM bf16", NcnnRunner(nc, precision="bf16", target=V86)),
            ("ARM int8", NcnnRunner(q8, target=V82)),
            ("x86 int8", NcnnRunner(q8)),
            ("ARM int8, ncnn's defaults", NcnnRunner(q8, precision="fp16", target=V82))]


def accuracy_rows(name: str, model: Any, x: Any, nc: Any, q8: Any, passed: list[str],
                  failed: list[str], notes: list[str]) -> list[list[str]]:
    import numpy as np
    import torch

    import workbench as wb

    with torch.no_grad():
        ref = model(x).numpy()
    rows, outs, runners = [], {}, dict(candidates(nc, q8))
    for label, r in runners.items():
        try:
            t0 = time.perf_counter()
            r.describe()  # the twin made: the model loaded (the worker started, if new)
            t1 = time.perf_counter()
            out = np.asarray(r.run((x,))["out0"]).reshape(ref.shape)
            t2 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - a run that fails is a printed row
            rows.append([name, label, r.target or "x86", "-", "-", "-", "-", "-",
                         f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"])
            continue
        outs[label] = out
        s = out_stats(ref, out)
        nonfinite = f"{s['bad']}/{s['n']}" if s["bad"] else "0"
        ran = r.flags.label + (" + fp16 storage rounded" if r.emulation is not None else "")
        rows.append([name, label, r.target or "x86", ran,
                     "inf/NaN" if s["bad"] else f"{s['max_abs']:.3g}",
                     "-inf" if s["bad"] else f"{s['snr']:.1f}", nonfinite, f"{t1 - t0:.1f}",
                     f"{t2 - t1:.1f}"])
        if label == "ARM fp16 arithmetic" and s["bad"]:
            print(f"  {name}: ARM fp16 arithmetic gives {s['bad']} inf/NaN of {s['n']} "
                  "outputs; comparing it op by op (mode='both')", flush=True)
            rep = wb.compare(model, [r], (x,), mode="both", progress=False)
            first = rep.first_divergence
            notes.append(f"{name}, ARM fp16 arithmetic: first divergence "
                         f"{getattr(first, 'node', None)!r} ({getattr(first, 'op_type', '')}"
                         f", module {getattr(first, 'reference', '')!r})\n  "
                         + rep.fp16_unsafe().summary().replace("\n", "\n  "))
    if "ARM int8" in outs and "x86 int8" in outs:
        a, b = outs["ARM int8"], outs["x86 int8"]
        notes.append(f"{name}: ARM int8 vs x86 int8 (the same int8 model, fp32 elsewhere): "
                     + ("bit-identical outputs" if np.array_equal(a, b) else
                        f"output max abs difference {float(np.abs(a - b).max()):.3g}; "
                        + first_difference(runners["ARM int8"], runners["x86 int8"], x,
                                           q8.path)))
    if "ARM fp32" in outs and "x86 fp32" in outs:
        a, b = outs["ARM fp32"], outs["x86 fp32"]
        rel = float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())
        check(rel <= REL_TOL, f"{name}: ARM fp32 within {REL_TOL:g} of x86 fp32, relative "
              f"(max abs diff / max |x86|: {rel:.2g})", passed, failed)
    else:
        check(False, f"{name}: ARM fp32 and x86 fp32 both ran", passed, failed)
    return rows


def first_difference(arm: Any, x86: Any, x: Any, param: Any) -> str:
    """The first layer (graph order) whose output differs between two runs of one model."""
    import numpy as np

    from workbench.params import parse_ncnn_param

    a, b = arm.run((x,), capture="all"), x86.run((x,), capture="all")
    for ly in parse_ncnn_param(param).layers:
        for top in ly.tops:
            if top in a and top in b and not np.array_equal(a[top], b[top], equal_nan=True):
                d = float(np.abs(np.asarray(a[top], np.float64) - b[top]).max())
                span = float(np.abs(b[top]).max()) or 1.0
                return (f"the first layer whose output differs: {ly.name} ({ly.type}), max "
                        f"abs difference {d:.3g} ({d / span:.2g} of its max |value|)")
    return "no captured blob differs"


# -- emulation cost ---------------------------------------------------------------------------------
def fresh_worker(target: str) -> None:
    """Stop the emulated worker of ``target`` (started by this bench), so the next run starts
    a fresh one: a cold run."""
    from workbench.runtime.ncnn_arm import place
    from workbench.runtime.worker import existing

    w = existing(place(target))
    if w is not None:
        w.close()


class Clock:
    """Wall time of a runner's calls, each call's own (a call inside another is taken out of
    it): ``describe`` (the twin's creation; on a fresh worker also the worker's start),
    ``run`` (the capture) and ``run_blobs`` (isolated passes)."""

    CALLS = ("describe", "run", "run_blobs")

    def __init__(self, runner: Any) -> None:
        import threading

        self.own = {c: 0.0 for c in self.CALLS}
        self.count = {c: 0 for c in self.CALLS}
        self.local = threading.local()
        for c in self.CALLS:
            setattr(runner, c, self._wrap(c, getattr(type(runner), c).__get__(runner)))

    def _wrap(self, call: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self.local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # time spent in calls inside this one
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                inner = stack.pop()
                self.own[call] += dt - inner
                self.count[call] += 1
                if stack:
                    stack[-1] += dt
        return timed

    def reset(self) -> None:
        self.own = {c: 0.0 for c in self.CALLS}
        self.count = {c: 0 for c in self.CALLS}


def capture_seconds(runner: Any, x: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        runner.run((x,), capture="all")
        out.append(time.perf_counter() - t0)
    return out


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system, every thread) process ``pid`` has used; 0 for None or gone."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def cost_figure(model: Any, x: Any, nc: Any, quick: bool, passed: list[str],
                failed: list[str]) -> None:
    import workbench as wb
    from workbench.runtime import NcnnRunner

    print(f"\n3. Emulation cost, ResNet-18-shaped model 1x3x{x.shape[-1]}x{x.shape[-1]}, "
          f"capture='all' (load {load()})")
    rows = [["precision", "x86 warm", "ARM cold: start+load", "ARM cold: run", "ARM warm",
             "ARM warm / x86", "ARM cold / x86", "CPU per run x86 / ARM", "CPU ratio",
             "load"]]
    warm_runs = 1 if quick else 2
    for precision in ("fp32", "fp16"):
        x86 = NcnnRunner(nc, precision=precision)
        capture_seconds(x86, x, 2)  # the native worker and its twin up, pages touched
        c0 = cpu_seconds(x86.worker_pid)
        native = statistics.median(capture_seconds(x86, x, 5))
        native_cpu = (cpu_seconds(x86.worker_pid) - c0) / 5
        fresh_worker(V82)
        arm = NcnnRunner(nc, precision=precision, target=V82)
        t0 = time.perf_counter()
        arm.describe()  # the emulated worker's start and the twin's creation (model load)
        start = time.perf_counter() - t0
        cold = capture_seconds(arm, x, 1)[0]
        c0 = cpu_seconds(arm.worker_pid)
        warm = statistics.median(capture_seconds(arm, x, warm_runs))
        arm_cpu = (cpu_seconds(arm.worker_pid) - c0) / warm_runs
        rows.append([f"{precision} ({arm.flags.label} on ARM)", f"{native * 1000:.0f} ms",
                     f"{start:.1f} s", f"{cold:.1f} s", f"{warm:.1f} s",
                     f"{warm / native:.0f}x", f"{(start + cold) / native:.0f}x",
                     f"{native_cpu:.2f} / {arm_cpu:.1f} s",
                     f"{arm_cpu / native_cpu:.0f}x" if native_cpu else "-", load()])
    print_table(rows)
    print(f"  x86 warm: median of 5 runs; ARM warm: median of {warm_runs} on the same runner; "
          "ARM cold: a fresh emulated worker (QEMU, the aarch64 Python, numpy and ncnn "
          "imported, the model loaded), then its first run. CPU per run: the worker "
          "process's user + system time (every thread), which the machine's load does not "
          "inflate as it does wall time. Emulated time is not phone time: it says what the "
          "workbench costs here, nothing of a phone's speed.")

    print(f"\n   wb.compare(model, [NcnnRunner(nc, precision='fp16', target='{V82}')], (x,), "
          "mode='both')")
    fresh_worker(V82)
    arm = NcnnRunner(nc, precision="fp16", target=V82)
    clock = Clock(arm)
    rep = None
    for when in ("cold (fresh emulated worker)", "warm (same runner, second compare)"):
        clock.reset()
        pid0, self0 = arm.worker_pid, own_cpu()
        worker0 = cpu_seconds(pid0)
        t0 = time.perf_counter()
        rep = wb.compare(model, [arm], (x,), mode="both", progress=False)
        wall = time.perf_counter() - t0
        pid1 = arm.worker_pid
        worker_cpu = cpu_seconds(pid1) - (worker0 if pid1 == pid0 else 0.0)
        self_cpu = own_cpu() - self0
        own = clock.own
        rest = wall - sum(own.values())
        print(f"  {when}: {wall:.1f} s wall (load {load()}): worker start + model load "
              f"{own['describe']:.1f} s, capture run {own['run']:.1f} s, "
              f"{clock.count['run_blobs']} isolated passes {own['run_blobs']:.1f} s, the rest "
              f"(torch's capture, alignment, measuring) {rest:.1f} s; CPU: emulated worker "
              f"{worker_cpu:.1f} s, this process {self_cpu:.1f} s, together "
              f"{(worker_cpu + self_cpu) / (2 * wall):.0%} of 2 cores over the wall time; "
              f"that CPU on 2 cores of its own: about {worker_cpu / 2 + self_cpu:.0f} s "
              "(the worker's 2 threads, then this process's)")
        check(wall <= COMPARE_SECONDS, f"ResNet-18-shaped compare on ARM fp16, {when.split()[0]}"
              f": within {COMPARE_SECONDS:.0f} s on 2 cores ({wall:.1f} s wall, load "
              f"{os.getloadavg()[0]:.1f})", passed, failed)
    name = rep.candidates[0].name
    line = next((ln for ln in rep.summary().splitlines() if ln.startswith(name)), "")
    print(f"  summary: {line}")
    print("  " + rep.fp16_unsafe().summary().replace("\n", "\n  "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--figures", default="1,2,3", help="which figures (1,2,3)")
    ap.add_argument("--quick", action="store_true",
                    help="small inputs (64x64; ViT depth 2): a smoke run, not the figures")
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    figures = set(args.figures.split(","))
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"engine: {engine_state()}")
    print(f"cores: usable {affinity}; load average at start: {load()}"
          + ("; --quick: small inputs, a smoke run" if args.quick else ""))
    from workbench.runtime.arm_env import TARGETS, arm_env

    env = arm_env()
    print(f"ARM target: ncnn {env.ncnn_version} (aarch64) under {env.qemu.name}; "
          + "; ".join(f"{t} = -cpu {TARGETS[t].qemu_cpu}" for t in (V82, V86)))
    passed: list[str] = []
    failed: list[str] = []
    missing: list[str] = []
    notes: list[str] = []
    root = tempfile.mkdtemp(prefix="wb-bench-arm-")
    t_all = time.perf_counter()
    try:
        if "1" in figures:
            t0 = time.perf_counter()
            try:
                probe_figure(root, passed, failed)
            except Exception:  # noqa: BLE001 - printed; the other figures still run
                traceback.print_exc()
                missing.append("overflow probe")
            print(f"[probe: {time.perf_counter() - t0:.0f} s, load {load()}]", flush=True)
        rows = [["model", "candidate", "target", "ran as", "max abs vs torch", "SNR dB",
                 "inf/NaN", "load s", "run s"]]
        built = {}
        if "2" in figures:
            print("\n2. Accuracy against torch fp32, final output")
        for name in names if figures & {"2", "3"} else ():
            t0 = time.perf_counter()
            try:
                built[name] = model, x, _, nc, q8, cut = build(name, args.quick, root)
                print(f"  {name}: {cut}; output max |torch| "
                      f"{float(model(x).detach().abs().max()):.3g}", flush=True)
                if "2" in figures:
                    rows += accuracy_rows(name, model, x, nc, q8, passed, failed, notes)
            except Exception:  # noqa: BLE001 - one model's failure is printed, the rest run
                traceback.print_exc()
                missing.append(name)
            print(f"  [{name}: {time.perf_counter() - t0:.0f} s, load {load()}]", flush=True)
        if "2" in figures:
            print_table(rows)
            print("  load s: the runner's model load in its worker (describe(): the twin "
                  "made; the first ARM row of a target also starts its emulated worker); "
                  "run s: one run, outputs only; wall time on a shared machine")
            for note in notes:
                print(note)
        if "3" in figures:
            if "resnet18" not in built:
                missing.append("emulation cost (needs --models resnet18)")
            else:
                model, x, _, nc, _, _ = built["resnet18"]
                try:
                    cost_figure(model, x, nc, args.quick, passed, failed)
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
                    missing.append("emulation cost")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = f"\nsummary: {len(passed)}/{len(passed) + len(failed)} checks PASS"
    if failed:
        summary += "; FAIL: " + "; ".join(failed)
    if missing:
        summary += f"; not available: {', '.join(missing)}"
    print(summary)
    print(f"total {time.perf_counter() - t_all:.0f} s; load average at end: {load()}")


if __name__ == "__main__":
    sys.exit(main())
