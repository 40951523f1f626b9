"""A runner's twin in a worker process, seen from this process: the handle that creates it
lazily (again after a crash) and sends it runs, and the /dev/shm files its runs travel
through (see worker.py for why files, not pickles)."""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import Any

from ..errors import RemoteError
from .base import ModelIO
from .timeouts import check_timeout, default_timeout
from .transfer import SharedFile, pack, unpack
from .worker import NATIVE, Place, TwinMissing, Worker, existing, send_drops, worker

_KEYS = itertools.count(1)


def _forget(key: int, place: Place) -> None:
    """A runner's handle is gone: its twin is dropped at its worker's next call."""
    w = existing(place)
    if w is not None:
        w.pending_drops.append(key)


class RemoteHandle:
    """A runner's twin in the worker: created lazily, re-created after a crash."""

    def __init__(self, cls: str, args: tuple, kwargs: dict[str, Any], backend: str,
                 timeout: float | None = None, custom_ops: bytes | None = None,
                 place: Place = NATIVE) -> None:
        self.cls, self.args, self.kwargs, self.backend = cls, args, kwargs, backend
        self.custom_ops = custom_ops or None  # pickled custom ops, installed before the twin
        self.place = place  # which worker process holds the twin
        # per call, in seconds; by default generous, scaled with the model's files and
        # with the place's slowdown (an emulated target)
        self.timeout = default_timeout(args[0] if args else None, place.slowdown) \
            if timeout is None else check_timeout(timeout)
        self.key = next(_KEYS)
        self._generation = -1
        self._describe: ModelIO | None = None
        self._arenas = Arenas(self.key)
        # results' files stay mapped here and in the worker between runs (SharedFile.keep)
        self.keep_mapped = False
        # when the runner that owns this handle goes, its twin in the worker goes too
        weakref.finalize(self, _forget, self.key, place)

    @property
    def pid(self) -> int | None:
        """The worker process holding this handle's twin (None before its first use)."""
        w = existing(self.place)
        if w is None or self._generation != w.generation or not w.alive:
            return None
        return w.pid

    def describe(self) -> ModelIO:
        self._ensure()
        return self._describe

    def release(self) -> None:
        """Let the twin's model and this handle's transfer files go now, not when the
        runner goes (a large model between its uses: compare measures one candidate at a
        time); the next call makes the twin again."""
        w = existing(self.place)
        if w is not None and self._generation == w.generation and w.alive:
            w.pending_drops.append(self.key)
            send_drops(self.place)  # now, or with the worker's next call when one is in flight
        self._generation = -1
        with self._arenas.lock:
            self._arenas.clear()

    def _ensure(self) -> None:
        w = worker(self.place)
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
        w = worker(self.place)
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
            except TwinMissing:
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

    def clear(self) -> None:
        """Every file unlinked (arrays still alive keep the pages they map); the next run
        makes new ones."""
        Arenas._remove(self.files, self.input_files)
        self.files.clear()
        self.input_files.clear()

    @staticmethod
    def _remove(files: list[SharedFile], inputs: list[SharedFile]) -> None:
        for f in files + inputs:
            _unlink(f.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


