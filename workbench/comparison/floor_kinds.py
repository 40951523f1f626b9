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


# elements of a weight converted to float64 at a time: a 151,936 x 896 embedding read whole
# would take 1.1 GB per copy (three of them: the float64 array, its |w|, its square)
CHUNK = 1 << 22


def row_sums(w: Any, rows: int, term: Any) -> Any:
    """sum(term(w)) over each of ``rows`` output rows, in float64, a slice of rows at a
    time (each row summed whole, as numpy sums it: the figures do not depend on the
    slicing)."""
    import numpy as np

    w = np.asarray(w)
    if not rows or not w.size:
        return term(np.asarray(w, dtype=np.float64)).reshape(rows, -1).sum(axis=1)
    w = w.reshape(rows, -1)
    step = max(1, CHUNK // w.shape[1])
    return np.concatenate([term(w[i:i + step].astype(np.float64)).sum(axis=1)
                           for i in range(0, rows, step)])


def abs_rows(w: Any, rows: int) -> Any:
    """Sum of |w| over each of ``rows`` output rows (float64)."""
    import numpy as np

    return row_sums(w, rows, np.abs)


def norm_rows(w: Any, rows: int) -> Any:
    """The L2 norm of each of ``rows`` output rows (float64)."""
    import numpy as np

    return np.sqrt(row_sums(w, rows, np.square))


def column_sums(w: Any) -> tuple[Any, Any]:
    """(sum of |w|, sum of w**2) over axis -2 of ``w``, in float64, a slice of its last
    axis at a time in the layout ``w`` has (numpy sums each column as it would the whole
    array's: slices of at least two columns keep the reduction's order)."""
    import numpy as np

    w = np.asarray(w)
    n = w.shape[-1]
    step = max(2, CHUNK // max(1, w.size // max(n, 1)))
    if n < 2 * step:
        step = n
    bounds = list(range(0, n, step))
    if len(bounds) > 1 and n - bounds[-1] < 2:
        bounds.pop()  # the last slice takes the remainder: never a single column
    ends = bounds[1:] + [n]
    absum, sqsum = [], []
    for a, b in zip(bounds, ends, strict=True):
        part = w[..., a:b].astype(np.float64)
        absum.append(np.abs(part).sum(axis=-2))
        sqsum.append(np.square(part).sum(axis=-2))
    if not bounds:
        part = w.astype(np.float64)
        return np.abs(part).sum(axis=-2), np.square(part).sum(axis=-2)
    return np.concatenate(absum, axis=-1), np.concatenate(sqsum, axis=-1)


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

    flat = np.asarray(a).reshape(-1)
    top = None
    for i in range(0, flat.size, CHUNK):  # a slice at a time: no float64 copy of it whole
        part = flat[i:i + CHUNK].astype(np.float64)
        part = part[np.isfinite(part)]
        if part.size:
            m = float(np.abs(part).max())
            top = m if top is None else max(top, m)
    return 0.0 if top is None else top


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
