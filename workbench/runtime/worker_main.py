"""The worker process's side: build runners, run them, answer on the socket.

Started by ``worker.Worker`` as ``python -c "from workbench.runtime.worker_main import
serve; serve(fd)"`` (natively, or an aarch64 Python under QEMU for an ARM target), it loads
nothing but the runners it is asked for: an emulated Python has only ncnn and numpy.
"""

from __future__ import annotations

import importlib
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from .heap import keep_freed_memory, one_heap
from .transfer import Packer, SharedFile, unpack

SERVING = False  # True in the worker process itself

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


class _Server:
    """One worker's state: its runners by key, a thread per runner, the socket.

    A thread receives; each runner's runs go to a thread of its own (a runner marked
    ``main_thread`` runs on the main thread: ncnn ran a ResNet-50 20-50% slower from any
    other thread of this process, measured, not explained), so that two runners (ONNX
    Runtime and ncnn: both release the GIL) can run at once, as compare() schedules them;
    every reply carries the id of its request. Creating, dropping and pings are answered in
    order, on the main thread."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.runners: dict[int, Any] = {}
        self.send_lock = threading.Lock()
        # a thread per runner, always the same (a thread team per calling thread is what
        # OpenMP keeps)
        self.threads: dict[int, ThreadPoolExecutor] = {}
        self.main_lane: queue.Queue = queue.Queue()

    def reply(self, msg: dict[str, Any], payload: dict[str, Any]) -> None:
        with self.send_lock:
            self.conn.send({"id": msg.get("id"), **payload})

    def handle(self, msg: dict[str, Any]) -> None:
        try:
            getattr(self, "op_" + msg["op"])(msg)
        except Exception as e:  # carried back; the worker lives on
            self.reply(msg, {"ok": False, "type": type(e).__name__, "message": str(getattr(
                e, "message", e)), "hint": getattr(e, "hint", "")})

    def op_create(self, msg: dict[str, Any]) -> None:
        if msg.get("custom_ops"):  # the @wb.custom_op kernels/layers the twin runs
            # cycle-free but deferred: customops loads onnx, which an emulated worker lacks
            from ..customops import install

            install(msg["custom_ops"])
        module, cls = msg["cls"].split(":")
        klass = getattr(importlib.import_module(module), cls)
        runner = klass(*msg["args"], **msg["kwargs"], isolated=False)
        self.runners[msg["key"]] = runner
        self.reply(msg, {"ok": True, "describe": runner.describe()})

    def op_run(self, msg: dict[str, Any]) -> None:
        runner = self.runners.get(msg["key"])
        if runner is None:  # dropped here, still alive in the parent
            self.reply(msg, {"ok": False, "type": "TwinMissing", "message": "", "hint": ""})
            return
        feed = unpack(msg["inputs"], msg["index"])
        packer = Packer(_output_file(msg["outputs"], msg.get("keep", False)),
                        msg.get("size_hint", 0))
        out = runner._execute(feed, msg["capture"], arena=packer)
        del feed
        index = packer.index(out)
        del out, packer
        self.reply(msg, {"ok": True, "outputs": index})

    def op_drop(self, msg: dict[str, Any]) -> None:
        self.runners.pop(msg["key"], None)
        gone = self.threads.pop(msg["key"], None)
        if gone is not None:
            gone.shutdown(wait=False)
        self.reply(msg, {"ok": True})

    def op_warm(self, msg: dict[str, Any]) -> None:
        """Import what the parent's next calls will need (``modules``) while it does other
        work (``worker.warm``)."""
        for name in msg.get("modules", ()):
            importlib.import_module(name)
        self.reply(msg, {"ok": True})

    def op_ping(self, msg: dict[str, Any]) -> None:
        self.reply(msg, {"ok": True, "pid": os.getpid(), "runners": len(self.runners)})

    def receive(self) -> None:
        """The receiving thread: runs go to their runner's thread, the rest in order to
        the main thread; None there when the parent is gone."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                # the parent is gone (SIGKILLed kernel, killed test): nobody waits for a
                # run still going, and a native run may take minutes; leave now
                os._exit(0)
            runner = self.runners.get(msg.get("key"))
            if msg["op"] != "run" or getattr(runner, "main_thread", False):
                self.main_lane.put(msg)
                continue
            if msg["key"] not in self.threads:
                self.threads[msg["key"]] = ThreadPoolExecutor(1, thread_name_prefix="wb-run")
            self.threads[msg["key"]].submit(self.handle, msg)

    def serve(self) -> None:
        threading.Thread(target=self.receive, daemon=True, name="wb-worker-receive").start()
        while (msg := self.main_lane.get()) is not None:
            self.handle(msg)


def serve(fd: int) -> None:  # pragma: no cover - runs in the child
    """The worker's main loop, answering on the socket ``fd`` until the parent goes."""
    global SERVING
    SERVING = True
    keep_freed_memory()  # results are fresh arrays each run: reuse their memory
    one_heap()  # runs come on several threads: let them reuse each other's freed memory
    _Server(Connection(fd)).serve()
