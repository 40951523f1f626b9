"""The sweep's cells on a Dask cluster: each a task that runs the cell in a fresh process on
its worker (``fresh.run_fresh``, held to the worker's memory limit) and brings the cell's
folder back as a tar, unless every worker writes to a ``shared`` folder; a worker lost
mid-cell is tried once more, and a worker its nanny restarted for memory is said so.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputError
from . import memory
from .cell import CellResult
from .fresh import run_fresh
from .matrix import Cell


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


def remote_cell(cell: Cell, shared: str | None, timeout: float,
                limit: memory.MemoryLimit | None = None) -> tuple[str, bytes | str | None, str]:
    """A Dask task: the cell in a fresh process on the worker (its tree held to the worker's
    memory limit and ``limit``). Returns the result as JSON, the cell's folder as a tar (None
    when it was written to ``shared``; the path it stayed at on the worker when it is larger
    than the worker's memory could hold to send it back) and the worker."""
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
    tmp = Path(tempfile.mkdtemp(prefix="wb-cell-"))
    try:
        cell_dir = tmp / cell.id
        result = run_fresh(cell, cell_dir, timeout, limit=limit)
        assert result is not None
        result.worker = worker
        if (kept := _keep_if_too_large(cell_dir)) is not None:
            return result.to_json(), str(kept), worker
        buf = io.BytesIO()
        # uncompressed: weights hardly compress (gzip saved ~10% of a zoo cell's 7 MB for
        # 0.7 s of the worker's CPU per cell)
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(cell_dir, arcname=cell.id)
        return result.to_json(), buf.getvalue(), worker
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _keep_if_too_large(cell_dir: Path) -> Path | None:
    """A cell folder larger than the room left under the worker's memory limit cannot come
    back as a tar (which the worker holds in memory): it is moved to ``wb-cells-kept/`` in
    the worker's temp folder and its path returned, rather than the nanny restarting the
    worker for it. None: it fits (or the worker has no limit)."""
    room = memory.dask_worker_limit()
    if room is None or not cell_dir.is_dir():
        return None
    size = sum(p.stat().st_size for p in cell_dir.rglob("*") if p.is_file())
    if size <= room.bytes - memory.own_rss():
        return None
    kept = Path(tempfile.gettempdir()) / "wb-cells-kept" / cell_dir.name
    kept.parent.mkdir(parents=True, exist_ok=True)
    if kept.exists():
        shutil.rmtree(kept)
    shutil.move(str(cell_dir), str(kept))
    return kept


def run_dask(client: Any, todo: list[Cell], folder: Path, shared: Any, timeout: float,
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
            if isinstance(tar, str):  # too large to come back: it stayed on the worker
                warnings.warn(f"cell {cell.id}: its folder stayed on the worker {result.worker} "
                              f"at {tar}: larger than the worker's memory could send back; "
                              "pass shared= (a folder every worker can write) for big models",
                              stacklevel=2)
                store(result, tar)
            elif tar is not None:
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


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


__all__ = ["connect", "remote_cell", "run_dask"]
