"""Scheduling a sweep: every cell in a fresh process, on a local pool or a Dask cluster; each
finished cell stored at once, so an interrupted sweep resumes where it stopped.

A cell is a child process of its own (``python -m workbench.sweeps.cell``) started by
``subprocess``, not a ``ProcessPoolExecutor`` worker: a native crash in one pool worker
breaks the whole pool and every cell in flight with it, and Dask's worker processes are
daemonic, where ``multiprocessing`` may not start children. A thread per slot waits on its
child, locally and inside a Dask task alike (``fresh.py``; the Dask side in ``dask_cells.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
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
from .cell import CellResult
from .dask_cells import connect, remote_cell, run_dask
from .db import CellRecord, SweepDB, writer_lock
from .factory import name_of, spec_of
from .fresh import CELL_TIMEOUT, cell_threads_env, kill_cell, run_fresh
from .matrix import Cell, Matrix

DEFAULT_WORKSPACE = Path("workbench-runs") / "sweep"
DEFAULT_WORKSPACE = Path("workbench-runs") / "sweep"
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
                run_dask(client, todo, folder, shared, cell_timeout, store, limit)
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


# -- local -------------------------------------------------------------------------------------
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
                    kill_cell(p)
            for fut in pending:
                fut.cancel()
            raise


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
