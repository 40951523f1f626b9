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


def load_npy(path: str) -> Any:
    """An .npy file as an array mapped from the file, not read into fresh memory.

    The files live in /dev/shm: a private (copy-on-write) mapping shares their pages, so
    the array costs neither a copy nor newly zeroed pages, and stays writable. The file may
    be unlinked at once; the pages go when the array does. (np.load(mmap_mode="c") does the
    same but returns np.memmap, a subclass that follows the array into every result.)"""
    import mmap

    import numpy as np

    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
        count = int(np.prod(shape, dtype=np.int64))
        if dtype.hasobject or count == 0 or f.seek(0, 2) < offset + count * dtype.itemsize:
            f.seek(0)
            return np.load(f)  # nothing to map (or not a plain file): read it
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    arr = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


# -- the worker process -------------------------------------------------------------------------
def _serve(fd: int) -> None:  # pragma: no cover - runs in the child
    """Worker main loop: build runners, run them, answer on the socket ``fd``."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    import numpy as np

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
                feed = {name: load_npy(path) for name, path in msg["inputs"].items()}
                out = runner._execute(feed, msg["capture"])
                files = {}
                for i, (name, arr) in enumerate(out.items()):
                    path = f"{msg['prefix']}-out{i}.npy"
                    np.save(path, np.ascontiguousarray(arr))
                    files[name] = path
                conn.send({"ok": True, "outputs": files})
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
        self._calls = itertools.count()
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

    def next_prefix(self) -> str:
        return str(self.dir / f"call{next(self._calls)}")

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

    def execute(self, feed: dict[str, Any], capture: str) -> dict[str, Any]:
        import numpy as np

        self._ensure()
        w = worker()
        prefix = w.next_prefix()
        paths = {}
        for i, (name, arr) in enumerate(feed.items()):
            paths[name] = f"{prefix}-in{i}.npy"
            np.save(paths[name], arr)
        try:
            msg = {"op": "run", "key": self.key, "inputs": paths, "capture": capture,
                   "prefix": prefix}
            try:
                reply = w.call(msg, self.backend)
            except _TwinMissing:
                self._generation = -1
                self._ensure()
                reply = w.call(msg, self.backend)
            out = {}
            for name, path in reply["outputs"].items():
                out[name] = load_npy(path)
                os.unlink(path)
            return out
        finally:
            for p in paths.values():
                if os.path.exists(p):
                    os.unlink(p)
