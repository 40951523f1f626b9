"""fp32's own rounding as the yardstick of an fp32 candidate: the noise floor of each tensor,
and the verdict it decides.

The bound. An fp32 op that sums n terms t_1..t_n (a convolution's or a matmul's w*x over its
reduction, plus its bias) rounds at every step; with round-to-nearest and the rounding errors
independent and of mean zero, its error stays within about sqrt(n) * u * sum |t_i|, with
u = 2**-24 fp32's unit roundoff (Higham & Mary, "A new approach to probabilistic rounding
error analysis", SISC 2019: lambda * sqrt(n) * u * sum |t_i| with probability at least
1 - 2 exp(-lambda^2 / 2) per element). The classic bound gamma_n * sum |t_i| with
gamma_n = n u / (1 - n u) holds for every summation order, but grows with n, not sqrt(n):
at a 3x3 convolution over 512 channels (n = 4608) it is 68 times the sqrt(n) one, so loose
that a weight damaged by 1% of its max would sit under it. The floor takes the sqrt(n) form
at lambda = 1 and leaves the margin to ``FACTOR``. sum |t_i| is what cancellation hides and
the output does not show: a BatchNorm folded into a convolution (running mean -76.65,
variance 0.0024: scale 25.75, bias 1974) computes about -1973.6 + 1974.0, whose fp32 error
(~1e-4) is that of 1974, not of the 0.4 it returns.

Per tensor, not per element: for an op with weights (floor_ops.py reads them from the
candidate's own files, where folding shows), the largest sum |t_i| over the outputs is
bounded per output channel by the smaller of sum_k |w_ck| * max |x| and, by Cauchy-Schwarz,
||w_c||_2 * the input's largest patch norm (``patch_norms``: one compiled pass over the
input), plus |b_c|; the floor is ``SIDES`` * sqrt(n) * u * the largest of them: the
reference's computation rounds too, and its terms (torch's conv, then its BatchNorm's
(y - mean) * scale + shift) are bounded by the folded ones. A recurrent layer's gates are
such sums at every step (its hidden state |h| <= 1), the steps' as one sum of steps * n
terms. Sums, means and products take the same form from their operands' magnitudes; data
movement, max and clamping round nothing (one rounding of the output is allowed to every
op); an activation whose implementations approximate in absolute terms (a sigmoid, a tanh,
softplus, GELU, ...: floor_slopes.ABSOLUTE) its measured ulps of its bound (1 for a sigmoid:
ORT's errs 2.3 ulps of 1 at outputs of 1e-7), the others ``SMOOTH_ULPS`` ulps of their
largest output; a sigmoid or a tanh fused into a weighted op's layer passes the sums'
rounding through its slope, which its output tells (floor_slopes.py: a sigmoid saturated
near 1 passes almost none), and a standalone one its input's error. An op whose terms are not
known (a normalisation, an attention, a custom op, a linear resize whose weights come from
coordinates) falls back to ``FALLBACK_ULPS`` ulps of its largest output per computation, so
that its tolerance is about the former default rtol (1e-3) of the whole tensor's range: its
``floor_basis`` says "fallback".

Accumulated error is the op's rounding plus the error its inputs already carry, which the
comparison measured: an input error e becomes at most ``gain * e`` (a weighted op's largest
row sum of |w|; 1 for data movement, a sum's operands, a mean; an activation's steepest
slope, or a sigmoid's or a tanh's where its output tells it; 2 for a softmax; for a recurrent layer its largest input row sum and for an unknown
op the ratio of its output's range to its input's, estimates). Steps with no reference
tensor of their own (a lowered op's pieces) carry their own floors to the aligned tensor
after them, in both modes.

The verdict: a tensor of an fp32 candidate is divergent when its max abs error exceeds
``FACTOR`` (4) times its noise floor; the record's ``tolerance`` is that bound. 4 covers the
largest element of millions (about six standard deviations of a sum whose partial sums
stay near sum |t_i|, both computations, is under 2.5 floors); a fault stands far above it (a
weight moved by 1% of its max: tens to thousands of floors). A tolerance the caller gives
(``tolerance=``, ``per_op_tolerance=``, ``per_tensor_tolerance=``) overrides it and judges
element by element, as it always did: |ref - cand| <= atol + rtol * |ref|. Low precisions (fp16, bf16, int8) keep
their own rules (tolerance.py's per-element atol + rtol * |ref|).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from . import floor_ops as ops
from . import floor_slopes as slopes
from .floor_patches import matmul_norms, patch_norms

if TYPE_CHECKING:
    from .metrics import TensorMetrics

U = 2.0 ** -24  # fp32's unit roundoff
SIDES = 2  # the reference's computation and the candidate's
FACTOR = 4.0  # divergent above FACTOR * noise floor: the record's tolerance
SMOOTH_ULPS = 64  # an activation's own error, in ulps of its largest output
FALLBACK_ULPS = 2048  # an op whose terms are not known: ulps of its largest output


@dataclass
class FloorInputs:
    """What one fp32 candidate's floors are computed from, on one input set: each tensor's
    ``OpFloor``, and the magnitude (max |v|) and shape of the tensors that have no record
    (its graph inputs, the steps of a lowered op) taken from its captured values."""

    rules: dict[str, ops.OpFloor]
    aligned: set[str]
    mags: dict[str, float] = field(default_factory=dict)
    shapes: dict[str, tuple] = field(default_factory=dict)
    # a weighted op's largest input patch norm per group, a matmul's row x column norms
    patch: dict[str, Any] = field(default_factory=dict)
    # a fused sigmoid's or tanh's outputs per channel: how near its steepest point they come
    gaps: dict[str, Any] = field(default_factory=dict)
    # their max abs error in the accumulated run: an isolated run's outputs lie within it
    seen: dict[str, float] = field(default_factory=dict)


def floor_inputs(cand: Any, al: Any, values: dict[str, Any], feeds: dict[str, Any] | None
                 ) -> FloorInputs | None:
    """The FloorInputs of an fp32 candidate (None for a low precision one: its own rules).
    ``values`` its captured tensors, ``feeds`` its inputs as it was fed them."""
    import numpy as np

    if getattr(cand, "precision", "fp32") != "fp32":
        return None
    try:
        rules = ops.op_floors(cand.kind, cand.path)
    except Exception:  # noqa: BLE001 - an unreadable file: every op falls back
        rules = {}
    if any(r.op in ops.QUANTIZED or r.op.startswith("QLinear") for r in rules.values()) or any(
            getattr(v, "dtype", None) is not None and v.dtype.kind == "f" and v.dtype.itemsize < 4
            for v in values.values()) or any(r.stored_low for r in rules.values()):
        return None  # a model holding int8 or 16-bit floats, given as a path: its own rules
    out = FloorInputs(rules, set(al.pairs))
    every = {**(feeds or {}), **values}
    wanted = set(rules) | {i for r in rules.values() for i in r.inputs}
    for name in wanted:
        v = every.get(name)
        if v is None:
            continue
        out.shapes[name] = np.shape(v)
        if name not in out.aligned:
            out.mags[name] = absmax(v)
    _patches(out, every)
    _gaps(out, every)
    return out


def _gaps(fi: FloorInputs, every: dict[str, Any]) -> None:
    """fi.gaps of every weighted op whose fused activation's slope its output tells (per
    channel), and of every standalone sigmoid or tanh (one for the tensor)."""
    import numpy as np

    for name, r in fi.rules.items():
        if r.act not in slopes.RECOVERABLE or every.get(name) is None:
            continue
        if r.kind == ops.WEIGHTED and r.rows is not None:
            got = slopes.channel_gaps(r.act, every[name], int(np.size(r.rows)),
                                      None if r.window is None else len(r.window))
        elif r.kind == ops.SMOOTH:
            got = slopes.channel_gaps(r.act, every[name], 1, None)
        else:
            continue
        if got is not None:
            fi.gaps[name] = got


def _patches(fi: FloorInputs, every: dict[str, Any]) -> None:
    """fi.patch of every weighted op and matmul whose input is at hand (one pass per input
    and way of reading it)."""
    done: dict[tuple, Any] = {}
    for name, r in fi.rules.items():
        if not r.inputs or any(every.get(i) is None for i in r.inputs):
            continue
        if r.kind in (ops.WEIGHTED, ops.RECURRENT) and r.window is not None and r.cin:
            key = (r.inputs[0], r.cin, r.groups, r.window)
            if key not in done:
                done[key] = patch_norms(every[r.inputs[0]], r.cin, r.groups, r.window)
            got = done[key]
        elif r.kind == ops.MATMUL and len(r.inputs) == 2:
            got = matmul_norms(every[r.inputs[0]], every[r.inputs[1]])
        else:
            continue
        if got is not None:
            fi.patch[name] = got


def absmax(v: Any) -> float:
    """max |v| over the finite values of a float array (0 for any other dtype)."""
    import numpy as np

    a = np.asarray(v)
    if a.dtype.kind != "f" or not a.size:
        return 0.0
    top = max(-float(a.min()), float(a.max()))
    if not math.isfinite(top):
        a = a[np.isfinite(a)]
        top = float(np.abs(a).max()) if a.size else 0.0
    return top


def _size(shape: tuple | None) -> int:
    return int(math.prod(shape)) if shape is not None else 0


class _Eval:
    """The floors of one run (``mode``) from its measured records, in topological order."""

    def __init__(self, fi: FloorInputs, mode: str, measured: dict[str, TensorMetrics]):
        self.fi, self.mode, self.measured = fi, mode, measured
        self.floors: dict[str, float] = {}
        self.basis: dict[str, str] = {}

    def mag(self, name: str) -> float | None:
        m = self.measured.get(name)
        return m.ref_absmax if m is not None else self.fi.mags.get(name)

    def err(self, name: str) -> float:
        """The error ``name`` carries into the op that reads it."""
        if name in self.measured and self.mode == "accumulated":
            return self.measured[name].max_abs
        if name in self.fi.aligned and self.mode == "isolated":
            return 0.0  # fed from the reference
        return self.floors.get(name, 0.0)  # a step's own floor; an input or constant: 0

    def run(self) -> None:
        for name, rule in self.fi.rules.items():
            floor, basis = self.floor(name, rule)
            self.floors[name] = floor
            carried = [self.basis.get(i) for i in rule.inputs if i not in self.fi.aligned]
            self.basis[name] = "fallback" if "fallback" in carried else basis

    def slope(self, name: str, rule: ops.OpFloor) -> Any:
        """Per channel, the steepest slope of a sigmoid or tanh (fused, or standalone: one
        for the tensor) between the reference's outputs and this run's (floor_slopes.py): they
        lie within the tensor's measured error of the captured (accumulated) ones, and in an
        isolated run within that plus the accumulated run's. None for an op with no such
        activation."""
        if rule.kind not in (ops.WEIGHTED, ops.SMOOTH) or rule.act not in slopes.RECOVERABLE:
            return None
        m = self.measured.get(name)
        radius = None
        if m is not None and self.mode == "accumulated":
            radius = self.fi.seen[name] = m.max_abs
        elif m is not None and name in self.fi.seen:
            radius = self.fi.seen[name] + m.max_abs
        return slopes.slopes(rule.act, self.fi.gaps.get(name), radius)

    def floor(self, name: str, rule: ops.OpFloor) -> tuple[float, str]:
        """(noise floor, basis) of one tensor: SIDES times its op's rounding plus the error
        its inputs carry through it."""
        m_out = self.mag(name)
        m_in = [self.mag(i) for i in rule.inputs]
        local_gains = None if m_out is None else _local(rule, m_out, m_in, [
            self.fi.shapes.get(i) for i in rule.inputs], self.fi.shapes.get(name),
            self.fi.patch.get(name), self.slope(name, rule))
        basis = rule.kind if rule.kind in (ops.EXACT, ops.SMOOTH, ops.FALLBACK) else "terms"
        if local_gains is None:  # terms unknown: a floor from the tensor's own magnitude
            top_in = max((m for m in m_in if m), default=0.0)
            m_out = m_out or 0.0
            local = fallback_floor(m_out) / SIDES
            gains = [max(1.0, m_out / top_in if top_in else 1.0)] * len(rule.inputs)
            combine, basis = sum, "fallback"
        else:
            local, gains, combine = local_gains
            local = max(local, U * m_out)  # every op may round its output once
        carried = [g * self.err(i) for g, i in zip(gains, rule.inputs, strict=True)]
        return SIDES * local + (combine(carried) if carried else 0.0), basis


def _terms(rule: ops.OpFloor, m_x: float, patch: Any) -> float:
    """The largest sum |w| |x| + |b| over a weighted op's outputs."""
    import numpy as np

    return float(np.max(_row_terms(rule, m_x, patch)))


def _row_terms(rule: ops.OpFloor, m_x: float, patch: Any) -> Any:
    """sum |w| |x| + |b| per output row of a weighted op, at most: the smaller of sum |w| *
    max |x| and ||w||_2 * its group's largest input patch norm, plus its |b| (the largest
    |b| where the biases are not one per row)."""
    import numpy as np

    rows, bias = np.asarray(rule.rows * m_x, dtype=np.float64), rule.bias
    if patch is not None and rule.rows2 is not None and np.shape(rule.rows2) == np.shape(rows):
        per = rows.size // max(np.size(patch), 1)
        near = np.repeat(patch, per) if per * np.size(patch) == rows.size else np.max(patch)
        rows = np.minimum(rows, rule.rows2 * near)
    if bias is not None and np.shape(bias) == np.shape(rows):
        return rows + bias
    return rows + (float(np.max(bias)) if bias is not None and np.size(bias) else 0.0)


def _local(rule: ops.OpFloor, m_out: float, m_in: list[float | None],
           shapes: list[tuple | None], out_shape: tuple | None,
           patch: Any = None, slope: Any = None) -> tuple | None:
    """(one computation's rounding, the gain of each input, how carried errors combine) of
    one op; None when its terms are not known. ``slope``: a sigmoid's or a tanh's, fused into
    a weighted op (per channel) or standalone (_Eval.slope); None where the output does not
    tell it (the rounding of the sums; an activation's steepest slope)."""
    import numpy as np

    k, lip = rule.kind, rule.lipschitz
    if k == ops.EXACT:
        return 0.0, [lip] * len(m_in), max
    if any(m is None for m in m_in):
        return None
    if k == ops.WEIGHTED and m_in and slope is not None:
        local, gain = slopes.through(rule.act, ops.ulp_terms(rule) * U * _row_terms(
            rule, m_in[0], patch), rule.rows, slope)
        return local, [gain], sum
    if k == ops.WEIGHTED and m_in:
        s = _terms(rule, m_in[0], patch)
        return ops.ulp_terms(rule) * U * s, [float(np.max(rule.rows)) * lip], sum
    if k == ops.RECURRENT and m_in and shapes[0] and rule.cin:
        # each step's gates round as a weighted sum and the state carries them on (damped:
        # a forget gate <= 1): the steps' sums as one sum of steps * n terms. An input error
        # moves the gates by at most the largest row sum of |w| and passes their slopes
        # (<= 1) once: an estimate, not a bound
        steps = max(_size(shapes[0]) // rule.cin, 1)
        s = _terms(rule, m_in[0], patch)
        return math.sqrt(steps) * ops.ulp_terms(rule) * U * s, [float(np.max(rule.rows))], sum
    if k == ops.MATMUL and len(m_in) == 2 and shapes[0]:
        n = shapes[0][-1]
        s = n * m_in[0] * m_in[1]
        s = min(s, patch) if patch is not None else s
        return math.sqrt(n) * U * s, [n * m_in[1], n * m_in[0]], sum
    if k == ops.SUM:
        return math.sqrt(max(rule.n, 1)) * U * (sum(m_in) + rule.const), [lip] * len(m_in), sum
    if k == ops.PRODUCT:
        gains = [rule.const * math.prod(m for j, m in enumerate(m_in) if j != i)
                 for i in range(len(m_in))]
        return len(m_in) * U * m_out, gains, sum
    if k in (ops.MEAN, ops.REDUCE_SUM) and m_in:
        n = rule.n or max(_size(shapes[0]) // max(_size(out_shape), 1), 1)
        total = n if k == ops.REDUCE_SUM else 1
        return math.sqrt(n) * U * total * m_in[0], [float(total)], sum
    if k == ops.SMOOTH:
        return _smooth(rule, m_out), [_smooth_gain(rule, m_out, slope)] * len(m_in), sum
    if k == ops.SOFTMAX and shapes and shapes[0]:
        return SMOOTH_ULPS * math.sqrt(shapes[0][-1]) * U * m_out, [2.0] * len(m_in), sum
    return None


def _smooth(rule: ops.OpFloor, m_out: float) -> float:
    """A standalone activation's own rounding: absolute, its measured ulps of the larger of
    its bound and its largest output, where its implementations approximate in absolute
    terms (floor_slopes.ABSOLUTE: a sigmoid's near 0 as near 1); ``SMOOTH_ULPS`` ulps of its
    largest output for the others."""
    if rule.act in slopes.OWN_ULPS:
        return slopes.own(rule.act, max(rule.bound, m_out))
    return SMOOTH_ULPS * U * m_out


def _smooth_gain(rule: ops.OpFloor, m_out: float, slope: Any) -> float:
    """What a standalone activation makes of an error in its input: the slope its output
    tells (a sigmoid's or a tanh's, ``slope``), its steepest (``lipschitz``), or for exp its
    largest output (its slope is its value)."""
    import numpy as np

    if slope is not None:
        return float(np.max(slope))
    return m_out if rule.lipschitz < 0 else rule.lipschitz


def noise_floors(fi: FloorInputs, mode: str, measured: dict[str, TensorMetrics]
                 ) -> dict[str, tuple[float, str]]:
    """{candidate tensor: (noise floor, basis)} of one run: ``mode`` "accumulated" (inputs
    carry their measured error) or "isolated" (aligned inputs fed from the reference);
    ``measured`` the run's metrics by candidate tensor. Basis: "terms" (the op's terms are
    known), "exact", "smooth" (an activation) or "fallback" (its own magnitude)."""
    ev = _Eval(fi, mode, measured)
    ev.run()
    return {n: (ev.floors[n], ev.basis[n]) for n in ev.floors}


def op_noise_floor(rule: ops.OpFloor, out: Any, inputs: dict[str, Any],
                   ref: Any = None) -> float:
    """The noise floor of one op computed alone on exact inputs (an isolated run): ``rule``
    its OpFloor, ``out`` its output, ``inputs`` {name: array} of what it reads; ``ref`` the
    reference's output, if known (a sigmoid's or a tanh's slope, fused or standalone, is then
    taken between the two: floor_slopes.py)."""
    import numpy as np

    from .metrics import Tolerance, tensor_metrics

    fi = FloorInputs({"out": rule}, set(inputs), {"out": absmax(out)},
                     {"out": np.shape(out), **{n: np.shape(v) for n, v in inputs.items()}})
    fi.mags.update({n: absmax(v) for n, v in inputs.items()})
    _patches(fi, inputs)
    _gaps(fi, {"out": out})
    if ref is None:
        return noise_floors(fi, "isolated", {})["out"][0]
    # on exact inputs the run is its own accumulated one: the outputs differ by the measured
    return noise_floors(fi, "accumulated", {"out": tensor_metrics(ref, out, Tolerance())})[
        "out"][0]


def fallback_floor(top: float) -> float:
    """The noise floor of a tensor whose op's terms are not known, from its largest value."""
    return SIDES * FALLBACK_ULPS * U * top


def judged(m: TensorMetrics, floor: float, basis: str, tol: Any = None,
           over: Any = None) -> TensorMetrics:
    """``m`` decided by one rule, which its ``tolerance`` states: ``FACTOR`` * ``floor``, or
    the caller's ``tol`` (a Tolerance) over the whole tensor, atol + rtol * max |ref|.
    ``passed`` is max abs <= tolerance; ``frac_over_tol`` the share of elements over it
    (``over(bound)`` counts them, asked only when some are); ``min_tol`` the smallest atol
    that passes with the rule's rtol (0 for the floor's)."""
    rtol = float(tol.rtol) if tol is not None else 0.0
    bound = (float(tol.atol) + rtol * m.ref_absmax) if tol is not None else FACTOR * floor
    if not math.isfinite(bound):  # magnitudes past fp32's range: the former default
        bound, basis = DEFAULT_ATOL + DEFAULT_RTOL * m.ref_absmax, "fallback"
    passed = m.max_abs <= bound and math.isfinite(m.max_abs)
    frac = 0.0 if passed else (over(bound) / m.size if over is not None and m.size else 1.0)
    return dataclasses.replace(m, tolerance=bound, passed=passed, frac_over_tol=frac,
                               min_tol=max(0.0, m.max_abs - rtol * m.ref_absmax),
                               noise_floor=floor, floor_basis=basis)


def count_over(ref: Any, cand: Any, bound: float) -> int:
    """Elements with |ref - cand| > bound (a NaN in ref is undefined there, not over; equal
    infinities are equal)."""
    import numpy as np

    a = np.asarray(ref, dtype=np.float64).reshape(-1)
    b = np.asarray(cand, dtype=np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
        return int(np.count_nonzero(~(diff <= bound) & (a != b) & ~np.isnan(a)))
