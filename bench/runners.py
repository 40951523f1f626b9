"""What crash isolation and capture="all" cost the runners, on a ResNet-50, side by side.

The model is ``transformers.ResNetModel(ResNetConfig())`` with seeded random weights (nothing is
downloaded), returning ``last_hidden_state``, on one seeded 1x3x224x224 input. It is exported
once to ONNX (TorchScript exporter, opset 17) and converted once to ncnn (fp32, through pnnx),
into a temporary workspace. Then every variant below runs round-robin (the order rotating each
round, so machine noise hits all alike) and each figure is a ratio of two medians:

1. ORT:   worker-isolated run / in-process run             (target <= 1.15)
2. ncnn:  worker-isolated run / in-process run             (target <= 1.15)
3. ORT:   capture="all" / capture="outputs", in-process    (target <= 1.25)
4. ncnn:  capture="all" / capture="outputs", in-process    (target <= 1.5)
5. torch: capture="all" / capture="outputs"                (target <= 1.16, when available)

Runners keep their default threads (onnxruntime's own default, ncnn num_threads=2); each
timed call follows the previous one directly (``--settle S`` adds a pause). Should
``to_ncnn(module)`` fail, the ncnn figures use ``to_ncnn(onnx artifact)`` and say so. It is a report, not a test: the exit status is 0
whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/runners.py [--runs N] [--quick] [--settle S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import print_figures, time_round_robin  # bench/ is on sys.path


@dataclass(frozen=True)
class Figure:
    label: str
    numerator: str  # variant names
    denominator: str
    target: float


FIGURES = [
    Figure("ORT isolated / in-process", "ort isolated", "ort in-process", 1.15),
    Figure("ncnn isolated / in-process", "ncnn isolated", "ncnn in-process", 1.15),
    Figure("ORT capture=all / outputs", "ort capture=all", "ort in-process", 1.25),
    Figure("ncnn capture=all / outputs", "ncnn capture=all", "ncnn in-process", 1.5),
    Figure("torch capture=all / outputs", "torch capture=all", "torch outputs", 1.16),
]


# Calls run back to back, as in a comparison. (onnxruntime's intra-op threads used to spin
# for tens of ms after a run and slow whatever ran next; workbench sessions now spin only while
# a run lasts. --settle S pauses S seconds before each call to see the figures without any
# overlap.)
SETTLE_S = 0.0


def build_model() -> tuple[Any, Any]:
    """ResNet-50 from its default config with seeded random weights, and a seeded input."""
    import torch
    from transformers import ResNetConfig, ResNetModel

    class LastHiddenState(torch.nn.Module):
        """ResNetModel returning ``last_hidden_state`` as a plain tensor."""

        def __init__(self) -> None:
            super().__init__()
            self.resnet = ResNetModel(ResNetConfig())

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.resnet(pixel_values).last_hidden_state

    torch.manual_seed(0)
    model = LastHiddenState().eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return model, x


def thread_settings() -> str:
    import inspect

    import onnxruntime as ort
    import torch

    from workbench.runtime import NcnnRunner

    ncnn_threads = inspect.signature(NcnnRunner).parameters["num_threads"].default
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    intra = ort.SessionOptions().intra_op_num_threads
    ort_threads = f"intra_op_num_threads={intra}" + (" (ORT default: one per physical core)"
                                                     if intra == 0 else "")
    return (f"cores: os.cpu_count()={os.cpu_count()}, usable (affinity)={affinity}\n"
            f"threads: onnxruntime {ort.__version__} {ort_threads}; "
            f"ncnn num_threads={ncnn_threads} (NcnnRunner default); "
            f"torch.get_num_threads()={torch.get_num_threads()}; "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")


def setup(workdir: Path) -> dict[str, Callable[[], Any]]:
    """Export and convert once; the variants to time (those that cannot run left out)."""
    import workbench as wb
    from workbench.errors import InputError
    from workbench.runtime import NcnnRunner, OrtRunner, TorchRunner
    from workbench.stages.ncnn import ConversionError

    model, x = build_model()
    t0 = time.perf_counter()
    onx = wb.export(model, (x,), workspace=workdir / "ws", exporter="torchscript", opset=17)
    t1 = time.perf_counter()
    try:
        nc = wb.to_ncnn(model, (x,), workspace=workdir / "ws")
    except ConversionError as e:  # keep measuring: the ONNX route converts the same model
        print(f"note: to_ncnn(module) failed ({e.message.splitlines()[0]}); "
              "the ncnn figures use to_ncnn(onnx artifact)")
        nc = wb.to_ncnn(onx, workspace=workdir / "ws")
    t2 = time.perf_counter()
    print(f"export {t1 - t0:.1f} s ({onx.graph.node_count} ONNX nodes), "
          f"to_ncnn {t2 - t1:.1f} s ({nc.params['source']} route, {nc.params['precision']}, "
          f"{nc.graph.node_count} ncnn layers)")

    ort_iso, ort_local = OrtRunner(onx), OrtRunner(onx, isolated=False)
    ncnn_iso, ncnn_local = NcnnRunner(nc), NcnnRunner(nc, isolated=False)
    torch_runner = TorchRunner(model)
    inputs = (x,)
    variants: dict[str, Callable[[], Any]] = {
        "ort isolated": lambda: ort_iso.run(inputs),
        "ort in-process": lambda: ort_local.run(inputs),
        "ort capture=all": lambda: ort_local.run(inputs, capture="all"),
        "ncnn isolated": lambda: ncnn_iso.run(inputs),
        "ncnn in-process": lambda: ncnn_local.run(inputs),
        "ncnn capture=all": lambda: ncnn_local.run(inputs, capture="all"),
        "torch outputs": lambda: torch_runner.run(inputs),
        "torch capture=all": lambda: torch_runner.run(inputs, capture="all"),
    }
    try:
        variants["torch capture=all"]()
    except InputError:  # not implemented yet
        del variants["torch capture=all"]
    return variants


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def report(times: dict[str, list[float]], load_start: str) -> None:
    rows = [("figure", "numerator ms", "denominator ms", "ratio", "target", "result")]
    passed, failed, missing = [], [], []
    verdicts = []
    for f in FIGURES:
        if f.numerator not in times:
            missing.append(f"{f.numerator}: not available")
            continue
        num = statistics.median(times[f.numerator]) * 1000
        den = statistics.median(times[f.denominator]) * 1000
        ratio = round(num / den, 2)  # judged as printed
        ok = ratio <= f.target
        (passed if ok else failed).append(f.label)
        rows.append((f.label, f"{num:.1f}", f"{den:.1f}", f"{ratio:.2f}", f"<= {f.target:.2f}",
                     "PASS" if ok else "FAIL"))
        verdicts.append(f"{f.label}: {ratio:.2f}, target <= {f.target:.2f}: "
                        + ("MET" if ok else "NOT MET"))
    print_figures(rows, passed, failed, missing, notes=missing)
    end = load_average()
    loaded = max(float(v) for v in (load_start + " " + end).split()[::3]) > 3
    print(f"load average (1, 5, 15 min): {load_start} at the start, {end} at the end"
          + (" [loaded: 1-min load above 3; ratios of 2-thread runs are not valid here, "
             "measure on a quiet machine]" if loaded else ""))
    for line in verdicts:
        print(line + (" as printed, but not valid: loaded (measure on a quiet machine)"
                      if loaded else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15,
                        help="timed rounds (default 15: the ratios are noisy on 2 cores)")
    parser.add_argument("--quick", action="store_true", help="3 timed rounds after 1 warm-up")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help=f"pause before each timed call, s (default {SETTLE_S}; 0 to see "
                        "the variants disturb each other)")
    args = parser.parse_args(argv)
    runs, warmup = (3, 1) if args.quick else (max(1, args.runs), 2)

    load_start = load_average()
    print(thread_settings())
    print(f"load average (1, 5, 15 min) at the start: {load_start}")
    print(f"model: transformers ResNetModel(ResNetConfig()) seeded, input 1x3x224x224; "
          f"medians of {runs} round-robin runs after {warmup} warm-up, {args.settle:g} s apart")
    try:
        with tempfile.TemporaryDirectory(prefix="wb-bench-runners-") as tmp:
            variants = setup(Path(tmp))
            report(time_round_robin(variants, runs, warmup, args.settle), load_start)
    except Exception:  # a report, not a test: say what broke and exit 0
        traceback.print_exc()
        print("summary: the benchmark could not run (traceback above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
