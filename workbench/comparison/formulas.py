"""Layers that compute another formula than the module they stand for (and ncnn layers
whose kernels compute wrongly: SDPA over a byte mask, ``mask_note``; pow over negative
bases, ``pow_note``).

A conversion can keep every weight and still change the function: ncnn's GELU layer
computes the exact form, 0.5 x (1 + erf(x / sqrt 2)), unless its param 0 (fast_gelu) is 1,
and pnnx writes transformers' tanh-approximate GELU (``NewGELUActivation``, "gelu_new",
in several encoders and decoders) as a GELU with 0=0. Each such activation then deviates by up to ~4.7e-4
(max |erf GELU - tanh GELU|, near |x| = 2): seen on a transformers encoder, ncnn against
its gelu_new, 4.73e-4 to the digit. The comparison still reports that divergence (the
candidate computes another function); this names its cause, its size and the fix, so that
it is not read as a fault in the weights. (``to_ncnn`` sets such layers right itself when
every GELU of the model is the tanh form, stages/ncnn_gelu.py; a model mixing both forms,
or ncnn files converted by hand, still come here.)

Which form a module computes is measured, not read from its class name: the module runs
on a probe of values from -6 to 6 and is matched to either formula (``gelu_form``).
"""

from __future__ import annotations

import math
from typing import Any

from .align import Alignment, CandidateTensor, call_module

# the probe: where the two forms differ most (|x| ~ 2) and beyond
_PROBE = (-6.0, 6.0, 481)
_SAME = 1e-5  # a module matches a form to within this (float32 rounding of either formula)


def _forms(x: Any) -> tuple[Any, Any]:
    """(erf GELU, tanh GELU) of a float64 array."""
    import numpy as np
    import torch

    erf = torch.erf(torch.from_numpy(x / math.sqrt(2.0))).numpy()  # float64
    exact = 0.5 * x * (1.0 + erf)
    tanh = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return exact, tanh


def gelu_form(module: Any) -> str | None:
    """"erf" or "tanh": which GELU ``module`` computes, run on the probe; None when it is
    neither (another activation, or a module that does not take a 1-D float tensor)."""
    import numpy as np
    import torch

    x = np.linspace(*_PROBE)
    try:
        with torch.no_grad():
            y = module(torch.from_numpy(x.astype(np.float32)))
        y = np.asarray(y.detach().cpu().numpy(), dtype=np.float64)
    except Exception:  # noqa: BLE001 - not an elementwise activation: no form to name
        return None
    if y.shape != x.shape:
        return None
    exact, tanh = _forms(x)
    off_erf, off_tanh = np.abs(y - exact).max(), np.abs(y - tanh).max()
    if off_tanh <= _SAME < off_erf:
        return "tanh"
    if off_erf <= _SAME < off_tanh:
        return "erf"
    return None


def _gap() -> float:
    """max |erf GELU - tanh GELU| over the probe (~4.7e-4)."""
    import numpy as np

    exact, tanh = _forms(np.linspace(*_PROBE))
    return float(np.abs(exact - tanh).max())


def formula_notes(cand: Any, al: Alignment, tensors: list[CandidateTensor],
                  model: Any) -> list[str]:
    """What an ncnn candidate's aligned GELU layers compute that their modules do not: one
    line per kind of mismatch, naming layers, modules and the fix; [] when none does (or
    the candidate is not ncnn, or the reference is not an nn.Module)."""
    if getattr(cand, "kind", None) != "ncnn" or not hasattr(model, "named_modules"):
        return []
    gelus = [t for t in tensors if t.op_type == "GELU" and t.name in al.pairs and t.node]
    if not gelus:
        return []
    param = cand.runner.graph  # parsed when the runner was made
    modules = dict(model.named_modules())
    forms: dict[int, str | None] = {}  # id(module) -> its form, probed once
    found: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (layer form, module form)
    for t in gelus:
        path = call_module(al.pairs[t.name])
        module = modules.get(path)
        if module is None:
            continue
        if id(module) not in forms:
            forms[id(module)] = gelu_form(module)
        want = forms[id(module)]
        try:
            layer = param.layer(t.node)
        except KeyError:
            continue
        has = "tanh" if str(layer.params.get(0, "0")) == "1" else "erf"
        if want is not None and want != has:
            found.setdefault((has, want), []).append(
                (layer.name, f"{path} ({type(module).__name__})"))
    notes = []
    for (has, want), pairs in found.items():
        layers = sorted({lay for lay, _ in pairs})
        mods = sorted({m for _, m in pairs})
        shown = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3
                                         else "")
        fix = "add 0=1 (fast_gelu)" if want == "tanh" else "remove 0=1"
        notes.append(
            f"GELU layer(s) {shown} compute the {has} form where {', '.join(mods[:3])}"
            f"{' ...' if len(mods) > 3 else ''} compute(s) the {want} form: the two differ by "
            f"up to {_gap():.2g} whatever the weights (a choice of the conversion, not a "
            f"fault); to run the model's form, {fix} on those layers in "
            f"{cand.runner.param.name}")
    return notes


def mask_note(cand: Any) -> str:
    """Why an ncnn candidate's SDPA layers compute garbage: a boolean mask pnnx stored as
    bytes, which ncnn reads as float (runtime/ncnn_masks.py); '' when it has none."""
    from ..runtime.ncnn_masks import note

    masks = getattr(getattr(cand, "runner", None), "byte_masks", None)
    return note(masks) if masks else ""


def pow_note(cand: Any, values: dict[str, Any]) -> str:
    """Which ncnn pow layers met negative bases in the candidate's run (``values``): ncnn's
    vectorised pow returns garbage there (runtime/ncnn_pow.py); '' when none did."""
    if getattr(cand, "kind", None) != "ncnn":
        return ""
    from ..runtime.ncnn_pow import negative_pows, note

    found = negative_pows(cand.runner.graph, values)
    return note(found) if found else ""
