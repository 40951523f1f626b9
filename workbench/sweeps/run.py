"""Scheduling a sweep: every cell in a fresh process, on a local pool or a Dask cluster; each
finished cell stored at once, so an interrupted sweep resumes where it stopped.

A cell is a child process of its own (``python -m workbench.sweeps.cell``) started by
``subprocess``, not a ``ProcessPoolExecutor`` worker: a native crash in one pool worker
breaks the whole pool and every cell in flight with it, and Dask's worker processes are
daemonic, where ``multiprocessing`` may not start children. A thread per slot waits on its
child, locally and inside a Dask task alike.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..runtime.arm_env import arm_env
from ..zoo import ZOO
from . import memory
from .cell import RUNNING, CellResult
from .db import CellRecord, SweepDB, writer_lock
from .factory import name_of, spec_of
from .matrix import Cell, Matrix

DEFAULT_WORKSPACE = Path("workbench-runs") / "sweep"
CELL_TIMEOUT = 1800.0
# What a Dask nanny sets in its workers (distributed.nanny.pre-spawn-environ), the local pool
# sets in its cells: cores / slots threads each, so cells side by side do not oversubscribe the
# cores (torch and pnnx's libtorch size their thread pools by it). A user's own value stays.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CRASH_HINT = ("the cell's process died (a native crash in torch, onnxruntime, pnnx or ncnn): "
              "its output is in the cell's cell.log; run that model's stages one by one in a "
              "notebook (the runners isolate native code) to find the stage")


@dataclass
class SweepResult:
    """Every cell of the sweep as stored, and what this run did."""

    workspace: Path
    cells: list[CellRecord]
    ran: int = 0  # cells run this time
    resumed: int = 0  # cells finished by an earlier run, not run again
    seconds: float = 0.0
    interrupted: bool = False
    where: str = "local"

    @property
    def failed(self) -> list[CellRecord]:
        return [c for c in self.cells if c.failed]

    @property
    def pending(self) -> list[CellRecord]:
        return [c for c in self.cells if not c.done]

    @property
    def ok(self) -> bool:
        """Every cell finished and none failed (the CI gate)."""
        return not self.failed and not self.pending

    def table(self) -> str:
        """One line per cell: model, choices, status, seconds, the first failing stage."""
        lines = []
        for c in self.cells:
            bad = next((s for s in c.stages if s.status not in ("ok", "skipped", "off")), None)
            why = f"  {bad.stage}: {bad.error_class}: {_first_line(bad.error)}" if bad else ""
            secs = f"{c.seconds:6.1f} s" if c.seconds is not None else "      -"
            lines.append(f"{c.name:<14} {c.label:<58} {c.status:<9} {secs}{why}")
        lines.append(f"{len(self.cells)} cells: {len(self.cells) - len(self.failed) - len(self.pending)}"
                     f" ok, {len(self.failed)} failed, {len(self.pending)} not run; "
                     f"{self.ran} run now, {self.resumed} from before; {self.seconds:.1f} s "
                     f"({self.where})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"workspace": str(self.workspace), "ok": self.ok, "ran": self.ran,
                "resumed": self.resumed, "seconds": round(self.seconds, 3),
                "interrupted": self.interrupted, "where": self.where,
                "cells": [asdict(c) | {"label": c.label} for c in self.cells]}

    def __str__(self) -> str:
        return self.table()


def sweep(models: Any = None, matrix: Matrix | dict[str, Any] | None = None, *,
          workspace: Any = None, client: Any = None, scheduler: str | None = None,
          shared: str | os.PathLike[str] | None = None, workers: int | None = None,
          retry_failed: bool = False, progress: bool = True, connect_timeout: float = 5.0,
          cell_timeout: float = CELL_TIMEOUT, memory_limit: int | str | None = None,
          on_cell: Callable[[CellResult], None] | None = None) -> SweepResult:
    """Run every model through every stage under every combination of ``matrix``.

    Args:
        models: factories: ``"module:function"`` / ``"path/file.py:function"`` strings, zoo
            names (``"resnet"``), or module-level callables, each returning
            ``(model, example_inputs)``; None: the project's zoo (``workbench.zoo.ZOO``).
        matrix: {choice: [values]} over ``exporter``, ``opset``, ``simplify``, ``raise``,
            ``ncnn`` (fp32, fp16, fp16-storage, none), ``precision`` (fp32, int8) and
            ``target`` (see ``workbench.sweeps.matrix.AXES``); choices left out keep
            defaults. Each candidate is compared with the tolerance of its precision
            (``workbench.tolerances.for_precision``); int8 by its SNR. ``target``: where
            the ncnn candidates run, None (this machine) or an ARM target
            (``{"target": [None, "arm64-v8.2"]}``): ncnn's own aarch64 build under QEMU
            user mode, started by the process that runs the cell (locally or on a Dask
            worker, which needs ``make arm-target`` too); there the ``ncnn`` value is also
            the precision ncnn runs (fp16: fp16 storage and arithmetic where the CPU has
            it), and each ncnn row records ``target``, ``flags`` (what ran) and
            ``target_max_abs`` (its output check there).
        workspace: the sweep's folder (``sweep.db`` and ``cells/``); a re-run resumes it.
        client: a ``dask.distributed.Client``: the cells run on its cluster.
        scheduler: a Dask scheduler address (``tcp://host:8786``) to connect to instead.
        shared: a folder every Dask worker can write: artifacts stay there (else each cell's
            folder comes back to the workspace).
        workers: local cells at a time (default: the number of cores); 1 runs them serially.
        retry_failed: run the failed cells again (finished ones are never rerun).
        connect_timeout: seconds to wait for ``scheduler`` to answer.
        cell_timeout: seconds one cell may take before it is stopped and reported.
        memory_limit: bytes (or '4GB') one cell's processes may hold together (the cell,
            its native worker, pnnx); past it the cell is stopped and reported
            ``out-of-memory``. On a Dask cluster each worker's own ``memory_limit`` applies
            too (its cells and itself together), whichever is lower.
        on_cell: called with each CellResult as it is stored.

    Returns:
        SweepResult: every cell (status, per-stage rows), what ran now and what resumed.
        Ctrl-C stops the running cells and raises KeyboardInterrupt; what finished is stored.
    """
    from tqdm.auto import tqdm

    specs = _specs(models)
    names = _names(specs)
    mat = Matrix.of(matrix)
    if client is None and scheduler is None and any(mat.axes.get("target", [None])):
        arm_env()  # the cells would run here: a missing piece is one hinted error, now
    cells = mat.cells(specs, names)
    folder = _folder(workspace)
    try:
        limit = memory.given_limit(memory_limit)
    except ValueError:
        raise InputError(f"memory_limit={memory_limit!r}: expected bytes or a size such as "
                         "'4GB'", "memory_limit='8GB' stops a cell whose processes pass "
                         "8 GB; None sets no limit of the sweep's own") from None
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise InputError(f"workers={workers!r}: expected a positive int",
                         "workers=1 runs one cell at a time; the default is one per core")
    t0 = time.perf_counter()
    with writer_lock(folder), SweepDB(folder) as db:
        db.claim(specs, mat.to_json(), cells)
        todo_ids = set(db.todo(retry_failed))
        todo = [c for c in cells if c.id in todo_ids]
        resumed = len(cells) - len(todo)
        own_client = None
        if client is None and scheduler is not None:
            client = own_client = connect(scheduler, connect_timeout)
        where = "local"
        interrupted = False
        bar = tqdm(total=len(todo), desc="sweep", unit="cell", disable=not progress)
        counts = {"ok": 0, "failed": 0}

        def store(result: CellResult, cell_folder: str) -> None:
            db.save(result, cell_folder)
            counts["ok" if result.status == "ok" else "failed"] += 1
            bar.set_postfix(counts)
            bar.update(1)
            if on_cell is not None:
                on_cell(result)

        try:
            if todo and client is not None:
                where = f"dask {client.scheduler.address}"
                _run_dask(client, todo, folder, shared, cell_timeout, store, limit)
            elif todo:
                n = workers or os.cpu_count() or 1
                where = f"local, {n} at a time"
                _run_local(todo, folder, n, cell_timeout, store, limit)
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            bar.close()
            if own_client is not None:
                own_client.close()
            if interrupted:
                done = counts["ok"] + counts["failed"]
                print(f"sweep interrupted: {done} of {len(todo)} cell(s) stored; run the "
                      "same sweep again to resume", file=sys.stderr)
        return SweepResult(folder, db.cells(), ran=len(todo), resumed=resumed,
                           seconds=time.perf_counter() - t0, where=where)


def connect(address: str, timeout: float = 5.0) -> Any:
    """A ``distributed.Client`` on ``address``, or a hinted InputError within ``timeout``."""
    from distributed import Client

    if not isinstance(address, str) or "://" not in address and ":" not in address:
        raise InputError(f"scheduler {address!r}: expected an address like tcp://host:8786",
                         "start one with `dask scheduler` and pass the address it prints")
    try:
        return Client(address, timeout=timeout)
    except (OSError, TimeoutError) as e:
        raise InputError(f"scheduler {address!r} did not answer within {timeout:g} s "
                         f"({type(e).__name__}: {_first_line(str(e))})",
                         "check the address and that `dask scheduler` runs there (and the "
                         "port is open); omit --scheduler to run on this machine") from e


# -- local -------------------------------------------------------------------------------------
def cell_threads_env(slots: int) -> dict[str, str]:
    """The thread variables for a cell sharing this machine with ``slots - 1`` others."""
    if slots <= 1:
        return {}
    threads = str(max(1, (os.cpu_count() or 1) // slots))
    return {v: threads for v in THREAD_VARS if v not in os.environ}


def _run_local(todo: list[Cell], folder: Path, n: int, timeout: float,
               store: Callable[[CellResult, str], None],
               limit: memory.MemoryLimit | None = None) -> None:
    stop = threading.Event()
    env = cell_threads_env(n)
    procs: set[subprocess.Popen[bytes]] = set()
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="wb-cell") as pool:
        pending: dict[Future[CellResult | None], Cell] = {}
        queue = list(todo)
        try:
            while queue or pending:
                while queue and len(pending) < n:
                    cell = queue.pop(0)
                    cell_dir = folder / "cells" / cell.id
                    pending[pool.submit(run_fresh, cell, cell_dir, timeout, stop, procs,
                                        lock, env, limit)] = cell
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    cell = pending.pop(fut)
                    result = fut.result()
                    if result is not None:
                        store(result, str(folder / "cells" / cell.id))
        except BaseException:  # Ctrl-C: stop the children; finished cells are stored
            stop.set()
            with lock:
                for p in procs:
                    _kill(p)
            for fut in pending:
                fut.cancel()
            raise


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
                _kill(proc)
                return CellResult.crashed(cell.id, f"the cell took over {timeout:g} s and was "
                                          "stopped", "raise cell_timeout (--cell-timeout) for "
                                          "big models, or look at cell.log for where it hung",
                                          seconds=timeout)
            if how == "memory":
                _kill(proc, signal.SIGKILL)  # at once: its memory grows while it waits
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


def _kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a cell's process group: ``sig`` (SIGTERM), then SIGKILL after 3 s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- Dask --------------------------------------------------------------------------------------
def remote_cell(cell: Cell, shared: str | None, timeout: float,
                limit: memory.MemoryLimit | None = None) -> tuple[str, bytes | None, str]:
    """A Dask task: the cell in a fresh process on the worker (its tree held to the worker's
    memory limit and ``limit``). Returns the result as JSON, the cell's folder as a tar (None
    when it was written to ``shared``) and the worker."""
    worker = ""
    with contextlib.suppress(ImportError, ValueError):
        from distributed import get_worker

        worker = get_worker().address
    if shared is not None:
        cell_dir = Path(shared) / "cells" / cell.id
        result = run_fresh(cell, cell_dir, timeout, limit=limit)
        assert result is not None
        result.worker = worker
        return result.to_json(), None, worker
    with tempfile.TemporaryDirectory(prefix="wb-cell-") as tmp:
        cell_dir = Path(tmp) / cell.id
        result = run_fresh(cell, cell_dir, timeout, limit=limit)
        assert result is not None
        result.worker = worker
        buf = io.BytesIO()
        # uncompressed: weights hardly compress (gzip saved ~10% of a zoo cell's 7 MB for
        # 0.7 s of the worker's CPU per cell)
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(cell_dir, arcname=cell.id)
        return result.to_json(), buf.getvalue(), worker


def _run_dask(client: Any, todo: list[Cell], folder: Path, shared: Any, timeout: float,
              store: Callable[[CellResult, str], None],
              limit: memory.MemoryLimit | None = None) -> None:
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    shared_s = str(Path(shared).absolute()) if shared is not None else None
    cells: dict[str, Cell] = {}
    attempts: dict[str, int] = {}

    def submit(cell: Cell) -> Any:
        attempts[cell.id] = attempts.get(cell.id, 0) + 1
        fut = client.submit(remote_cell, cell, shared_s, timeout, limit, pure=False,
                            key=f"wb-cell-{cell.id}-{attempts[cell.id]}-{os.getpid()}")
        cells[fut.key] = cell
        return fut

    futures = [submit(c) for c in todo]
    queue = as_completed(futures)
    try:
        for fut in queue:
            cell = cells[fut.key]
            try:
                text, tar, _ = fut.result()
            except KilledWorker as e:  # the worker died mid-cell: once more, then reported
                # (once more also when its nanny restarted it for memory: the cells queued
                # on that worker die with it, and only a second death is the cell's own)
                if attempts[cell.id] < 2:
                    queue.add(submit(cell))
                    continue
                oom = memory.restarted_for_memory(client, e.last_worker.address)
                if oom is not None:
                    result = CellResult.out_of_memory(
                        cell.id, "model", int(oom.get("rss") or 0),
                        int(getattr(e.last_worker, "memory_limit", 0) or 0),
                        f"the Dask worker {e.last_worker.address}'s memory_limit",
                        restarted=True)
                else:
                    result = CellResult.crashed(
                        cell.id, f"the Dask worker running the cell was lost twice ({e})",
                        "a worker died mid-cell (out of memory? killed?): look at the "
                        "worker's log; --retry-failed runs the cell again")
                result.attempts = attempts[cell.id]
                store(result, "")
                continue
            result = CellResult.from_json(text)
            result.attempts = attempts[cell.id]
            if tar is not None:
                target = folder / "cells" / cell.id
                _unpack(tar, target)
                store(result, str(target))
            else:
                store(result, str(Path(shared_s or "") / "cells" / cell.id))
    except BaseException:
        client.cancel(futures)
        raise


def _unpack(tar: bytes, target: Path) -> None:
    """A cell's folder from the worker into the workspace: unpacked beside, then renamed
    over the old one (a reader sees the old folder or the new, never half)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent)) \
        if target.parent.exists() else None
    if tmp is None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:*") as t:
        t.extractall(tmp, filter="data")  # no absolute paths, no .., no device files
    if target.exists():
        shutil.rmtree(target)
    (tmp / target.name).rename(target)
    shutil.rmtree(tmp)


# -- inputs ------------------------------------------------------------------------------------
def _specs(models: Any) -> list[str]:
    if models is None or models == "zoo":
        return [f"workbench.zoo:{name}" for name in ZOO]
    if isinstance(models, str) or callable(models):
        models = [models]
    if not isinstance(models, Iterable):
        raise InputError(f"models: expected a list of factories, got {type(models).__name__}",
                         "e.g. ['workbench.zoo:resnet', 'mypkg.nets:make_net']")
    specs = [spec_of(m) for m in models]
    if not specs:
        raise InputError("models: the list is empty", "give at least one factory, or None "
                         "for the project's zoo")
    dupes = {s for s in specs if specs.count(s) > 1}
    if dupes:
        raise InputError(f"models: {sorted(dupes)} given more than once",
                         "list each factory once")
    return specs


def _names(specs: list[str]) -> list[str]:
    short = [name_of(s) for s in specs]
    return [n if short.count(n) == 1 else s for n, s in zip(short, specs, strict=True)]


def _folder(workspace: Any) -> Path:
    if workspace is None:
        return DEFAULT_WORKSPACE.absolute()
    path = getattr(workspace, "path", workspace)
    try:
        return Path(path).absolute()
    except TypeError:
        raise InputError(f"workspace={workspace!r}: expected a folder path",
                         "e.g. workspace='runs/zoo-sweep'") from None


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


__all__ = ["SweepResult", "connect", "remote_cell", "run_fresh", "sweep"]
