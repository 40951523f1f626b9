"""The worker's folder in /dev/shm never outlives its process for long: removed by close()
whatever the worker does, swept by the next workbench process when its owner was SIGKILLed,
gone after a normal exit; and the worker process ends when its parent is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workbench.runtime import worker as worker_mod
from workbench.runtime.worker_dir import LOCK, PREFIX, UNLOCKED_AGE, OwnedDir, sweep_dead

CHILD = """
import sys, time
from workbench.runtime.worker import worker
w = worker()
w.call({"op": "ping"}, "test")
(w.dir / "h1-out0").write_bytes(b"x" * 4096)  # a run's file
print(w.dir, w.pid, flush=True)
if sys.argv[1] == "wait":
    time.sleep(120)
"""


def _child(mode: str) -> tuple[subprocess.Popen, Path, int]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                p for p in sys.path if p)))
    folder, pid = proc.stdout.readline().split()
    return proc, Path(folder), int(pid)


def _gone(pid: int, within: float) -> bool:
    """The process ``pid`` exited (absent or a zombie) within ``within`` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_a_sigkilled_owner_leaves_a_folder_the_next_worker_sweeps_and_its_worker_exits():
    proc, folder, worker_pid = _child("wait")
    assert folder.name.startswith(PREFIX) and (folder / LOCK).is_file()
    proc.kill()  # SIGKILL: no atexit, no finally
    proc.wait()
    # the worker reads EOF on its socket and exits: no orphan holding memory
    assert _gone(worker_pid, 15), f"worker {worker_pid} outlived its SIGKILLed parent"
    w = worker_mod.Worker()  # the next process's worker: sweeps what the dead one left
    try:
        assert not folder.exists(), f"{folder} of a SIGKILLed process was not swept"
        assert w.dir.is_dir() and (w.dir / LOCK).is_file()
    finally:
        w.close()
    assert not w.dir.exists()


def test_no_folder_is_left_after_a_normal_exit():
    proc, folder, worker_pid = _child("exit")
    assert proc.wait(timeout=60) == 0
    assert not folder.exists()
    assert _gone(worker_pid, 10)


class _Deaf(worker_mod.Worker):
    """A worker that ignores SIGTERM, as one stuck in native code with a handler would."""

    def command(self, fd: int) -> list[str]:
        return [sys.executable, "-c", "import signal; signal.signal(signal.SIGTERM, "
                "signal.SIG_IGN); from workbench.runtime.worker_main import serve; "
                f"serve({fd})"]


def test_close_removes_the_folder_even_when_the_worker_ignores_sigterm():
    w = _Deaf()
    w.call({"op": "ping"}, "test")
    proc = w._proc
    w.CLOSE_SECONDS = 0.5
    t0 = time.perf_counter()
    w.close()  # before: TimeoutExpired out of close(), the folder left
    assert time.perf_counter() - t0 < 5
    assert not w.dir.exists()
    assert proc.poll() == -signal.SIGKILL


def test_a_live_owners_folder_is_never_swept_and_old_unlocked_ones_are(tmp_path):
    live = OwnedDir(tmp_path)
    (live.path / "h1-in").write_bytes(b"x")
    old = tmp_path / (PREFIX + "oldlayout")  # the layout before the lock: no .owner.lock
    old.mkdir()
    (old / "worker.log").write_text("x")
    recent = tmp_path / (PREFIX + "recent")
    recent.mkdir()
    other = tmp_path / "not-ours"
    other.mkdir()
    past = time.time() - UNLOCKED_AGE - 60
    for p in (old, old / "worker.log"):
        os.utime(p, (past, past))
    removed = sweep_dead(tmp_path)
    assert removed == [old]
    assert live.path.is_dir() and recent.is_dir() and other.is_dir()
    # its owner gone (the lock let go without removing: as a killed process leaves it)
    live._release()
    assert sweep_dead(tmp_path) == [live.path] and not live.path.exists()


def test_a_folder_removed_under_a_live_owner_is_made_again_with_its_lock(tmp_path):
    import shutil

    owned = OwnedDir(tmp_path)
    shutil.rmtree(owned.path)  # a tmp cleaner
    owned.ensure()
    assert (owned.path / LOCK).is_file()
    assert sweep_dead(tmp_path) == []  # locked again: not taken for dead
    owned.remove()
    assert not owned.path.exists()
