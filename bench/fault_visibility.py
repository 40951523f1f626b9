"""Is an injected fault visible on a candidate at all? (``bench/faults.py``, issue 36)

A trial is *invisible on its candidate* when the fault moves no tensor the candidate computes
beyond the tolerance the comparison judges that tensor by, so no verdict could name it: a
conv whose one output element feeds a sigmoid saturated at 1 - 1.4e-6, fused into one ncnn
layer, shows the conv's fault only through that sigmoid. Measured, not guessed: the
candidate is run clean and damaged with every tensor captured, and for each float tensor

    effect = max |damaged - clean| / the bound its verdict uses

- its accumulated record's ``tolerance`` in the fault's comparison, where that record is
  judged by fp32's noise floor (one bound over the whole tensor; it carries the error the
  tensor's inputs bring, as every accumulated verdict does);
- the default per-element rule ``atol + rtol * |clean|`` (1e-4, 1e-3) where the record is
  judged element by element, or the tensor has no record (attributed, unaligned);
- for the tensors of the op reading the damaged weight, also their isolated record's
  ``tolerance``: their inputs are the same in both runs, so the difference is what the fault
  adds to the op on its own inputs, which is what the isolated verdict measures.

The trial is invisible when every effect is at most 1, the comparison named no divergence
in either mode, the edit was verified where it should be, and the damaged run was captured.
Such a trial is no localisation miss and no hit: it is counted and printed on its own, with
its largest effect, and left out of hits / trials. Anything else not blamed on its module is
a miss, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INVISIBLE = ("invisible on this candidate: the fault moves no candidate tensor beyond its "
             "tolerance")


@dataclass
class Effect:
    tensor: str
    ratio: float  # max |damaged - clean| over the bound
    moved: float  # max |damaged - clean|
    bound: str  # which bound judged it


def effects(rep: Any, clean: dict[str, Any], bad: dict[str, Any],
            readers: list[str]) -> list[Effect]:
    """The fault's effect on every float tensor captured in both runs, largest first."""
    import numpy as np

    from workbench.comparison.metrics import DEFAULT_ATOL, DEFAULT_RTOL

    records = {(r.name, r.mode): r.metrics for r in rep.records}
    out = []
    for name, c in clean.items():
        if name not in bad:
            continue
        c, b = np.asarray(c), np.asarray(bad[name])
        if c.dtype.kind != "f" or b.shape != c.shape:
            continue
        c64, b64 = c.astype(np.float64), b.astype(np.float64)
        same = (c64 == b64) | (np.isnan(c64) & np.isnan(b64))
        d = np.where(same, 0.0, np.abs(b64 - c64))
        d = np.where(np.isnan(d), np.inf, d)
        moved = float(d.max()) if d.size else 0.0
        acc = records.get((name, "accumulated"))
        if acc is not None and acc.noise_floor > 0:
            out.append(Effect(name, _over(moved, acc.tolerance), moved,
                              "accumulated noise-floor tolerance"))
        else:
            per = d / (DEFAULT_ATOL + DEFAULT_RTOL * np.abs(np.nan_to_num(c64)))
            out.append(Effect(name, float(per.max()) if per.size else 0.0, moved,
                              "per-element default tolerance"))
        iso = records.get((name, "isolated"))
        if name in readers and iso is not None:
            out.append(Effect(name, _over(moved, iso.tolerance), moved,
                              "isolated tolerance (the op reading the weight)"))
    return sorted(out, key=lambda e: -e.ratio)


def _over(moved: float, tolerance: float) -> float:
    if moved == 0:
        return 0.0
    return moved / tolerance if tolerance > 0 else float("inf")


def invisible(found: list[Effect], rep: Any, verified: str) -> bool:
    """The fault moves nothing beyond its tolerance, and the comparison says so too."""
    named = any(not r.metrics.passed for r in rep.records)
    return bool(found) and verified == "yes" and rep.first_divergence is None \
        and not named and found[0].ratio <= 1


def describe(e: Effect | None) -> str:
    if e is None:
        return "not measured"
    return f"{e.ratio:.3g}x at {e.tensor} (moved {e.moved:.3g}; {e.bound})"


def print_invisible(trials: list[Any]) -> None:
    """The invisible trials, each with its largest effect (left out of hits / trials)."""
    shown = [t for t in trials if t.cause == INVISIBLE]
    if not shown:
        return
    print(f"\n{INVISIBLE} ({len(shown)}; not counted in hits / trials: no verdict could name "
          "them; the rule is in bench/fault_visibility.py):")
    for t in shown:
        print(f"  {t.model} / {t.kind} x{t.strength:g}: {t.module} [{t.module_type}]: largest "
              f"effect {t.effect}; torch effect at the module's own output (a tensor this "
              f"candidate need not compute) {t.torch_effect:.3g}x; the {t.reader_op} reading "
              f"the weight: {t.reader}")
