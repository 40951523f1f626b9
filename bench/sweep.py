"""The sweep's scaling and resume, measured side by side (issue 19).

The matrix is the project's zoo (``workbench.zoo.ZOO``) × exporter {torchscript, dynamo} ×
ncnn {fp32, fp16}; every cell runs every stage and the comparison in a fresh process. The same
cells run three times, each into a fresh workspace:

1. serial:  one cell at a time on this machine (``workers=1``)
2. pool:    the local pool, ``--workers`` cells at a time (default 2)
3. cluster: a Dask ``LocalCluster`` of ``--workers`` worker processes, 1 thread each

Figures: pool and cluster speed-up over serial in wall time (target >= 1.7 on 2 cores); the
Dask path's overhead over the pool, as wall time, (cluster - pool) / pool, and per cell: each
path's slot time not spent inside a cell's process, (wall × slots - Σ cell seconds) / cells,
cluster minus pool, over the mean cell time (target <= 10% either way). Then resume:
``workbench sweep`` is started as a process, stopped with SIGINT once half its cells are
stored, and started again; the figure is how many finished cells the second run redid
(target 0), by each cell's stored finish time and attempts.

A shared machine's load moves every figure: each line prints the 1-minute load average at its
start and end ("loaded" above 3 on 2 cores), so a ratio can be read against it.

Run:  cd /work/main && .venv/bin/python bench/sweep.py [--quick] [--models resnet,vit]
      [--exporter ...] [--ncnn ...] [--precision fp32,int8] [--workers 2]
      [--skip serial,pool,cluster,resume]
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.sweeps.db import SweepDB
from workbench.sweeps.matrix import Matrix
from workbench.zoo import ZOO

QUICK_MODELS = ("resnet", "vit")  # the two quickest zoo models: 8 cells
LOADED = 3.0  # a 1-minute load average above this on 2 cores: the figures are noise-bound


def load() -> float:
    return os.getloadavg()[0]


def load_note(a: float, b: float) -> str:
    return f"load {a:.1f}->{b:.1f}" + (" (loaded)" if max(a, b) > LOADED else "")


def timed_sweep(models: list[str], matrix: dict, ws: Path, slots: int, **kw
                ) -> dict[str, float]:
    """One sweep; its wall time, the cells' own seconds and the slot overhead per cell."""
    l0, t0 = load(), time.perf_counter()
    res = wb.sweep(models, matrix, workspace=ws, progress=False, **kw)
    wall = time.perf_counter() - t0
    inside = sum(c.seconds or 0.0 for c in res.cells)
    n = max(1, len(res.cells))
    fig = {"wall": wall, "inside": inside, "n": n, "overhead": (wall * slots - inside) / n,
           "load0": l0, "load1": load()}
    print(f"  {res.where}: {len(res.cells)} cells ({len(res.failed)} failed: "
          f"{sorted({c.status for c in res.failed})}), wall {wall:.1f} s, inside the cells "
          f"{inside:.1f} s, slot time outside a cell {fig['overhead']:.2f} s per cell; "
          f"{load_note(l0, fig['load1'])}", flush=True)
    return fig


def resume_figure(models: list[str], matrix: dict, ws: Path, workers: int) -> None:
    cmd = [sys.executable, "-m", "workbench.cli", "sweep", *models, "--workspace", str(ws),
           "--workers", str(workers)]
    for key, values in matrix.items():
        cmd += [f"--{key}", ",".join(values)]
    n = len(Matrix.of(matrix).cells(models, models))
    half = max(1, n // 2)
    l0 = load()
    # SIGINT back to its default in the child: a shell starts background jobs with SIGINT
    # ignored, and Python started so would never see the Ctrl-C this figure sends
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    done, polls, last_error = 0, 0, ""
    while proc.poll() is None:
        time.sleep(1)
        polls += 1
        try:
            c = sqlite3.connect(f"file:{ws / 'sweep.db'}?mode=ro", uri=True)
            try:
                done = c.execute("SELECT count(*) FROM cells WHERE status != 'pending'"
                                 ).fetchone()[0]
            finally:
                c.close()
        except sqlite3.OperationalError as e:  # not created yet
            last_error = str(e)
            continue
        if done >= half:
            proc.send_signal(signal.SIGINT)
            break
    rc = proc.wait()
    with SweepDB(ws, readonly=True) as db:
        before = {c.cell_id: (c.finished, c.attempts) for c in db.cells() if c.done}
    print(f"  first run stopped (exit {rc}, 130 = Ctrl-C) with {len(before)} of {n} cells "
          f"stored (polled {polls} time(s){', last poll error: ' + last_error if last_error else ''})",
          flush=True)
    res = wb.sweep(models, matrix, workspace=ws, workers=workers, progress=False)
    after = {c.cell_id: (c.finished, c.attempts) for c in res.cells}
    redone = sum(after[k] != v for k, v in before.items())
    print(f"  second run: ran {res.ran} cell(s), {res.resumed} resumed; finished cells redone: "
          f"{redone} (target 0); all stored: {not res.pending}; {load_note(l0, load())}",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="zoo names or MODULE:FACTORY, comma-"
                    "separated (default: the whole zoo)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{', '.join(QUICK_MODELS)} only, unless --models says otherwise")
    ap.add_argument("--exporter", default="torchscript,dynamo")
    ap.add_argument("--ncnn", default="fp32,fp16")
    ap.add_argument("--precision", default="fp32", help="e.g. fp32,int8")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated: serial,pool,cluster,resume")
    args = ap.parse_args()
    models = [m for m in (args.models or ",".join(QUICK_MODELS if args.quick else ZOO)
                          ).split(",") if m]
    matrix = {"exporter": args.exporter.split(","), "ncnn": args.ncnn.split(","),
              "precision": args.precision.split(",")}
    skip = set(args.skip.split(","))
    base = Path(tempfile.mkdtemp(prefix="wb-bench-sweep-"))
    n = len(Matrix.of(matrix).cells(models, models))
    print(f"sweep bench: {n} cells ({', '.join(models)} x {matrix}), {os.cpu_count()} cores, "
          f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}, workspaces in "
          f"{base}", flush=True)
    figs: dict[str, dict[str, float]] = {}
    if "serial" not in skip:
        print("serial:", flush=True)
        figs["serial"] = timed_sweep(models, matrix, base / "serial", 1, workers=1)
    if "pool" not in skip:
        print(f"pool ({args.workers} at a time):", flush=True)
        figs["pool"] = timed_sweep(models, matrix, base / "pool", args.workers,
                                   workers=args.workers)
    if "cluster" not in skip:
        from distributed import Client, LocalCluster

        print(f"cluster (LocalCluster, {args.workers} worker processes, 1 thread each):",
              flush=True)
        t0 = time.perf_counter()
        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            print(f"  cluster started in {time.perf_counter() - t0:.1f} s (not counted)")
            figs["cluster"] = timed_sweep(models, matrix, base / "cluster", args.workers,
                                          client=client)
    print("\nfigures:")
    for name in ("pool", "cluster"):
        if "serial" in figs and name in figs:
            s, f = figs["serial"], figs[name]
            print(f"  {name} speed-up over serial: {s['wall'] / f['wall']:.2f}x (target >= 1.7); "
                  f"serial {load_note(s['load0'], s['load1'])}, {name} "
                  f"{load_note(f['load0'], f['load1'])}")
    if "pool" in figs and "cluster" in figs:
        p, c = figs["pool"], figs["cluster"]
        over = (c["wall"] - p["wall"]) / p["wall"]
        per_cell = c["overhead"] - p["overhead"]
        mean_cell = (p["inside"] + c["inside"]) / (p["n"] + c["n"])
        print(f"  Dask overhead over the pool: wall {100 * over:+.1f}%; per cell "
              f"{per_cell:+.2f} s of slot time outside a cell = {100 * per_cell / mean_cell:+.1f}%"
              f" of the mean cell ({mean_cell:.1f} s) (target <= 10%); pool "
              f"{load_note(p['load0'], p['load1'])}, cluster {load_note(c['load0'], c['load1'])}")
    if "resume" not in skip:
        print("resume:", flush=True)
        resume_figure(models, matrix, base / "resume", args.workers)


if __name__ == "__main__":
    main()
