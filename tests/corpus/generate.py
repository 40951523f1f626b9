"""Generate the corpus from a seed, run it two cases at a time, and sum up the classes."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .harness import CLASSES, Case, Result, run_case, snapshot, snapshot_diff

FAMILIES = ("onnx_trunc", "onnx_flip", "onnx_mutate", "ncnn_param", "ncnn_bin",
            "artifact_damage", "input", "worker", "kill_stage", "workspace", "hostile_path",
            "hostile_name")
TARGET_ZERO = ("silent wrong", "died", "hang", "artifact lost", "write outside")


def generate(seed: int = 17) -> list[Case]:
    """Every case, in a stable order; the same seed gives the same cases."""
    from . import ncnn_cases, onnx_cases, runtime_cases, ws_cases

    out: list[Case] = []
    for k, mod in enumerate((onnx_cases, ncnn_cases, runtime_cases, ws_cases)):
        out += mod.cases(np.random.default_rng(seed * 1000 + k))
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return out


def build_base(root: Path, seed: int = 17) -> tuple[Path, dict[str, Any]]:
    """The base models under root/base, built in a child (this process stays light)."""
    from .base import build
    from .harness import mp_context

    base = root / "base"
    ctx = mp_context()
    with ctx.Pool(1) as pool:
        index = pool.apply(build, (base, seed))
    return base, index


def run_all(cases: Iterable[Case], root: Path | None = None, seed: int = 17, jobs: int = 2,
            progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Run every case (``jobs`` at a time) under ``root`` (a fresh temp folder by default)."""
    import shutil

    cases = list(cases)
    own = root is None
    root = Path(tempfile.mkdtemp(prefix="wb-corpus-")) if root is None else root
    try:
        base, index = build_base(root, seed)
        runs = root / "cases"
        runs.mkdir(exist_ok=True)

        def one(case: Case) -> Result:
            try:
                res = run_case(case, base, runs, index)
            except Exception as e:  # noqa: BLE001 - a harness failure must not stop the run
                res = Result(case.id, case.family, case.kind, "foreign", case.expect,
                             error_type="CorpusHarnessError", message=f"{type(e).__name__}: {e}")
            if res.cls in ("ok", "hinted") and not res.extra:
                shutil.rmtree(runs / case.id, ignore_errors=True)
            if progress is not None:
                progress(res)
            return res

        before = snapshot(base)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, cases))
        changed = snapshot_diff(before, snapshot(base))
        if changed:  # cases read some base models in place: the engine wrote next to them
            results.append(Result("base-models-untouched", "harness", "base", "ok", "ok",
                                  extra=["write outside"],
                                  detail="written in base/: " + ", ".join(changed[:5])))
        return results
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def summarize(results: list[Result]) -> dict[str, Any]:
    """Counts per class and per family, and the figures against issue 17's targets."""
    per_class: Counter[str] = Counter()
    per_family: dict[str, Counter[str]] = {}
    for r in results:
        for c in [r.cls, *r.extra]:
            per_class[c] += 1
            per_family.setdefault(r.family, Counter())[c] += 1
    should_fail = [r for r in results if r.expect != "ok" and r.cls not in ("ok",)]
    hinted = sum(r.cls == "hinted" for r in should_fail)
    frac = hinted / len(should_fail) if should_fail else 1.0
    zero = {k: per_class.get(k, 0) for k in TARGET_ZERO}
    return {"classes": {c: per_class.get(c, 0) for c in CLASSES},
            "families": {f: dict(c) for f, c in per_family.items()},
            "hinted_fraction": frac, "should_fail": len(should_fail), "hinted": hinted,
            "zero_targets": zero,
            "targets_met": all(v == 0 for v in zero.values()) and frac >= 0.95}
