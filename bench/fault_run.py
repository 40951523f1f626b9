"""One model through ``bench/faults.py``: its candidates built once, each compared clean,
then one trial per depth and strength on each candidate."""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Any

from fault_candidates import build_candidates
from fault_damage import depth_picks, weighted_modules
from fault_edit import capture
from fault_locate import Store, ncnn_stores, onnx_stores
from fault_records import DEVIATES, RUN_FAILED, UNBUILT, Clean, Trial, first_line
from fault_trial import ModelRun, one_trial
from fault_verdict import judge_clean


def run_model(name: str, factory: Any, kinds: list[str], depths: int, mode: str,
              workdir: Path, bar: Any, notes: list[str], damage: str = "relative",
              strengths: tuple[float, ...] = (1.0,)) -> tuple[list[Trial], list[Clean]]:
    """The clean comparison of every candidate kind, then one trial per depth and strength.
    A factory returns (model, inputs) or (model, inputs, wb.export options)."""
    import workbench as wb
    from workbench.runtime import TorchRunner

    made = factory()
    model, x = made[0], made[1]
    targets = weighted_modules(model, x)
    picks = depth_picks(len(targets), depths)
    ws = wb.Workspace(workdir / name)
    t0 = time.perf_counter()
    cands = build_candidates(name, model, x, ws, kinds, notes,
                             made[2] if len(made) > 2 else None)
    notes.append(f"{name}: {len(targets)} weighted modules, depths {picks}; candidates built in "
                 f"{time.perf_counter() - t0:.1f} s ({', '.join(cands) or 'none'})")
    params = {t.module: getattr(dict(model.named_modules())[t.module], t.param).detach()
              .cpu().numpy() for t in targets}
    run = ModelRun(name, model, x, targets, params,
                   list(TorchRunner(model).run(x, capture="all")), mode, damage,
                   [(d, k) for k in strengths for d in picks], workdir, bar, notes)
    trials: list[Trial] = []
    cleans: list[Clean] = []
    for kind in kinds:
        got, clean = run_kind(run, kind, cands.get(kind))
        trials += got
        cleans.append(clean)
    return trials, cleans


def run_kind(run: ModelRun, kind: str, path: Path | None) -> tuple[list[Trial], Clean]:
    """One candidate kind: its clean comparison, then its trials (or the trials not run, and
    why)."""
    if path is None:
        trials = run.not_run(kind, UNBUILT, error="no candidate (see notes)")
        run.bar.update()
        return trials, Clean(run.name, kind, error="no candidate")
    clean, clean_rep, failed = compare_clean(run, kind, path)
    if failed:
        trials = run.not_run(kind, RUN_FAILED)
        run.bar.update()
        return trials, clean
    run.bar.update()
    if clean.deviates:
        return run.not_run(kind, DEVIATES), clean
    stores = read_stores(run, kind, path)
    try:
        clean_values = capture(kind, path, run.x)
    except Exception as e:
        clean_values = {}
        run.notes.append(f"{run.name}/{kind}: clean capture failed: {first_line(e)}")
    trials = []
    for d, k in run.runs:
        trial = Trial(run.name, kind, d, k, run.damage)
        t1 = time.perf_counter()
        try:
            one_trial(trial, run, kind, path, stores, clean_values, clean_rep)
        except Exception as e:
            trial.error = f"{type(e).__name__}: {first_line(e)}"
            trial.cause = trial.cause or f"bench or engine error: {trial.error}"
            if "--verbose" in sys.argv:
                traceback.print_exc()
        trial.seconds = time.perf_counter() - t1
        trials.append(trial)
        run.bar.update()
    return trials, clean


def compare_clean(run: ModelRun, kind: str, path: Path) -> tuple[Clean, Any, bool]:
    """The clean candidate compared with torch: (its record, the report or None, whether
    the candidate's run failed: a true verdict, its trials not run)."""
    import workbench as wb

    clean = Clean(run.name, kind)
    rep = None
    try:
        rep = wb.compare(run.model, [path], run.x, mode=run.mode, progress=False)
        if getattr(rep, "failed", None):
            clean.ok = False
            clean.failed = next(iter(rep.failed.values())).splitlines()[0][:300]
            return clean, rep, True
        judge_clean(clean, rep, run.model, path, run.x)
    except Exception as e:
        clean.error = f"{type(e).__name__}: {first_line(e)}"
        clean.false_alarm = True
    return clean, rep, False


def read_stores(run: ModelRun, kind: str, path: Path) -> list[Store]:
    """The arrays of the candidate that may hold a weight; a failure is a note (and no
    weight is found: the trials say so)."""
    try:
        if kind == "ncnn":
            stores, walk = ncnn_stores(path)
            run.notes.append(f"{run.name}/ncnn: {walk}")
        else:
            import onnx

            stores = onnx_stores(onnx.load(str(path)))
    except Exception as e:
        stores = []
        run.notes.append(f"{run.name}/{kind}: reading the weights failed: {type(e).__name__}: "
                         f"{first_line(e)}")
        traceback.print_exc()
    return stores
