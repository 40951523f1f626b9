"""Reading ``wb.compare``'s verdict for ``bench/faults.py``: what it named, and whether that is
the damaged module.

``rep = wb.compare(model, [candidate], inputs, mode=...)`` (default ``both``). A hit:
``rep.first_divergence`` names the perturbed module (``reference`` is the module, one of its
calls ``module#k`` or tuple outputs ``module.k``) or a fused op whose record ``covers`` it. The
accumulated-mode verdict (the earliest failing accumulated record) is scored beside it. Every
clean candidate is compared too: a false alarm is a first divergence, or ``rep.ok`` False,
unless the report's note names the divergence's layer as computing another formula than its
module, or a plain run of the candidate shows its outputs off too (a true deviation, named).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from fault_records import Clean

# unaligned reasons of tensors align does not count (parameters, index glue)
NOT_COUNTED = re.compile(r"^a constant|shape or index glue|^not captured")


def tensor_status(rep: Any, name: str) -> str:
    """How the comparison placed one candidate tensor: aligned (to what, covering what),
    attributed, or unaligned (why)."""
    if rep is None:
        return "no comparison"
    (al,) = rep.alignments.values()
    if name in al.pairs:
        cov = getattr(al, "covers", {}).get(name)
        rel = al.relation(name) if hasattr(al, "relation") else "equal"
        return (f"aligned to {al.pairs[name]}" + (f" covering {list(cov)}" if cov else "")
                + (f" ({rel})" if rel != "equal" else ""))
    if name in getattr(al, "attributed", {}):
        return f"attributed to {al.attributed[name]}"
    if name in al.unaligned:
        return f"unaligned: {al.unaligned[name]}"
    return "not listed"


def names_module(ref: str, module: str) -> bool:
    """Whether a record name is ``module``: itself, one of its calls, one of its outputs, or
    a functional call it made (BiT's WeightStandardizedConv2d standardizes its weight and
    calls ``F.conv2d``: 'embedder.convolution/F.conv2d_0')."""
    return bool(re.fullmatch(re.escape(module) + r"((#\d+)?(\.\d+)?|/[^/]+)", ref or ""))


def covers_of(rep: Any, rec: Any) -> tuple[str, ...]:
    got = getattr(rec, "covers", None)
    if got:
        return tuple(got)
    al = rep.alignments.get(rec.candidate)
    return tuple(getattr(al, "covers", {}).get(rec.name, ())) if al is not None else ()


def blames(rep: Any, rec: Any, module: str) -> bool:
    if rec is None:
        return False
    return names_module(rec.reference, module) or any(
        names_module(c, module) for c in covers_of(rep, rec))


def first_failing(rep: Any, mode: str) -> Any:
    failing = [r for r in rep.records if r.mode == mode and not r.metrics.passed]
    return min(failing, key=lambda r: r.order) if failing else None


def describe(rep: Any, rec: Any) -> dict[str, Any] | None:
    if rec is None:
        return None
    m = rec.metrics
    al = rep.alignments.get(rec.candidate)
    relation = getattr(rec, "relation", None) or (
        al.relation(rec.name) if al is not None and hasattr(al, "relation") else "equal")
    return {"reference": rec.reference, "tensor": rec.name, "op_type": rec.op_type,
            "mode": rec.mode, "max_abs": m.max_abs, "tolerance": m.tolerance,
            "frac_over_tol": m.frac_over_tol, "min_tol": m.min_tol,
            "covers": list(covers_of(rep, rec)),
            "relation": relation}


def output_deviation(model: Any, path: Path, x: tuple) -> str:
    """How the candidate's outputs, from a plain run (no wb.compare), differ from torch's at
    the same positions, by to_ncnn's own output check (shapes.fit, max_errors, each output
    against its own range at the default tolerance); '' if they do not."""
    import numpy as np
    import torch

    from workbench.comparison.metrics import DEFAULT_ATOL, DEFAULT_RTOL
    from workbench.runtime import runner_for
    from workbench.shapes import fit
    from workbench.tolerances import failing_output, max_errors

    with torch.no_grad():
        ref = model(*x)
    refs = [np.asarray(r) for r in (ref if isinstance(ref, (tuple, list)) else (ref,))]
    got = [np.asarray(g) for g in runner_for(path).run(x).values()]
    errs = max_errors(refs, [fit(g, r.shape) for r, g in zip(refs, got, strict=False)]
                      + got[len(refs):])
    if errs["shape_mismatch"]:
        return "; ".join(errs["shape_mismatch"])
    bad = failing_output(errs, DEFAULT_ATOL, DEFAULT_RTOL, refs)
    return f"output {bad[0]} differs by max abs {bad[1]:.3g}" if bad else ""


def alignment_figures(rep: Any) -> dict[str, Any]:
    """Aligned fraction, and the tensors neither aligned nor attributed (counted ones)."""
    (name, al), = rep.alignments.items()
    attributed = len(getattr(al, "attributed", {}))
    unexplained = al.considered - len(al.pairs)
    reasons = Counter(reason_group(r) for n, r in al.unaligned.items()
                      if n not in getattr(al, "attributed", {}) and not NOT_COUNTED.search(r))
    return {"aligned_fraction": rep.aligned_fraction.get(name, 0.0), "pairs": len(al.pairs),
            "considered": al.considered, "attributed": attributed,
            "unexplained": unexplained,
            "unaligned_reasons": dict(reasons.most_common(6))}


def reason_group(reason: str) -> str:
    reason = re.sub(r"'[^']*'", "'…'", reason)
    reason = re.sub(r"\[[^\]]*\]", "[…]", reason)
    return re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", "N", reason)



def judge_clean(clean: Clean, rep: Any, model: Any, path: Path, x: tuple) -> None:
    """A clean candidate's comparison into ``clean``: a false alarm, or a true deviation the
    report explains or a plain run confirms; what was named, and the alignment figures."""
    div = rep.first_divergence
    clean.ok = bool(rep.ok)
    clean.false_alarm = div is not None or not clean.ok
    note = next(iter(getattr(rep, "notes", {}).values()), "")
    if div is not None and div.node and "form where" in note \
            and re.search(rf"\b{re.escape(div.node)}\b", note):
        clean.explained, clean.false_alarm = note, False
    if clean.false_alarm:
        # a true deviation, not a false alarm, when a plain run of the candidate,
        # outside wb.compare, shows its outputs off too (what compare named is
        # listed with it: no fault was put in, so the bench cannot score the name)
        seen = output_deviation(model, path, x)
        if seen:
            reasons = next(iter(rep.verdicts().values())).reasons
            named = (f"first divergence named at {div.reference} ({div.op_type} "
                     f"{div.name})" if div is not None else reasons[0] if reasons
                     else "not ok")
            clean.explained = f"{named} [a plain run shows it: {seen}]"
            clean.false_alarm = False
            clean.deviates = True
    clean.named = describe(rep, div)
    if clean.false_alarm:
        clean.summary = rep.summary()
    clean.figures = alignment_figures(rep)
