"""How one candidate op rounds, as the fp32 noise floor (noise_floor.py) reads it: the
``OpFloor`` each file reader fills (floor_ops.py for ONNX, floor_ncnn.py for ncnn), its kinds,
and the magnitudes of a weighted op's terms taken from its weights (float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# kinds (noise_floor.py says how each rounds and carries error)
WEIGHTED = "weighted"  # sum over a row of weights times inputs, plus a bias
MATMUL = "matmul"  # a product of two activations
EXACT = "exact"  # moves, selects or clamps values: no rounding of its own
SUM = "sum"  # adds its operands (and constants)
PRODUCT = "product"  # multiplies its operands (and constants)
MEAN = "mean"  # an average over a window (n terms, or the input/output size ratio)
REDUCE_SUM = "reduce_sum"  # a sum over an axis (n from the input/output size ratio)
SMOOTH = "smooth"  # an activation computed to a few ulps; ``lipschitz`` its steepest slope
SOFTMAX = "softmax"  # normalised exponentials: carries at most twice the input's error
# an LSTM/GRU/RNN: a weighted sum per gate and step (input rows in ``rows``; the hidden
# state's, |h| <= 1, folded into ``bias``), its rounding carried over the sequence's steps
RECURRENT = "recurrent"
FALLBACK = "fallback"  # terms unknown: a floor from the tensor's own magnitude

# ops of a quantized model: a candidate holding them is judged by low precision's rules
QUANTIZED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                       "MatMulInteger", "ConvInteger", "Quantize", "Dequantize", "Requantize"})


@dataclass(frozen=True)
class OpFloor:
    """How one candidate op rounds: ``kind``; ``inputs`` the activations it reads (constants
    folded into ``const``); ``n`` terms per output element; ``rows``/``bias`` the per-output
    sum of |w| and |bias| (a weighted op); ``lipschitz`` the largest slope of what it
    applies elementwise (an activation, a fused one, a sum's coefficients); ``op`` the op or
    layer type it was read from. A weighted op also gives the L2 norm of each output's row
    (``rows2``) and how it reads its input (``cin`` channels in ``groups``, a patch
    ``window`` wide on each spatial axis, () for a matmul's rows, None when unknown), for
    the Cauchy-Schwarz bound (floor_patches.patch_norms). ``stored_low``: an ncnn layer whose
    .bin stores its weights in fp16 or int8 (their rounding is not fp32's). ``act`` the
    activation a weighted op's layer or node applies to its sums, "" for none (its slope:
    floor_slopes.py); for a standalone activation (SMOOTH) whose implementations round in
    absolute terms, its name, and ``bound`` the magnitude its rounding is counted in ulps of
    (1 for a sigmoid or a tanh; an ELU's alpha: floor_slopes.ABSOLUTE)."""

    kind: str
    inputs: tuple[str, ...] = ()
    n: int = 0
    rows: Any = None
    bias: Any = None
    const: float = 0.0
    lipschitz: float = 1.0
    op: str = ""
    rows2: Any = None
    cin: int = 0
    groups: int = 1
    window: tuple[int, ...] | None = None
    stored_low: bool = False
    act: str = ""
    bound: float = 0.0


def abs_rows(w: Any, rows: int) -> Any:
    """Sum of |w| over each of ``rows`` output rows (float64)."""
    import numpy as np

    return np.abs(np.asarray(w, dtype=np.float64)).reshape(rows, -1).sum(axis=1)


def norm_rows(w: Any, rows: int) -> Any:
    """The L2 norm of each of ``rows`` output rows (float64)."""
    import numpy as np

    return np.sqrt(np.square(np.asarray(w, dtype=np.float64)).reshape(rows, -1).sum(axis=1))


def extent(kernel: Any, dilation: Any) -> tuple[int, ...]:
    """The input extent a (dilated) kernel reads on each spatial axis."""
    dilation = list(dilation or []) + [1] * len(kernel)
    return tuple((int(k) - 1) * int(d) + 1 for k, d in zip(kernel, dilation, strict=False))


def abs_bias(b: Any) -> Any:
    """|b| as a flat float64 array (None for no bias)."""
    import numpy as np

    return None if b is None else np.abs(np.asarray(b, dtype=np.float64)).reshape(-1)


def max_abs(a: Any) -> float:
    """max |a| over its finite values (0 for none)."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)] if a.size else a
    return float(np.abs(a).max()) if a.size else 0.0


def recurrent(acts: tuple[str, ...], w_x: Any, w_h: Any, bias: Any, op: str) -> OpFloor:
    """A recurrent layer's gate rows: input rows ``w_x``, hidden rows ``w_h`` (|h| <= 1)."""
    import numpy as np

    rows = abs_rows(w_x, w_x.shape[0])
    fixed = abs_rows(w_h, w_h.shape[0]) + (bias if np.size(bias) == w_h.shape[0]
                                           else np.max(bias, initial=0.0))
    return OpFloor(RECURRENT, acts, w_x.shape[1] + w_h.shape[1] + 1, rows, fixed, op=op,
                   rows2=norm_rows(w_x, w_x.shape[0]), cin=w_x.shape[1], window=())


def ulp_terms(rule: OpFloor) -> float:
    """sqrt(n): how the rounding of an n-term sum grows (see noise_floor.py)."""
    return math.sqrt(max(rule.n, 1))
