"""The converter's tools of issue 33, measured: one section function per figure.

Sections (``--section NAME``, repeatable; default: all):

- ``rewriters``: rewriters add no cost when none match. ``wb.export`` of the default model
  (super-resolution CNN, TorchScript, opset 17) with 50 rewriters registered (``wb.rewrite``
  on 50 torch functions, each for backend "ncnn") exported for ONNX Runtime, so none
  matches, against the same export with none registered. One run, the two variants
  alternating (the order swapped each round), the registering done between timings; the
  figure is the median over rounds of each round's ratio (its two exports ran back to
  back, so the machine's drift cancels). Target: <= 1.05. The time to choose the
  rewriters of one export (the registry walked, conditions checked) is printed beside it,
  and its share of the export time: what the figure measures when the machine is quiet.

- ``prune``: pruning as the deployed model feels it (``bench/prune_figures.py``, whose
  docstring says how it is measured): the zoo's ResNet and MobileNetV2 pruned 30% and 50%,
  structured and unstructured; ONNX file, ncnn .bin and ORT / ncnn latency ÷ unpruned.
  Target: structured 50% cuts latency on both backends.

Run:  cd /work/main && .venv/bin/python bench/converter.py [--section rewriters] [--runs 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import engine_state, print_figures  # bench/ is on sys.path
from prune_figures import section_prune

REWRITER_TARGET = 1.05
N_REWRITERS = 50


def _fifty_targets() -> list[str]:
    """50 torch functions to register rewriters on (none of them the default model calls)."""
    import torch

    names = sorted(n for n in dir(torch) if not n.startswith("_") and n.islower()
                   and callable(getattr(torch, n)) and n not in ("conv2d", "relu",
                                                                   "pixel_shuffle"))
    return [f"torch.{n}" for n in names[:N_REWRITERS]]


def _register(targets: list[str]) -> list[str]:
    import workbench as wb

    names = []
    for k, target in enumerate(targets):
        name = f"bench.unused_{k}"
        wb.rewrite(target, backend="ncnn", name=name)(lambda *a, **kw: None)
        names.append(name)
    return names


def _unregister(names: list[str]) -> None:
    import workbench as wb

    for name in names:
        wb.unregister_rewriter(name)


def section_rewriters(runs: int) -> tuple[list[list[str]], list[str], list[str], list[str]]:
    """Export with 50 non-matching rewriters registered vs none, alternating."""
    import workbench as wb
    from workbench.stages.rewrite_session import choose
    from workbench.stages.rewriters import RewriteContext

    model, x = wb.default_model()
    targets = _fifty_targets()
    times: dict[str, list[float]] = {"none": [], "50": []}
    registered: list[str] = []
    with tempfile.TemporaryDirectory(prefix="wb-bench-converter-") as tmp:
        ws = wb.Workspace(Path(tmp) / "ws")
        wb.export(model, x, workspace=ws)  # warm-up: imports, first-call costs
        for r in range(runs):
            for variant in (("none", "50") if r % 2 == 0 else ("50", "none")):
                if variant == "50" and not registered:
                    registered = _register(targets)
                elif variant == "none" and registered:
                    _unregister(registered)
                    registered = []
                t0 = time.perf_counter()
                art = wb.export(model, x, workspace=ws)
                times[variant].append(time.perf_counter() - t0)
                assert art.rewrites == [], art.rewrites  # none matched
        registered = registered or _register(targets)
        ctx = RewriteContext("export", "onnxruntime", "torchscript", 17)
        t0 = time.perf_counter()
        for _ in range(1000):
            choose(ctx)
        choose_us = (time.perf_counter() - t0) * 1e3
        _unregister(registered)
    none, fifty = statistics.median(times["none"]), statistics.median(times["50"])
    # each round's two exports ran back to back: their ratio cancels the machine's drift
    ratio = statistics.median(b / a for a, b in zip(times["none"], times["50"], strict=True))
    table = [["figure", "value", "target"],
             [f"export with {N_REWRITERS} rewriters registered, none matching / none "
              "registered (median of the rounds' ratios)", f"{ratio:.3f}",
              f"<= {REWRITER_TARGET}"],
             ["  export, none registered (median s)", f"{none:.3f}", ""],
             [f"  export, {N_REWRITERS} registered (median s)", f"{fifty:.3f}", ""],
             [f"  choosing the rewriters of one export, {N_REWRITERS} registered (us)",
              f"{choose_us:.1f}", ""],
             ["  choosing / export (%)", f"{choose_us * 1e-6 / none * 100:.4f}", ""]]
    ok = ratio <= REWRITER_TARGET
    figure = "rewriters: no cost when none match"
    notes = [f"{runs} rounds, variants alternating; default model (super-resolution CNN, "
             f"{list(x[0].shape)}), TorchScript exporter, opset 17"]
    return table, ([figure] if ok else []), ([] if ok else [figure]), notes


SECTIONS: dict[str, Callable[[int], tuple]] = {"rewriters": section_rewriters,
                                                "prune": section_prune}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", action="append", choices=sorted(SECTIONS),
                        help="a section to run (repeatable; default: all)")
    parser.add_argument("--runs", type=int, default=15, help="rounds per timed figure")
    args = parser.parse_args(argv)
    print(engine_state())
    for name in args.section or list(SECTIONS):
        print(f"\n== {name}")
        table, passed, failed, notes = SECTIONS[name](args.runs)
        print_figures(table, passed, failed, [], notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
