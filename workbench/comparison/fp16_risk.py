"""Which layers fp16 arithmetic breaks: the layers of an fp16 candidate (ncnn's ARM build,
``NcnnRunner(nc, precision="fp16", target="arm64-v8.2")``) whose output, computed on the
reference's own inputs (isolated mode), overflows fp16 (inf or NaN where the reference is
finite) or loses more than fp16 storage alone would.

Each is named by the ncnn layer to set ``31=`` on (``wb.ncnn_featmask(nc, layers,
fp16_arithmetic=False)``), with its inputs' and output's range beside fp16's largest finite
value, 65504: a sum whose terms or partial sums pass it is infinite in fp16 whatever the
exact result (64 products of 250 x 250 summed to 0 give inf or NaN on an ARMv8.2 phone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .candidates import candidate_tensors

if TYPE_CHECKING:
    from .record import Record
    from .report import CompareReport

FP16_MAX = 65504.0  # fp16's largest finite value
# fp16 storage alone, rounding an output to 11 significant bits, keeps about 6.02 * 11 + 1.76
# = 68 dB; an fp16-arithmetic layer whose isolated SNR falls under this loses far more than
# its storage does (long sums, cancellation): it is listed
DEFAULT_MIN_SNR_DB = 40.0


@dataclass(frozen=True)
class Fp16Risk:
    """One layer fp16 arithmetic breaks, measured on the reference's inputs (isolated).

    Attributes:
        layer: the ncnn layer (what ``wb.ncnn_featmask`` takes).
        op_type: its type.
        reference: the reference tensor (module) it is aligned to; ``covers`` what a fused
            layer spans.
        overflow: its output holds inf/NaN where the reference is finite.
        snr_db: its isolated SNR (-inf on overflow).
        output_max: the largest |value| of its reference output.
        input_max: the largest |value| of its reference inputs (None: not aligned).
        record: the isolated record it comes from.
    """

    layer: str
    op_type: str
    reference: str
    covers: tuple[str, ...]
    overflow: bool
    snr_db: float
    output_max: float
    input_max: float | None
    record: Record

    def describe(self) -> str:
        """One line: the layer, what breaks, and the magnitudes beside fp16's limit."""
        inputs = "inputs not aligned" if self.input_max is None else \
            f"inputs up to {self.input_max:.4g}"
        if self.overflow:
            what = (f"overflows fp16 ({self.record.metrics.inf_cand + self.record.metrics.nan_cand}"
                    f" inf/NaN where the reference is finite)")
        else:
            what = f"loses accuracy in fp16 (isolated SNR {self.snr_db:.1f} dB)"
        covers = f" covering {', '.join(self.covers)}" if self.covers else ""
        return (f"{self.layer} ({self.op_type}, {self.reference}{covers}) {what}: {inputs}, "
                f"output up to {self.output_max:.4g}; fp16 holds at most {FP16_MAX:g}")


class Fp16Risks(list):
    """The layers fp16 arithmetic breaks, in graph order, with ``layers`` (their ncnn names,
    for ``wb.ncnn_featmask``) and ``summary()``."""

    candidate: str = ""

    @property
    def layers(self) -> list[str]:
        return [r.layer for r in self]

    def summary(self) -> str:
        if not self:
            return f"{self.candidate}: no layer overflows or loses accuracy in fp16 on its own"
        head = f"{self.candidate}: {len(self)} layer(s) unsafe in fp16 arithmetic"
        return "\n".join([head] + [f"  {r.describe()}" for r in self])

    def __str__(self) -> str:
        return self.summary()


def nonfinite(record: Record) -> bool:
    """The candidate holds inf/NaN where the reference holds a finite value."""
    m = record.metrics
    return m.nan_cand + m.inf_cand > m.nan_ref + m.inf_ref


def fp16_unsafe(report: CompareReport, candidate: str | None = None,
                min_snr_db: float = DEFAULT_MIN_SNR_DB) -> Fp16Risks:
    """The layers of an fp16 ncnn candidate whose own (isolated) output overflows fp16 or
    falls under ``min_snr_db``: what to keep in fp32 with ``wb.ncnn_featmask``.

    Args:
        report: a comparison with mode "both" or "isolated".
        candidate: the candidate's name (None: the first ncnn candidate that ran fp16
            arithmetic, else the first asked for fp16).
        min_snr_db: the isolated SNR under which a layer is listed (40 dB: fp16 storage
            alone keeps about 68).

    Returns:
        Fp16Risks in graph order (empty: none).

    Raises:
        InputError: no such candidate, not an ncnn fp16 one, or no isolated run.
    """
    cand = _fp16_candidate(report, candidate)
    if not report.isolated_available.get(cand.name):
        raise InputError(f"fp16_unsafe: {cand.name} has no isolated records: a layer's own "
                         "error needs its reference inputs",
                         "wb.compare(model, [...], x, mode='both')")
    if isinstance(min_snr_db, bool) or not isinstance(min_snr_db, (int, float)):
        raise InputError(f"min_snr_db={min_snr_db!r}: expected a number of dB",
                         "e.g. min_snr_db=40")
    recs = [r for r in report.records if r.candidate == cand.name and r.mode == "isolated"
            and r.exact and r.node and (nonfinite(r) or r.metrics.snr_db < min_snr_db)]
    out = Fp16Risks()
    out.candidate = cand.name
    if not recs:
        return out
    ranges = _ranges(report, cand, recs)
    for r in sorted(recs, key=lambda r: r.order):
        out_max, in_max = ranges[r.name]
        out.append(Fp16Risk(r.node, r.op_type, r.reference, r.covers, nonfinite(r),
                            r.metrics.snr_db, out_max, in_max, r))
    return out


def overflow_note(report: CompareReport, record: Record) -> str:
    """For a divergence whose values are inf/NaN where the reference is finite: its inputs'
    and output's range beside fp16's limit (an fp16 candidate), or "" for any other."""
    cand = next((c for c in report.candidates if c.name == record.candidate), None)
    if cand is None or not nonfinite(record) or cand.kind != "ncnn":
        return ""
    out_max, in_max = _ranges(report, cand, [record])[record.name]
    inputs = "" if in_max is None else f"its inputs reach {in_max:.4g}, "
    fp16 = getattr(getattr(cand.runner, "flags", None), "fp16_storage", False) or \
        cand.precision.startswith("fp16")
    limit = f"; fp16 holds at most {FP16_MAX:g}" if fp16 else ""
    return (f"{record.metrics.inf_cand + record.metrics.nan_cand} inf/NaN where the reference "
            f"is finite: {inputs}its output {out_max:.4g}{limit}")


def _fp16_candidate(report: CompareReport, name: str | None) -> Any:
    fp16 = [c for c in report.candidates if c.kind == "ncnn" and c.precision == "fp16"
            and c.name not in report.failed]
    if name is None:
        # the one whose layers computed in fp16 (an ARM target), before a storage emulation
        fp16.sort(key=lambda c: not getattr(getattr(c.runner, "flags", None),
                                            "fp16_arithmetic", False))
        if not fp16:
            raise InputError("fp16_unsafe: no ncnn candidate asked for fp16 ran in this "
                             f"comparison (candidates: {[c.name for c in report.candidates]})",
                             "compare NcnnRunner(nc, precision='fp16', target='arm64-v8.2')")
        return fp16[0]
    cand = report._candidate(name)
    if cand not in fp16:
        raise InputError(f"fp16_unsafe: {name!r} is not an ncnn candidate run in fp16",
                         f"fp16 candidates: {[c.name for c in fp16]}")
    return cand


def _ranges(report: CompareReport, cand: Any, recs: list[Record]
            ) -> dict[str, tuple[float, float | None]]:
    """{record name: (max |reference output|, max |reference inputs| or None)}, from one
    run of the reference (kept on the report for the next call)."""
    values = report.reference_values()
    al = report.alignments[cand.name]
    model = getattr(report.reference, "model", None)
    modules = {n for n, _ in model.named_modules()} if model is not None else set()
    inputs_of = {t.name: t.inputs for t in candidate_tensors(cand, modules)}
    names = list(getattr(cand.runner, "input_names", []))
    out = {}
    for r in recs:
        out_max = _max_abs(values.get(r.reference))
        ins = []
        for blob in inputs_of.get(r.name, ()):
            if blob in al.pairs:
                ins.append(_max_abs(values.get(al.pairs[blob])))
            elif blob in names and names.index(blob) < len(report.inputs):
                ins.append(_max_abs(report.inputs[names.index(blob)]))
            else:
                ins.append(None)
        known = [v for v in ins if v is not None]
        out[r.name] = (out_max if out_max is not None else math.nan,
                       max(known) if known and len(known) == len(ins) else None)
    return out


def _max_abs(v: Any) -> float | None:
    if v is None:
        return None
    import numpy as np

    a = np.asarray(v.detach().numpy() if hasattr(v, "detach") else v, dtype=np.float64)
    fin = a[np.isfinite(a)]
    return float(np.abs(fin).max()) if fin.size else None
