"""One cell in a fresh Python process (``python -m workbench.sweeps.cell``), started by
``subprocess`` rather than a ``ProcessPoolExecutor`` worker: a native crash in one pool worker
breaks the whole pool and every cell in flight with it, and Dask's worker processes are
daemonic, where ``multiprocessing`` may not start children. The process that waits on it
measures its process tree against a memory limit (``memory.py``) and stops it past the limit
or the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import memory
from .cell import RUNNING, CellResult
from .matrix import Cell

CELL_TIMEOUT = 1800.0
# What a Dask nanny sets in its workers (distributed.nanny.pre-spawn-environ), the local pool
# sets in its cells: cores / slots threads each, so cells side by side do not oversubscribe the
# cores (torch and pnnx's libtorch size their thread pools by it). A user's own value stays.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CRASH_HINT = ("the cell's process died (a native crash in torch, onnxruntime, pnnx or ncnn): "
              "its output is in the cell's cell.log; run that model's stages one by one in a "
              "notebook (the runners isolate native code) to find the stage")


def cell_threads_env(slots: int) -> dict[str, str]:
    """The thread variables for a cell sharing this machine with ``slots - 1`` others."""
    if slots <= 1:
        return {}
    threads = str(max(1, (os.cpu_count() or 1) // slots))
    return {v: threads for v in THREAD_VARS if v not in os.environ}


def run_fresh(cell: Cell, cell_dir: Path, timeout: float = CELL_TIMEOUT,
              stop: threading.Event | None = None,
              procs: set[subprocess.Popen[bytes]] | None = None,
              lock: threading.Lock | None = None,
              extra_env: dict[str, str] | None = None,
              limit: memory.MemoryLimit | None = None) -> CellResult | None:
    """Run ``cell`` in a fresh Python process with its artifacts in ``cell_dir``; its result,
    or a crashed result when the process died, or an out-of-memory one when its process tree
    passed ``limit`` (with this process's own use when in a Dask worker); None when ``stop``
    was set meanwhile. ``extra_env`` is added to this process's environment (the pool's
    thread limits)."""
    if cell_dir.exists():  # a cell run again (retry): its earlier files go
        shutil.rmtree(cell_dir)
    cell_dir.mkdir(parents=True)
    spec = cell_dir / "cell.json"
    result_path = cell_dir / "result.json"
    spec.write_text(json.dumps({"model": cell.model, "name": cell.name,
                                "choices": [list(c) for c in cell.choices],
                                "folder": str(cell_dir), "result": str(result_path),
                                "parent": os.getpid()}))
    env = dict(os.environ) | (extra_env or {})
    # the parent's import path: a factory importable here is importable in the child
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    t0 = time.perf_counter()
    with open(cell_dir / "cell.log", "wb") as log:
        # a session of its own: Ctrl-C in the terminal reaches the sweep, which stops the
        # children itself (and does not store a cell half run)
        proc = subprocess.Popen([sys.executable, "-m", "workbench.sweeps.cell", str(spec)],
                                stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        if procs is not None and lock is not None:
            with lock:
                procs.add(proc)
        in_worker = memory.dask_worker_limit()
        limit = memory.tightest(limit, in_worker)
        watch = memory.TreeWatch(proc.pid, limit, count_self=in_worker is not None) \
            if limit is not None else None
        try:
            how = memory.wait(proc, timeout, watch)
            if how == "timeout":
                kill_cell(proc)
                return CellResult.crashed(cell.id, f"the cell took over {timeout:g} s and was "
                                          "stopped", "raise cell_timeout (--cell-timeout) for "
                                          "big models, or look at cell.log for where it hung",
                                          seconds=timeout)
            if how == "memory":
                kill_cell(proc, signal.SIGKILL)  # at once: its memory grows while it waits
                stage = _running_stage(cell_dir)
                return CellResult.out_of_memory(cell.id, stage, watch.used, limit.bytes,
                                                limit.source, round(time.perf_counter() - t0, 3))
            rc = proc.returncode
        finally:
            if procs is not None and lock is not None:
                with lock:
                    procs.discard(proc)
    if stop is not None and stop.is_set():
        return None
    seconds = round(time.perf_counter() - t0, 3)
    if rc == 0 and result_path.is_file():
        return CellResult.from_json(result_path.read_text())
    how = (f"signal {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals()
           else f"exit code {rc}")
    tail = (cell_dir / "cell.log").read_text(errors="replace").splitlines()[-12:]
    return CellResult.crashed(cell.id, f"the cell's process died ({how}) before it "
                              "stored a result", CRASH_HINT, seconds, "\n".join(tail))


def _running_stage(cell_dir: Path) -> str:
    """The stage a stopped cell was in (the cell writes it as each starts)."""
    try:
        return (cell_dir / RUNNING).read_text().strip() or "model"
    except OSError:
        return "model"


def kill_cell(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a cell's process group: ``sig`` (SIGTERM), then SIGKILL after 3 s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


__all__ = ["CELL_TIMEOUT", "CRASH_HINT", "THREAD_VARS", "cell_threads_env", "kill_cell", "run_fresh"]
