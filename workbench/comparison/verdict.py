"""Honest verdicts: a pair that cannot be measured is listed (the comparison goes on), and a
candidate with nothing compared, too little of it explained, or an output that is not torch's
output at its position, is not ok.

``measure_pair`` measures one aligned pair or says why it cannot; ``verdict`` says whether
a candidate's comparison can be trusted at all, before any tolerance is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..shapes import same_elements, squeezed

if TYPE_CHECKING:
    from .metrics import TensorMetrics

MIN_EXPLAINED = 0.5  # below this share of tensors aligned or attributed, no verdict is "ok"


@dataclass
class Verdict:
    """Whether one candidate's comparison says anything: ``compared`` aligned tensors
    measured, ``explained`` the share of its float tensors aligned or attributed; ``ok`` only
    when something was compared, enough was explained and every measured tensor passed.
    ``reasons`` say why not, one phrase each."""

    candidate: str
    compared: int
    explained: float
    passed: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons and self.passed


def measure_pair(ref: Any, cand: Any, tol: Any) -> TensorMetrics | str:
    """The metrics of one aligned pair, or the reason it cannot be measured (a string):
    never an exception, so one odd pair does not lose the comparison. Arrays whose shapes
    differ only in axes of size 1 ([1,1,1,7,7,768] against [1,7,7,768]) hold the same
    elements in the same order and are measured as the reference's shape
    (``shapes.same_elements``)."""
    import numpy as np

    from .metrics import tensor_metrics

    a, b = np.asarray(ref), np.asarray(cand)
    if a.shape != b.shape:
        if not same_elements(a.shape, b.shape):
            return (f"shapes differ: reference {list(a.shape)}, candidate {list(b.shape)} "
                    "(not the same elements in another shape)")
        b = b.reshape(a.shape)
    try:
        return tensor_metrics(a, b, tol)
    except (InputError, ValueError, TypeError) as e:
        return getattr(e, "message", None) or f"{type(e).__name__}: {e}"


def shape_relation(ref_shape: tuple, cand_shape: tuple) -> str | None:
    """How two shapes of one tensor differ beyond ncnn's dropped batch axis, or None."""
    if ref_shape == cand_shape or ref_shape[1:] == cand_shape or cand_shape[1:] == ref_shape:
        return None
    what = ("axes of size 1 differ" if squeezed(ref_shape) == squeezed(cand_shape)
            else "leading axes merged")
    return f"{what}: reference {list(ref_shape)}, candidate {list(cand_shape)}"


def verdict(candidate: str, alignment: Any, records: list[Any],
            min_explained: float = MIN_EXPLAINED, failure: str | None = None) -> Verdict:
    """The verdict on one candidate from its alignment and its measured records; ``failure``:
    why its run failed (it is then not ok whatever else was measured)."""
    compared = len({r.name for r in records})
    explained = alignment.explained_fraction if alignment is not None else 0.0
    reasons = [f"its run failed: {failure}"] if failure else []
    total = (alignment.considered + len(alignment.attributed)) if alignment is not None else 0
    if not compared:
        n = len(alignment.pairs) if alignment is not None else 0
        if not (failure and alignment is None):  # never ran: this would only repeat it
            reasons.append(f"nothing compared ({n} of {total} tensors aligned"
                           + (", none measured" if n else "") + ")"
                           if total else "nothing compared (no float tensor to align)")
    elif explained < min_explained:
        reasons.append(f"only {explained:.0%} of {total} tensors aligned or attributed "
                       f"(threshold {min_explained:.0%})")
    for name, why in (alignment.outputs_unmatched.items() if alignment is not None else ()):
        reasons.append(f"its output {name!r} is not torch's: {why}")
    passed = all(r.metrics.passed for r in records)
    return Verdict(candidate, compared, explained, passed, reasons)
