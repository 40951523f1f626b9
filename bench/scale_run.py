"""Running one job of ``bench/scale.py`` in a fresh child and measuring it: the child's
markers read from its stdout, its process tree sampled (scale_tree.py) between them, a
progress line while it runs, a timeout that kills the child's whole process group."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scale_jobs import DONE, START
from scale_tree import TreeSampler

HEARTBEAT = 60.0  # seconds between "still running" lines


@dataclass
class Job:
    """One measured job and its figures (kB, seconds); ``ok`` False with ``error`` when it
    failed or timed out."""

    model: str  # "decoder-4L", "cnn"
    layers: int | None
    stage: str
    side: str  # "wb" or "bare"
    ok: bool = False
    error: str = ""
    seconds: float | None = None  # the stage, timed in the child between the markers
    wall: float | None = None  # the child's whole life (imports, model build, exit)
    start_kb: int = 0  # the tree when the stage started (model, imports, inputs)
    peak_kb: int = 0
    peak_anon_kb: int = 0  # the peak's RssAnon, summed over the tree
    peak_file_kb: int = 0  # its RssFile (pages of files the processes map)
    peak_child_kb: int = 0  # the job child's own share of the peak (the rest: worker, pnnx)
    peak_at: float = 0.0  # seconds into the stage
    rss_sum_kb: int = 0
    hwm_kb: int = 0
    procs: int = 0
    samples: int = 0
    model_bytes: int = 0
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.model} {self.stage} {self.side}"


def gb(kb: float) -> str:
    return f"{kb / 1024 / 1024:.2f} GB"


def run_job(job: Job, spec: dict[str, Any], timeout: float, log: Path,
            tag: str = "", floor_kb: int = 0) -> Job:
    """Run ``spec`` (scale_jobs.child) in a fresh child; fill ``job`` with what it measured."""
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "scale.py"), "--child",
           json.dumps(spec)]
    print(f"{tag}{job.label}: running (timeout {timeout:.0f} s)", flush=True)
    t0 = time.perf_counter()
    with open(log, "ab") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)  # its group: the worker, pnnx
    sampler = TreeSampler(proc.pid, floor_kb=floor_kb,
                          on_low_memory=lambda _kb: _kill_group(proc, reap=False)).start()
    state: dict[str, Any] = {}
    done = threading.Event()
    reader = threading.Thread(target=_read, args=(proc, sampler, state, done), daemon=True)
    reader.start()
    next_beat = t0 + HEARTBEAT
    try:
        while not done.is_set() and proc.poll() is None:
            now = time.perf_counter()
            if now - t0 > timeout:
                job.error = f"timed out after {timeout:.0f} s"
                break
            if now >= next_beat:
                print(f"{tag}{job.label}: still running, {now - t0:.0f} s, tree now "
                      f"{gb(sampler.last_kb)}", flush=True)
                next_beat += HEARTBEAT
            done.wait(0.5)
        if done.is_set():  # let it close its worker and exit
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
    finally:
        _kill_group(proc)
        shm = (state.get("start") or {}).get("shm")
        # a child that did not finish did not close its worker: remove the worker's files
        if not state.get("done") and shm and shm.startswith("/dev/shm/wb-worker-"):
            shutil.rmtree(shm, ignore_errors=True)
        reader.join(timeout=10)
        sampler.stop()
    job.wall = time.perf_counter() - t0
    if sampler.low_memory_kb and not state.get("done"):
        job.error = (f"stopped: the machine's MemAvailable was {gb(sampler.low_memory_kb)}, "
                     f"below the floor of {gb(floor_kb)}, with the job's tree at "
                     f"{gb(sampler.low_tree_kb)}: out of memory here")
    _fill(job, state, sampler, proc.returncode, log)
    if job.ok:
        print(f"{tag}{job.label}: {job.seconds:.1f} s, peak {gb(job.peak_kb)} (from "
              f"{gb(job.start_kb)} at the start; {job.procs} process(es); at {job.peak_at:.1f} s: "
              f"anon {gb(job.peak_anon_kb)}, file {gb(job.peak_file_kb)}, the child "
              f"{gb(job.peak_child_kb)}); child {job.wall:.0f} s in all", flush=True)
    else:
        print(f"{tag}{job.label}: FAILED after {job.wall:.0f} s: {job.error}", flush=True)
    return job


def _read(proc: subprocess.Popen, sampler: TreeSampler, state: dict[str, Any],
          done: threading.Event) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith(START):
            sampler.arm()
            state["start"] = json.loads(line[len(START):])
        elif line.startswith(DONE):
            sampler.disarm()
            state["done"] = json.loads(line[len(DONE):])
            done.set()
    done.set()


def _kill_group(proc: subprocess.Popen, reap: bool = True) -> bool:
    """SIGKILL to the child's process group (this bench started it: the child, its worker,
    pnnx) if any of it still runs, then reap the child; whether anything was killed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        killed = True
    except (ProcessLookupError, PermissionError):
        killed = False
    if not reap:
        return killed
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    return killed


def _fill(job: Job, state: dict[str, Any], s: TreeSampler, rc: int | None, log: Path) -> None:
    start, done = state.get("start"), state.get("done")
    if start:
        job.model_bytes = start["model_bytes"]
    job.start_kb, job.peak_kb, job.rss_sum_kb = s.start_kb, s.peak_kb, s.peak_rss_sum_kb
    job.peak_anon_kb = s.peak_parts.get("RssAnon", 0)
    job.peak_file_kb = s.peak_parts.get("RssFile", 0)
    job.peak_child_kb, job.peak_at = s.peak_per_pid.get(s.root, 0), round(s.peak_at, 2)
    job.hwm_kb, job.procs, job.samples = s.hwm_kb, s.procs, s.samples
    if done:
        job.ok, job.seconds, job.result = True, done["seconds"], done["result"] or {}
        return
    if not job.error:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        # the exception's own line (the last "SomeError: ..."), else the log's last line
        why = next((ln for ln in reversed(lines) if re.match(r"[\w.]+(Error|Exception)\b", ln)),
                   lines[-1] if lines else "")
        job.error = (f"the child exited {rc}" + (" before its start marker" if not start else "")
                     + (f": {why[:400]}" if why else "") + f" (log: {log})")
