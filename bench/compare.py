"""What ``wb.compare`` costs next to plain inference, and how much of each model it aligns.

ResNet-50 (``zoo.get("resnet50")``: transformers ``ResNetConfig(num_labels=1000)``, seeded
random weights and BatchNorm statistics, nothing downloaded; one seeded 1x3x224x224 input) is
exported once to ONNX (TorchScript exporter, opset 17) and converted once to ncnn (fp32, with
``to_ncnn(module)``, or ``to_ncnn(onnx artifact)`` should that raise ConversionError; the route
is printed) into a temporary workspace. Then, side by side in one run:

1a. time: ``wb.compare(model, [onx, nc], x, mode="accumulated")`` / (torch + ORT + ncnn plain
    ``run(x)``), each a median; the plain runners are built once and keep their defaults
    (ORT and ncnn in the worker process, as compare's own runners; two threads each, where
    compare runs its captures at once on one thread each: the denominator is each
    backend at its fastest here).
    Target <= 1.5.
1b. the same with ``mode="isolated"``. Target <= 5.
1c. peak RSS of one comparison / peak RSS of the plain runs (target <= 2), each measured in a
    fresh subprocess of this script (``--child rss-plain`` / ``--child rss-compare``), which
    builds the same seeded model and uses the artifacts built here. A peak is the child's
    own VmHWM plus the worker's (both read from /proc, the worker's before it exits). The
    child's VmHWM is reset (``/proc/self/clear_refs``) once the model is built, so it is the
    peak of the measured work with the model and imports resident. ``ru_maxrss`` (self, and
    RUSAGE_CHILDREN for the worker) is printed too, but not used: a process started with
    subprocess (vfork + exec) starts with its spawner's high-water mark in ``ru_maxrss``, so
    the children would all report this process's peak (and the worker its child's).
    Accumulated mode is figure 1c; isolated mode is reported beside it, same target.
2.  ``report.aligned_fraction`` of the ONNX and the ncnn candidate on the default model
    (``wb.default_model()``), MobileNetV2, ResNet-50 and a small ViT (zoo). Target >= 0.9 each;
    the reasons tensors stay unaligned are listed, grouped, with counts.

Timed calls run round-robin (the order rotating each round) after warm-up rounds. The RSS
child also reports how much a second comparison grows the worker (compare keeps the runners
of unchanged files, so a re-run reuses the worker's sessions instead of building more). ``--profile`` adds the
time of one comparison per mode split by phase (exclusive time of workbench functions).
It is a report, not a test: the exit status is 0 whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/compare.py [--runs N] [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import print_figures, time_round_robin  # bench/ is on sys.path

ALIGN_MODELS = ("default", "mobilenet_v2", "resnet50", "vit")
RSS_TAG = "RSS-JSON "


@dataclass
class Row:
    label: str
    numerator: str
    denominator: str
    value: float | None  # None: could not be measured
    target: float
    at_most: bool = True  # value <= target passes; else value >= target

    @property
    def ok(self) -> bool:
        v = round(self.value, 2)  # judged as printed
        return v <= self.target if self.at_most else v >= self.target


# -- small helpers ------------------------------------------------------------------------------
def mb(kb: float) -> str:
    return f"{kb / 1024:.0f} MB"


def proc_status(pid: int | str) -> dict[str, int]:
    """VmRSS / VmHWM of a process in kB (empty if it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def worker_pid() -> int | None:
    from workbench.runtime.worker import worker

    w = worker()
    return w.pid if w.alive else None


def build_artifacts(name: str, workdir: Path) -> tuple[Any, tuple, Any, Any, str]:
    """(model, inputs, onnx artifact, ncnn artifact, ncnn route) of one model."""
    import workbench as wb
    from workbench import zoo

    model, x = wb.default_model() if name == "default" else zoo.get(name)
    ws = workdir / name
    onx = wb.export(model, x, workspace=ws, exporter="torchscript", opset=17)
    try:
        nc = wb.to_ncnn(model, x, workspace=ws)
        route = "to_ncnn(module)"
    except wb.ConversionError as e:
        first = (e.message or "").splitlines()[0] if e.message else type(e).__name__
        nc = wb.to_ncnn(onx)
        route = f"to_ncnn(onnx artifact), after to_ncnn(module) failed: {first}"
    return model, x, onx, nc, route


def thread_settings() -> str:
    import inspect

    import onnxruntime as ort
    import torch

    from workbench.runtime import NcnnRunner

    ncnn_threads = inspect.signature(NcnnRunner).parameters["num_threads"].default
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return (f"cores: os.cpu_count()={os.cpu_count()}, usable={affinity}; load average "
            f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}\n"
            f"threads: onnxruntime {ort.__version__} intra_op_num_threads="
            f"{ort.SessionOptions().intra_op_num_threads} (0 = ORT default); "
            f"ncnn num_threads={ncnn_threads}; torch {torch.__version__} "
            f"get_num_threads()={torch.get_num_threads()}")


# -- 1a / 1b: time ------------------------------------------------------------------------------
def timing_rows(model: Any, x: tuple, onx: Any, nc: Any, runs: int, warmup: int,
                keep: dict[str, Any]) -> list[Row]:
    import workbench as wb
    from workbench.runtime import NcnnRunner, OrtRunner, TorchRunner

    torch_r, ort_r, ncnn_r = TorchRunner(model), OrtRunner(onx), NcnnRunner(nc)

    def compare(mode: str) -> Any:
        rep = wb.compare(model, [onx, nc], x, mode=mode, progress=False)
        keep[mode] = rep  # the last report of each mode (alignment data stays valid)
        return rep

    variants: dict[str, Callable[[], Any]] = {
        "torch": lambda: torch_r.run(x),
        "onnxruntime": lambda: ort_r.run(x),
        "ncnn": lambda: ncnn_r.run(x),
        "compare accumulated": lambda: compare("accumulated"),
        "compare isolated": lambda: compare("isolated"),
    }
    times = time_round_robin(variants, runs, warmup)
    med = {n: statistics.median(t) * 1000 for n, t in times.items()}
    print("medians: " + ", ".join(f"{n} {v:.0f} ms" for n, v in med.items())
          + f" (spread of compare accumulated: {min(times['compare accumulated']):.2f}-"
          f"{max(times['compare accumulated']):.2f} s; load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())})")
    plain = med["torch"] + med["onnxruntime"] + med["ncnn"]
    load = os.getloadavg()[0]
    if load > 3:  # the plain runs use 2 threads each: on a loaded machine they wait at every
        # barrier while compare's single-threaded runs time-slice, so the ratio flatters
        print(f"LOADED (1-min load {load:.2f} > 3): figures 1a and 1b are not valid here; "
              "measure them on a quiet machine")
    mark = " [loaded]" if load > 3 else ""
    return [Row(f"1{k}. ResNet-50 compare {mode} / plain{mark}", f"{med[f'compare {mode}']:.0f} ms",
                f"{plain:.0f} ms", med[f"compare {mode}"] / plain, target)
            for k, mode, target in (("a", "accumulated", 1.5), ("b", "isolated", 5.0))]


# -- 1c: memory, in fresh subprocesses ----------------------------------------------------------
def child(kind: str, onnx_path: str, ncnn_path: str, mode: str) -> int:
    """One measured thing in this fresh process; prints its peaks as one JSON line."""
    import resource

    import workbench as wb
    from workbench import zoo

    model, x = zoo.get("resnet50")
    gc.collect()
    out: dict[str, Any] = {"base_kb": proc_status("self").get("VmRSS", 0)}
    try:  # the build's own peak (BatchNorm calibration) is not the measured thing
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (not ru_maxrss)
        out["reset"] = True
    except OSError:
        out["reset"] = False
    if kind == "rss-plain":
        from workbench.runtime import NcnnRunner, OrtRunner, TorchRunner

        for runner in (TorchRunner(model), OrtRunner(onnx_path), NcnnRunner(ncnn_path)):
            for _ in range(2):
                runner.run(x)
    else:
        wb.compare(model, [onnx_path, ncnn_path], x, mode=mode, progress=False)
    out["parent_kb"] = proc_status("self").get("VmHWM", 0)
    out["ru_maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pid = worker_pid()
    status = proc_status(pid) if pid else {}
    out["worker_hwm_kb"] = status.get("VmHWM", 0)
    if kind == "rss-compare":  # a second comparison: what the first one left behind
        wb.compare(model, [onnx_path, ncnn_path], x, mode=mode, progress=False)
        again = proc_status(pid) if pid else {}
        out["worker_growth_kb"] = again.get("VmRSS", 0) - status.get("VmRSS", 0)
    from workbench.runtime.worker import worker

    worker().close()
    out["worker_children_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(RSS_TAG + json.dumps(out), flush=True)
    return 0


def run_child(kind: str, onx: Any, nc: Any, mode: str = "accumulated") -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind,
           "--onnx", str(onx.path), "--ncnn", str(nc.path), "--mode", mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith(RSS_TAG):
            return json.loads(line[len(RSS_TAG):])
    raise RuntimeError(f"{kind} child exited {proc.returncode} without a result:\n"
                       + "\n".join((proc.stderr or proc.stdout).splitlines()[-15:]))


def rss_rows(onx: Any, nc: Any) -> list[Row]:
    plain = run_child("rss-plain", onx, nc)
    rows = []

    def show(what: str, r: dict[str, Any]) -> None:
        again = "worker_growth_kb" in r
        extra = (f"; a second comparison grows the worker by {mb(r['worker_growth_kb'])}"
                 if again else "")
        since = ("since the model was built, with" if r["reset"]
                 else "including the model build (the reset failed);")
        print(f"rss {what}: parent VmHWM {mb(r['parent_kb'])} ({since} "
              f"{mb(r['base_kb'])} resident; ru_maxrss {mb(r['ru_maxrss_kb'])}), worker "
              f"VmHWM {mb(r['worker_hwm_kb'])} (RUSAGE_CHILDREN "
              f"{mb(r['worker_children_kb'])}{' after both calls' if again else ''})"
              f"{extra}")

    show("plain runs", plain)
    base = plain["parent_kb"] + plain["worker_hwm_kb"]
    for label, mode in (("1c. ResNet-50 peak RSS compare accumulated / plain", "accumulated"),
                        ("1c. (isolated mode) peak RSS compare / plain", "isolated")):
        try:
            r = run_child("rss-compare", onx, nc, mode)
        except Exception as e:  # keep the other figures
            print(f"rss compare {mode}: could not measure: {e}")
            rows.append(Row(label, "-", mb(base), None, 2.0))
            continue
        show(f"compare {mode}", r)
        peak = r["parent_kb"] + r["worker_hwm_kb"]
        rows.append(Row(label, mb(peak), mb(base), peak / base, 2.0))
    return rows


# -- 2: aligned fraction ------------------------------------------------------------------------
def reason_group(reason: str) -> str:
    """A reason with its names, shapes and numbers blanked, so alike reasons group."""
    reason = re.sub(r"'[^']*'", "'…'", reason)
    reason = re.sub(r"\[[^\]]*\]", "[…]", reason)
    return re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", "N", reason)


def alignment_rows(report: Any, model_name: str) -> list[Row]:
    rows = []
    unaligned = report.unaligned
    for cand in report.candidates:
        al = report.alignments.get(cand.name)
        frac = report.aligned_fraction.get(cand.name)
        if al is None or frac is None:
            rows.append(Row(f"2. aligned {model_name} / {cand.kind}", "-", "-", None, 0.9,
                            at_most=False))
            continue
        groups = Counter(reason_group(r) for r in unaligned.get(cand.name, {}).values())
        top = "; ".join(f"{n}x {g}" for g, n in groups.most_common(4))
        more = f"; +{len(groups) - 4} more kinds" if len(groups) > 4 else ""
        print(f"  {model_name} / {cand.name}: {frac:.3f} ({len(al.pairs)}/{al.considered} "
              f"aligned; {len(unaligned.get(cand.name, {}))} unaligned, "
              f"{al.considered - len(al.pairs)} of them counted)"
              + (f"\n    unaligned: {top}{more}" if groups else ""))
        rows.append(Row(f"2. aligned {model_name} / {cand.kind}", str(len(al.pairs)),
                        str(al.considered), frac, 0.9, at_most=False))
    return rows


def alignment_section(workdir: Path, resnet50: tuple[Any, str] | None) -> list[Row]:
    import workbench as wb

    rows: list[Row] = []
    for name in ALIGN_MODELS:
        try:
            if name == "resnet50" and resnet50 is not None:
                report, route = resnet50
            else:
                model, x, onx, nc, route = build_artifacts(name, workdir)
                report = wb.compare(model, [onx, nc], x, mode="accumulated",
                                    progress=False)
            print(f"{name} (ncnn via {route}):")
            rows += alignment_rows(report, name)
        except Exception as e:  # keep the other models
            print(f"{name}: could not compare: {type(e).__name__}: {e}")
            rows += [Row(f"2. aligned {name} / {k}", "-", "-", None, 0.9, at_most=False)
                     for k in ("onnx", "ncnn")]
    return rows


# -- --profile: one comparison split by phase ---------------------------------------------------
PHASES = [  # (label, module, attribute path)
    ("worker: create sessions/nets", "workbench.runtime.remote", "RemoteHandle._ensure"),
    ("worker: run + transfer", "workbench.runtime.remote", "RemoteHandle.execute"),
    ("torch capture='all'", "workbench.runtime.torch_runner", "TorchRunner._execute"),
    ("load/check .onnx", "workbench.onnx_io", "load_onnx"),
    ("list candidate tensors", "workbench.comparison.capture", "candidate_tensors"),
    ("align", "workbench.comparison.capture", "align"),
    ("metrics (tensor_metrics)", "workbench.comparison.metrics", "tensor_metrics"),
    ("noise floor: inputs", "workbench.comparison.capture", "floor_inputs"),
    ("noise floor: per tensor", "workbench.comparison.measure", "noise_floors"),
    ("isolated ONNX: rewrite graph", "workbench.comparison.isolated", "isolated_model"),
    ("isolated ONNX: save + new runner", "workbench.comparison.measure", "isolated"),
    ("isolated ncnn: plan passes", "workbench.comparison.isolated", "_isolated_ncnn"),
]


def profile_phases(model: Any, x: tuple, onx: Any, nc: Any) -> None:
    """Exclusive seconds per phase of one warm compare call per mode."""
    import importlib

    import workbench as wb

    spent: Counter[str] = Counter()
    # per thread (compare captures candidates in a thread while it measures the previous
    # one), per active phase: seconds its nested phases took
    local = threading.local()

    def timed(label: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = local.__dict__.setdefault("stack", [])
            stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                spent[label] += dt - stack.pop()
                if stack:
                    stack[-1] += dt
        return wrapper

    patched = []
    for label, module, attr in PHASES:
        owner: Any = importlib.import_module(module)
        *path, leaf = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if hasattr(owner, leaf):
            patched.append((owner, leaf, getattr(owner, leaf)))
            setattr(owner, leaf, timed(label, getattr(owner, leaf)))
    try:
        for mode in ("accumulated", "isolated"):
            wb.compare(model, [onx, nc], x, mode=mode, progress=False)  # warm
            spent.clear()
            t0 = time.perf_counter()
            wb.compare(model, [onx, nc], x, mode=mode, progress=False)
            total = time.perf_counter() - t0
            print(f"profile, one compare {mode}: {total:.2f} s (phases in the capture thread "
                  "overlap the others: the sum may exceed the total)")
            for label, s in spent.most_common():
                print(f"  {label:<34} {s:6.2f} s  {100 * s / total:4.0f}%")
            other = total - sum(spent.values())
            print(f"  {'other (compare loop, records...)':<34} {other:6.2f} s  "
                  f"{100 * other / total:4.0f}%")
    finally:
        for owner, leaf, original in patched:
            setattr(owner, leaf, original)


# -- the table ----------------------------------------------------------------------------------
def print_table(rows: list[Row]) -> None:
    table = [("figure", "numerator", "denominator", "measured", "target", "result")]
    passed, failed, missing = [], [], []
    for r in rows:
        if r.value is None:
            missing.append(r.label)
            table.append((r.label, r.numerator, r.denominator, "-",
                          f"{'<=' if r.at_most else '>='} {r.target:.2f}", "n/a"))
            continue
        (passed if r.ok else failed).append(r.label)
        table.append((r.label, r.numerator, r.denominator, f"{r.value:.2f}",
                      f"{'<=' if r.at_most else '>='} {r.target:.2f}",
                      "PASS" if r.ok else "FAIL"))
    print_figures(table, passed, failed, missing)
    print(f"load average (1, 5, 15 min) now: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for r in rows:  # one line a figure, as the README quotes them
        target = f"target {'<=' if r.at_most else '>='} {r.target:.2f}"
        verdict = "MET" if r.ok else "NOT MET"
        if "[loaded]" in r.label:  # 2-thread plain runs stall at barriers on a busy machine
            verdict += " as printed, but not valid: loaded (measure on a quiet machine)"
        print(f"{r.label}: " + ("not measured" if r.value is None else
                                f"{r.value:.2f}, {target}: {verdict}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="2 timed rounds after 1 warm-up")
    parser.add_argument("--profile", action="store_true",
                        help="also split one ResNet-50 comparison per mode by phase")
    parser.add_argument("--timing-only", action="store_true",
                        help="figures 1a and 1b only (no RSS children, no aligned fractions)")
    parser.add_argument("--child", choices=("rss-plain", "rss-compare"), help=argparse.SUPPRESS)
    parser.add_argument("--onnx", help=argparse.SUPPRESS)
    parser.add_argument("--ncnn", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="accumulated", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.onnx, args.ncnn, args.mode)
    runs, warmup = (2, 1) if args.quick else (max(1, args.runs), 1)

    t_start = time.perf_counter()
    rows: list[Row] = []
    try:
        print(thread_settings())
        with tempfile.TemporaryDirectory(prefix="wb-bench-compare-") as tmp:
            workdir = Path(tmp)
            t0 = time.perf_counter()
            model, x, onx, nc, route = build_artifacts("resnet50", workdir)
            print(f"ResNet-50: export + to_ncnn {time.perf_counter() - t0:.1f} s "
                  f"({onx.graph.node_count} ONNX nodes, {nc.graph.node_count} ncnn layers); "
                  f"ncnn via {route}")
            print(f"timing: medians of {runs} round-robin rounds after {warmup} warm-up")
            reports: dict[str, Any] = {}
            try:
                rows += timing_rows(model, x, onx, nc, runs, warmup, reports)
            except Exception:
                traceback.print_exc()
                rows += [Row(f"1{k}. ResNet-50 compare {m} / plain", "-", "-", None, t)
                         for k, m, t in (("a", "accumulated", 1.5), ("b", "isolated", 5.0))]
            if args.profile:
                profile_phases(model, x, onx, nc)
            if args.timing_only:
                print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
                print_table(rows)
                return 0
            try:
                rows += rss_rows(onx, nc)
            except Exception:
                traceback.print_exc()
                rows.append(Row("1c. ResNet-50 peak RSS compare accumulated / plain", "-", "-",
                                None, 2.0))
            print("aligned fractions (mode='accumulated'):")
            rep = reports.get("accumulated")
            rows += alignment_section(workdir, (rep, route) if rep is not None else None)
            del model, reports, rep
        print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
              f"whole run {time.perf_counter() - t_start:.0f} s")
        print_table(rows)
    except Exception:  # a report, not a test: say what broke and exit 0
        traceback.print_exc()
        if rows:
            print_table(rows)
        print("summary: the benchmark could not finish (traceback above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
