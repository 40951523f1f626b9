"""File I/O every layer uses: atomic writes (a temp file and a rename, so a reader never
sees half a file) and sha256 of files.

A file's sha256 is computed once per process while the file is unchanged: ``file_sha256``
keeps each digest by what identifies the file's content without reading it (device, inode,
size, mtime and ctime: any write changes the ctime, which nothing can set back, and a
rename keeps all five), so the workspace's commit and a runner's check of the same
1.3 GB file hash it once. ``hash_ahead`` hashes files in the background while the caller
waits on something else (hashlib and file reads let go of the GIL), on one core fewer than
the machine has: to_ncnn's check loads a 2.5 GB ncnn net while pnnx's two 2.5 GB files are
hashed, and two hashing threads beside it on 2 cores slowed its load by half. Across processes, a
record keeps a file's device, inode and mtime beside its digest (``stat_record``), and a
later check trusts a file that still matches them (``matches_record``) as it trusts, within
one process, a file it hashed: a 0.5B decoder's 2 GB were otherwise read again by each stage
run in a fresh process (2.4 s each)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

# a digest is kept only for a file whose ctime is this much older than the hashing's start:
# a write in the same timestamp tick as the stat (a coarse clock) would not change the key
RACY_NS = 50_000_000
_KEPT = 256
_DIGESTS: OrderedDict[tuple, str] = OrderedDict()  # content key -> sha256
_PENDING: dict[tuple, Future] = {}  # content key -> the digest being computed (hash_ahead)
_LOCK = threading.Lock()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The sha256 of ``path``'s bytes, read now (see ``file_sha256`` for the kept one)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def content_key(st: os.stat_result) -> tuple:
    """What identifies a file's content without reading it (see the module's docstring)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_sha256(path: Path) -> str:
    """The sha256 of ``path``: the one this process computed while the file was as it is
    now (same content key), or one computed now (waiting for ``hash_ahead``'s when it is
    under way). Raises OSError when the file cannot be read."""
    key = content_key(os.stat(path))
    with _LOCK:
        digest = _DIGESTS.get(key)
        pending = _PENDING.get(key)
    if digest is not None:
        return digest
    if pending is not None and pending.cancel():  # still queued: hashed here, now
        with _LOCK:
            if _PENDING.get(key) is pending:
                del _PENDING[key]
    elif pending is not None:
        with contextlib.suppress(Exception):  # its error is found again below
            pending.result()
        with _LOCK:  # kept when the file did not change while it was read
            digest = _DIGESTS.get(content_key(os.stat(path)))
        if digest is not None:
            return digest
    return _hash_and_keep(Path(path))


def _hash_and_keep(path: Path) -> str:
    """The sha256 of ``path``, kept by content key when the file did not change while it
    was read and its last change is at least RACY_NS before the reading started (a file
    just written is waited for that long: a write in the same clock tick as the stat would
    leave the key as it was)."""
    before = content_key(os.stat(path))
    wait = before[4] + RACY_NS - time.time_ns()
    if 0 < wait <= RACY_NS:
        time.sleep(wait / 1e9)
    started = time.time_ns()
    digest = sha256_file(path)
    after = content_key(os.stat(path))
    if before == after and started - before[4] > RACY_NS:
        with _LOCK:
            _DIGESTS[after] = digest
            _DIGESTS.move_to_end(after)
            while len(_DIGESTS) > _KEPT:
                _DIGESTS.popitem(last=False)
    return digest


def stat_record(path: Path) -> tuple[str, dict[str, int]]:
    """``path``'s sha256 (``file_sha256``) and what a record keeps
    beside it so that another process can tell, without reading the file, that it is still
    the file hashed (``matches_record``): its device, inode and mtime (with its size, which
    records keep as ``bytes``). No stat is kept for a file changed while it was hashed or
    less than RACY_NS before (a write in the same clock tick would leave its mtime as it
    was): that one is hashed again when checked."""
    before = os.stat(path)
    digest = file_sha256(path)
    after = os.stat(path)
    if content_key(before) != content_key(after) or \
            time.time_ns() - after.st_mtime_ns <= RACY_NS:
        return digest, {}
    return digest, {"device": after.st_dev, "inode": after.st_ino,
                    "mtime_ns": after.st_mtime_ns}


def matches_record(st: os.stat_result, meta: dict[str, Any]) -> bool:
    """Whether the file ``st`` describes is the one a record's ``stat_record`` fields (and
    ``bytes``) were taken of: same device, inode, size and mtime. A write changes the
    mtime; a copy or a move to another file system, the inode; a record without the
    fields (an older workspace, a file just written) never matches."""
    return (meta.get("mtime_ns") is not None and meta.get("mtime_ns") == st.st_mtime_ns
            and meta.get("inode") == st.st_ino and meta.get("device") == st.st_dev
            and meta.get("bytes") == st.st_size)


def hash_ahead(paths: list[Path]) -> None:
    """Queue each file of ``paths`` to be hashed in the background, in order, by at most
    ``HASHERS`` threads (daemons: nothing waits for them but ``file_sha256`` of that file,
    which hashes a file still queued itself and waits for one under way). A file that
    changes meanwhile is hashed again by whoever asks; an error is left to them too."""
    global _STARTED
    for path in paths:
        try:
            key = content_key(os.stat(path))
        except OSError:
            continue
        future: Future = Future()
        with _LOCK:
            if key in _DIGESTS or key in _PENDING:
                continue
            _PENDING[key] = future
            _QUEUE.put((Path(path), key, future))
            if _STARTED < HASHERS:  # started as work comes, then they wait on the queue
                _STARTED += 1
                threading.Thread(target=_hasher, daemon=True, name="wb-hash-ahead").start()


# threads hashing ahead: one core left to the work the hashing runs beside (sha256 reads
# ~1.4 GB/s per core here; a thread per file took both cores from to_ncnn's check). Written
# here rather than with a ThreadPoolExecutor: its threads are joined at interpreter exit, so
# a process could not end before files nobody asks for any more were hashed
HASHERS = max(1, (os.cpu_count() or 2) - 1)
_QUEUE: queue.SimpleQueue = queue.SimpleQueue()
_STARTED = 0  # hashing threads started (under _LOCK)


def _hasher() -> None:
    while True:
        _run_ahead(*_QUEUE.get())


def _run_ahead(path: Path, key: tuple, future: Future) -> None:
    if not future.set_running_or_notify_cancel():  # its caller did not wait: hashed there
        return
    try:
        future.set_result(_hash_and_keep(path))
    except BaseException as e:  # noqa: BLE001 - handed to whoever waits on it
        future.set_exception(e)
    finally:
        with _LOCK:
            if _PENDING.get(key) is future:
                del _PENDING[key]


def _forget_in_child() -> None:
    """A forked child has none of its parent's hashing threads: what they had queued or
    begun is hashed again by whoever asks (waiting on it would wait forever)."""
    global _QUEUE, _LOCK, _STARTED
    _LOCK = threading.Lock()  # another thread may have held it at the fork
    _PENDING.clear()
    _QUEUE = queue.SimpleQueue()
    _STARTED = 0


os.register_at_fork(after_in_child=_forget_in_child)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
