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
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .. import errors
from ..errors import BackendCrashed, BackendTimeout, RemoteError, WorkbenchError
from .worker_dir import OwnedDir, sweep_dead

__all__ = ["Worker", "Place", "NATIVE", "worker", "existing", "send_drops", "warm"]


class TwinMissing(Exception):
    """The worker no longer holds a runner's twin (dropped); the handle builds it again."""


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
        # the folder runs travel through, this process's for its lifetime (worker_dir.py);
        # first, the folders of workbench processes that died without removing theirs
        sweep_dead()
        self._owned = OwnedDir()
        self.dir: Path = self._owned.path
        self.log = self.dir / "worker.log"
        # twins of runners garbage-collected here, dropped in the worker at the next call
        # (not from the finalizer itself: it may run while a call holds the lock)
        self.pending_drops: list[int] = []

    def command(self, fd: int) -> list[str]:
        """The worker process's argv; it answers on the socket ``fd``."""
        return [sys.executable, "-c",
                f"from workbench.runtime.worker_main import serve; serve({fd})"]

    def environ(self) -> dict[str, str]:
        """The worker process's environment: this one's, with this process's import path."""
        return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))

    def _start(self) -> None:
        self.ensure_dir()
        ours, theirs = socket.socketpair()
        with open(self.log, "wb") as log:  # native prints land here, not in the kernel
            self._proc = subprocess.Popen(
                self.command(theirs.fileno()), pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.environ())
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
        self._owned.ensure()

    def call(self, msg: dict[str, Any], backend: str,
             timeout: float | None = None) -> dict[str, Any]:
        """Send ``msg`` and wait for its reply: BackendCrashed if the worker dies,
        BackendTimeout if it stalls or ``timeout`` seconds pass (the worker is replaced)."""
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
                raise TwinMissing()
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

    CLOSE_SECONDS = 5.0  # a worker that ignores SIGTERM this long is killed

    def close(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after CLOSE_SECONDS) and remove the
        folder, whatever happens on the way: at interpreter exit (atexit) the reader thread
        may clear ``_proc`` meanwhile, and a stuck worker ignores SIGTERM."""
        try:
            proc = self._proc  # once: the reader thread sets it to None when it dies
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=self.CLOSE_SECONDS)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=self.CLOSE_SECONDS)
        finally:
            self._owned.remove()


@dataclass(frozen=True)
class Place:
    """Where a runner's twin runs: which worker process (``key``: None for the native one,
    else a target's name), how to start it, and how much slower than native it runs
    (``slowdown``: default timeouts scale by it)."""

    key: str | None = None
    make: Callable[[], Worker] = field(default=lambda: Worker(), compare=False)
    slowdown: float = 1.0


NATIVE = Place()
_WORKER: Worker | None = None  # the native worker
_TARGETED: dict[str, Worker] = {}  # a worker per other place, by its key


def worker(place: Place = NATIVE) -> Worker:
    """The process-wide worker of ``place`` (created on first use, closed at exit)."""
    global _WORKER
    if place.key is None:
        if _WORKER is None:
            _WORKER = place.make()
            atexit.register(_WORKER.close)
        return _WORKER
    if place.key not in _TARGETED:
        _TARGETED[place.key] = made = place.make()
        atexit.register(made.close)
    return _TARGETED[place.key]


def existing(place: Place = NATIVE) -> Worker | None:
    """The worker of ``place`` if one was made, without making one."""
    return _WORKER if place.key is None else _TARGETED.get(place.key)


def warm(modules: tuple[str, ...], place: Place = NATIVE) -> None:
    """Start ``place``'s worker now, importing ``modules`` there, in the background: a stage
    about to wait on the exporter or pnnx finds its worker ready for the check that follows
    (starting one and importing onnxruntime took ~0.8 s of the export's numeric check).
    Never raises: what fails here fails again, explained, at the real call."""
    w = worker(place)

    def start() -> None:
        with contextlib.suppress(Exception):
            w.call({"op": "warm", "modules": list(modules)}, "the worker (warming up)",
                   timeout=120)

    threading.Thread(target=start, daemon=True, name="wb-worker-warm").start()


def send_drops(place: Place = NATIVE) -> None:
    """Send the worker of ``place`` the drops of twins whose runners are gone, now rather
    than with its next call, so that their models' memory goes now (to_ncnn's check: the
    last net it ran, 1.1 GB of a 1.3 GB decoder's, was held until the next stage's call).
    Nothing when there are none, or when a call is in flight (the next call carries them)."""
    w = existing(place)
    if w is None or not w.pending_drops or not w.alive:
        return
    with w._lock:
        busy = bool(w._waiting)
    if not busy:
        w.call({"op": "ping"}, "the worker")


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


