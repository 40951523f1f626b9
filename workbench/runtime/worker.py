"""Crash isolation: native backends run in a persistent worker process.

onnxruntime and ncnn are native code; a bad model or input can segfault or abort them, and
in a notebook that would kill the kernel. Runners created with ``isolated=True`` (the
default) keep a twin of themselves in one shared worker process and send it only checked
feeds. Tensors travel through files in a memory-backed folder (``/dev/shm`` when there is
one), not as pickles through the pipe: arrays back to back, written with pwrite (or by
ONNX Runtime itself, through an IO binding) and read as views of one mapping made with its
pages at once, so a ResNet-50's every activation crosses with about one copy. When the
worker dies, the call raises
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
import time
import weakref
from pathlib import Path
from typing import Any

from ..customops import install
from ..errors import BackendCrashed, BackendTimeout, InputError, RemoteError, WorkbenchError
from .base import ModelIO
from .transfer import Packer, SharedFile, _shm_dir, pack, unpack

__all__ = ["BackendCrashed", "BackendTimeout", "RemoteError", "Packer", "SharedFile", "pack",
           "unpack", "Worker", "RemoteHandle", "worker"]


class _TwinMissing(Exception):
    """The worker no longer holds a runner's twin (dropped); the handle builds it again."""


# -- the worker process -------------------------------------------------------------------------
_KEPT: dict[str, SharedFile] = {}  # the worker's kept output files, by path
# runs of two runners come on two threads (compare's ORT and ncnn captures at once): without
# the lock one thread's scan of _KEPT met the other's insert ('dictionary changed size during
# iteration', a failed capture and a lost comparison, seen in a clean checkout's test run)
_KEPT_LOCK = threading.Lock()


def _output_file(path: str, keep: bool) -> SharedFile:
    """The worker's SharedFile for a run's results: kept mapped between runs when the
    parent keeps it too; files the parent has removed are let go."""
    with _KEPT_LOCK:
        for gone in [p for p in _KEPT if p != path and not os.path.exists(p)]:
            del _KEPT[gone]
        if not keep:
            _KEPT.pop(path, None)
            return SharedFile(path)
        if path not in _KEPT:
            _KEPT[path] = SharedFile(path, keep=True)
        return _KEPT[path]


SERVING = False  # True in the worker process itself


def _serve(fd: int) -> None:  # pragma: no cover - runs in the child
    global SERVING
    SERVING = True
    """Worker main loop: build runners, run them, answer on the socket ``fd``.

    A thread receives; each runner's runs go to a thread of its own (ncnn's to the main
    thread), so that two runners (ONNX Runtime and ncnn: both release the GIL) can run at
    once, as compare() schedules them; every reply carries the id of its request.
    Creating, dropping and pings are answered in order, on the main thread."""
    from concurrent.futures import ThreadPoolExecutor
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    from .base import keep_freed_memory, one_heap

    keep_freed_memory()  # results are fresh arrays each run: reuse their memory
    one_heap()  # runs come on several threads: let them reuse each other's freed memory
    runners: dict[int, Any] = {}
    send_lock = threading.Lock()
    # a thread per runner, always the same (a thread team per calling thread is what
    # OpenMP keeps); a runner marked main_thread runs on the main thread: ncnn ran a
    # ResNet-50 20-50% slower from any other thread of this process (measured, not
    # explained)
    threads: dict[int, ThreadPoolExecutor] = {}

    def reply(msg: dict[str, Any], payload: dict[str, Any]) -> None:
        with send_lock:
            conn.send({"id": msg.get("id"), **payload})

    def handle(msg: dict[str, Any]) -> None:
        op = msg["op"]
        try:
            if op == "create":
                if msg.get("custom_ops"):  # the @wb.custom_op kernels/layers the twin runs

                    install(msg["custom_ops"])
                module, cls = msg["cls"].split(":")
                klass = getattr(importlib.import_module(module), cls)
                runner = klass(*msg["args"], **msg["kwargs"], isolated=False)
                runners[msg["key"]] = runner
                reply(msg, {"ok": True, "describe": runner.describe()})
            elif op == "run":
                runner = runners.get(msg["key"])
                if runner is None:  # dropped here, still alive in the parent
                    reply(msg, {"ok": False, "type": "TwinMissing", "message": "", "hint": ""})
                    return
                feed = unpack(msg["inputs"], msg["index"])
                packer = Packer(_output_file(msg["outputs"], msg.get("keep", False)),
                                msg.get("size_hint", 0))
                out = runner._execute(feed, msg["capture"], arena=packer)
                del feed
                index = packer.index(out)
                del out, packer
                reply(msg, {"ok": True, "outputs": index})
            elif op == "drop":
                runners.pop(msg["key"], None)
                gone = threads.pop(msg["key"], None)
                if gone is not None:
                    gone.shutdown(wait=False)
                reply(msg, {"ok": True})
            elif op == "ping":
                reply(msg, {"ok": True, "pid": os.getpid(), "runners": len(runners)})
        except Exception as e:  # carried back; the worker lives on
            reply(msg, {"ok": False, "type": type(e).__name__, "message": str(getattr(
                e, "message", e)), "hint": getattr(e, "hint", "")})

    import queue

    main_lane: queue.Queue = queue.Queue()

    def receive() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                main_lane.put(None)
                return
            runner = runners.get(msg.get("key"))
            if msg["op"] != "run" or getattr(runner, "main_thread", False):
                main_lane.put(msg)  # in order, on this process's main thread
                continue
            if msg["key"] not in threads:
                threads[msg["key"]] = ThreadPoolExecutor(1, thread_name_prefix="wb-run")
            threads[msg["key"]].submit(handle, msg)

    threading.Thread(target=receive, daemon=True, name="wb-worker-receive").start()
    while (msg := main_lane.get()) is not None:
        handle(msg)


# -- the parent side ----------------------------------------------------------------------------
class Worker:
    """One persistent worker process, restarted after a crash. Calls may come from several
    threads at once: each waits for the reply with its own id, which a reader thread hands
    out; when the process dies, every call waiting on it raises BackendCrashed."""

    # a call whose worker is stopped (SIGSTOP, a debugger) for this long, or uses no CPU for
    # STALL_SECONDS while the call waits, is abandoned: the worker is replaced
    STOPPED_SECONDS = 3.0
    STALL_SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()  # starting the process, sending, settling a death
        self._abandoned: dict[int, str] = {}  # generation -> why the workbench killed it
        self._proc = None
        self._conn = None
        self._tainted = -1  # a generation whose memory a run may have corrupted (taint)
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[Any, str, int]] = {}  # id -> (future, backend, gen)
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

        self.ensure_dir()
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
        threading.Thread(target=self._read, args=(self._conn, self._proc, self.generation),
                         daemon=True, name=f"wb-worker-reader-{self.generation}").start()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def ensure_dir(self) -> None:
        """The folder runs travel through, made again if something removed it (a tmp
        cleaner, another job wiping /dev/shm): mappings already made live on regardless."""
        if not self.dir.is_dir():
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def call(self, msg: dict[str, Any], backend: str,
             timeout: float | None = None) -> dict[str, Any]:
        """Send ``msg`` and wait for its reply: BackendCrashed if the worker dies,
        BackendTimeout if it stalls or ``timeout`` seconds pass (the worker is replaced)."""
        from concurrent.futures import Future

        future: Future = Future()
        with self._lock:
            if self._tainted == self.generation and self.alive and not any(
                    e[2] == self.generation for e in self._waiting.values()):
                self._proc.kill()  # replaced below, now that no call waits on it
                self._proc.wait()
            if not self.alive:
                if self._proc is not None:  # died between calls: a fresh one
                    self._conn.close()
                self._start()
                self.pending_drops.clear()  # a fresh worker holds none of them
            mid = next(self._ids)
            self._waiting[mid] = (future, backend, self.generation)
            try:
                while self.pending_drops:  # answered, and the answer dropped (no waiter)
                    self._conn.send({"op": "drop", "key": self.pending_drops.pop()})
                self._conn.send({**msg, "id": mid})
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # the process is gone: the reader settles this call with the crash
            proc, generation = self._proc, self.generation
        reply = self._wait(future, proc, generation, backend, timeout)
        if not reply["ok"]:
            if reply["type"] == "TwinMissing":
                raise _TwinMissing()
            from .. import errors

            klass = getattr(errors, reply["type"], None)
            if isinstance(klass, type) and issubclass(klass, WorkbenchError):
                raise klass(reply["message"], reply["hint"])
            raise RemoteError(f"{backend} raised {reply['type']}: {reply['message']}",
                              reply["hint"] or "the model or the inputs are not what the "
                              "backend expects", kind=reply["type"])
        return reply

    def taint(self) -> None:
        """The process ran something that may have corrupted its memory without killing it
        (ncnn's SDPA over a byte mask, runtime/ncnn_masks.py): it is replaced at the next
        call that finds no other call waiting on it, so that no later model runs in a
        damaged heap (seen: an unrelated model then crashed in it, "pool allocator
        destroyed too early")."""
        with self._lock:
            if self.alive:
                self._tainted = self.generation

    def _wait(self, future: Any, proc: Any, generation: int, backend: str,
              timeout: float | None) -> dict[str, Any]:
        """The reply, watching the worker meanwhile (the heartbeat): its state and CPU time
        are read from /proc each second. Stopped, or no CPU used for STALL_SECONDS, or past
        ``timeout``: the worker is killed (every call waiting on it fails) and the next
        call starts a fresh one."""
        from concurrent.futures import TimeoutError as FutureTimeout

        start = time.monotonic()
        cpu, progress, stopped_since = None, start, None
        while True:
            try:
                return future.result(timeout=1.0)
            except FutureTimeout:
                pass
            now = time.monotonic()
            state, used = _proc_stat(proc.pid)
            if used != cpu:
                cpu, progress = used, now
            stopped_since = (stopped_since or now) if state in ("T", "t") else None
            why = None
            if stopped_since is not None and now - stopped_since >= self.STOPPED_SECONDS:
                why = f"is stopped (state {state}: SIGSTOP or a debugger)"
            elif now - progress >= self.STALL_SECONDS:
                why = f"used no CPU for {now - progress:.0f} s while a call waited"
            elif timeout is not None and now - start >= timeout:
                why = f"did not answer within timeout={timeout:g} s"
            if why is not None:
                self._abandon(proc, generation, why)
                return future.result()  # the reader settles it with BackendTimeout

    def _abandon(self, proc: Any, generation: int, why: str) -> None:
        with self._lock:
            self._abandoned[generation] = why
        try:
            proc.kill()  # SIGKILL reaches a stopped process too
        except OSError:
            pass

    def _read(self, conn: Any, proc: Any, generation: int) -> None:
        """Hand each reply to the call waiting for it; when the process dies, fail every
        call still waiting on it."""
        try:
            while True:
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    break
                entry = self._waiting.pop(reply.get("id"), None)
                if entry is not None:
                    entry[0].set_result(reply)
        finally:
            with self._lock:
                orphans = [(mid, e) for mid, e in self._waiting.items() if e[2] == generation]
                for mid, _ in orphans:
                    del self._waiting[mid]
                if self._proc is proc:
                    self._proc = None
                    conn.close()
            if orphans:
                code, sig, tail = self._death(proc)
                why = self._abandoned.pop(generation, None)
                for _, (future, backend, _) in orphans:
                    future.set_exception(self._crashed(backend, code, sig, tail) if why is None
                                         else self._timed_out(backend, why, proc.pid))

    def _death(self, proc: Any) -> tuple[int | None, str | None, str]:
        """The dead process's exit code, signal name and last log lines."""
        try:
            code = proc.wait(timeout=5)
        except Exception:
            proc.kill()
            code = proc.wait()
        sig = None
        if code is not None and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
        try:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            tail = ""
        return code, sig, tail

    @staticmethod
    def _crashed(backend: str, code: int | None, sig: str | None,
                 tail: str) -> BackendCrashed:
        how = f"was killed by {sig}" if sig else f"exited with status {code}"
        return BackendCrashed(
            f"{backend} crashed: its worker process {how}; this process is unharmed"
            + (f"\nworker log (last lines):\n{tail}" if tail.strip() else ""),
            "the model or an input made the native backend crash; check input shapes and "
            "dtypes against the model, or load the model in a fresh runner; the next run "
            "starts a new worker",
            backend=backend, signal_name=sig, log_tail=tail)

    @staticmethod
    def _timed_out(backend: str, why: str, pid: int) -> BackendTimeout:
        return BackendTimeout(
            f"{backend}: its worker process (pid {pid}) {why}; it was stopped and this "
            "call abandoned (this process is unharmed)",
            "the next run starts a fresh worker. A large model may need longer: pass "
            "timeout= (seconds) to the runner or to wb.compare, or set runner.timeout")

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

    def __init__(self, cls: str, args: tuple, kwargs: dict[str, Any], backend: str,
                 timeout: float | None = None, custom_ops: bytes | None = None) -> None:
        self.cls, self.args, self.kwargs, self.backend = cls, args, kwargs, backend
        self.custom_ops = custom_ops or None  # pickled custom ops, installed before the twin
        # per call, in seconds; by default generous and scaled with the model's files
        self.timeout = default_timeout(args[0] if args else None) if timeout is None \
            else check_timeout(timeout)
        self.key = next(_KEYS)
        self._generation = -1
        self._describe: ModelIO | None = None
        self._arenas = Arenas(self.key)
        # results' files stay mapped here and in the worker between runs (SharedFile.keep)
        self.keep_mapped = False
        # when the runner that owns this handle goes, its twin in the worker goes too
        weakref.finalize(self, _forget, self.key)

    @property
    def pid(self) -> int | None:
        """The worker process holding this handle's twin (None before its first use)."""
        w = _WORKER
        if w is None or self._generation != w.generation or not w.alive:
            return None
        return w.pid

    def describe(self) -> ModelIO:
        self._ensure()
        return self._describe

    def _ensure(self) -> None:
        w = worker()
        if self._generation != w.generation or not w.alive:
            reply = w.call({"op": "create", "key": self.key, "cls": self.cls,
                            "args": self.args, "kwargs": self.kwargs,
                            "custom_ops": self.custom_ops}, self.backend,
                           self.timeout)
            self._describe = reply["describe"]
            self._generation = w.generation

    def execute(self, feed: dict[str, Any], capture: Any) -> dict[str, Any]:
        """Run the twin: feeds and results travel through files in /dev/shm that this
        handle keeps mapped and writes over (see Arenas), not as pickles through the pipe."""
        self._ensure()
        w = worker()
        for attempt in (1, 2):  # twice: once more if the folder vanished mid-run
            w.ensure_dir()
            try:
                return self._execute(w, feed, capture)
            except (FileNotFoundError, RemoteError) as e:
                gone = isinstance(e, FileNotFoundError) or e.kind == "FileNotFoundError"
                if attempt == 2 or not gone or w.dir.is_dir():
                    raise
        raise AssertionError("unreachable")

    def _execute(self, w: Worker, feed: dict[str, Any], capture: Any) -> dict[str, Any]:
        with self._arenas.lock:
            inputs = self._arenas.inputs(w)
            out = self._arenas.free_output(w)
            kind = capture if isinstance(capture, str) else "blobs"  # a BlobCapture
            out.keep = self.keep_mapped
            msg = {"op": "run", "key": self.key, "inputs": inputs.path,
                   "index": pack(inputs, feed), "capture": capture, "outputs": out.path,
                   "size_hint": self._arenas.sizes.get(kind, 0), "keep": out.keep}
            try:
                reply = w.call(msg, self.backend, self.timeout)
            except _TwinMissing:
                self._generation = -1
                self._ensure()
                reply = w.call(msg, self.backend, self.timeout)
            self._arenas.sizes[kind] = reply["outputs"]["size"]
            return unpack(out, reply["outputs"])


class Arenas:
    """The /dev/shm files one handle's runs travel through, kept from run to run (and kept
    mapped, here and in the worker, when the handle's ``keep_mapped`` says so).

    Results are returned as views of their file, so the next run may write into that file
    only once the caller has let go of every array of it (SharedFile.in_use). Writing over
    pages that exist and are mapped costs a copy and nothing more; a fresh file per run
    cost a zeroed page for each 4 kB (on a ResNet-50, ~190 MB per capture="all"), and a
    fresh mapping a fault per page. A file still in use when a run needs one is left to its
    arrays (unlinked: its pages go with them) and a new one is made; one file stays kept
    per handle, so what stays allocated between runs is one run's results."""

    KEEP = 1  # output files kept per handle

    def __init__(self, key: int) -> None:
        self.key = key
        self.lock = threading.Lock()
        self.count = itertools.count()
        self.files: list[SharedFile] = []
        self.input_files: list[SharedFile] = []
        self.sizes: dict[str, int] = {}  # the last result size per capture kind: a hint
        weakref.finalize(self, Arenas._remove, self.files, self.input_files)

    def inputs(self, w: Worker) -> SharedFile:
        path = str(w.dir / f"h{self.key}-in")
        for f in self.input_files:
            if f.path == path:
                return f
        self.input_files.append(SharedFile(path))
        return self.input_files[-1]

    def free_output(self, w: Worker) -> SharedFile:
        """A kept output file none of whose arrays is alive, or a new one."""
        for f in reversed(self.files):
            if f.path.startswith(str(w.dir)) and not f.in_use():
                return f
        self.files.append(SharedFile(str(w.dir / f"h{self.key}-out{next(self.count)}")))
        while len(self.files) > self.KEEP:  # its arrays keep the pages they map
            _unlink(self.files.pop(0).path)
        return self.files[-1]

    @staticmethod
    def _remove(files: list[SharedFile], inputs: list[SharedFile]) -> None:
        for f in files + inputs:
            _unlink(f.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _proc_stat(pid: int) -> tuple[str, int | None]:
    """A process's state letter and CPU time (user + system, in clock ticks) from
    /proc/<pid>/stat; ("?", None) where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return "?", None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[11]) + int(fields[12])


def check_timeout(timeout: Any) -> float:
    """``timeout`` as seconds > 0, or InputError."""

    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InputError(f"timeout={timeout!r} is not a number of seconds > 0",
                         "e.g. timeout=600 for a model that takes minutes per run")
    return float(timeout)


def default_timeout(model: Any) -> float:
    """Seconds a call may take before it is abandoned: 300 plus 2 per MB of the model's
    files (the .onnx or .ncnn.param and what sits beside it), generous on purpose: a
    stalled worker is caught sooner by the heartbeat."""
    size = 0
    try:
        path = Path(model)
        stem = path.name.split(".")[0]
        size = sum(p.stat().st_size for p in path.parent.glob(f"{stem}*") if p.is_file())
    except (TypeError, OSError, ValueError):
        pass
    return 300.0 + 2.0 * size / 1e6
