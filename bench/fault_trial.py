"""One trial of ``bench/faults.py``: a fault put into one candidate, the edit verified, the
damaged candidate compared with torch and the verdict scored.

The module asked for is the one at the trial's depth; if its weight is not in the candidate,
the nearest one that is (alternating later/earlier) is taken and the trial says so. A trial
not blamed on its module is a miss (with a guessed cause, ``fault_causes``), unless its fault
is invisible on its candidate (``fault_visibility``): it moves no tensor the candidate
computes beyond the bound its verdict uses, the comparison named nothing in either mode and
the edit was verified.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fault_visibility as visibility
from fault_causes import miss_cause
from fault_damage import Target, fault, torch_effect
from fault_edit import capture, first_changed, perturb_ncnn, perturb_onnx, readers
from fault_locate import Located, Store, locate
from fault_records import NO_WEIGHT, Trial, first_line
from fault_verdict import blames, describe, first_failing, tensor_status


@dataclass
class ModelRun:
    """What every trial of one model shares."""

    name: str
    model: Any
    x: tuple
    targets: list[Target]  # the weighted modules, in execution order
    params: dict[str, Any]  # each target's torch weight (numpy), by module
    ref_order: list[str]  # torch's captured tensors, in execution order
    mode: str  # wb.compare's mode
    damage: str
    runs: list[tuple[int, float]]  # (depth, strength) of each trial on a candidate
    workdir: Path
    bar: Any
    notes: list[str]
    # the torch effect of each (module, strength): the same on every candidate
    effects: dict[tuple[str, float], float] = field(default_factory=dict)

    def not_run(self, kind: str, cause: str, **kw: Any) -> list[Trial]:
        """The trials of one candidate kind, not run for ``cause``."""
        self.bar.update(len(self.runs))
        return [Trial(self.name, kind, d, k, self.damage, cause=cause, **kw)
                for d, k in self.runs]


def one_trial(trial: Trial, run: ModelRun, kind: str, path: Path, stores: list[Store],
              clean_values: dict[str, Any], clean_rep: Any) -> None:
    """The fault of ``trial`` put into the candidate at ``path``, compared and scored; the
    trial's fields filled in."""
    import workbench as wb

    placed = place_fault(trial, run, kind, path, stores)
    if placed is None:
        trial.cause = NO_WEIGHT
        return
    target, loc, cand = placed
    bad_values = verify_edit(trial, kind, path, cand, loc, clean_values, run.x)
    rep = wb.compare(run.model, [cand], run.x, mode=run.mode, progress=False)
    outs = score(trial, run, kind, path, loc, target, rep, clean_rep)
    moved = visibility.effects(rep, clean_values, bad_values, outs)
    trial.effect = visibility.describe(moved[0] if moved else None)
    if not trial.hit and visibility.invisible(moved, rep, trial.verified):
        trial.cause = visibility.INVISIBLE
    elif not trial.hit:
        trial.cause = miss_cause(trial, rep, rep.first_divergence, clean_rep, target.module,
                                 run.ref_order)


def place_fault(trial: Trial, run: ModelRun, kind: str, path: Path, stores: list[Store]
                ) -> tuple[Target, Located, Path] | None:
    """(module, where its weight is, the damaged candidate's path), or None when no
    module's weight is found in the candidate."""
    targets = run.targets
    # the asked module, else the nearest one (alternating later/earlier) found in the candidate
    order = sorted(range(len(targets)), key=lambda i: (abs(i - trial.depth), i < trial.depth))
    loc = target = None
    for i in order:
        t = targets[i]
        loc = locate(run.params[t.module], stores, f"{t.module}.{t.param}")
        if loc is not None:
            target = t
            break
    if target is None or loc is None:
        return None
    asked = targets[trial.depth].module
    trial.module, trial.module_type = target.module, target.type
    trial.substitute_for = asked if asked != target.module else ""
    trial.store, trial.relation, trial.offset = loc.store.label, loc.relation, loc.store.offset
    f = fault(trial.model, target, run.params[target.module], trial.damage, trial.strength)
    key = (target.module, trial.strength)
    if key not in run.effects:
        run.effects[key] = torch_effect(run.model, run.x, target, f)
    trial.torch_effect = run.effects[key]
    out_dir = run.workdir / run.name / "faults"
    stem = re.sub(r"[^\w.-]", "_", target.module)[-80:] + f"-x{trial.strength:g}"
    if kind == "ncnn":
        cand, trial.edited = perturb_ncnn(path, out_dir / f"{kind}-{stem}", loc, f)
    else:
        cand = out_dir / f"{kind}-{stem}" / "model.onnx"
        trial.edited = perturb_onnx(path, cand, loc, f)
    return target, loc, cand


def verify_edit(trial: Trial, kind: str, path: Path, cand: Path, loc: Located,
                clean_values: dict[str, Any], x: tuple) -> dict[str, Any]:
    """The damaged candidate's captured tensors; ``trial.verified`` says whether the edit
    changes the op that reads the weight first, nothing before it."""
    bad_values: dict[str, Any] = {}
    try:
        bad_values = capture(kind, cand, x)
        changed = first_changed(kind, cand, clean_values, bad_values)
        expect, _, _ = readers(kind, path, loc)
        trial.verified = "yes" if changed in expect else (
            f"no: first changed {changed or 'nothing'}, expected {sorted(expect)}")
    except Exception as e:
        trial.verified = f"not checked: {first_line(e)}"
    return bad_values


def score(trial: Trial, run: ModelRun, kind: str, path: Path, loc: Located, target: Target,
          rep: Any, clean_rep: Any) -> list[str]:
    """What the damaged candidate's comparison named, and whether that is the module: a hit
    by the first divergence, by the accumulated verdict, by the error source (reported, not
    counted); the module's own records and how the op reading the weight was placed. Returns
    the output tensors of that op."""
    mode = run.mode
    first = rep.first_divergence
    acc = first_failing(rep, "accumulated") if mode != "isolated" else None
    trial.hit = blames(rep, first, target.module)
    trial.hit_accumulated = blames(rep, acc, target.module) if acc is not None else False
    trial.named, trial.named_accumulated = describe(rep, first), describe(rep, acc)
    source = next(iter(rep.error_sources().values()), None)
    trial.source, trial.source_blames = describe(rep, source), blames(rep, source,
                                                                      target.module)
    trial.aligned_fraction = next(iter(rep.aligned_fraction.values()), 0.0)
    trial.own = [{"tensor": r.name, "reference": r.reference, "mode": r.mode,
                  "passed": r.metrics.passed, "max_abs": r.metrics.max_abs,
                  "tolerance": r.metrics.tolerance}
                 for r in rep.records if blames(rep, r, target.module)]
    _, outs, trial.reader_op = readers(kind, path, loc)
    trial.reader = "; ".join(f"{o}: {tensor_status(rep, o)}" for o in outs[:2])
    trial.reader_clean = "; ".join(f"{o}: {tensor_status(clean_rep, o)}" for o in outs[:2])
    return outs
