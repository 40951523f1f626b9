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
rotating each round so load hits all alike; each latency the median of ``--repeat`` rounds).

Each figure is pruned ÷ unpruned, measured in the same run: ONNX file size, ncnn .bin size,
ONNX Runtime latency, ncnn latency. Target: structured 50% (``wb.prune``'s default,
``round_to=8``: every pruned width a multiple of 8) cuts latency on both backends (ratio
< 1). Printed beside it, whatever they are: structured at exact widths (``round_to=None``,
the amount met exactly, widths that leave the packed kernels) and unstructured (its zeros
are stored and multiplied like any weight). A report, not a test: the exit status is 0
whatever the figures.

Run:  cd /work/main && .venv/bin/python bench/prune_figures.py [--repeat N] [--threads T]
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
from _common import engine_state, print_figures  # noqa: E402 - bench/ on sys.path

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


def prune_section(repeat: int = 30, threads: int = 1, models: tuple[str, ...] = MODELS) -> None:
    """Print the pruning figures (the table, the target's verdicts, the notes)."""
    import workbench as wb
    from workbench import zoo

    print(f"engine: {engine_state()}")
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{threads} thread(s) per backend, medians of {repeat} alternating rounds")
    table, passed, failed, missing, notes = [HEADER], [], [], [], []
    root = tempfile.mkdtemp(prefix="wb-bench-prune-")
    t_all = time.perf_counter()
    for name in models:
        model, inputs = zoo.get(name)
        for amount in AMOUNTS:
            for method, round_to in VARIANTS:
                shown = method + (f" round_to={round_to}" if method == "l1-structured"
                                  else "")
                label = f"{name} {shown} {amount:.0%}"
                try:
                    res = wb.prune(model, amount, method, example_inputs=inputs,
                                   round_to=round_to, workspace=Path(root) / name,
                                   threads=threads, repeat=repeat, progress=False)
                except Exception:  # noqa: BLE001 - printed; the other rows still run
                    traceback.print_exc()
                    missing.append(label)
                    continue
                rep = res.report
                for stage, err in rep.errors.items():
                    missing.append(f"{label} {stage}")
                    notes.append(f"{label}: {stage}: {err.message.splitlines()[0][:160]}")
                table.append([name, shown, f"{amount:.0%}", f"{rep.weights_pruned:.1%}",
                              _ratio(rep.onnx_bytes), _ratio(rep.ncnn_bin_bytes),
                              _ratio(rep.ort_ms), _ratio(rep.ncnn_ms), _ms(rep.ort_ms),
                              _ms(rep.ncnn_ms), f"{rep.snr_db:.1f}"])
                if (method, round_to) == VARIANTS[0] and amount == 0.5:
                    for backend, fig in (("ORT", rep.ort_ms), ("ncnn", rep.ncnn_ms)):
                        what = f"{name} structured 50%: {backend} latency ÷ unpruned < 1"
                        if fig is None or fig.ratio is None:
                            missing.append(what)
                        else:
                            (passed if fig.ratio < 1.0 else failed).append(
                                f"{what} ({fig.ratio:.2f})")
                print(f"[{label}: {rep.seconds:.0f} s, load {os.getloadavg()[0]:.1f}]",
                      flush=True)
    notes.append(f"total {time.perf_counter() - t_all:.0f} s; load average at the end: "
                 f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print_figures(table, passed, failed, missing, notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30, help="timed rounds per model")
    ap.add_argument("--threads", type=int, default=1, help="threads of both backends")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo names")
    args = ap.parse_args(argv)
    prune_section(args.repeat, args.threads, tuple(m for m in args.models.split(",") if m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
