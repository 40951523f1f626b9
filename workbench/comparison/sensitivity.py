"""Which layers cost a low-precision candidate its accuracy: a sensitivity ranking.

For each layer aligned exactly to a module call of the PyTorch reference, the candidate's
*isolated* output of that layer (the layer run on reference inputs: its own error, nothing
accumulated) is put in place of the module's output in an otherwise float PyTorch run,
and the final outputs are measured against the clean run. The layers whose own error costs
the final output most come first: the ones to keep in float (``wb.quantize(...,
exclude=rep.sensitive(k))``). This is PPQ's layerwise analysis carried to the model's
output, with the module named.

A layer aligned to a functional call (``layer1/Tensor.add_0``) cannot be put back into the
torch run: it is ranked by its isolated SNR alone, after the measured ones.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .align import call_module
from .candidates import copies as _copies
from .isolated import fit_reference as _fit
from .isolated import isolated as _isolated


@dataclass
class Sensitivity:
    """One layer's cost: ``final_snr_db`` is the model output's SNR (the worst output) when
    only this layer's isolated error is let into a float run (None: not measurable, a
    functional call); ``isolated_snr_db`` the layer's own SNR on reference inputs."""

    record: Any  # the isolated Record (``.reference`` is the module call)
    final_snr_db: float | None
    isolated_snr_db: float
    # ncnn int8: the layers whose rounding of this record's tensor (ncnn rounds a blob
    # inside each int8 layer that reads it) is counted here rather than against them
    via: tuple[str, ...] = ()

    @property
    def reference(self) -> str:
        return self.record.reference


def sensitivity(report: Any, candidate: str | None = None, progress: bool = True
                ) -> list[Sensitivity]:
    """Every exactly aligned layer of ``candidate`` (default: the candidate whose outputs
    are furthest from the reference), most costly first."""
    import numpy as np
    from tqdm.auto import tqdm

    from ..precision.snr import snr_db
    from ..runtime import TorchRunner

    ref_runner = report.reference
    if not isinstance(ref_runner, TorchRunner):
        raise InputError("sensitivity puts layer outputs back into the PyTorch model; this "
                         f"comparison's reference is a {type(ref_runner).__name__}",
                         "compare against the nn.Module: wb.compare(model, [...], inputs)")
    cand = _pick(report, candidate)
    al = report.alignments[cand.name]
    records = [r for r in report.records if r.candidate == cand.name
               and r.mode == "isolated" and r.exact]
    fixed, covers = _parent_pairs(report, cand, al)
    if fixed:
        al = dataclasses.replace(al, pairs={**al.pairs, **fixed})
    records = [dataclasses.replace(r, reference=fixed.get(r.name, r.reference),
                                   covers=covers[r.name]) if r.name in covers else r
               for r in records]
    if not records:
        raise InputError(f"{cand.name} has no isolated records to rank",
                         "compare with mode='both' or 'isolated' (the default 'accumulated' "
                         "measures accumulated error only)")
    args = report.inputs
    ref_values = ref_runner.run(_copies(args), capture="all")
    clean = ref_runner.run(_copies(args))
    values = cand.runner.run(_copies(args), capture="all")
    layout = {n: (np.shape(v), np.asarray(v).dtype) for n, v in values.items()}
    values = None
    iso = _isolated(cand, al, ref_values, layout, _copies(args)) or {}
    model = ref_runner.model
    modules = dict(model.named_modules())
    out = []
    for rec in tqdm(records, desc="sensitivity", disable=not progress, leave=False):
        iso_snr = rec.metrics.snr_db
        target = call_module(rec.reference)
        value = iso.get(rec.name)
        if rec.name in fixed and value is not None:  # measured against its parent's pair
            iso_snr = snr_db(_fit(np.asarray(ref_values[rec.reference], dtype=np.float32),
                                  np.shape(value)), np.asarray(value, dtype=np.float32))
        final = None
        if target in modules and value is not None and target != "":
            k = int(rec.reference.split("#", 1)[1]) if "#" in rec.reference else 0
            shape = np.shape(ref_values[rec.reference])
            try:
                replaced = _fit(np.asarray(value, dtype=np.float32), shape)
            except InputError:
                replaced = None
            if replaced is not None:
                got = _run_with(ref_runner, modules[target], k, replaced, args)
                if got is not None:
                    final = min(snr_db(clean[n], got[n]) for n in clean)
        out.append(Sensitivity(rec, final, iso_snr))
    if cand.kind == "ncnn":
        out = _blame_inputs(out, cand, al, ref_values, clean,
                            lambda m, k, v: _run_with(ref_runner, modules[m], k, v, args)
                            if m in modules and m else None)
    # measured first, lowest final SNR first; then the rest by isolated SNR
    out.sort(key=lambda s: (s.final_snr_db is None,
                            s.final_snr_db if s.final_snr_db is not None else s.isolated_snr_db))
    # one entry a module call: several candidate tensors of one layer (onnxruntime's Q/DQ
    # output and the Reshape its optimizer put after it) would take several of the top k
    seen: set[str] = set()
    return [s for s in out if not (s.reference in seen or seen.add(s.reference))]


def _parent_pairs(report: Any, cand: Any, al: Any
                  ) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """For a quantized candidate (the quantize stage's artifact), the pairs its float
    parent aligns where they differ from the candidate's own ({candidate tensor:
    reference}), and the parent's ``covers`` of every tensor it pairs.

    The quantized graph is its parent's modulo QuantizeLinear/DequantizeLinear (ONNX Runtime;
    ``x`` becomes ``x_DequantizeLinear_Output``) or with the same blob names (ncnn), but its
    values are off by the int8 error, and where a folding leaves two reference tensors close
    in order (a conv and the BatchNorm folded into it) values can no longer tell them apart:
    the quantized conv pairs with the conv, and putting its output (BatchNorm applied) in
    place of the conv's applies the BatchNorm twice. The float parent decides (its values
    are exact); nothing changes for a candidate that is not a quantize artifact."""
    parent = _float_parent(cand.path)
    if parent is None:
        return {}, {}
    from ..precision.qdq import float_name
    from .candidates import alignment_of

    try:  # the parent's alignment alone (compare() here would be an import cycle)
        pal = alignment_of(report.reference.model, parent, report.inputs)
    except InputError:
        return {}, {}
    out, covers = {}, {}
    for name, ref in al.pairs.items():
        pname = name if name in pal.pairs else float_name(name)
        want = pal.pairs.get(pname)
        if want is None:
            continue
        covers[name] = pal.covers.get(pname, ())
        if want != ref:
            out[name] = want
    return out, covers


def _blame_inputs(out: list[Sensitivity], cand: Any, al: Any, ref_values: dict[str, Any],
                  clean: dict[str, Any], run: Any) -> list[Sensitivity]:
    """ncnn int8 rounds a blob inside each int8 layer that reads it (at the scale the
    calibration table gives that layer), so a layer's isolated error holds the rounding
    of its input: an outlier channel in the tensor it reads makes it look costly, while the
    tensor's producer looks clean. Each int8 layer's input rounding is measured on its own
    (the reference tensor rounded at the table's scale, put back into the float run); when
    it explains the layer's cost (within 3 dB) the cost is the producer's: its entry takes
    the worst of its own, the layer's and the rounding's, lists the layer in ``via``, and
    the layer's entry goes (or keeps only what it is blamed for as a producer itself).
    Keeping the producer in float (``wb.quantize(exclude=...)``) keeps its readers float."""
    import numpy as np

    from ..params import parse_ncnn_param
    from ..precision.ncnn_table import read_table
    from ..precision.snr import snr_db

    table_path = cand.path.parent / "model.table"
    if not table_path.is_file():
        return out
    table = read_table(table_path)
    int8 = set(table.blob_scales) - set(table.float_layers)
    layers = parse_ncnn_param(cand.path).layers
    alias = {t: ly.bottoms[0] for ly in layers if ly.type == "Split" for t in ly.tops}

    def root(blob: str) -> str:
        while blob in alias:
            blob = alias[blob]
        return blob

    by_name = {e.record.name: e for e in out}
    by_node = {e.record.node: e for e in out if e.record.node}
    tried: dict[tuple[str, float], tuple[float | None, float]] = {}
    blamed: list[tuple[Sensitivity, Sensitivity, float, float, str]] = []
    for ly in layers:
        if ly.name not in int8 or not ly.bottoms or ly.name not in by_node:
            continue
        reader = by_node[ly.name]
        blob = root(ly.bottoms[0])
        producer = by_name.get(blob)
        ref = al.pairs.get(blob)
        if producer is None or producer is reader or ref is None or ref not in ref_values:
            continue
        scale = float(table.blob_scales[ly.name][0])
        if (blob, scale) not in tried:
            v = np.asarray(ref_values[ref], dtype=np.float32)
            q = (np.clip(np.round(v * scale), -127, 127) / scale).astype(np.float32)
            k = int(ref.split("#", 1)[1]) if "#" in ref else 0
            got = run(call_module(ref), k, q)
            final = None if got is None else min(snr_db(clean[n], got[n]) for n in clean)
            tried[(blob, scale)] = (final, snr_db(v, q))
        final, iso = tried[(blob, scale)]
        if final is None or reader.final_snr_db is None or final > reader.final_snr_db + 3:
            continue
        blamed.append((reader, producer, min(final, reader.final_snr_db), iso, ly.name))
    # decided on the layers' own figures first: a layer explained by its input loses its
    # own cost (it is its producer's); one also blamed for its output keeps that blame
    readers = {id(r) for r, *_ in blamed}
    for e in out:
        if id(e) in readers:
            e.final_snr_db = None
    for _reader, producer, cost, iso, name in blamed:
        producer.via = (*producer.via, name)
        producer.final_snr_db = cost if producer.final_snr_db is None else min(
            producer.final_snr_db, cost)
        producer.isolated_snr_db = min(producer.isolated_snr_db, iso)
    return [e for e in out if id(e) not in readers or e.via]


def _float_parent(path: Any) -> Any:
    """The float Artifact a quantize artifact's main file ``path`` was made from (None for
    another file)."""
    import json
    from pathlib import Path

    from ..artifact import Artifact

    folder = Path(path).parent
    try:
        rec = json.loads((folder / "artifact.json").read_text())
        if rec.get("stage") != "quantize" or not rec.get("parent"):
            return None
        pfolder = folder.parent / rec["parent"]
        prec = json.loads((pfolder / "artifact.json").read_text())
    except (OSError, ValueError):
        return None
    parent = Artifact.from_record(prec, pfolder)
    return parent if parent.path.exists() else None


def _pick(report: Any, candidate: str | None) -> Any:
    if candidate is not None or len(report.candidates) == 1:
        return report._candidate(candidate)
    worst: dict[str, float] = {}
    for r in report.records:
        if r.mode == "accumulated":
            snr = r.metrics.snr_db
            worst[r.candidate] = min(worst.get(r.candidate, math.inf), snr)
    name = min(worst, key=worst.get) if worst else report.candidates[-1].name
    return report._candidate(name)


def _run_with(runner: Any, module: Any, call: int, value: Any, args: tuple
              ) -> dict[str, Any] | None:
    """The reference's outputs with ``module``'s ``call``-th output replaced by ``value``
    (None when that call returns no single tensor)."""
    import torch

    seen = {"n": 0, "ok": False}

    def hook(_m: Any, _i: Any, output: Any) -> Any:
        n = seen["n"]
        seen["n"] += 1
        if n != call or not isinstance(output, torch.Tensor):
            return None
        seen["ok"] = True
        return torch.from_numpy(value).to(output.dtype).reshape(output.shape)

    handle = module.register_forward_hook(hook)
    try:
        got = runner.run(_copies(args))
    finally:
        handle.remove()
    return got if seen["ok"] else None
