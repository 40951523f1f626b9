"""The GELU form of a converted ncnn model, fixed where pnnx wrote the wrong one.

ncnn's GELU layer computes the exact form, 0.5 x (1 + erf(x / sqrt 2)), unless its param 0
(fast_gelu) is 1: then the tanh approximation. pnnx writes transformers' tanh GELU
(``NewGELUActivation``, "gelu_new": ALBERT, GPT-2) as a GELU with 0=0, so every such layer
is off by up to 4.7e-4 whatever the weights (ALBERT: 4.73e-4 at each activation). Run by
hand, pnnx leaves that; here the converted param is tried once more with its erf-form GELU
layers set to 0=1, and when that brings the example outputs at least ``CLOSER`` times nearer
the reference, the param is written so and a warning gives both figures. A model whose
GELUs are the erf form only gets further from its reference (nothing changes); a model
mixing both forms is left as pnnx wrote it, and ``wb.compare`` names each layer that
computes the other form (comparison/formulas.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..diagnostics import Diagnostic
from ..params import parse_ncnn_param
from .ncnn_runs import ncnn_errors

CLOSER = 10.0  # how much nearer the reference the tanh form must bring the outputs


def fix_gelu_form(param: Path, args: tuple, reference: list | None,
                  before: float | None) -> Diagnostic | None:
    """Rewrite ``param`` (in place) with 0=1 on its erf-form GELU layers when that brings
    the outputs on ``args`` CLOSER times nearer ``reference`` than ``before`` (the output
    check's fp32 max abs); the warning that says so, or None (no such layer, no reference,
    or no clear gain)."""
    if reference is None or not before:  # the run failed, or nothing to gain
        return None
    erf = [la for la in parse_ncnn_param(param).layers
           if la.type == "GELU" and str(la.params.get(0, "0")) != "1"]
    if not erf:
        return None
    lines = param.read_text().splitlines()
    for la in erf:
        toks = lines[la.line - 1].split()
        if toks[:2] != ["GELU", la.name]:  # not the line parse_ncnn_param read: leave it
            return None
        lines[la.line - 1] = (lines[la.line - 1].rstrip() + " 0=1" if not any(
            t.startswith("0=") for t in toks) else " ".join(
            [t for t in toks if not t.startswith("0=")] + ["0=1"]))
    trial = param.parent / "gelu-tanh"
    trial.mkdir(exist_ok=True)
    stem = param.name[:-len(".ncnn.param")]
    for extra in (f"{stem}.ncnn.bin", f"{stem}_ncnn.py"):
        src = param.parent / extra
        if src.exists():
            _link_or_copy(src, trial / extra)
    (trial / param.name).write_text("\n".join(lines) + "\n")
    try:
        after = _max_abs(trial / param.name, args, reference)
    finally:
        shutil.rmtree(trial, ignore_errors=True)
    if after is None or after * CLOSER > before:
        return None
    param.write_text("\n".join(lines) + "\n")
    names = [la.name for la in erf]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return Diagnostic(
        "warning", "ncnn-gelu-tanh",
        f"pnnx wrote {len(names)} GELU layer(s) ({shown}) in erf form, but the model computes "
        f"the tanh approximation (transformers' gelu_new): its outputs were {before:.3g} off "
        f"the reference, {after:.3g} with 0=1 (fast_gelu) on those layers, so the param is "
        "written with 0=1",
        "the layers now compute ncnn's tanh GELU, as the model does; wb.compare(model, "
        "[artifact], inputs) checks every layer")


def _max_abs(param: Path, args: tuple, reference: list) -> float | None:
    """The fp32 outputs' max abs error against ``reference``, as the output check takes
    it (None: the run failed or the shapes differ)."""
    try:
        _, _, errs = ncnn_errors(param, args, reference, "fp32")
    except Exception:  # noqa: BLE001 - a trial: the param as pnnx wrote it stays
        return None
    return None if errs["shape_mismatch"] else float(errs["max_abs"])


def _link_or_copy(src: Path, dest: Path) -> Any:
    try:
        os.link(src, dest)  # the weights can be large: a link, not a copy
    except OSError:
        shutil.copy2(src, dest)
