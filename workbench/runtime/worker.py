"""Crash isolation: native backends run in a persistent worker process.

onnxruntime and ncnn are native code; a bad model or input can segfault or abort them, and
in a notebook that would kill the kernel. Runners created with ``isolated=True`` (the
default) keep a twin of themselves in one shared worker process and send it only checked
feeds. Tensors travel as ``.npy`` files in a memory-backed folder (``/dev/shm`` when there
is one), not as pickles through the pipe. When the worker dies, the call raises
``BackendCrashed`` with the signal and the last lines the worker printed; the next call
starts a fresh worker.

(A plain ``python -c`` subprocess with a socketpair and multiprocessing's Connection is used
rather than multiprocessing.Process or a pool: spawn re-imports the user's ``__main__``,
which breaks scripts without a main guard, and we need one long-lived process, our own crash
reporting and the worker's native stdout/stderr in a log file.)
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import mmap
import os
import shutil
import signal
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError


class BackendCrashed(WorkbenchError):
    """The worker process running a native backend died (segfault, abort, SIGFPE...)."""

    def __init__(self, message: str, hint: str = "", *, backend: str = "",
                 signal_name: str | None = None, log_tail: str = "") -> None:
        super().__init__(message, hint)
        self.backend = backend
        self.signal = signal_name
        self.log_tail = log_tail


class _TwinMissing(Exception):
    """The worker no longer holds a runner's twin (dropped); the handle builds it again."""


class RemoteError(WorkbenchError):
    """An ordinary Python error raised inside the worker, carried back by type name."""


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


_ALIGN = 64  # each array starts on a cache line (and any dtype's alignment)


def pack(path: str, arrays: dict[str, Any]) -> dict[str, Any]:
    """Write arrays back to back into the file ``path`` (grown, never shrunk, so a file
    used again keeps its pages) -> the index ``unpack`` reads them back with."""
    import numpy as np

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        index, end = {}, 0
        for name, value in arrays.items():
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                raise TypeError(f"{name!r} holds Python objects ({arr.dtype}), not numbers")
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            index[name] = (end, arr.dtype.str, arr.shape)
            done = 0
            while done < raw.nbytes:
                done += os.pwrite(fd, raw[done:], end + done)
            end += -(-raw.nbytes // _ALIGN) * _ALIGN
        if os.fstat(fd).st_size < end:
            os.ftruncate(fd, end)
    finally:
        os.close(fd)
    return {"arrays": index, "size": end}


def unpack(path: str, index: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The arrays ``pack`` wrote, as views of the file mapped in memory (no copy, and the
    pages of the file, no new ones); private (copy-on-write), so writes stay here.
    -> (arrays, the mapping they view: gone when they all are)."""
    import mmap

    import numpy as np

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        view = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) if size else b""
    out = {}
    for name, (offset, dtype, shape) in index["arrays"].items():
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = (np.frombuffer(view, dtype=dt, count=count, offset=offset).reshape(shape)
                     if count else np.empty(shape, dt))
    return out, view


# -- the worker process -------------------------------------------------------------------------
def _serve(fd: int) -> None:  # pragma: no cover - runs in the child
    """Worker main loop: build runners, run them, answer on the socket ``fd``."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    from .base import keep_freed_memory

    keep_freed_memory()  # results are fresh arrays each run: reuse their memory
    runners: dict[int, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        op = msg["op"]
        try:
            if op == "create":
                module, cls = msg["cls"].split(":")
                klass = getattr(importlib.import_module(module), cls)
                runner = klass(*msg["args"], **msg["kwargs"], isolated=False)
                runners[msg["key"]] = runner
                conn.send({"ok": True, "describe": runner.describe()})
            elif op == "run":
                runner = runners.get(msg["key"])
                if runner is None:  # dropped here, still alive in the parent
                    conn.send({"ok": False, "type": "TwinMissing", "message": "", "hint": ""})
                    continue
                feed, _ = unpack(msg["inputs"], msg["index"])
                out = runner._execute(feed, msg["capture"])
                del feed
                conn.send({"ok": True, "outputs": pack(msg["outputs"], out)})
            elif op == "drop":
                runners.pop(msg["key"], None)
                conn.send({"ok": True})
            elif op == "ping":
                conn.send({"ok": True, "pid": os.getpid(), "runners": len(runners)})
        except Exception as e:  # carried back; the worker lives on
            conn.send({"ok": False, "type": type(e).__name__, "message": str(getattr(
                e, "message", e)), "hint": getattr(e, "hint", "")})


# -- the parent side ----------------------------------------------------------------------------
class Worker:
    """One persistent worker process, restarted after a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self.generation = 0
        self.dir = Path(tempfile.mkdtemp(prefix="wb-worker-", dir=_shm_dir()))
        self.log = self.dir / "worker.log"
        # twins of runners garbage-collected here, dropped in the worker at the next call
        # (not from the finalizer itself: it may run while a call holds the lock)
        self.pending_drops: list[int] = []

    def _start(self) -> None:
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        with open(self.log, "wb") as log:  # native prints land here, not in the kernel
            self._proc = subprocess.Popen(
                [sys.executable, "-c",
                 f"from workbench.runtime.worker import _serve; _serve({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=env)
        theirs.close()
        self._conn = Connection(ours.detach())
        self.generation += 1

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def call(self, msg: dict[str, Any], backend: str) -> dict[str, Any]:
        with self._lock:
            if not self.alive:
                if self._proc is not None:  # died between calls: a fresh one
                    self._conn.close()
                self._start()
                self.pending_drops.clear()  # a fresh worker holds none of them
            try:
                while self.pending_drops:
                    self._conn.send({"op": "drop", "key": self.pending_drops.pop()})
                    self._conn.recv()
                self._conn.send(msg)
                reply = self._conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                raise self._crashed(backend) from None
        if not reply["ok"]:
            if reply["type"] == "TwinMissing":
                raise _TwinMissing()
            from .. import errors

            klass = getattr(errors, reply["type"], None)
            if isinstance(klass, type) and issubclass(klass, WorkbenchError):
                raise klass(reply["message"], reply["hint"])
            raise RemoteError(f"{backend} raised {reply['type']}: {reply['message']}",
                              reply["hint"] or "the model or the inputs are not what the "
                              "backend expects")
        return reply

    def _crashed(self, backend: str) -> BackendCrashed:
        try:
            code = self._proc.wait(timeout=5)
        except Exception:
            self._proc.kill()
            code = self._proc.wait()
        self._proc = None
        self._conn.close()
        sig = None
        if code is not None and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        how = f"was killed by {sig}" if sig else f"exited with status {code}"
        return BackendCrashed(
            f"{backend} crashed: its worker process {how}; this process is unharmed"
            + (f"\nworker log (last lines):\n{tail}" if tail.strip() else ""),
            "the model or an input made the native backend crash; check input shapes and "
            "dtypes against the model, or load the model in a fresh runner; the next run "
            "starts a new worker",
            backend=backend, signal_name=sig, log_tail=tail)

    def close(self) -> None:
        if self.alive:
            self._proc.terminate()
            self._proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


_WORKER: Worker | None = None
_KEYS = itertools.count(1)


def worker() -> Worker:
    """The process-wide worker (created on first use, closed at exit)."""
    global _WORKER
    if _WORKER is None:
        _WORKER = Worker()
        atexit.register(_WORKER.close)
    return _WORKER


def _forget(key: int) -> None:
    if _WORKER is not None:
        _WORKER.pending_drops.append(key)


class RemoteHandle:
    """A runner's twin in the worker: created lazily, re-created after a crash."""

    def __init__(self, cls: str, args: tuple, kwargs: dict[str, Any], backend: str) -> None:
        self.cls, self.args, self.kwargs, self.backend = cls, args, kwargs, backend
        self.key = next(_KEYS)
        self._generation = -1
        self._describe: dict[str, Any] | None = None
        self._arenas = Arenas(self.key)
        # when the runner that owns this handle goes, its twin in the worker goes too
        weakref.finalize(self, _forget, self.key)

    def describe(self) -> dict[str, Any]:
        self._ensure()
        return self._describe

    def _ensure(self) -> None:
        w = worker()
        if self._generation != w.generation or not w.alive:
            reply = w.call({"op": "create", "key": self.key, "cls": self.cls,
                            "args": self.args, "kwargs": self.kwargs}, self.backend)
            self._describe = reply["describe"]
            self._generation = w.generation

    def execute(self, feed: dict[str, Any], capture: Any) -> dict[str, Any]:
        """Run the twin: feeds and results travel through files in /dev/shm that this
        handle keeps and writes over (see Arenas), not as pickles through the pipe."""
        self._ensure()
        w = worker()
        with self._arenas.lock:
            inputs = self._arenas.inputs(w)
            out_path = self._arenas.free_output(w)
            msg = {"op": "run", "key": self.key, "inputs": inputs,
                   "index": pack(inputs, feed), "capture": capture, "outputs": out_path}
            try:
                reply = w.call(msg, self.backend)
            except _TwinMissing:
                self._generation = -1
                self._ensure()
                reply = w.call(msg, self.backend)
            out, view = unpack(out_path, reply["outputs"])
            self._arenas.mapped(out_path, view)
            return out


class Arenas:
    """The /dev/shm files one handle's runs travel through, kept from run to run.

    Results are returned as views of their file mapped in memory, so the next run may
    write into that file only once the caller has let go of every array of it (then the
    mapping is gone too: it is held weakly here). Writing over pages that exist costs a
    copy and nothing more; a fresh file per run cost a zeroed page for each 4 kB (on a
    ResNet-50, ~190 MB per capture="all"). A file still in use when a run needs one is
    left to its arrays (unlinked: its pages go with them) and a new one is made; one file
    stays kept per handle, so what stays allocated between runs is one run's results."""

    KEEP = 1  # output files kept per handle

    def __init__(self, key: int) -> None:
        self.key = key
        self.lock = threading.Lock()
        self.count = itertools.count()
        self.files: list[list[Any]] = []  # [path, weak ref to its mapping or None]
        self.input_files: list[str] = []
        weakref.finalize(self, Arenas._remove, self.files, self.input_files)

    def inputs(self, w: Worker) -> str:
        path = str(w.dir / f"h{self.key}-in")
        if path not in self.input_files:
            self.input_files.append(path)
        return path

    def free_output(self, w: Worker) -> str:
        """A kept output file none of whose arrays is alive, or a new one."""
        for entry in reversed(self.files):
            path, ref = entry
            if path.startswith(str(w.dir)) and (ref is None or ref() is None):
                return path
        path = str(w.dir / f"h{self.key}-out{next(self.count)}")
        self.files.append([path, None])
        while len(self.files) > self.KEEP:  # its arrays keep the pages they map
            _unlink(self.files.pop(0)[0])
        return path

    def mapped(self, path: str, view: Any) -> None:
        for entry in self.files:
            if entry[0] == path:
                entry[1] = weakref.ref(view) if isinstance(view, mmap.mmap) else None

    @staticmethod
    def _remove(files: list[list[Any]], inputs: list[str]) -> None:
        for path in [f[0] for f in files] + inputs:
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
