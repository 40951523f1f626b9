"""Pruning as the deployed model feels it (issue 33): the zoo's ResNet and MobileNetV2 pruned
30% and 50%, structured and unstructured, each against its unpruned model.

Models: ``workbench.zoo`` ``resnet`` and ``mobilenet_v2`` (1x3x64x64, seeded random weights,
BatchNorm statistics set on a seeded batch; nothing downloaded). For each model, amount and
method, ``wb.prune(model, amount, method, example_inputs=(x,))`` prunes a copy (``amount``:
the fraction of conv/linear weights removed with whole channels, "l1-structured", through
torch-pruning's dependency graph; or zeroed, "l1-unstructured", ``torch.nn.utils.prune``),
exports the unpruned and the pruned model (``wb.export``, TorchScript, opset 17), converts
both to ncnn (``wb.to_ncnn`` of that ONNX, fp32) in a temporary workspace, and times the
four models round-robin in this process (``--threads`` threads for both backends, the order
rotating each round so load hits all alike; each latency as ``wb.prune`` measures it over
``--runs`` rounds: with one thread, from the runs' CPU time, round by round).

First, the timing check (``section_identical``): each model, and notebook 10's small CNN
(``small_cnn``, ~2 ms a run), against its own copy (``wb.prune``
at amount 0: a deep copy, identical cost), timed as ``wb.prune`` times at its defaults
(``repeat=15, warmup=3``, 1 thread), as the first ``wb.prune`` call of this process and
again as the second: each backend's ratio must be within 10% of 1. Printed beside it: the
ratio a wall clock gave on the same rounds, one run a turn, median over the rounds (as
``wb.prune`` timed before), the spread, how many runs other processes preempted, the load. Target: within 10% on an idle-ish machine (load under the
2 cores); under heavier load it is printed all the same.

Each figure is pruned ÷ unpruned, measured in the same run: ONNX file size, ncnn .bin size,
ONNX Runtime latency, ncnn latency. Target: structured 50% (``wb.prune``'s default,
``round_to=8``: every pruned width a multiple of 8) cuts latency on both backends (ratio
< 1). Printed beside it, whatever they are: structured at exact widths (``round_to=None``,
the amount met exactly, widths that leave the packed kernels) and unstructured (its zeros
are stored and multiplied like any weight). A report, not a test: the exit status is 0
whatever the figures.

Run:  cd /work/main && .venv/bin/python bench/prune_figures.py [--runs N] [--threads T]
                                                         [--timing-only]
  or  cd /work/main && .venv/bin/python bench/converter.py --section prune [--runs N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import engine_state, print_figures, print_table  # noqa: E402 - bench/ on sys.path

MODELS = ("resnet", "mobilenet_v2")
AMOUNTS = (0.3, 0.5)
# (method, round_to): the default, structured at exact widths (why 8 is the default), and
# unstructured
VARIANTS = (("l1-structured", 8), ("l1-structured", None), ("l1-unstructured", None))
HEADER = ["model", "method", "amount", "weights pruned", "ONNX file ÷", "ncnn .bin ÷",
          "ORT latency ÷", "ncnn latency ÷", "ORT ms", "ncnn ms", "output SNR dB"]


def _ratio(fig: Any) -> str:
    return "-" if fig is None or fig.ratio is None else f"{fig.ratio:.2f}"


def _ms(fig: Any) -> str:
    return "-" if fig is None else f"{fig.before:.2f}->{fig.after:.2f}"


IDENTICAL = ["model", "call", "backend", "ratio", "wall ratio (as before)", "ms (unpruned)",
             "spread (IQR/2)", "preempted", "load"]
TOLERANCE = 0.10  # two models of identical cost: latency ratio within 10% of 1


def small_cnn() -> tuple[Any, tuple]:
    """Notebook 10's CNN (five conv-BN-ReLU blocks, 64x64): ~2 ms a run here, about one
    scheduler slice, where a wall clock's medians flip most."""
    import torch
    from torch import nn

    def block(cin: int, cout: int, stride: int = 1) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU())

    torch.manual_seed(0)
    model = nn.Sequential(block(3, 32), block(32, 64, 2), block(64, 64), block(64, 128, 2),
                          block(128, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(128, 10))
    return model.eval(), (torch.rand(1, 3, 64, 64),)


def section_identical(models: tuple[str, ...] = (*MODELS, "small_cnn"), calls: int = 2
                      ) -> tuple[list[list[str]], list[str], list[str]]:
    """Each model against its identical copy at wb.prune's default timing, the first
    ``calls`` wb.prune calls of this process: (table, passed, failed)."""
    import workbench as wb
    from workbench import zoo

    table, passed, failed = [IDENTICAL], [], []
    with tempfile.TemporaryDirectory(prefix="wb-bench-same-") as root:
        for call in range(1, calls + 1):
            for name in models:
                model, inputs = small_cnn() if name == "small_cnn" else zoo.get(name)
                rep = wb.prune(model, 0.0, "l1-unstructured", example_inputs=inputs,
                               workspace=Path(root) / name, progress=False).report
                timing = getattr(rep, "timing", None)  # None: an engine before it
                for backend, key in (("ORT", "ort_ms"), ("ncnn", "ncnn_ms")):
                    fig = getattr(rep, key)
                    if fig is None:
                        failed.append(f"{name} call {call}: {backend} identical (not measured)")
                        continue
                    table.append([name, str(call), backend, f"{fig.ratio:.3f}",
                                  *_timing_cells(timing, key, fig),
                                  f"{rep.load[0]:.1f}-{rep.load[1]:.1f}"])
                    what = (f"{name} call {call}: {backend} identical-cost ratio within "
                            f"{TOLERANCE:.0%} of 1 ({fig.ratio:.3f})")
                    (passed if abs(fig.ratio - 1) <= TOLERANCE else failed).append(what)
    return table, passed, failed


def _timing_cells(timing: Any, key: str, fig: Any) -> list[str]:
    """wall-median ratio, ms, spread, preempted: '-' where the engine did not say."""
    if timing is None:
        return ["-", f"{fig.before:.3f}", "-", "-"]
    wall, spread = timing.wall_ms[key], timing.spread[key]
    return [f"{wall.ratio:.3f}", f"{fig.before:.3f}",
            f"±{max(spread.before, spread.after) / 2:.0%}",
            f"{timing.preempted}/{timing.runs}" if timing.preempted is not None else "-"]


def section_prune(runs: int = 30, threads: int = 1, models: tuple[str, ...] = MODELS
                  ) -> tuple[list[list[str]], list[str], list[str], list[str]]:
    """The pruning figures: (table, passed, failed, notes), as bench/converter.py's sections
    return them; a target figure that could not be measured counts as failed. The timing
    check (``section_identical``) runs first, its table printed here."""
    from workbench import zoo

    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{threads} thread(s) per backend, {runs} alternating rounds", flush=True)
    same, passed, failed = section_identical((*models, "small_cnn"))
    print("timing check: each model against its identical copy, wb.prune's defaults "
          "(repeat=15, warmup=3)")
    print_table(same)
    print(flush=True)
    table, notes = [HEADER], []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wb-bench-prune-") as root:
        for name in models:
            model, inputs = zoo.get(name)
            for amount in AMOUNTS:
                for method, round_to in VARIANTS:
                    rep = _measure(model, inputs, name, amount, method, round_to,
                                   Path(root) / name, runs, threads, table, notes)
                    if (method, round_to) == VARIANTS[0] and amount == 0.5:
                        for backend, fig in (("ORT", getattr(rep, "ort_ms", None)),
                                             ("ncnn", getattr(rep, "ncnn_ms", None))):
                            what = f"{name} structured 50%: {backend} latency ÷ unpruned < 1"
                            if fig is None or fig.ratio is None:
                                failed.append(f"{what} (not measured)")
                            else:
                                (passed if fig.ratio < 1.0 else failed).append(
                                    f"{what} ({fig.ratio:.2f})")
    notes.append(f"total {time.perf_counter() - t_all:.0f} s; load average at the end: "
                 f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return table, passed, failed, notes


def _measure(model: Any, inputs: tuple, name: str, amount: float, method: str,
             round_to: int | None, workspace: Path, runs: int, threads: int,
             table: list[list[str]], notes: list[str]) -> Any:
    """One ``wb.prune`` run: its row appended to ``table``, its failures to ``notes``; the
    report (None when pruning itself failed)."""
    import workbench as wb

    shown = method + (f" round_to={round_to}" if method == "l1-structured" else "")
    label = f"{name} {shown} {amount:.0%}"
    try:
        rep = wb.prune(model, amount, method, example_inputs=inputs, round_to=round_to,
                       workspace=workspace, threads=threads, repeat=runs,
                       progress=False).report
    except Exception as err:  # noqa: BLE001 - printed; the other rows still run
        traceback.print_exc()
        notes.append(f"{label}: not available: {type(err).__name__}")
        return None
    for stage, err in rep.errors.items():
        notes.append(f"{label}: {stage} not available: {err.message.splitlines()[0][:160]}")
    table.append([name, shown, f"{amount:.0%}", f"{rep.weights_pruned:.1%}",
                  _ratio(rep.onnx_bytes), _ratio(rep.ncnn_bin_bytes), _ratio(rep.ort_ms),
                  _ratio(rep.ncnn_ms), _ms(rep.ort_ms), _ms(rep.ncnn_ms),
                  f"{rep.snr_db:.1f}"])
    print(f"[{label}: {rep.seconds:.0f} s, load {os.getloadavg()[0]:.1f}]", flush=True)
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="timed rounds per model pair")
    ap.add_argument("--threads", type=int, default=1, help="threads of both backends")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo names")
    ap.add_argument("--timing-only", action="store_true",
                    help="only the timing check (each model against its identical copy)")
    args = ap.parse_args(argv)
    print(f"engine: {engine_state()}")
    models = tuple(m for m in args.models.split(",") if m)
    if args.timing_only:
        print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        same, passed, failed = section_identical((*models, "small_cnn"))
        print_figures(same, passed, failed, [])
        return 0
    table, passed, failed, notes = section_prune(args.runs, args.threads, models)
    print_figures(table, passed, failed, [], notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
