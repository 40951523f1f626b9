"""A file's sha256 computed once per process while it is unchanged (fileio.file_sha256):
the workspace's commit, hashed ahead while the stage waits, and the checks of the artifact's
files after it read each file once; a file changed on disk (also with its size and mtime
put back) is hashed again and refused."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import workbench as wb
from workbench import fileio


@pytest.fixture
def reads(monkeypatch):
    """The files fileio read to hash them (the real reading, counted)."""
    seen: list[str] = []
    real = fileio.sha256_file

    def counted(path, *a, **k):
        seen.append(Path(path).name)
        return real(path, *a, **k)

    monkeypatch.setattr(fileio, "sha256_file", counted)
    return seen


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_is_hashed_once_while_unchanged_and_again_when_changed(tmp_path, reads):
    (tmp_path / "staging").mkdir()
    f = tmp_path / "staging" / "w.bin"
    f.write_bytes(b"a" * 1000)
    assert fileio.file_sha256(f) == _sha(b"a" * 1000)
    assert fileio.file_sha256(f) == _sha(b"a" * 1000)
    os.rename(tmp_path / "staging", tmp_path / "0001-x")  # a commit: the folder renamed
    moved = tmp_path / "0001-x" / "w.bin"
    assert fileio.file_sha256(moved) == _sha(b"a" * 1000)
    assert reads == ["w.bin"]
    os.rename(moved, tmp_path / "moved.bin")  # a file renamed: a new ctime, hashed again
    moved = tmp_path / "moved.bin"
    assert fileio.file_sha256(moved) == _sha(b"a" * 1000)
    assert reads == ["w.bin", "moved.bin"]
    st = moved.stat()
    with open(moved, "r+b") as h:  # same size, mtime put back: only the ctime tells
        h.write(b"b")
    os.utime(moved, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert moved.stat().st_mtime_ns == st.st_mtime_ns and moved.stat().st_size == st.st_size
    assert fileio.file_sha256(moved) == _sha(b"b" + b"a" * 999)
    assert reads == ["w.bin", "moved.bin", "moved.bin"]


def test_hashing_ahead_is_what_a_later_ask_gets_and_a_change_meanwhile_is_seen(tmp_path, reads):
    f, g = tmp_path / "f.bin", tmp_path / "g.bin"
    f.write_bytes(os.urandom(3 << 20))
    g.write_bytes(b"x" * 10)
    fileio.hash_ahead([f, g, tmp_path / "missing.bin"])
    assert fileio.file_sha256(f) == _sha(f.read_bytes())
    time.sleep(0.06)
    g.write_bytes(b"y" * 10)  # after hash_ahead began: the new bytes' digest
    assert fileio.file_sha256(g) == _sha(b"y" * 10)
    assert reads.count("f.bin") == 1


def test_a_commit_hashed_ahead_reads_each_file_once_through_the_runners_check(tmp_path, reads):
    from workbench.runtime import OrtRunner

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    art = wb.export(nn.Linear(8, 4).eval(), (x,), workspace=wb.Workspace(tmp_path / "ws"))
    assert art.ok
    assert sorted(reads) == sorted(art.files)  # hashed once, ahead or at commit
    art.check_files()
    OrtRunner(str(art.path), isolated=False).run((x,))  # by path: its record checked
    assert sorted(reads) == sorted(art.files)
    art.path.write_bytes(art.path.read_bytes())  # rewritten in place, the same bytes
    art.check_files()  # read again (it could have been anything), and still right
    assert reads.count("model.onnx") == 2


def test_a_changed_file_is_still_refused_after_its_commit(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    ws = wb.Workspace(tmp_path / "ws")
    a, b = (wb.export(nn.Linear(8, 4).eval(), (x,), workspace=ws) for _ in range(2))
    torch.manual_seed(1)
    c = wb.export(nn.Linear(8, 4).eval(), (x,), workspace=ws)
    b.path.write_bytes(c.path.read_bytes())  # another model's bytes, same size
    with pytest.raises(wb.ModelFileError, match="changed since its export stage wrote it"):
        b.check_files()
    a.check_files()


def _forget_this_process(monkeypatch):
    """As a fresh process: nothing hashed or verified here before."""
    from workbench.artifact import record

    monkeypatch.setattr(record, "_VERIFIED", {})
    monkeypatch.setattr(fileio, "_DIGESTS", fileio.OrderedDict())


def test_another_process_trusts_a_file_its_record_still_describes(tmp_path, reads,
                                                                  monkeypatch):
    """The record keeps each file's device, inode and mtime beside its digest: a stage run
    in a fresh process checks its parent without reading it again, and a file written
    since (other bytes of the same size), copied over, or moved to another folder is read
    and refused or verified."""
    ws = wb.Workspace(tmp_path / "ws")
    with ws.staging() as d:
        (d / "w.bin").write_bytes(os.urandom(1 << 16))
        (d / "main.txt").write_text("m")  # just written: its hashing waits out RACY_NS
        art = ws.commit(d, stage="x", format="bin", main="main.txt")
    assert all({"device", "inode", "mtime_ns"} <= set(m) for m in art.files.values())
    _forget_this_process(monkeypatch)
    reads.clear()
    wb.Workspace(tmp_path / "ws").get(art.id).check_files()
    assert reads == []  # each file as its record describes it: none read

    w = art.dir / "w.bin"
    w.write_bytes(os.urandom(1 << 16))  # other bytes, same size: a new mtime
    _forget_this_process(monkeypatch)
    with pytest.raises(wb.ModelFileError, match="w.bin changed since"):
        wb.Workspace(tmp_path / "ws").get(art.id).check_files()

    assert not fileio.matches_record(w.stat(), {"sha256": "x", "bytes": 1 << 16})  # no stat
    st = w.stat()
    meta = {"bytes": st.st_size, "device": st.st_dev, "inode": st.st_ino,
            "mtime_ns": st.st_mtime_ns}
    assert fileio.matches_record(st, meta)
    for key, other in (("inode", st.st_ino + 1), ("bytes", st.st_size - 1),
                       ("mtime_ns", st.st_mtime_ns - 1), ("device", st.st_dev + 1)):
        assert not fileio.matches_record(st, {**meta, key: other}), key


@pytest.fixture
def slow_reads(monkeypatch):
    """sha256_file taking 0.3 s a file: (files read, most read at once)."""
    import threading

    seen: list[str] = []
    at_once = [0, 0]
    lock = threading.Lock()
    real = fileio.sha256_file

    def slow(path, *a, **k):
        with lock:
            seen.append(Path(path).name)
            at_once[0] += 1
            at_once[1] = max(at_once)
        time.sleep(0.3)
        try:
            return real(path, *a, **k)
        finally:
            with lock:
                at_once[0] -= 1

    monkeypatch.setattr(fileio, "sha256_file", slow)
    return seen, at_once


def _old_files(folder: Path, n: int) -> list[Path]:
    files = []
    for i in range(n):
        f = folder / f"w{i}.bin"
        f.write_bytes(os.urandom(1000))
        files.append(f)
    time.sleep(fileio.RACY_NS / 1e9 + 0.01)  # old enough to be kept
    return files


def test_hashing_ahead_takes_at_most_hashers_threads_and_an_early_ask_hashes_itself(
        tmp_path, slow_reads, monkeypatch):
    seen, at_once = slow_reads
    files = _old_files(tmp_path, 4)
    fileio.hash_ahead(files)
    # the last file is still queued behind the others: its asker hashes it now, once
    assert fileio.file_sha256(files[3]) == _sha(files[3].read_bytes())
    for f in files:
        assert fileio.file_sha256(f) == _sha(f.read_bytes())
    assert sorted(seen) == sorted(f.name for f in files)  # each read once, ahead or here
    # the hashing threads, plus this thread's own ask, never more
    assert at_once[1] <= fileio.HASHERS + 1


def test_a_forked_child_asks_for_a_file_its_parent_was_hashing_ahead(tmp_path, slow_reads):
    import multiprocessing

    files = _old_files(tmp_path, 2)
    fileio.hash_ahead(files)  # under way in this process's threads, none in the child's

    def child() -> None:
        ok = all(fileio.file_sha256(f) == _sha(f.read_bytes()) for f in files)
        os._exit(0 if ok else 3)

    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join(20)
    alive = p.is_alive()
    if alive:
        p.kill()
    assert not alive and p.exitcode == 0  # the old code waited on the parent's futures
