"""Who may write a workspace, and what a stopped writer left: the workspace's lock
(``.lock``, held while the manifest is read or written), each stage's staging folder with
the lock it holds while the stage runs, and the cleanup of folders no live stage holds."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import WorkspaceError

# report(code, message, hint): a problem found, kept in Workspace.problems and warned
Report = Callable[..., None]


@contextlib.contextmanager
def workspace_lock(folder: Path) -> Iterator[None]:
    """The workspace's exclusive lock, held for the body (one process reads or writes the
    manifest at a time)."""
    try:
        f = open(folder / ".lock", "a+")  # noqa: SIM115 - closed below
    except OSError as e:  # a folder in its place, no permission...
        raise WorkspaceError(
            f"workspace {str(folder)!r}: its lock file .lock cannot be opened "
            f"({e.strerror or e})", "remove whatever is at .lock in the workspace folder "
            "(the workbench makes it again), or use another folder") from e
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def staging_folder(folder: Path) -> Iterator[Path]:
    """A fresh ``.staging-<id>`` folder in ``folder``, removed after the body unless renamed
    away; its lock is held meanwhile, so reopening the workspace leaves a live stage's
    folder be."""
    d = folder / f".staging-{uuid.uuid4().hex}"
    with open(d.with_name(d.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        d.mkdir()
        try:
            yield d
        finally:
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)
            os.unlink(lock.name)


def clean_leftovers(folder: Path, report: Report) -> None:
    """Remove staging folders of stages that were killed; list old pnnx temp folders.

    A live stage holds an flock on ``.staging-<id>.lock``; a folder whose lock can be
    taken belongs to no running process. pnnx's temporary folders hold no lock: those
    untouched for an hour are reported, not removed.
    """
    for d in folder.glob(".staging-*"):
        if not d.is_dir():
            continue
        lock = d.with_name(d.name + ".lock")
        try:
            with open(lock, "a+") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a stage is writing there now
        shutil.rmtree(d, ignore_errors=True)
        lock.unlink(missing_ok=True)
        report("staging-removed", f"removed {d.name}, left by a stage that was "
               "stopped before it finished", "nothing to do")
    for lock in folder.glob(".staging-*.lock"):
        if not lock.with_suffix("").exists():
            lock.unlink(missing_ok=True)
    now = time.time()
    for d in folder.glob("wb-pnnx-*"):
        if d.is_dir() and now - d.stat().st_mtime > 3600:
            report("leftover-temp-folder",
                   f"{d} is a pnnx temporary folder left by a conversion that was "
                   "stopped", f"remove it: shutil.rmtree({str(d)!r})")
