"""ncnn's BinaryOp pow over negative bases: garbage where torch gives a number.

ncnn's vectorised pow is ``exp(y * log(x))`` (``pow_ps`` in src/layer/x86/sse_mathfun.h at
ncnn a4d2ea1d4; the ARM one is the same formula), so a negative base gives garbage even
for a whole exponent, where torch (and C's powf, which ncnn's scalar tail uses) gives the
signed power. Measured with ncnn 1.0.20261020 on x86: transformers' GPT-2 GELU ("gelu_new",
``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * torch.pow(x, 3.0))))``), which pnnx
writes as BinaryOp pow with 2=3.0, returned 2.41e+38 for pow(-1.596, 3) (torch: -4.07), and
the model's output was off by 2.9 on a range of 3.5.

Whether a model meets it depends on its values, not its graph: found from a run's blobs,
so ``to_ncnn`` can name the layer in its numeric-mismatch hint and ``wb.compare`` in its note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POW, RPOW = "6", "9"  # BinaryOp's op_type (param 0) for a ** b and b ** a


@dataclass(frozen=True)
class NegativePow:
    """A pow layer that met negative bases on a run."""

    layer: str
    exponent: str  # as written (2=3.0), or "its second input"
    negatives: int  # how many bases were negative
    size: int  # of how many
    base: float  # one negative base
    got: float  # what ncnn returned for it
    want: float  # the signed power (nan when the exponent is not a whole number)


def negative_pows(graph: Any, blobs: dict[str, Any]) -> list[NegativePow]:
    """The BinaryOp pow layers of ``graph`` (an NcnnParam) whose base had negative values in
    ``blobs`` (a capture="all" run, by blob name); [] when none did."""
    import numpy as np

    found = []
    for la in graph.layers:
        if la.type != "BinaryOp" or str(la.params.get(0, "0")) not in (POW, RPOW):
            continue
        scalar = str(la.params.get(1, "0")) == "1"
        op = str(la.params.get(0))
        if op == RPOW and scalar:  # b ** x with a constant base
            continue  # a constant negative base: not seen in the wild, not measured
        if not la.bottoms or not la.tops:
            continue
        base = blobs.get(la.bottoms[0] if op == POW else la.bottoms[-1])
        top = blobs.get(la.tops[0])
        if base is None or top is None:
            continue
        base, top = np.asarray(base), np.asarray(top)
        neg = base < 0
        if not neg.any():
            continue
        exponent = str(la.params.get(2, "")) if scalar else "its second input"
        i = np.flatnonzero(neg.ravel())[0]
        b = float(base.ravel()[i])
        got = float(top.ravel()[i]) if top.size == base.size else float("nan")
        want = float("nan")
        if scalar:
            try:
                e = float(exponent)
                want = float(np.float64(b) ** e) if e.is_integer() else float("nan")
            except ValueError:
                pass
        found.append(NegativePow(la.name, exponent, int(neg.sum()), int(base.size), b, got,
                                 want))
    return found


HINT = ("compute the power by multiplication (x * x * x for torch.pow(x, 3)), or as "
        "torch.sign(x) * x.abs() ** p for an odd whole p; for transformers' GELU \"gelu_new\" "
        "(GPT-2 and others), hidden_act / activation_function=\"gelu_pytorch_tanh\" computes "
        "the same function with F.gelu(approximate=\"tanh\"), which ncnn runs as one GELU "
        "layer")


def note(found: list[NegativePow]) -> str:
    """The cause in one line, with one measured case per layer, and the fix."""
    parts = []
    for f in found:
        what = f"pow({f.base:.4g}, {f.exponent}) gave {f.got:.3g}"
        if f.want == f.want:  # not nan
            what += f", not {f.want:.4g}"
        parts.append(f"{f.layer} (BinaryOp pow, exponent {f.exponent}) met {f.negatives} "
                     f"negative bases of {f.size}: {what}")
    return (f"{'; '.join(parts)}: ncnn's vectorised pow computes exp(y * log(x)), garbage "
            f"for a negative base even with a whole exponent; {HINT}")
