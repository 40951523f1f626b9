"""A cell's memory held to a limit: its whole process tree (the cell, the workbench's native
worker, pnnx), not only the process a Dask nanny watches.

A Dask nanny restarts its worker when the worker process's own RSS passes
``memory_limit`` x ``distributed.worker.memory.terminate`` (0.95); a cell runs in a child
process of the worker, and its children (the native worker running ONNX Runtime and ncnn,
pnnx) are further down: the nanny sees none of them, and a 0.5B model's cell could take
the machine's memory while the worker looked small. So the process that waits on a cell
measures the tree itself (PSS: a page shared by two processes counts once, as the tensor
files mapped by the cell and its worker are) every ``INTERVAL`` seconds and stops the whole
process group when the tree, with the waiting process's own use, passes the limit: the cell
is reported as out of memory (``CellResult.out_of_memory``) and the worker lives on.
A worker the nanny restarted anyway (its own memory) is said the same way, from the
nanny's ``worker-restart-memory`` event (``restarted_for_memory``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

INTERVAL = 0.25  # seconds between two measurements of a cell's tree
TERMINATE = 0.95  # Dask's default distributed.worker.memory.terminate


@dataclass(frozen=True)
class MemoryLimit:
    """The bytes a cell's tree and the process waiting on it may hold together, and where
    the figure comes from (as messages say it)."""

    bytes: int
    source: str


def dask_worker_limit() -> MemoryLimit | None:
    """The limit of the Dask worker this runs in: its ``memory_limit`` times the fraction at
    which its nanny restarts it; None outside a worker, or for one without a limit."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return None
    limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    if not limit:
        return None
    import dask

    fraction = dask.config.get("distributed.worker.memory.terminate", TERMINATE) or 1.0
    return MemoryLimit(int(limit * fraction), f"the Dask worker {worker.address}'s "
                       f"memory_limit ({_show(limit)}) x {fraction:g}, where its nanny "
                       "restarts it")


def given_limit(value: Any) -> MemoryLimit | None:
    """``sweep(memory_limit=...)``: bytes, or a string such as '4GB' / '500 MiB'; None: none.

    Raises:
        ValueError: not a size (the caller turns it into a hinted InputError).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, str):
        from dask.utils import parse_bytes

        value = parse_bytes(value)
    if not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(value)
    return MemoryLimit(int(value), f"memory_limit={_show(int(value))}")


def tightest(*limits: MemoryLimit | None) -> MemoryLimit | None:
    found = [m for m in limits if m is not None]
    return min(found, key=lambda m: m.bytes) if found else None


def tree_bytes(pid: int) -> int:
    """Memory of process ``pid`` and all its descendants: the sum of their PSS (RSS where
    PSS cannot be read); 0 when it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            try:
                total += p.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                total += p.memory_info().rss
    return total


def own_rss() -> int:
    """This process's resident memory (what a nanny counts of it)."""
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


class TreeWatch:
    """Measures a cell's process tree against ``limit``, counting this (the waiting)
    process's own resident memory too; ``over()`` says when it passed, ``peak`` the most
    seen."""

    def __init__(self, pid: int, limit: MemoryLimit, count_self: bool = True) -> None:
        self.pid, self.limit, self.count_self = pid, limit, count_self
        self.peak = 0
        self.used = 0

    def over(self) -> bool:
        tree = tree_bytes(self.pid)
        self.peak = max(self.peak, tree)
        self.used = tree + (own_rss() if self.count_self else 0)
        return self.used > self.limit.bytes


def wait(proc: Any, timeout: float, watch: TreeWatch | None) -> str:
    """Wait for the cell's process: "done" when it exits, "timeout" after ``timeout``
    seconds, "memory" when ``watch`` finds its tree over the limit (the caller stops it)."""
    import subprocess
    import time

    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return "timeout"
        try:
            proc.wait(timeout=min(left, INTERVAL) if watch is not None else left)
            return "done"
        except subprocess.TimeoutExpired:
            if watch is not None and watch.over():
                return "memory"


def restarted_for_memory(client: Any, address: str) -> dict[str, Any] | None:
    """The nanny's last ``worker-restart-memory`` event for the worker at ``address`` (it
    passed its memory limit and was restarted), or None."""
    try:
        events = client.get_events("worker-restart-memory")
    except Exception:  # noqa: BLE001 - an old scheduler, a lost connection: not known
        return None
    for _, event in reversed(list(events or ())):
        if isinstance(event, dict) and event.get("worker") == address:
            return event
    return None


def _show(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


__all__ = ["MemoryLimit", "TreeWatch", "dask_worker_limit", "given_limit", "restarted_for_memory",
           "tightest", "tree_bytes", "wait"]
