"""The worker's folder (the files tensors travel through, the worker's log) in a memory-backed
folder such as /dev/shm, owned for exactly as long as its process lives, and the sweep of
folders whose owner died.

/dev/shm is RAM: a folder left by a process that died (a killed kernel, a test stopped by a
timeout, SIGKILL) holds its runs' files until the machine reboots (586 of them, 7.1 GB, were
found on one machine). So the owner holds an exclusive ``flock`` on ``.owner.lock`` inside
its folder for its whole life; the kernel drops that lock when the process dies however it
dies (SIGKILL included), with no pid to be reused. Any workbench process making a worker
sweeps the folder's parent: a folder whose lock it can take has no owner and is removed.

A folder is made under a name the sweep does not take (``wb-new-*``), locked, then renamed
to ``wb-worker-*``: a sweep never sees a folder whose owner has not locked it yet. Folders of
the layout before the lock (no ``.owner.lock``), and ``wb-new-*`` ones left by a process that
died while making one, are removed once nothing in them changed for ``UNLOCKED_AGE`` (1 h):
a live owner of the old layout that sat idle that long finds its folder gone and makes it
again (``Worker.ensure_dir``); its open mappings live on.

(A hand-written sweep rather than a library: tempfile, atexit and weakref.finalize all clean
up only when the process gets to run its exit code, which SIGKILL never lets it.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

from .transfer import _shm_dir

PREFIX = "wb-worker-"
MAKING = "wb-new-"  # a folder being made, not yet locked (the sweep leaves it alone)
LOCK = ".owner.lock"
UNLOCKED_AGE = 3600.0  # seconds unchanged before a folder without a lock is taken as dead

__all__ = ["OwnedDir", "sweep_dead", "PREFIX", "LOCK", "UNLOCKED_AGE"]


def default_parent() -> Path:
    """/dev/shm when it is there and writable, else the system's temp folder."""
    return Path(_shm_dir() or tempfile.gettempdir())


class OwnedDir:
    """A ``wb-worker-*`` folder in ``parent`` that this process owns (its lock held) until
    ``remove``; made again, lock and all, by ``ensure`` if something removed it meanwhile."""

    def __init__(self, parent: Path | None = None) -> None:
        self.parent = Path(parent) if parent is not None else default_parent()
        self._lock_fd: int | None = None
        self.path = self._make(None)

    def _make(self, path: Path | None) -> Path:
        """A locked folder at ``path`` (None: a fresh name)."""
        fresh = Path(tempfile.mkdtemp(prefix=MAKING, dir=self.parent))
        try:
            fd = os.open(fresh / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                target = path or fresh.with_name(PREFIX + fresh.name[len(MAKING):])
                os.rename(fresh, target)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        self._release()
        self._lock_fd = fd
        return target

    def ensure(self) -> None:
        """The folder is there (made again if a tmp cleaner or another job removed it)."""
        if self.path.is_dir():
            return
        try:
            self._make(self.path)
        except OSError:  # the parent itself is gone: a plain folder, made with it
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)

    def remove(self) -> None:
        """Remove the folder, then let the lock go (never the other way round: a sweep
        between the two would find an unowned folder, which is harmless, but this order
        keeps the folder owned until it is gone)."""
        try:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            self._release()

    def _release(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def sweep_dead(parent: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove the worker folders in ``parent`` whose owner is gone; return them.

    A ``wb-worker-*`` folder with a lock file is its owner's while the owner lives: it is
    removed when its lock can be taken. One without (the older layout), or a ``wb-new-*``
    one, is removed when nothing in it changed for UNLOCKED_AGE seconds. Folders of other
    users (no permission) and anything else are left alone; no error escapes."""
    parent = Path(parent) if parent is not None else default_parent()
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith((PREFIX, MAKING)):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            if entry.name.startswith(PREFIX) and (path / LOCK).exists():
                if _take_and_remove(path):
                    removed.append(path)
            elif now - _last_change(path) > UNLOCKED_AGE:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:  # another user's folder, or gone meanwhile
            continue
    return removed


def _take_and_remove(path: Path) -> bool:
    """Remove ``path`` if its lock can be taken (its owner is dead)."""
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # alive
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def _last_change(path: Path) -> float:
    """The latest modification time of ``path`` and the entries directly in it."""
    latest = path.stat().st_mtime
    with os.scandir(path) as it:
        for e in it:
            with contextlib.suppress(OSError):
                latest = max(latest, e.stat(follow_symlinks=False).st_mtime)
    return latest
