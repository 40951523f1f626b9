"""The memory of a process tree (a process and all its descendants), sampled from /proc.

``bench/scale.py`` measures each job in a fresh child; the workbench's work spreads over that
child, its worker process (workbench/runtime/worker.py) and pnnx, so one process's peak says
too little. What is counted, and why not PSS:

- each process's ``RssAnon + RssFile`` from ``/proc/PID/status``, summed over the tree, plus
  the largest ``RssShmem`` of any one process in it (not their sum). The tree's shared
  memory is the worker's transfer files in /dev/shm, which the main process and the worker
  both map: summing RSS would count those pages twice, PSS would split them. PSS
  (``/proc/PID/smaps_rollup``) walks every page table under the target's mmap lock: 61 ms
  for one 2.3 GB process measured here, so a 10 GB tree sampled every 25 ms would cost a
  core of this 2-core machine and stall the measured process. ``status`` costs 0.02 ms.
  Shared library pages mapped by both the child and the worker stay counted twice (tens of
  MB; they are in the bare runs too, once); /dev/shm files nobody maps are not counted.
- ``rss_sum_kb``: the plain sum of RSS (double counting the shared pages), printed beside;
- ``peak_parts`` / ``peak_per_pid`` / ``peak_at``: the peak reading's RssAnon, RssFile and
  RssShmem apart, each process's share, and when it came (seconds into the stage): whether
  a peak is the process's own memory or file pages it maps (onnxruntime maps external
  data), and whose;
- ``hwm_kb``: the sum over the tree of each process's own ``VmHWM`` (the last value read
  while armed), an upper bound: the processes peak at different moments. The job child
  resets its own with ``/proc/self/clear_refs`` when its stage starts.

The descendants are found from each process's parent pid (``/proc/PID/stat``; this kernel
has no ``/proc/PID/task/TID/children``), read once per new pid.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def status(pid: int) -> dict[str, int]:
    """The memory fields of ``/proc/PID/status`` in kB (empty when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _FIELDS:
            out[key] = int(rest.split()[0])
    return out


class _Parents:
    """pid -> parent pid of every process, each pid's stat read once while it lives."""

    def __init__(self) -> None:
        self._ppid: dict[int, int] = {}

    def descendants(self, root: int) -> list[int]:
        live = {int(d) for d in os.listdir("/proc") if d.isdigit()}
        for pid in list(self._ppid):
            if pid not in live:
                del self._ppid[pid]
        for pid in live - self._ppid.keys():
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            self._ppid[pid] = int(stat[stat.rfind(b")") + 2:].split()[1])
        kids: dict[int, list[int]] = {}
        for pid, ppid in self._ppid.items():
            kids.setdefault(ppid, []).append(pid)
        out, todo = [], [root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo += kids.get(pid, [])
        return out


@dataclass
class TreeReading:
    """One reading of a tree: the counted memory (kB), the plain RSS sum, the processes."""

    kb: int
    rss_sum_kb: int
    pids: list[int]
    hwm: dict[int, int]  # pid -> its VmHWM (kB)
    parts: dict[str, int] = field(default_factory=dict)  # RssAnon, RssFile, RssShmem (kB)
    per_pid: dict[int, int] = field(default_factory=dict)  # pid -> its RssAnon + RssFile


def read_tree(root: int, parents: _Parents | None = None) -> TreeReading:
    """The memory of ``root`` and its descendants now (see the module docstring)."""
    pids = (parents or _Parents()).descendants(root)
    rss = shm = 0
    hwm, per_pid = {}, {}
    parts = {"RssAnon": 0, "RssFile": 0}
    for pid in pids:
        s = status(pid)
        if not s:
            continue
        for k in parts:
            parts[k] += s.get(k, 0)
        per_pid[pid] = s.get("RssAnon", 0) + s.get("RssFile", 0)
        shm = max(shm, s.get("RssShmem", 0))
        rss += s.get("VmRSS", 0)
        hwm[pid] = s.get("VmHWM", 0)
    parts["RssShmem"] = shm
    return TreeReading(sum(parts.values()), rss, pids, hwm, parts, per_pid)


def mem_available_kb() -> int:
    """The machine's MemAvailable (kB; 0 when /proc/meminfo cannot be read)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class TreeSampler:
    """Samples ``root``'s tree every ``interval`` seconds in a thread; while armed, keeps
    the peaks. ``arm()`` when the measured work starts, ``disarm()`` when it ends. When the
    machine's MemAvailable falls below ``floor_kb``, ``on_low_memory(available_kb)`` is
    called once (from the sampling thread): the caller stops the job before the kernel's
    OOM killer picks a process, maybe another user's."""

    root: int
    interval: float = 0.025
    floor_kb: int = 0
    on_low_memory: Callable[[int], None] | None = None
    low_memory_kb: int = 0  # MemAvailable when the floor was crossed (0: never)
    low_tree_kb: int = 0  # the tree then
    armed: bool = False
    start_kb: int = 0  # the tree at arm()
    peak_kb: int = 0
    peak_parts: dict[str, int] = field(default_factory=dict)  # the peak's RssAnon, RssFile...
    peak_per_pid: dict[int, int] = field(default_factory=dict)  # each process at the peak
    peak_at: float = 0.0  # seconds from arm() to the peak
    peak_rss_sum_kb: int = 0
    last_kb: int = 0
    samples: int = 0
    procs: int = 0  # the most processes seen at once while armed
    hwm: dict[int, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _armed_at: float = field(default=0.0, repr=False)

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tree-sampler")
        self._thread.start()
        return self

    def _loop(self) -> None:
        parents = _Parents()
        while not self._stop.is_set():
            self._take(read_tree(self.root, parents))
            if self.floor_kb and not self.low_memory_kb:
                avail = mem_available_kb()
                if 0 < avail < self.floor_kb:
                    self.low_memory_kb, self.low_tree_kb = avail, self.last_kb
                    if self.on_low_memory is not None:
                        self.on_low_memory(avail)
            self._stop.wait(self.interval)

    def _take(self, r: TreeReading) -> None:
        with self._lock:
            self.last_kb = r.kb
            if not self.armed:
                return
            self.samples += 1
            if r.kb > self.peak_kb:
                self.peak_kb, self.peak_parts, self.peak_per_pid = r.kb, r.parts, r.per_pid
                self.peak_at = time.monotonic() - self._armed_at
            self.peak_rss_sum_kb = max(self.peak_rss_sum_kb, r.rss_sum_kb)
            self.procs = max(self.procs, len(r.hwm))
            self.hwm.update(r.hwm)

    def arm(self) -> None:
        """Start keeping peaks (one reading taken now)."""
        r = read_tree(self.root)
        with self._lock:
            self.armed = True
            self.start_kb = r.kb
            self._armed_at = time.monotonic()
        self._take(r)

    def disarm(self) -> None:
        """Stop keeping peaks (one last reading first)."""
        self._take(read_tree(self.root))
        with self._lock:
            self.armed = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def hwm_kb(self) -> int:
        """The sum of each process's own peak (VmHWM) seen while armed."""
        return sum(self.hwm.values())


def wait_armed_sample(sampler: TreeSampler, timeout: float = 1.0) -> None:
    """Block until the sampler has taken a reading since it was armed (tests)."""
    end = time.monotonic() + timeout
    while sampler.samples < 2 and time.monotonic() < end:
        time.sleep(sampler.interval / 2)
