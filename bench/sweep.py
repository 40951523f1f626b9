"""The sweep's scaling and resume, measured side by side (issue 19).

The matrix is the project's zoo (``workbench.zoo.ZOO``) × exporter {torchscript, dynamo} ×
ncnn {fp32, fp16}; every cell runs every stage and the comparison in a fresh process. The same
cells run three times, each into a fresh workspace:

1. serial:  one cell at a time on this machine (``workers=1``)
2. pool:    the local pool, ``--workers`` cells at a time (default 2)
3. cluster: a Dask ``LocalCluster`` of ``--workers`` worker processes, 1 thread each

and the figures are: pool and cluster speed-up over serial (target >= 1.7 on 2 cores), and
the Dask path's overhead per cell over the pool, (cluster wall - pool wall) / pool wall
(target <= 10%). Then resume: ``workbench sweep`` is started as a process, stopped with
SIGINT once half its cells are stored, and started again; the figure is how many finished
cells the second run redid (target 0), checked by each cell's stored finish time.

Wall times on a shared machine move with the load of everything else running; each variant
prints its own cell count and wall time so the ratios can be read against it.

Run:  cd /work/main && .venv/bin/python bench/sweep.py [--models resnet,vit] [--exporter ...]
      [--ncnn ...] [--workers 2] [--skip serial,pool,cluster,resume]
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
from workbench.zoo import ZOO


def timed_sweep(models: list[str], matrix: dict, ws: Path, **kw) -> tuple[float, object]:
    t0 = time.perf_counter()
    res = wb.sweep(models, matrix, workspace=ws, progress=True, **kw)
    wall = time.perf_counter() - t0
    print(f"  {res.where}: {len(res.cells)} cells, {len(res.failed)} failed, wall {wall:.1f} s",
          flush=True)
    return wall, res


def resume_figure(models: list[str], matrix: dict, ws: Path, workers: int) -> None:
    cmd = [sys.executable, "-m", "workbench.cli", "sweep", *models, "--workspace", str(ws),
           "--workers", str(workers)]
    for key, values in matrix.items():
        cmd += [f"--{key}", ",".join(values)]
    n = len(models) * len(matrix.get("exporter", [1])) * len(matrix.get("ncnn", [1]))
    half = max(1, n // 2)
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
    print(f"  polled {polls} time(s), last saw {done} stored"
          + (f", last poll error: {last_error}" if last_error else ""), flush=True)
    with SweepDB(ws, readonly=True) as db:
        before = {c.cell_id: c.finished for c in db.cells() if c.done}
    print(f"  first run stopped (exit {rc}) with {len(before)} of {n} cells stored", flush=True)
    res = wb.sweep(models, matrix, workspace=ws, workers=workers, progress=True)
    after = {c.cell_id: c.finished for c in res.cells}
    redone = sum(after[k] != v for k, v in before.items())
    print(f"  second run: ran {res.ran} cell(s), {res.resumed} resumed; finished cells redone: "
          f"{redone} (target 0); all stored: {not res.pending}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(ZOO), help="zoo names or MODULE:FACTORY")
    ap.add_argument("--exporter", default="torchscript,dynamo")
    ap.add_argument("--ncnn", default="fp32,fp16")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated: serial,pool,cluster,resume")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    matrix = {"exporter": args.exporter.split(","), "ncnn": args.ncnn.split(",")}
    skip = set(args.skip.split(","))
    base = Path(tempfile.mkdtemp(prefix="wb-bench-sweep-"))
    n = len(models) * len(matrix["exporter"]) * len(matrix["ncnn"])
    print(f"sweep bench: {n} cells ({', '.join(models)} x {matrix}), {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}, workspaces in {base}", flush=True)
    walls: dict[str, float] = {}
    if "serial" not in skip:
        print("serial:", flush=True)
        walls["serial"], _ = timed_sweep(models, matrix, base / "serial", workers=1)
    if "pool" not in skip:
        print(f"pool ({args.workers} at a time):", flush=True)
        walls["pool"], _ = timed_sweep(models, matrix, base / "pool", workers=args.workers)
    if "cluster" not in skip:
        from distributed import Client, LocalCluster

        print(f"cluster (LocalCluster, {args.workers} worker processes, 1 thread each):",
              flush=True)
        t0 = time.perf_counter()
        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            print(f"  cluster started in {time.perf_counter() - t0:.1f} s (not counted)")
            walls["cluster"], _ = timed_sweep(models, matrix, base / "cluster", client=client)
    print(f"\nfigures (load average now {os.getloadavg()[0]:.1f}):")
    for name in ("pool", "cluster"):
        if "serial" in walls and name in walls:
            print(f"  {name} speed-up over serial: {walls['serial'] / walls[name]:.2f}x "
                  "(target >= 1.7)")
    if "pool" in walls and "cluster" in walls:
        over = (walls["cluster"] - walls["pool"]) / walls["pool"]
        print(f"  Dask overhead over the pool: {100 * over:+.1f}% of wall time, "
              f"{(walls['cluster'] - walls['pool']) / n:+.2f} s per cell (target <= 10%)")
    if "resume" not in skip:
        print("resume:", flush=True)
        resume_figure(models, matrix, base / "resume", args.workers)


if __name__ == "__main__":
    main()
