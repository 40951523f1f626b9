"""An activation's part in the fp32 noise floor (noise_floor.py): the slope it lets an error
in its input through, told by its own output, and its own rounding, absolute where its
implementations approximate in absolute terms.

Pattern 1, fused: a weighted op whose layer or node applies an elementwise activation to the
sums it computes, so the sums are never a tensor of their own:

    ncnn   Convolution | Convolution1D | ConvolutionDepthWise* | Deconvolution* | InnerProduct
           with 9=activation_type (1 relu, 2 leaky relu, 3 clip, 4 sigmoid, 5 mish, 6 hardswish)
    ONNX   com.microsoft FusedConv | FusedGemm with activation="Sigmoid" | "Tanh" | "Relu" ...

floor_ops.py reads the activation into ``OpFloor.act``. The rule: the sums' rounding p (the
floor of the weighted op, per output channel c) reaches the output as |f(p_ref) - f(p_cand)|
<= max |f'| between the two pre-activations * |p_ref - p_cand|, plus the activation's own
rounding. For a sigmoid and a tanh the slope is a function of the output (s (1 - s) =
1/4 - (s - 1/2)^2; 1 - t^2), and the outputs between the reference's and the candidate's lie
within ``radius`` of the candidate's captured one (radius: the tensor's measured max abs error
in that run, plus the accumulated run's in an isolated run, whose outputs are not the ones
captured, plus each side's own rounding): so per channel

    slope_c = h^2 - max(gap_c - radius, 0)^2,   gap_c = min over c's outputs of |out - mid|

(mid the output where the slope is steepest and h^2 that slope: 1/2 and 1/4 for a sigmoid,
0 and 1 for a tanh), and
the layer's rounding is max_c slope_c * sqrt(n) u S_c + ``OWN_ULPS`` u. A sigmoid saturated at
1 - 1.4e-6 passes a 128-term sum's rounding (3e-5) through a slope of 1.4e-6: its floor is
its own rounding, 2 ulps, not the sum's. Where the radius is not known (a tensor not measured,
an isolated run with no accumulated one) the slope is the steepest, and the floor is the
sum's floor times it plus the activation's own rounding. A piecewise-linear activation
(relu, clip, leaky relu, hard sigmoid) or one that is not monotonic (mish, hardswish, swish)
keeps the floor it had: an output at a clip's bound or at a relu's zero does not say how far
past it the sum went, so the slope there cannot be told from the output.

Pattern 2, standalone: an activation that is a node or layer of its own (ONNX Sigmoid, Tanh,
HardSigmoid, Softplus, Elu/Celu/Selu, Gelu, Mish, HardSwish; ncnn's layers of those names,
TanH, ELU, ...: ``ABSOLUTE``). Its own rounding is ``OWN_ULPS`` ulps of its bound (1 for a
sigmoid or a tanh; the larger of the bound and its largest output where it grows past it),
measured per implementation, not ulps of its largest output: ORT's sigmoid errs 2.3 ulps of
1 at outputs of 1e-7 (inputs in [-17.5, -15]), which 64 ulps of the largest output (a
tolerance of 9e-12) called a divergence; ncnn's tanh 2.2 ulps of 1 at outputs of 1e-3. A
sigmoid's or a tanh's input error passes through the slope its output tells, as above with
one gap for the whole tensor: inputs near -16 carry an upstream error through 1e-7 of it.
"""

from __future__ import annotations

import math
from typing import Any

U = 2.0 ** -24  # fp32's unit roundoff (noise_floor.U)
# the steepest slope of activations (|f'| at most), by op type: what an input error becomes
LIPSCHITZ = {"Sigmoid": 0.25, "HardSigmoid": 0.5, "Tanh": 1.0, "TanH": 1.0, "Softplus": 1.0,
             "Erf": 1.13, "Gelu": 1.13, "GELU": 1.13, "Swish": 1.1, "Mish": 1.1,
             "HardSwish": 1.5, "Elu": 1.0, "ELU": 1.0, "Celu": 1.0, "CELU": 1.0,
             "Selu": 1.76, "SELU": 1.76, "Softsign": 1.0, "BNLL": 1.0}
SIGMOID, TANH = "sigmoid", "tanh"
# the activations whose slope the output tells: (where the slope is steepest, its square root)
RECOVERABLE = {SIGMOID: (0.5, 0.5), TANH: (0.0, 1.0)}
# activations whose implementations round in absolute terms, by op type (ONNX, ncnn): their
# own error is a few ulps of a bound of what they compute with (``own``), however small their
# outputs. A sigmoid's, a tanh's, a hard sigmoid's outputs' range (1: ORT's rational
# approximations; ncnn's tanh near 0), softplus's 1 + e^x (ncnn: log(exp(x) + 1)), an ELU's
# alpha (alpha (e^x - 1) near 0; a SELU's alpha * gamma: the caller passes it), the gate
# GELU, Mish and hard swish multiply their input by (torch's GELU, ncnn's Mish in their tails)
ABSOLUTE = {"Sigmoid": SIGMOID, "Tanh": TANH, "TanH": TANH, "HardSigmoid": "hardsigmoid",
            "Softplus": "softplus", "Elu": "elu", "ELU": "elu", "Celu": "elu", "CELU": "elu",
            "Selu": "selu", "SELU": "selu", "Gelu": "gelu", "GELU": "gelu", "Mish": "mish",
            "HardSwish": "hardswish"}
# an activation's own error, per side, in ulps of its bound, or of its largest output where
# that is larger (softplus, GELU, ... grow past their bound): half the largest difference
# measured between any two of torch, ORT and ncnn's packed and scalar paths, each against
# float64 on inputs over [-88, 30], 64K per decade of the curve. Sigmoid: torch 1.5, ORT
# 2.3 (at outputs near 1e-8 too: ORT's approximation is absolute, and zero below -18), ncnn
# 2.4 (3.1 measured before); any two differ by 3 ulps of 1. Tanh: torch 0.5, ncnn 4.8 (2.2
# ulps of 1 at outputs of 1e-3: not relative), ORT 5.2; torch against either 5. Hard sigmoid
# 3 (ncnn 1.75 at outputs near 0: alpha x + beta cancels), softplus 3.1 (ncnn 1 ulp of 1 at
# outputs of 1e-7), ELU and CELU 1 (ORT's e^x - 1 near 0), SELU 2.3, GELU 17 (torch's own,
# x in [-5, -3]; its tanh form 13 against ncnn's), Mish 20 (ncnn's, x in [-8, -5]), hard
# swish 5.3 (ncnn near -3). Erf (relative near 0, 1 ulp near +-1), swish, exp and log err
# relative to their outputs: not here (noise_floor.SMOOTH_ULPS of the largest output)
OWN_ULPS = {SIGMOID: 2.0, TANH: 5.0, "hardsigmoid": 2.0, "softplus": 2.0, "elu": 1.0,
            "selu": 2.0, "gelu": 9.0, "mish": 10.0, "hardswish": 3.0}
# ncnn's activation_type (9=) and ORT's fused ops' activation attribute, by name
NCNN_ACT = {1: "relu", 2: "leakyrelu", 3: "clip", 4: SIGMOID, 5: "mish", 6: "hardswish"}
ONNX_ACT = {"Relu": "relu", "LeakyRelu": "leakyrelu", "Clip": "clip", "Sigmoid": SIGMOID,
            "Tanh": TANH, "HardSigmoid": "hardsigmoid"}


def steepest(act: str, alpha: float | None = None) -> float:
    """The steepest slope of a fused activation by name (``alpha``: a leaky relu's or a hard
    sigmoid's slope, None for the default); 0 for one not known."""
    if act == "leakyrelu":
        return max(1.0, abs(alpha if alpha is not None else 0.01))
    if act == "hardsigmoid":
        return abs(alpha if alpha is not None else 0.2)
    return {"relu": 1.0, "clip": 1.0, SIGMOID: 0.25, TANH: 1.0, "mish": 1.1,
            "hardswish": 1.5}.get(act, 0.0)


def channel_gaps(act: str, out: Any, rows: int, spatial: int | None) -> Any:
    """Per output channel, how close its outputs come to where ``act`` is steepest (min
    |out - mid|): ``out`` the candidate's output, ``rows`` its channels, on axis -(spatial +
    1) (0: the last axis, a matmul's; None: the layout is not known). One value for the whole
    tensor where the channels are not on that axis; None for an activation whose slope the
    output does not tell, or no finite value."""
    import numpy as np

    if act not in RECOVERABLE:
        return None
    a = np.asarray(out)
    if a.dtype.kind != "f" or not a.size:
        return None
    gap = np.abs(a.astype(np.float64) - RECOVERABLE[act][0])
    gap = np.where(np.isfinite(gap), gap, 0.0)  # a NaN or inf: the steepest, nothing known
    axis = a.ndim - spatial - 1 if spatial is not None else -1
    if spatial is not None and 0 <= axis < a.ndim and a.shape[axis] == rows:
        return np.moveaxis(gap, axis, 0).reshape(rows, -1).min(axis=1)
    return np.array([gap.min()])


def slopes(act: str, gaps: Any, radius: float | None) -> Any:
    """The steepest slope of ``act`` per channel between the reference's outputs and the
    candidate's, which lie within ``radius`` of the gaps' outputs (None: not known, the
    steepest everywhere)."""
    import numpy as np

    mid, h = RECOVERABLE[act]
    if gaps is None or radius is None or not math.isfinite(radius):
        return np.array([h * h])
    # each side's output is within its own rounding of the activation of its sums
    d = np.maximum(np.asarray(gaps, dtype=np.float64) - (radius + 2 * own(act)), 0.0)
    return np.clip((h - d) * (h + d), 0.0, h * h)


def own(act: str, scale: float = 1.0) -> float:
    """An activation's own rounding on one side, absolute: ``OWN_ULPS`` ulps of ``scale`` (1
    for a fused sigmoid or tanh, whose outputs are within [-1, 1]; for a standalone one the
    larger of its bound and its largest output); 0 for an activation not in the table."""
    return OWN_ULPS.get(act, 0.0) * U * scale


def absolute(op: str, alpha: float = 1.0) -> tuple[str, float]:
    """(activation, bound) of a standalone activation op whose rounding is absolute
    (``ABSOLUTE``), ("", 0) for the others: the bound 1, or |alpha| for an ELU, a CELU and a
    SELU (alpha * gamma)."""
    act = ABSOLUTE.get(op, "")
    if not act:
        return "", 0.0
    return act, abs(alpha) if act in ("elu", "selu") else 1.0


def through(act: str, local: Any, rows: Any, slope: Any) -> tuple[float, float]:
    """(the rounding, the gain of its input's error) of a weighted op with ``act`` fused:
    ``local`` its sums' rounding per channel, ``rows`` their sums of |w|, ``slope`` the
    activation's per channel (or one for the tensor)."""
    import numpy as np

    local, rows = np.asarray(local, dtype=np.float64), np.asarray(rows, dtype=np.float64)
    slope = np.asarray(slope, dtype=np.float64)
    if slope.size == local.size == rows.size:
        return float(np.max(slope * local)) + own(act), float(np.max(slope * rows))
    top = float(np.max(slope))
    return top * float(np.max(local)) + own(act), top * float(np.max(rows))
