"""Does ``wb.compare`` blame an injected fault on the right layer, and stay quiet on a clean one?

Models: the default model (``wb.default_model()``), the zoo (``workbench.zoo.ZOO``:
transformers architectures, small configs, seeded) and the architectures it lacks
(``bench/fault_models.py``: LSTM/GRU sequence model, UNet, YOLO-style backbone, depthwise-
separable net with squeeze-excite, causal decoder). Nothing is downloaded.

Candidate kinds, built once per model in a temporary workspace: ``export`` (``wb.export``,
TorchScript exporter, opset 17), ``simplify`` (``wb.simplify``, onnxslim), ``raise``
(``wb.raise_ops`` of the simplified model) and ``ncnn`` (``wb.to_ncnn(model)``, fp32 weights;
``to_ncnn(onnx artifact)`` if that raises ConversionError). Opt-in, ``--kinds dynamo``:
``wb.export(..., exporter="dynamo", opset=18)``, whose nodes name their modules in metadata,
not in value names.

A fault: one weight (Conv/ConvTranspose/Linear ``weight``, LSTM/GRU ``weight_ih_l0``) of a
module picked at evenly spaced depths of the model's weighted modules in execution order
(first ... last; ``--depths``, ``--quick`` one in the middle), Gaussian noise on a quarter of
its values (seeded by model and module: the same values and draws at every strength), put
*into the candidate*, not the torch reference. Two damages (``--damage``):

- ``relative`` (the bench's since issue 16): each chosen value times 1 + 0.1·K·N(0, 1), noise
  of 10% of the value itself;
- ``max`` (issue 36's, on trained weights): each chosen value plus 0.1·K·max|w|·N(0, 1),
  noise of 10% of the weight's largest magnitude: on a heavy-tailed trained weight most
  values move by far more than 10% of themselves.

``--strength K`` (default 1: the damage as above, "the current strength"; ``1,3`` runs both on
the same candidates and clean comparisons) scales the noise. ``--damage auto`` (default) takes
``max`` on the trained set and ``relative`` on the others. The edit, wherever the weight is:

- ONNX: the initializer holding that weight, found by value (as stored; transposed, as a
  Linear's MatMul holds it; scaled per output channel, as a BatchNorm or layer scale folded
  into it; or its values permuted, as LSTM gates are), is edited and the model saved anew;
- ncnn: the ``.ncnn.bin`` is walked layer by layer from the ``.ncnn.param`` (each layer's
  weights in load order, a 4-byte flag tag before every blob ncnn loads with type 0); the walk
  must end exactly at the end of the file. The weight is found among those blobs the same way
  and its bytes changed in a copy of the model.

Each edit is checked by running the candidate clean and perturbed with every tensor
captured: the first node/layer whose output changes must be the one that reads the edited
weight ("offset verified"). A module whose weight cannot be found (folded beyond
recognition) is replaced by the nearest one that can, and said so.

Then ``rep = wb.compare(model, [candidate], inputs, mode=...)`` (default ``both``). A hit:
``rep.first_divergence`` names the perturbed module (``reference`` is the module, one of its
calls ``module#k`` or tuple outputs ``module.k``) or a fused op whose record ``covers`` it. The
accumulated-mode verdict (the earliest failing accumulated record) is scored beside it. Every
clean candidate is compared too: a false alarm is a first divergence, or ``rep.ok`` False.

A trial not blamed on its module is a miss, unless the fault is *invisible on its candidate*
(``bench/fault_visibility.py``): run clean and damaged, it moves no tensor the candidate
computes beyond the bound its verdict uses (the accumulated record's noise-floor tolerance;
the default per-element rule where the record is per-element or there is none; and, for the
op reading the weight, its isolated record's tolerance), the comparison named nothing in
either mode, and the edit was verified (a conv whose one output element feeds a sigmoid
saturated near 1, both in one ncnn layer). Invisible trials are counted and printed on
their own, each with its largest effect, and left out of hits / trials.

Targets (issue 16; issue 36 holds the default, hf and trained sets to them, at strength 1
and 3): localisation >= 98% on every kind; 0 false alarms on clean comparisons; every tensor
aligned or attributed; aligned fraction >= 0.95 on every candidate. The misses
are listed with model, module, what was named instead and the figures, and a guessed cause.
It is a report, not a test: the exit status is 0 whatever the figures say.

``--models trained`` runs the trained zoo (``bench/fault_trained.py``: ``workbench.trained``'s
MobileNetV2, CREPE tiny, silero-vad, MiniLM, real weights and real inputs; issue 36's set).
Sets can be combined (``--models trained,hf``); each set and strength gets its own summary,
with its targets as PASS/FAIL lines, and a side-by-side table ends the run.

``--models hf`` runs the opt-in set of ``bench/hf_models.py`` instead (37 transformers
architectures beyond the zoo: Llama, Qwen2, T5, Whisper, ALBERT, SqueezeBERT, EfficientNet,
LeViT, BEiT, DINOv2, CLIP, FocalNet, Segformer, RegNet, Wav2Vec2, PoolFormer, MobileViT,
GPT-2, BLOOM, GPT-NeoX, DistilBERT, BiT, ConvNeXt V2, MobileNetV1, CvT, YOLOS, HuBERT,
Mistral, Phi, Gemma, OPT, ELECTRA, DeBERTa-v2, Swin V2, DeiT, WavLM, MobileNetV2): where
new wrong verdicts are looked for (issue 16 left its misses as open findings; issue 36
makes its targets the same as the default set's).

Run:  cd /work/main && .venv/bin/python bench/faults.py [--models a,b|hf|trained]
          [--kinds export,ncnn] [--quick] [--depths N] [--strength 1,3]
          [--damage auto|relative|max] [--mode both|accumulated|isolated] [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fault_visibility as visibility
from _common import engine_state, print_figures, print_table  # bench/ is on sys.path

KINDS = ("export", "simplify", "raise", "ncnn")
# opt-in (--kinds dynamo): the torch.export-based exporter, whose nodes carry their modules in
# metadata rather than in value names: another path through alignment
EXTRA_KINDS = ("dynamo",)
NOISE, FRACTION = 0.10, 0.25
# how the noise scales (see the docstring): by the value itself, or by the weight's max |w|
DAMAGES = ("relative", "max")
LOCALISATION, ALIGNED = 0.98, 0.95
# unaligned reasons of tensors align does not count (parameters, index glue)
UNBUILT = "candidate could not be built"
# the candidate's clean run crashed or failed (wb.compare says so: report.failed): a true
# verdict, not a false alarm (Clean.failed); its trials are not counted, as an unbuilt
# candidate's
RUN_FAILED = "candidate's run failed"
# the clean candidate's outputs are off in a plain run (Clean.explained): a fault put in
# would be named after a divergence already there; its trials are not counted either
DEVIATES = "clean candidate deviates"
# no module's weight is in the candidate as any relation the bench knows (BiT's
# weight-standardised convolutions: the weight used is computed in forward, and a
# simplified graph holds only that): no fault can be put in, so no trial
NO_WEIGHT = "no weight of the model found in the candidate"
NOT_RUN = (UNBUILT, RUN_FAILED, DEVIATES, NO_WEIGHT)
NOT_COUNTED = re.compile(r"^a constant|shape or index glue|^not captured")


# -- models -------------------------------------------------------------------------------------
def model_factories() -> dict[str, Any]:
    import fault_models

    import workbench as wb
    from workbench import zoo

    out: dict[str, Any] = {"default": wb.default_model}
    out.update({name: (lambda n=name: zoo.get(n)) for name in zoo.ZOO})
    out.update(fault_models.MODELS)
    return out


def opt_in_factories() -> dict[str, Any]:
    """``--models hf``: transformers architectures beyond the zoo (bench/hf_models.py), not
    in the default run."""
    import hf_models

    return dict(hf_models.MODELS)


def model_sets() -> dict[str, dict[str, Any]]:
    """{set name: {model name: factory}}: the default set (no ``--models``), and the opt-in
    ``hf`` and ``trained`` sets."""
    import fault_trained

    return {"default": model_factories(), "hf": opt_in_factories(),
            "trained": dict(fault_trained.MODELS)}


def set_damage(set_name: str, damage: str) -> str:
    """The damage a set's trials take: ``--damage`` unless auto, then the trained set's own
    (issue 36's, ``fault_trained.DAMAGE``) or the bench's relative noise."""
    if damage != "auto":
        return damage
    import fault_trained

    return fault_trained.DAMAGE if set_name == "trained" else "relative"


@dataclass
class Target:
    module: str  # qualified name, as named_modules gives it
    param: str  # the parameter perturbed: "weight", "weight_ih_l0"
    type: str  # the module class
    index: int  # position among the weighted modules, in execution order


def weighted_modules(model: Any, inputs: tuple) -> list[Target]:
    """Leaf modules with a perturbable weight, in the order forward first calls them."""
    import torch
    from torch import nn

    kinds = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
             nn.ConvTranspose3d, nn.Linear, nn.LSTM, nn.GRU, nn.RNN)
    names = {m: n for n, m in model.named_modules()}
    order: list[Any] = []

    def hook(mod: Any, *_: Any) -> None:
        if mod not in order:
            order.append(mod)

    def weighted(m: Any) -> bool:  # transformers' Conv1D (GPT-2) is a Linear by another name
        return isinstance(m, kinds) or type(m).__name__ == "Conv1D" and hasattr(m, "nf")

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if weighted(m)]
    try:
        with torch.no_grad():
            model(*[t.clone() for t in inputs])
    finally:
        for h in handles:
            h.remove()
    out = []
    for m in order:
        param = "weight_ih_l0" if isinstance(m, (nn.LSTM, nn.GRU, nn.RNN)) else "weight"
        w = getattr(m, param, None)
        if w is None or w.numel() < 16:
            continue
        out.append(Target(names[m], param, type(m).__name__, len(out)))
    return out


def depth_picks(n: int, depths: int) -> list[int]:
    if depths == 1:
        return [n // 2]
    return sorted({round(k * (n - 1) / (depths - 1)) for k in range(depths)})


@dataclass
class Fault:
    """The damage to one torch weight: ``w[idx] = w[idx] * factors + adds`` (flat indices)."""

    idx: Any
    factors: Any  # float32, 1 where the damage only adds
    adds: Any  # float32, in the torch weight's units; 0 where it only scales


def fault(model_name: str, target: Target, w: Any, damage: str = "relative",
          strength: float = 1.0) -> Fault:
    """The noise on a quarter of the values of ``w`` (numpy): ``relative``, each times
    1 + 0.1·K·N(0, 1); ``max``, each plus 0.1·K·max|w|·N(0, 1). The values picked and the
    draws depend on model and module only, not on damage or strength K."""
    import numpy as np

    size = int(w.size)
    rng = np.random.default_rng(zlib.crc32(f"{model_name}/{target.module}".encode()))
    idx = np.sort(rng.choice(size, max(1, int(size * FRACTION)), replace=False))
    noise = NOISE * strength * rng.standard_normal(idx.size)
    if damage == "relative":
        return Fault(idx, (1.0 + noise).astype(np.float32), np.zeros(idx.size, np.float32))
    if damage == "max":
        scale = float(np.abs(w).max())
        return Fault(idx, np.ones(idx.size, np.float32), (noise * scale).astype(np.float32))
    raise ValueError(f"unknown damage {damage!r}; known: {', '.join(DAMAGES)}")


def torch_effect(model: Any, inputs: tuple, target: Target, f: Fault) -> float:
    """The same fault put into a torch copy: max change at the module's first output over
    compare's default tolerance there (below 1, no comparison could see it)."""
    import torch

    from workbench.comparison.metrics import DEFAULT_ATOL, DEFAULT_RTOL

    def first_output(m: Any) -> Any:
        got: list[Any] = []
        mod = dict(m.named_modules())[target.module]
        h = mod.register_forward_hook(lambda _m, _a, out: got.append(
            out[0] if isinstance(out, tuple) else out) if not got else None)
        try:
            with torch.no_grad():
                m(*[t.clone() for t in inputs])
        finally:
            h.remove()
        return got[0].detach().float()

    clean = first_output(model)
    bad = copy.deepcopy(model)
    with torch.no_grad():
        w = getattr(dict(bad.named_modules())[target.module], target.param)
        flat = w.data.reshape(-1)
        at = torch.as_tensor(f.idx)
        flat[at] = flat[at] * torch.as_tensor(f.factors) + torch.as_tensor(f.adds)
    out = first_output(bad)
    tol = DEFAULT_ATOL + DEFAULT_RTOL * float(clean.abs().max())
    return float((out - clean).abs().max()) / tol


# -- finding a weight in a candidate ------------------------------------------------------------
@dataclass
class Store:
    """One array of the candidate that may hold a weight: an ONNX initializer or an ncnn blob."""

    label: str  # initializer name, or "layer name (type) blob k"
    values: Any  # float32, flat
    offset: int = -1  # ncnn: byte offset of the values in the .bin
    layer: str = ""  # ncnn: the layer that loads it


@dataclass
class Located:
    store: Store
    positions: Any  # for each flat index of the torch weight, its index in store.values (-1: none)
    relation: str  # "as stored", "transposed", "scaled per output channel", "permuted"
    # for each flat index of the torch weight, the factor folded into its stored value (a
    # BatchNorm's scale): what an added amount is multiplied by in the store; None: 1
    scale: Any = None


def locate(w: Any, stores: list[Store], name: str = "") -> Located | None:
    """Where the torch weight ``w`` (numpy) sits among ``stores``, and how; a store named
    ``name`` (the parameter's qualified name, as the exporter keeps it unless it folded the
    weight) is tried first."""
    import numpy as np

    stores = sorted(stores, key=lambda s: s.label != name)

    flat = w.reshape(-1).astype(np.float32)
    views = [("as stored", np.arange(flat.size))]
    if w.ndim == 2:  # a MatMul / Gemm holding W^T
        views.append(("transposed", np.arange(flat.size).reshape(w.shape[1], w.shape[0]).T
                      .reshape(-1)))
    same = [s for s in stores if s.values.size == flat.size]
    for s in same:
        for rel, perm in views:
            if np.array_equal(s.values[perm], flat):
                return Located(s, perm, rel)
    rows = w.shape[0]
    for s in same:  # a per-output-channel scale folded in (BatchNorm, layer scale)
        for rel, perm in views:
            got = s.values[perm].reshape(rows, -1).astype(np.float64)
            ref = flat.reshape(rows, -1).astype(np.float64)
            ok = np.abs(ref) > 1e-6 * (np.abs(ref).max() + 1e-30)
            if not ok.any():
                continue
            ratio = np.where(ok, got / np.where(ok, ref, 1.0), np.nan)
            scale = np.nanmedian(ratio, axis=1, keepdims=True)
            if np.all(np.isfinite(scale)) and np.all(scale != 0) and np.nanmax(
                    np.abs(ratio / scale - 1)) < 1e-4:
                what = "scaled" if np.allclose(scale, scale[0]) else "scaled per output channel"
                per_value = np.repeat(scale[:, 0], flat.size // rows).astype(np.float32)
                return Located(s, perm, f"{rel}, {what} (folded)", per_value)
    # the values themselves, anywhere in one store (LSTM gates reordered, q/k/v split...)
    keys = flat.view(np.uint32)
    for s in sorted(stores, key=lambda s: s.values.size):
        if s.values.size < flat.size:
            continue
        sv = s.values.view(np.uint32)
        order = np.argsort(sv, kind="stable")
        sorted_v = sv[order]
        lo = np.searchsorted(sorted_v, keys, "left")
        hi = np.searchsorted(sorted_v, keys, "right")
        unique = (hi - lo) == 1
        if unique.mean() < 0.9:
            continue
        pos = np.where(unique, order[np.minimum(lo, sv.size - 1)], -1)
        return Located(s, pos, "permuted (found by value)")
    return None


def onnx_stores(model: Any) -> list[Store]:
    import numpy as np
    from onnx import numpy_helper

    out = []
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.size >= 16:
            out.append(Store(t.name, a.reshape(-1).copy()))
    for node in model.graph.node:  # constants the simplifier wrote as Constant nodes
        if node.op_type == "Constant":
            for at in node.attribute:
                if at.name == "value":
                    a = numpy_helper.to_array(at.t)
                    if a.dtype == np.float32 and a.size >= 16:
                        out.append(Store(f"Constant:{node.output[0]}", a.reshape(-1).copy()))
    return out


def ncnn_stores(param_path: Path) -> tuple[list[Store], str]:
    """Every weight blob of the .bin, by the engine's layer walk (workbench.ncnn_bin); (stores,
    note). The walk must account for every byte and find each blob stored as fp32;
    otherwise the whole file is one store (found by value only) and the note says why."""
    import numpy as np

    from workbench.ncnn_bin import walk_bin
    from workbench.params import parse_ncnn_param

    bin_path = param_path.with_name(param_path.name[: -len(".param")] + ".bin")
    layout = walk_bin(parse_ncnn_param(param_path), bin_path)
    problem = layout.problem or (f"layer type(s) {layout.unknown} not sized"
                                 if layout.unknown else "")
    if not problem and layout.end != layout.size:
        problem = f"the walk ends at byte {layout.end} of {layout.size}"
    # a MemoryData of raw bytes (a boolean mask, 21=3) holds no weight: not a store
    weights = [b for b in layout.blobs if b.storage != "int8-raw"]
    odd = next((b for b in weights if b.storage != "float32"), None)
    if not problem and odd is not None:
        problem = f"{odd.layer} ({odd.layer_type}) blob {odd.role}: stored as {odd.storage}"
    data = bin_path.read_bytes()
    if problem:
        whole = np.frombuffer(data[: len(data) // 4 * 4], np.float32).copy()
        return [Store("whole .ncnn.bin", whole, 0, "")], f"layer walk failed: {problem}"
    stores = [Store(f"{b.layer} ({b.layer_type}) {b.role}",
                    np.frombuffer(data, np.float32, b.count, b.offset).copy(), b.offset, b.layer)
              for b in weights]
    raw = len(layout.blobs) - len(weights)
    return stores, (f"layer walk: {len(stores)} blobs, {len(data)} bytes, every tag fp32"
                    + (f" ({raw} raw-byte MemoryData left out)" if raw else ""))


# -- perturbed copies ---------------------------------------------------------------------------
def damaged(loc: Located, f: Fault) -> tuple[Any, Any]:
    """(positions in the store, their new values) of the fault put into ``loc``'s store: the
    stored value scaled as the torch value is, plus the added amount times the factor folded
    into it."""
    pos = loc.positions[f.idx]
    keep = pos >= 0
    adds = f.adds if loc.scale is None else f.adds * loc.scale[f.idx]
    return pos[keep], loc.store.values[pos[keep]] * f.factors[keep] + adds[keep]


def perturb_onnx(src: Path, dst: Path, loc: Located, f: Fault) -> Any:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    at, values = damaged(loc, f)
    new = loc.store.values.copy()
    new[at] = values
    label = loc.store.label
    if label.startswith("Constant:"):
        out = label[len("Constant:"):]
        node = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == out)
        at = next(a for a in node.attribute if a.name == "value")
        shape = numpy_helper.to_array(at.t).shape
        at.t.CopyFrom(numpy_helper.from_array(new.reshape(shape), at.t.name))
    else:
        t = next(t for t in model.graph.initializer if t.name == label)
        t.CopyFrom(numpy_helper.from_array(new.reshape(tuple(t.dims)).astype(np.float32),
                                           label))
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    return int(at.size)


def perturb_ncnn(src_param: Path, dst_dir: Path, loc: Located, f: Fault) -> Any:
    import numpy as np

    dst_dir.mkdir(parents=True, exist_ok=True)
    stem = src_param.name[: -len(".ncnn.param")]
    for file in src_param.parent.iterdir():  # param, the _ncnn.py, the .pnnx.param if beside
        if file.name.startswith(stem) and not file.name.endswith(".ncnn.bin"):
            shutil.copy2(file, dst_dir / file.name)
    pnnx = _pnnx_param(src_param)
    if pnnx is not None and not (dst_dir / f"{stem}.pnnx.param").exists():
        shutil.copy2(pnnx, dst_dir / f"{stem}.pnnx.param")
    data = bytearray(src_param.with_name(f"{stem}.ncnn.bin").read_bytes())
    at, values = damaged(loc, f)
    vals = np.frombuffer(bytes(data), np.float32).copy()
    vals[loc.store.offset // 4 + at] = values
    (dst_dir / f"{stem}.ncnn.bin").write_bytes(vals.tobytes() + bytes(data[len(vals) * 4:]))
    return dst_dir / f"{stem}.ncnn.param", int(at.size)


def _pnnx_param(param: Path) -> Path | None:
    from workbench.runtime.ncnn_io import pnnx_param_for

    return pnnx_param_for(param, param)


def first_changed(kind: str, path: Path, clean: dict[str, Any], bad: dict[str, Any]) -> str:
    """The first node (ONNX, graph order) or layer (ncnn) whose output changed, by name."""
    import numpy as np

    if kind == "ncnn":
        from workbench.params import parse_ncnn_param

        for layer in parse_ncnn_param(path).layers:
            for top in layer.tops:
                if top in clean and top in bad and not np.array_equal(clean[top], bad[top]):
                    return layer.name
        return ""
    import onnx

    for node in onnx.load(str(path), load_external_data=False).graph.node:
        for o in node.output:
            if o in clean and o in bad and not np.array_equal(clean[o], bad[o], equal_nan=True):
                return node.name or o
    return ""


def readers(kind: str, path: Path, loc: Located) -> tuple[set[str], list[str], str]:
    """(names, output tensors, op types) of the nodes (ONNX) or the layer (ncnn) that read
    the edited weight: an ONNX weight reaches its op through nodes of constants only (a
    Transpose of it, an Identity)."""
    if kind == "ncnn":
        from workbench.params import parse_ncnn_param

        if not loc.store.layer:  # the walk failed: found by value in the whole file
            return set(), [], ""
        layer = parse_ncnn_param(path).layer(loc.store.layer)
        return {layer.name}, list(layer.tops), layer.type
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    consts = {t.name for t in graph.initializer}
    reached = {loc.store.label.removeprefix("Constant:")}
    names: set[str] = set()
    tensors: list[str] = []
    types: list[str] = []
    for node in graph.node:
        if node.op_type == "Constant":
            consts.update(node.output)
            continue
        if any(i in reached for i in node.input):
            if all(not i or i in consts or i in reached for i in node.input):
                reached.update(node.output)
                consts.update(node.output)
            else:
                names.add(node.name or node.output[0])
                tensors += [o for o in node.output if o]
                types.append(node.op_type)
        elif node.input and all(not i or i in consts for i in node.input):
            consts.update(node.output)
    return names, tensors, "/".join(dict.fromkeys(types))


def tensor_status(rep: Any, name: str) -> str:
    """How the comparison placed one candidate tensor: aligned (to what, covering what),
    attributed, or unaligned (why)."""
    if rep is None:
        return "no comparison"
    (al,) = rep.alignments.values()
    if name in al.pairs:
        cov = getattr(al, "covers", {}).get(name)
        rel = al.relation(name) if hasattr(al, "relation") else "equal"
        return (f"aligned to {al.pairs[name]}" + (f" covering {list(cov)}" if cov else "")
                + (f" ({rel})" if rel != "equal" else ""))
    if name in getattr(al, "attributed", {}):
        return f"attributed to {al.attributed[name]}"
    if name in al.unaligned:
        return f"unaligned: {al.unaligned[name]}"
    return "not listed"


# -- the comparison's verdict -------------------------------------------------------------------
def names_module(ref: str, module: str) -> bool:
    """Whether a record name is ``module``: itself, one of its calls, one of its outputs, or
    a functional call it made (BiT's WeightStandardizedConv2d standardizes its weight and
    calls ``F.conv2d``: 'embedder.convolution/F.conv2d_0')."""
    return bool(re.fullmatch(re.escape(module) + r"((#\d+)?(\.\d+)?|/[^/]+)", ref or ""))


def covers_of(rep: Any, rec: Any) -> tuple[str, ...]:
    got = getattr(rec, "covers", None)
    if got:
        return tuple(got)
    al = rep.alignments.get(rec.candidate)
    return tuple(getattr(al, "covers", {}).get(rec.name, ())) if al is not None else ()


def blames(rep: Any, rec: Any, module: str) -> bool:
    if rec is None:
        return False
    return names_module(rec.reference, module) or any(
        names_module(c, module) for c in covers_of(rep, rec))


def first_failing(rep: Any, mode: str) -> Any:
    failing = [r for r in rep.records if r.mode == mode and not r.metrics.passed]
    return min(failing, key=lambda r: r.order) if failing else None


def describe(rep: Any, rec: Any) -> dict[str, Any] | None:
    if rec is None:
        return None
    m = rec.metrics
    al = rep.alignments.get(rec.candidate)
    relation = getattr(rec, "relation", None) or (
        al.relation(rec.name) if al is not None and hasattr(al, "relation") else "equal")
    return {"reference": rec.reference, "tensor": rec.name, "op_type": rec.op_type,
            "mode": rec.mode, "max_abs": m.max_abs, "tolerance": m.tolerance,
            "frac_over_tol": m.frac_over_tol, "min_tol": m.min_tol,
            "covers": list(covers_of(rep, rec)),
            "relation": relation}


def output_deviation(model: Any, path: Path, x: tuple) -> str:
    """How the candidate's outputs, from a plain run (no wb.compare), differ from torch's at
    the same positions, by to_ncnn's own output check (shapes.fit, max_errors, each output
    against its own range at the default tolerance); '' if they do not."""
    import numpy as np
    import torch

    from workbench.comparison.metrics import DEFAULT_ATOL, DEFAULT_RTOL
    from workbench.runtime import runner_for
    from workbench.shapes import fit
    from workbench.tolerances import failing_output, max_errors

    with torch.no_grad():
        ref = model(*x)
    refs = [np.asarray(r) for r in (ref if isinstance(ref, (tuple, list)) else (ref,))]
    got = [np.asarray(g) for g in runner_for(path).run(x).values()]
    errs = max_errors(refs, [fit(g, r.shape) for r, g in zip(refs, got, strict=False)]
                      + got[len(refs):])
    if errs["shape_mismatch"]:
        return "; ".join(errs["shape_mismatch"])
    bad = failing_output(errs, DEFAULT_ATOL, DEFAULT_RTOL, refs)
    return f"output {bad[0]} differs by max abs {bad[1]:.3g}" if bad else ""


def alignment_figures(rep: Any) -> dict[str, Any]:
    """Aligned fraction, and the tensors neither aligned nor attributed (counted ones)."""
    (name, al), = rep.alignments.items()
    attributed = len(getattr(al, "attributed", {}))
    unexplained = al.considered - len(al.pairs)
    reasons = Counter(reason_group(r) for n, r in al.unaligned.items()
                      if n not in getattr(al, "attributed", {}) and not NOT_COUNTED.search(r))
    return {"aligned_fraction": rep.aligned_fraction.get(name, 0.0), "pairs": len(al.pairs),
            "considered": al.considered, "attributed": attributed,
            "unexplained": unexplained,
            "unaligned_reasons": dict(reasons.most_common(6))}


def reason_group(reason: str) -> str:
    reason = re.sub(r"'[^']*'", "'…'", reason)
    reason = re.sub(r"\[[^\]]*\]", "[…]", reason)
    return re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", "N", reason)


# -- one model ----------------------------------------------------------------------------------
@dataclass
class Trial:
    model: str
    kind: str
    depth: int  # index among the model's weighted modules that was asked for
    strength: float = 1.0  # --strength: the noise's multiple of the damage's 10%
    damage: str = "relative"  # --damage: "relative" or "max"
    module: str = ""
    module_type: str = ""
    substitute_for: str = ""  # the module asked for, when its weight could not be found
    store: str = ""
    relation: str = ""
    edited: int = 0
    offset: int = -1
    verified: str = ""  # "yes" or what changed first instead
    torch_effect: float = 0.0
    hit: bool = False
    hit_accumulated: bool = False
    named: dict[str, Any] | None = None
    named_accumulated: dict[str, Any] | None = None
    # no divergence named, but wb.compare says where the error comes from
    # (CompareReport.error_sources): reported beside a miss, not counted as a hit
    source: dict[str, Any] | None = None
    source_blames: bool = False
    own: list[dict[str, Any]] = field(default_factory=list)  # records naming the module
    reader_op: str = ""  # the op type(s) reading the weight
    reader: str = ""  # how the tensor(s) of the op reading the weight were placed
    reader_clean: str = ""  # the same, in the clean comparison
    aligned_fraction: float = 0.0
    # the fault's largest effect on a candidate tensor over its tolerance (fault_visibility)
    effect: str = ""
    cause: str = ""
    error: str = ""
    seconds: float = 0.0


@dataclass
class Clean:
    model: str
    kind: str
    false_alarm: bool = False
    ok: bool = True
    summary: str = ""  # the report's summary line, kept for a false alarm
    named: dict[str, Any] | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    failed: str = ""  # why its run failed (report.failed): not a false alarm, not counted
    # the report's note naming the divergence's layer as computing another formula than its
    # module (ncnn's erf GELU for a tanh GELU), or its verdict naming an output that is not
    # torch's, which a plain run confirms: a true deviation, named; not a false alarm
    explained: str = ""
    deviates: bool = False  # a plain run shows the outputs off: its trials are not counted


def build_candidates(name: str, model: Any, x: tuple, ws: Any, kinds: list[str],
                     notes: list[str], export_options: dict[str, Any] | None = None
                     ) -> dict[str, Path]:
    import workbench as wb

    out: dict[str, Path] = {}
    onx = sim = None
    opts = export_options or {}
    try:
        if {"export", "simplify", "raise", "ncnn"} & set(kinds):
            onx = wb.export(model, x, workspace=ws, exporter="torchscript", opset=17, **opts)
            out["export"] = Path(onx.path)
        if {"simplify", "raise"} & set(kinds):
            sim = wb.simplify(onx, workspace=ws)
            out["simplify"] = Path(sim.path)
        if "raise" in kinds:
            out["raise"] = Path(wb.raise_ops(sim, workspace=ws).path)
    except Exception as e:
        notes.append(f"{name}: ONNX stages failed: {type(e).__name__}: {_first(e)}")
    if "dynamo" in kinds:
        try:
            out["dynamo"] = Path(wb.export(model, x, workspace=ws, exporter="dynamo",
                                           opset=18, **opts).path)
        except Exception as e:
            notes.append(f"{name}: dynamo export failed: {type(e).__name__}: {_first(e)}")
    if "ncnn" in kinds:
        try:
            out["ncnn"] = Path(wb.to_ncnn(model, x, workspace=ws).path)
        except wb.ConversionError as e:
            first = _first(e)
            try:
                if onx is None:
                    raise
                out["ncnn"] = Path(wb.to_ncnn(onx, workspace=ws).path)
                notes.append(f"{name}: ncnn via to_ncnn(onnx artifact); to_ncnn(module): {first}")
            except Exception as e2:
                notes.append(f"{name}: to_ncnn failed: {type(e2).__name__}: {_first(e2)} "
                             f"(to_ncnn(module): {first})")
        except Exception as e:
            notes.append(f"{name}: to_ncnn failed: {type(e).__name__}: {_first(e)}")
    return {k: v for k, v in out.items() if k in kinds}


def _first(e: BaseException) -> str:
    text = getattr(e, "message", None) or str(e)
    return (text.strip().splitlines() or [type(e).__name__])[0][:300]


def capture(kind: str, path: Path, x: tuple) -> dict[str, Any]:
    from workbench.runtime import NcnnRunner, OrtRunner

    # in the worker, not in-process: ncnn's SDPA corrupted this process's heap on a
    # transformers Llama ("malloc_consolidate(): invalid chunk size") and took the whole run
    # with it; in the worker that is a BackendCrashed, and the trial says so
    runner = NcnnRunner(path, num_threads=1) if kind == "ncnn" else OrtRunner(
        path, num_threads=1)
    return runner.run(x, capture="all")


def run_model(name: str, factory: Any, kinds: list[str], depths: int, mode: str,
              workdir: Path, bar: Any, notes: list[str], damage: str = "relative",
              strengths: tuple[float, ...] = (1.0,)) -> tuple[list[Trial], list[Clean]]:
    """The clean comparison of every candidate kind, then one trial per depth and strength.
    A factory returns (model, inputs) or (model, inputs, wb.export options)."""
    import workbench as wb

    made = factory()
    model, x = made[0], made[1]
    targets = weighted_modules(model, x)
    picks = depth_picks(len(targets), depths)
    ws = wb.Workspace(workdir / name)
    t0 = time.perf_counter()
    cands = build_candidates(name, model, x, ws, kinds, notes,
                             made[2] if len(made) > 2 else None)
    notes.append(f"{name}: {len(targets)} weighted modules, depths {picks}; candidates built in "
                 f"{time.perf_counter() - t0:.1f} s ({', '.join(cands) or 'none'})")
    trials: list[Trial] = []
    cleans: list[Clean] = []
    params = {t.module: getattr(dict(model.named_modules())[t.module], t.param).detach()
              .cpu().numpy() for t in targets}
    effects: dict[tuple[str, float], float] = {}
    runs = [(d, k) for k in strengths for d in picks]

    def not_run(cause: str, **kw: Any) -> list[Trial]:
        bar.update(len(runs))
        return [Trial(name, kind, d, k, damage, cause=cause, **kw) for d, k in runs]

    from workbench.runtime import TorchRunner

    ref_order = list(TorchRunner(model).run(x, capture="all"))
    for kind in kinds:
        path = cands.get(kind)
        if path is None:
            trials += not_run(UNBUILT, error="no candidate (see notes)")
            cleans.append(Clean(name, kind, error="no candidate"))
            bar.update()
            continue
        # the clean comparison
        clean = Clean(name, kind)
        clean_rep = None
        try:
            clean_rep = wb.compare(model, [path], x, mode=mode, progress=False)
            if getattr(clean_rep, "failed", None):
                clean.ok = False
                clean.failed = next(iter(clean_rep.failed.values())).splitlines()[0][:300]
                cleans.append(clean)
                trials += not_run(RUN_FAILED)
                bar.update()
                continue
            div = clean_rep.first_divergence
            clean.ok = bool(clean_rep.ok)
            clean.false_alarm = div is not None or not clean.ok
            note = next(iter(getattr(clean_rep, "notes", {}).values()), "")
            if div is not None and div.node and "form where" in note \
                    and re.search(rf"\b{re.escape(div.node)}\b", note):
                clean.explained, clean.false_alarm = note, False
            if clean.false_alarm:
                # a true deviation, not a false alarm, when a plain run of the candidate,
                # outside wb.compare, shows its outputs off too (what compare named is
                # listed with it: no fault was put in, so the bench cannot score the name)
                seen = output_deviation(model, path, x)
                if seen:
                    reasons = next(iter(clean_rep.verdicts().values())).reasons
                    named = (f"first divergence named at {div.reference} ({div.op_type} "
                             f"{div.name})" if div is not None else reasons[0] if reasons
                             else "not ok")
                    clean.explained = f"{named} [a plain run shows it: {seen}]"
                    clean.false_alarm = False
                    clean.deviates = True
            clean.named = describe(clean_rep, div)
            if clean.false_alarm:
                clean.summary = clean_rep.summary()
            clean.figures = alignment_figures(clean_rep)
        except Exception as e:
            clean.error = f"{type(e).__name__}: {_first(e)}"
            clean.false_alarm = True
        cleans.append(clean)
        bar.update()
        if clean.deviates:
            trials += not_run(DEVIATES)
            continue
        try:
            if kind == "ncnn":
                stores, walk = ncnn_stores(path)
                notes.append(f"{name}/ncnn: {walk}")
            else:
                import onnx

                stores = onnx_stores(onnx.load(str(path)))
        except Exception as e:
            stores = []
            notes.append(f"{name}/{kind}: reading the weights failed: {type(e).__name__}: "
                         f"{_first(e)}")
            traceback.print_exc()
        try:
            clean_values = capture(kind, path, x)
        except Exception as e:
            clean_values = {}
            notes.append(f"{name}/{kind}: clean capture failed: {_first(e)}")
        for d, k in runs:
            trial = Trial(name, kind, d, k, damage)
            t1 = time.perf_counter()
            try:
                _one_trial(trial, model, x, targets, params, effects, kind, path, stores,
                           clean_values, clean_rep, mode, workdir / name / "faults",
                           ref_order)
            except Exception as e:
                trial.error = f"{type(e).__name__}: {_first(e)}"
                trial.cause = trial.cause or f"bench or engine error: {trial.error}"
                if "--verbose" in sys.argv:
                    traceback.print_exc()
            trial.seconds = time.perf_counter() - t1
            trials.append(trial)
            bar.update()
    return trials, cleans


def _one_trial(trial: Trial, model: Any, x: tuple, targets: list[Target],
               params: dict[str, Any], effects: dict[tuple[str, float], float], kind: str,
               path: Path,
               stores: list[Store], clean_values: dict[str, Any], clean_rep: Any, mode: str,
               out_dir: Path, ref_order: list[str]) -> None:
    import workbench as wb

    # the asked module, else the nearest one (alternating later/earlier) found in the candidate
    order = sorted(range(len(targets)), key=lambda i: (abs(i - trial.depth), i < trial.depth))
    loc = target = None
    for i in order:
        t = targets[i]
        loc = locate(params[t.module], stores, f"{t.module}.{t.param}")
        if loc is not None:
            target = t
            break
    if target is None or loc is None:
        trial.cause = NO_WEIGHT
        return
    asked = targets[trial.depth].module
    trial.module, trial.module_type = target.module, target.type
    trial.substitute_for = asked if asked != target.module else ""
    trial.store, trial.relation, trial.offset = loc.store.label, loc.relation, loc.store.offset
    f = fault(trial.model, target, params[target.module], trial.damage, trial.strength)
    key = (target.module, trial.strength)
    if key not in effects:
        effects[key] = torch_effect(model, x, target, f)
    trial.torch_effect = effects[key]
    stem = re.sub(r"[^\w.-]", "_", target.module)[-80:] + f"-x{trial.strength:g}"
    if kind == "ncnn":
        cand, trial.edited = perturb_ncnn(path, out_dir / f"{kind}-{stem}", loc, f)
    else:
        cand = out_dir / f"{kind}-{stem}" / "model.onnx"
        trial.edited = perturb_onnx(path, cand, loc, f)
    # the edit changes the op that reads the weight first, nothing before it
    bad_values: dict[str, Any] = {}
    try:
        bad_values = capture(kind, cand, x)
        changed = first_changed(kind, cand, clean_values, bad_values)
        expect, _, _ = readers(kind, path, loc)
        trial.verified = "yes" if changed in expect else (
            f"no: first changed {changed or 'nothing'}, expected {sorted(expect)}")
    except Exception as e:
        trial.verified = f"not checked: {_first(e)}"
    rep = wb.compare(model, [cand], x, mode=mode, progress=False)
    first = rep.first_divergence
    acc = first_failing(rep, "accumulated") if mode != "isolated" else None
    trial.hit = blames(rep, first, target.module)
    trial.hit_accumulated = blames(rep, acc, target.module) if acc is not None else False
    trial.named, trial.named_accumulated = describe(rep, first), describe(rep, acc)
    source = next(iter(rep.error_sources().values()), None)
    trial.source, trial.source_blames = describe(rep, source), blames(rep, source,
                                                                      target.module)
    trial.aligned_fraction = next(iter(rep.aligned_fraction.values()), 0.0)
    trial.own = [{"tensor": r.name, "reference": r.reference, "mode": r.mode,
                  "passed": r.metrics.passed, "max_abs": r.metrics.max_abs,
                  "tolerance": r.metrics.tolerance}
                 for r in rep.records if blames(rep, r, target.module)]
    _, outs, trial.reader_op = readers(kind, path, loc)
    trial.reader = "; ".join(f"{o}: {tensor_status(rep, o)}" for o in outs[:2])
    trial.reader_clean = "; ".join(f"{o}: {tensor_status(clean_rep, o)}" for o in outs[:2])
    moved = visibility.effects(rep, clean_values, bad_values, outs)
    trial.effect = visibility.describe(moved[0] if moved else None)
    if not trial.hit and visibility.invisible(moved, rep, trial.verified):
        trial.cause = visibility.INVISIBLE
    elif not trial.hit:
        trial.cause = miss_cause(trial, rep, first, clean_rep, target.module, ref_order)


def miss_cause(trial: Trial, rep: Any, first: Any, clean_rep: Any, module: str,
               ref_order: list[str]) -> str:
    """A first guess at why the fault was not blamed on its module."""
    twice = any("#" in r.reference for r in rep.records if names_module(r.reference, module))
    tag = " (module called twice)" if twice else ""
    if trial.torch_effect < 1:
        return f"fault below tolerance in torch itself ({trial.torch_effect:.2g}x)"
    if not trial.verified.startswith("yes") and not trial.verified.startswith("not checked"):
        return f"edit not where expected: {trial.verified}"
    own = trial.own
    if first is None:
        if not own:
            return "no divergence named; no tensor aligned to the perturbed module" + tag
        return "no divergence named; the module's own tensor passed" + passed_why(trial) + tag
    clean_div = clean_rep.first_divergence if clean_rep is not None else None
    if clean_div is not None and clean_div.reference == first.reference:
        return "named the clean comparison's false alarm, ahead of the fault"
    where = ""
    if first.reference in ref_order:
        later = [r for r in ref_order if names_module(r, module)]
        if later:
            where = (" (a later module)" if ref_order.index(first.reference) >
                     ref_order.index(later[0]) else " (an earlier module)")
    if not own:
        reader = trial.reader.split(": ", 1)[-1]
        clean = trial.reader_clean.split(": ", 1)[-1]
        if reader.startswith("aligned to"):
            return (f"the {trial.reader_op} reading the weight is aligned to another module "
                    f"without covers (fused/folded); named {first.op_type}{where}{tag}")
        if reader.startswith("unaligned") and clean.startswith("aligned"):
            return (f"the faulty tensor lost its alignment (the value match failed; clean: "
                    f"aligned); named {first.op_type}{where}{tag}")
        if reader.startswith("unaligned"):
            return (f"the {trial.reader_op} reading the weight is never aligned "
                    f"({reason_group(reader)}); named {first.op_type}{where}{tag}")
        if reader.startswith("attributed"):
            return (f"the {trial.reader_op} reading the weight is attributed, not measured; "
                    f"named {first.op_type}{where}{tag}")
        return (f"no tensor aligned to the perturbed module ({reader}); named "
                f"{first.op_type}{where}{tag}")
    if all(o["passed"] for o in own):
        return (f"the module's own tensor passed{passed_why(trial)}; named "
                f"{first.op_type}{where}{tag}")
    return f"the module's tensor fails too, but an earlier record was named{where}{tag}"


def passed_why(trial: Trial) -> str:
    """Why the damaged module's own tensor passed, where the trial shows it: paired under a
    relation the clean comparison did not need (the fault taken for a folding), or the fault
    not reaching it (a fused op after the module absorbs it: a saturated sigmoid)."""
    def relation(status: str) -> str:  # the last balanced "(...)" of an aligned status
        if not status.startswith("aligned") or not status.endswith(")"):
            return "equal"
        depth = 0
        for i in range(len(status) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(status[i], 0)
            if depth == 0:
                return status[i + 1:-1]
        return "equal"

    reader = trial.reader.split(": ", 1)[-1]
    clean = trial.reader_clean.split(": ", 1)[-1]
    if reader.startswith("aligned") and relation(reader) != relation(clean):
        return (f" as '{relation(reader)}', a relation the clean comparison did not need "
                f"('{relation(clean)}'): the fault taken for a folding")
    worst = max((o["max_abs"] / o["tolerance"] for o in trial.own if o["tolerance"]),
                default=None)
    if worst is not None and worst < 1:
        return (f" (at {worst:.2g}x its tolerance: the fault hardly reaches it, "
                f"torch's module output moves {trial.torch_effect:.3g}x)")
    return ""


# -- report -------------------------------------------------------------------------------------
def fmt_named(n: dict[str, Any] | None) -> str:
    if not n:
        return "nothing"
    cov = f", covers {n['covers']}" if n.get("covers") else ""
    rel = f", {n['relation']}" if n.get("relation") not in (None, "equal") else ""
    # tolerance is the whole-tensor bound (atol + rtol * max |ref|); an element fails on
    # its own atol + rtol * |ref|: "needs atol" is the atol that would pass them all
    return (f"{n['reference']} ({n['op_type']} {n['tensor']}, {n['mode']} max abs "
            f"{n['max_abs']:.3g}, {100 * n['frac_over_tol']:.2g}% of elements over tol, "
            f"needs atol {n['min_tol']:.3g}{cov}{rel})")


def counted(t: Trial) -> bool:
    """A trial counted in hits / trials: it ran, and its fault is visible on its candidate."""
    return t.cause not in NOT_RUN and t.cause != visibility.INVISIBLE


def report(trials: list[Trial], cleans: list[Clean], kinds: list[str], mode: str,
           title: str = "", clean_details: bool = True) -> None:
    """One model set at one strength: the table per candidate kind, the misses, the
    invisible trials, and the targets as PASS/FAIL lines; the clean comparisons' details
    unless ``clean_details`` is False (a second strength of the same set: they are the same
    comparisons)."""
    table = [("kind", "hits / trials", "localised", "acc. verdict", "not run", "invisible",
              "false alarms / clean", "aligned min", "aligned median", "unexplained tensors",
              "offsets verified")]
    rows: list[tuple[str, float | None, str, bool]] = []
    for kind in kinds:
        line, mine = kind_figures(trials, cleans, kind, mode)
        table.append(line)
        rows += mine
    print()
    if title:
        print(f"== {title} ==")
    print(f"fault localisation (compare mode={mode!r}; a hit: first_divergence names the "
          "perturbed module or covers it)")
    print_table(table)
    print_misses([t for t in trials if not t.hit and counted(t)])
    visibility.print_invisible(trials)
    print_not_run(trials)
    if clean_details:
        clean_sections(cleans)
    else:
        print(f"\nclean comparisons: as listed above for this set ({sum(c.false_alarm for c in cleans)}"
              " false alarms)")
    print("\nwhere the weights were found (relation to the torch weight):")
    for kind in kinds:
        rel = Counter(t.relation for t in trials if t.kind == kind and t.relation)
        print(f"  {kind}: " + ("; ".join(f"{n}x {r}" for r, n in rel.most_common()) or "-"))
    subs = [t for t in trials if t.substitute_for]
    if subs:
        print(f"\nweights not found in the candidate (folded, or where the bench does not look: "
              f"graph initializers and graph-level Constants only, not a raised function's "
              f"body), another module taken ({len(subs)}):")
        for t in subs:
            print(f"  {t.model} / {t.kind}: {t.substitute_for} -> {t.module}")
    print()
    print_targets(rows, title)


def kind_figures(trials: list[Trial], cleans: list[Clean], kind: str, mode: str
                 ) -> tuple[tuple[str, ...], list[tuple[str, float | None, str, bool]]]:
    """One kind's table line and its target rows (label, value, shown, met)."""
    unbuilt = [t for t in trials if t.kind == kind and t.cause in NOT_RUN]
    unseen = [t for t in trials if t.kind == kind and t.cause == visibility.INVISIBLE]
    ts = [t for t in trials if t.kind == kind and counted(t)]
    scored = [t for t in ts if not t.error]
    hits = sum(t.hit for t in ts)
    acc = sum(t.hit_accumulated for t in scored)
    cs = [c for c in cleans if c.kind == kind and c.error != "no candidate" and not c.failed]
    alarms = sum(c.false_alarm for c in cs)
    # past a true deviation the candidate's values match nothing: not an alignment gap
    fr = [c.figures["aligned_fraction"] for c in cs if c.figures and not c.deviates]
    unexpl = sum(c.figures.get("unexplained", 0) for c in cs if c.figures and not c.deviates)
    with_unexpl = sum(1 for c in cs if c.figures.get("unexplained") and not c.deviates)
    ver = sum(t.verified == "yes" for t in scored)
    loc = hits / len(ts) if ts else None
    line = (kind, f"{hits}/{len(ts)}", f"{100 * loc:.1f}%" if loc is not None else "-",
            f"{acc}/{len(scored)}" if mode != "isolated" else "-", str(len(unbuilt)),
            str(len(unseen)), f"{alarms}/{len(cs)}", f"{min(fr):.3f}" if fr else "-",
            f"{statistics.median(fr):.3f}" if fr else "-",
            f"{unexpl} in {with_unexpl}/{len(fr)}", f"{ver}/{len(scored)}")
    rows = [(f"localisation {kind} >= {100 * LOCALISATION:.0f}%", loc, f"{hits}/{len(ts)}",
             loc is not None and loc >= LOCALISATION),
            (f"false alarms {kind} = 0", float(alarms) if cs else None, f"{alarms}/{len(cs)}",
             alarms == 0),
            (f"aligned min {kind} >= {ALIGNED}", min(fr) if fr else None,
             f"{min(fr):.3f}" if fr else "-", bool(fr) and round(min(fr), 3) >= ALIGNED),
            (f"every tensor aligned or attributed ({kind})", float(unexpl) if fr else None,
             f"{unexpl} unexplained", bool(fr) and unexpl == 0)]
    return line, rows


def print_misses(misses: list[Trial]) -> None:
    """Each miss with what was named instead, its figures and a guessed cause."""
    print(f"\nmisses ({len(misses)}):")
    for t in misses:
        sub = f" (for {t.substitute_for}, not found)" if t.substitute_for else ""
        own = "; ".join(f"{o['mode']} {o['tensor']} max abs {o['max_abs']:.3g} "
                        f"{'passed' if o['passed'] else 'FAILED'}" for o in t.own[:3]) or "none"
        print(f"  {t.model} / {t.kind}: {t.module or '-'} [{t.module_type}]{sub}")
        if t.error:
            print(f"      error: {t.error}")
        else:
            print(f"      named: {fmt_named(t.named)}")
            if t.named_accumulated and t.named_accumulated != t.named:
                print(f"      accumulated verdict: {fmt_named(t.named_accumulated)}")
            if t.source:
                print(f"      error source named (not a divergence): {fmt_named(t.source)}"
                      f" ({'the perturbed module' if t.source_blames else 'another module'})")
            print(f"      weight: {t.store} ({t.relation}, {t.edited} values edited"
                  f"{f', byte {t.offset}' if t.offset >= 0 else ''}); edit verified: "
                  f"{t.verified}; torch effect {t.torch_effect:.3g}x tolerance")
            print(f"      the module's own records: {own}")
            print(f"      the {t.reader_op} reading the weight: {t.reader}; clean: "
                  f"{t.reader_clean}")
            print(f"      the fault's largest effect on the candidate: {t.effect}")
        print(f"      cause: {t.cause}")
    sourced = [t for t in misses if t.source_blames]
    if misses:
        print(f"\nmisses whose error source wb.compare names at the perturbed module "
              f"(CompareReport.error_sources, no divergence): {len(sourced)}/{len(misses)}")
    causes = Counter(re.sub(r"named \S+", "named …", t.cause) for t in misses)
    if causes:
        print("\nmisses by cause:")
        for c, n in causes.most_common():
            print(f"  {n:3d}  {c}")


def print_not_run(trials: list[Trial]) -> None:
    """Trials not run: no candidate built, or no weight of the model found in it."""
    unbuilt = Counter(f"{t.model} / {t.kind}" for t in trials if t.cause == UNBUILT)
    if unbuilt:
        print(f"\nnot run, the candidate could not be built (see the notes above; not counted "
              f"in hits / trials): {', '.join(f'{k} ({n} trials)' for k, n in unbuilt.items())}")
    unweighted = Counter(f"{t.model} / {t.kind}" for t in trials if t.cause == NO_WEIGHT)
    if unweighted:
        print(f"\nnot run, {NO_WEIGHT} (computed in forward, folded: no fault to put in; not "
              f"counted): {', '.join(f'{k} ({n} trials)' for k, n in unweighted.items())}")


def print_targets(rows: list[tuple[str, float | None, str, bool]], title: str) -> None:
    """The target rows as PASS/FAIL figures, then one line per target."""
    fig = [("target", "measured", "result")]
    passed, failed = [], []
    for label, value, shown, ok in rows:
        if value is None:
            fig.append((label, "-", "n/a"))
            continue
        (passed if ok else failed).append(label)
        fig.append((label, shown, "PASS" if ok else "FAIL"))
    print_figures(fig, passed, failed, [r[0] for r in rows if r[1] is None])
    for target, key in (("localisation >= 98% on every candidate kind", "localisation"),
                       ("0 false alarms on clean comparisons", "false alarms"),
                       (f"aligned >= {ALIGNED} on every candidate", "aligned min"),
                       ("every tensor aligned or attributed", "every tensor")):
        mine = [r for r in rows if r[0].startswith(key)]
        met = all(r[3] for r in mine) and all(r[1] is not None for r in mine)
        print(f"target {target}: {'met' if met else 'not met'}"
              + (f" ({title})" if title else ""))


def clean_sections(cleans: list[Clean]) -> None:
    """The clean comparisons that failed to run, truly deviate, raised an alarm, or left
    tensors unaligned."""
    failed = [c for c in cleans if c.failed]
    if failed:
        print(f"\nclean candidates whose run failed ({len(failed)}; wb.compare reports them "
              "not ok, rightly: not false alarms; their trials not counted):")
        for c in failed:
            print(f"  {c.model} / {c.kind}: {RUN_FAILED}: {c.failed}")
    explained = [c for c in cleans if c.explained]
    if explained:
        print(f"\nclean candidates that truly deviate, the cause named by wb.compare "
              f"({len(explained)}; not false alarms):")
        for c in explained:
            print(f"  {c.model} / {c.kind}: {fmt_named(c.named)}\n      note: {c.explained}"
                  + ("\n      its trials not counted (the candidate already deviates)"
                     if c.deviates else ""))
    alarms = [c for c in cleans if c.false_alarm]
    print(f"\nfalse alarms on clean comparisons ({len(alarms)}):")
    for c in alarms:
        print(f"  {c.model} / {c.kind}: {c.error or fmt_named(c.named)}"
              f"{'' if c.ok or c.error else ' (rep.ok False)'}")
        if c.summary:
            print(f"      summary: {c.summary}")
    low = [c for c in cleans if c.figures and not c.deviates and (
        c.figures["aligned_fraction"] < ALIGNED or c.figures["unexplained"])]
    print(f"\ncandidates with aligned < {ALIGNED} or tensors unexplained ({len(low)}):")
    for c in low:
        f = c.figures
        print(f"  {c.model} / {c.kind}: aligned {f['aligned_fraction']:.3f} ({f['pairs']}/"
              f"{f['considered']}, {f['attributed']} attributed, {f['unexplained']} "
              f"unexplained): {'; '.join(f'{n}x {r}' for r, n in f['unaligned_reasons'].items())}")


def side_by_side(trials: list[Trial], cleans: list[Clean], kinds: list[str],
                 sets: dict[str, list[str]], strengths: tuple[float, ...]) -> None:
    """Localised k/n per set, kind and strength in one table, with the clean false alarms."""
    table = [("set", "kind", *(f"localised {k:g}x" for k in strengths), "false alarms / clean")]
    for set_name, names in sets.items():
        for kind in kinds:
            cells = []
            for k in strengths:
                at = [t for t in trials if t.model in names and t.kind == kind
                      and t.strength == k]
                ts = [t for t in at if counted(t)]
                hits = sum(t.hit for t in ts)
                unseen = sum(t.cause == visibility.INVISIBLE for t in at)
                cells.append((f"{hits}/{len(ts)} ({100 * hits / len(ts):.1f}%)" if ts else "-")
                             + (f" +{unseen} invisible" if unseen else ""))
            cs = [c for c in cleans if c.model in names and c.kind == kind
                  and c.error != "no candidate" and not c.failed]
            table.append((set_name, kind, *cells,
                          f"{sum(c.false_alarm for c in cs)}/{len(cs)}"))
    print("\nside by side (targets: localised >= 98% on every kind, 0 false alarms; "
          "invisible trials, on no tensor beyond tolerance, not counted)")
    print_table(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated model names or sets (default: the "
                        "default set); hf: the opt-in transformers set; trained: the trained "
                        "zoo (bench/fault_trained.py)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated candidate kinds (default {','.join(KINDS)})")
    parser.add_argument("--quick", action="store_true", help="one depth (the middle)")
    parser.add_argument("--depths", type=int, default=5, help="depths per model (default 5)")
    parser.add_argument("--strength", default="1",
                        help="comma-separated multiples K of the damage (default 1: the "
                        "current strength, noise of 10%% -- of each value (relative) or of "
                        "the weight's max |w| (max) -- on a quarter of one weight's values); "
                        "'1,3' runs both on the same candidates")
    parser.add_argument("--damage", default="auto", choices=("auto", *DAMAGES),
                        help="relative: each value times 1 + 0.1*K*N(0,1) (the bench's since "
                        "issue 16); max: each value plus 0.1*K*max|w|*N(0,1) (issue 36's "
                        "damage on trained weights); auto (default): max on the trained set, "
                        "relative on the others")
    parser.add_argument("--mode", default="both", choices=("accumulated", "isolated", "both"))
    parser.add_argument("--json", help="write every trial and clean comparison here")
    parser.add_argument("--verbose", action="store_true", help="tracebacks of failed trials")
    args = parser.parse_args(argv)
    from tqdm import tqdm

    sets = model_sets()
    factories = {n: f for members in sets.values() for n, f in members.items()}
    set_of = {n: s for s, members in sets.items() for n in members}
    asked = args.models.split(",") if args.models else list(sets["default"])
    names = list(dict.fromkeys(m for n in asked for m in (
        list(sets[n]) if n in ("hf", "trained") else [n])))
    unknown = [n for n in names if n not in factories]
    kinds = args.kinds.split(",")
    bad_kinds = [k for k in kinds if k not in KINDS + EXTRA_KINDS]
    try:
        strengths = tuple(dict.fromkeys(float(k) for k in args.strength.split(",")))
    except ValueError:
        strengths = ()
    if unknown or bad_kinds or not strengths or min(strengths) <= 0:
        parser.error(f"unknown models {unknown} or kinds {bad_kinds}, or strengths "
                     f"{args.strength!r} not positive numbers; models: {', '.join(factories)}; "
                     f"sets: hf, trained; kinds: {', '.join(KINDS + EXTRA_KINDS)}")
    by_set: dict[str, list[str]] = {}
    for n in names:
        by_set.setdefault(set_of[n], []).append(n)
    depths = 1 if args.quick else max(1, args.depths)
    t_start = time.perf_counter()
    trials: list[Trial] = []
    cleans: list[Clean] = []
    notes: list[str] = []
    print(engine_state(), flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="wb-bench-faults-") as tmp:
            bar = tqdm(total=len(names) * len(kinds) * (depths * len(strengths) + 1),
                       desc="faults", file=sys.stderr)
            for name in names:
                bar.set_postfix_str(name)
                t0 = time.perf_counter()
                try:
                    t, c = run_model(name, factories[name], kinds, depths, args.mode,
                                     Path(tmp), bar, notes, set_damage(set_of[name], args.damage),
                                     strengths)
                    trials += t
                    cleans += c
                except Exception as e:
                    notes.append(f"{name}: failed: {type(e).__name__}: {_first(e)}")
                    traceback.print_exc()
                notes.append(f"{name}: {time.perf_counter() - t0:.1f} s")
            bar.close()
        for n in notes:
            print(n)
        damages = "; ".join(f"{s}: {set_damage(s, args.damage)}" for s in by_set)
        print(f"whole run {time.perf_counter() - t_start:.0f} s; models: {', '.join(names)}; "
              f"depths per model: {depths}; noise {100 * NOISE:.0f}% x strength "
              f"{', '.join(f'{k:g}' for k in strengths)} on {100 * FRACTION:.0f}% of one "
              f"weight; damage by set: {damages}; load average "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        for set_name, members in by_set.items():
            damage = set_damage(set_name, args.damage)
            cs = [c for c in cleans if c.model in members]
            for i, k in enumerate(strengths):
                ts = [t for t in trials if t.model in members and t.strength == k]
                report(ts, cs, kinds, args.mode,
                       f"model set {set_name} ({len(members)} models), damage {damage}, "
                       f"strength {k:g}x", clean_details=i == 0)
        if len(by_set) > 1 or len(strengths) > 1:
            side_by_side(trials, cleans, kinds, by_set, strengths)
    except Exception:
        traceback.print_exc()
        print("summary: the benchmark could not finish (traceback above)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"trials": [asdict(t) for t in trials], "clean": [asdict(c) for c in cleans],
             "notes": notes}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
