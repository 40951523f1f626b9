"""The slope a fused activation lets a weighted op's rounding through: the noise floor of a
layer that applies a sigmoid or a tanh to its sums (noise_floor.py), from its own output.

Pattern: a weighted op whose layer or node applies an elementwise activation to the sums it
computes, so the sums are never a tensor of their own:

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
# an activation's own error, per side, in ulps of 1 (its outputs are within [-1, 1]; ORT's
# rational approximations err in absolute terms, not relative to the output). Measured
# against float64 over [-30, 30]: sigmoid, torch 1.5, ncnn's SIMD path 3.1, ORT 2.8 ulps, and
# any two of them differ by at most 3 (4 on both sides); tanh: torch 0.5, ncnn 4.8, ORT 4.5,
# ORT against torch 5 (10 on both sides)
OWN_ULPS = {SIGMOID: 2.0, TANH: 5.0}
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


def own(act: str) -> float:
    """An activation's own rounding on one side (absolute: its outputs are within [-1, 1])."""
    return OWN_ULPS.get(act, 0.0) * U


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
