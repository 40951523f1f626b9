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
    fixed = _parent_pairs(report, cand, al)
    if fixed:
        al = dataclasses.replace(al, pairs={**al.pairs, **fixed})
        records = [dataclasses.replace(r, reference=fixed[r.name]) if r.name in fixed else r
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
    # measured first, lowest final SNR first; then the rest by isolated SNR
    out.sort(key=lambda s: (s.final_snr_db is None,
                            s.final_snr_db if s.final_snr_db is not None else s.isolated_snr_db))
    return out


def _parent_pairs(report: Any, cand: Any, al: Any) -> dict[str, str]:
    """For a quantized candidate (the quantize stage's artifact), the pairs its float
    parent aligns where they differ from the candidate's own: {candidate tensor: reference}.

    The quantized graph is its parent's modulo QuantizeLinear/DequantizeLinear (ONNX Runtime;
    ``x`` becomes ``x_DequantizeLinear_Output``) or with the same blob names (ncnn), but its
    values are off by the int8 error, and where a folding leaves two reference tensors close
    in order (a conv and the BatchNorm folded into it) values can no longer tell them apart:
    the quantized conv pairs with the conv, and putting its output (BatchNorm applied) in
    place of the conv's applies the BatchNorm twice. The float parent decides (its values
    are exact); nothing changes for a candidate that is not a quantize artifact."""
    parent = _float_parent(cand.path)
    if parent is None:
        return {}
    from ..precision.qdq import float_name
    from .compare import compare

    try:
        prep = compare(report.reference.model, [parent], report.inputs, mode="accumulated",
                       progress=False)
    except InputError:
        return {}
    pairs = next(iter(prep.alignments.values())).pairs
    out = {}
    for name, ref in al.pairs.items():
        want = pairs.get(name, pairs.get(float_name(name)))
        if want is not None and want != ref:
            out[name] = want
    return out


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
