"""How tensors travel between this process and the worker: arrays back to back in a file
in a memory-backed folder (``/dev/shm`` when there is one), written with pwrite (or by the
backend itself, into views ``Packer.alloc`` hands out) and read back as views of one
mapping of the file. See ``worker.py`` for why not pickles through the pipe.
"""

from __future__ import annotations

import mmap
import os
import weakref
from typing import Any


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


_ALIGN = 64  # each array starts on a cache line (and any dtype's alignment)


class SharedFile:
    """A file in /dev/shm whose arrays are views of one mapping of it, made with all its
    pages mapped at once (MAP_POPULATE): faulting 100+ MB in 4 kB at a time cost about as
    much as a ResNet-50 capture itself. The mapping lives as long as any array viewing it
    (numpy points every view, and every view of a view, at the array that holds the
    memory) and no longer, so ``in_use`` says whether one is alive; once none is, the file
    may be written over. The file is grown, never shrunk: used again, it keeps its pages.

    ``keep``: the mapping stays after its arrays are gone, so the next run maps nothing
    (~10 ms per 100 MB here). It costs no memory (the file's pages exist either way), but
    this process's resident set counts them while mapped."""

    def __init__(self, path: str, keep: bool = False) -> None:
        self.path = path
        self.keep = keep
        self._root: Any = None  # weak reference to the uint8 array over the mapping
        self._kept: Any = None  # the same array, held, when keep

    def map(self, size: int) -> Any:
        """A uint8 array over the first ``size`` bytes of the file (grown if shorter): the
        live mapping if it is long enough, else a new one. Hold it while viewing it."""
        import numpy as np

        root = self._root() if self._root is not None else None
        if root is not None and len(root) >= size:
            self._kept = root if self.keep else None
            return root
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            if not size:
                return np.empty(0, np.uint8)
            # only the bytes asked for: a file used again may be longer than this run's
            # results, and every page mapped here counts in this process's resident set
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            root = np.frombuffer(mmap.mmap(fd, size, flags=flags), np.uint8)
        finally:
            os.close(fd)
        self._root = weakref.ref(root)
        self._kept = root if self.keep else None
        return root

    def in_use(self) -> bool:
        """Whether an array of this file is still alive somewhere."""
        import sys

        root = self._root() if self._root is not None else None
        if root is None:
            return False
        # held here (kept), by `root` and by getrefcount's argument: any more is a view
        return self._kept is None or sys.getrefcount(root) > 3


def _view(root: Any, offset: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    import numpy as np

    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if not count:
        return np.empty(shape, dt)
    return root[offset:offset + count * dt.itemsize].view(dt).reshape(shape)


class Packer:
    """Writes a run's arrays back to back into a SharedFile, each aligned to 64 bytes.

    A runner may ask ``alloc`` for its result arrays and have the backend write there
    (ONNX Runtime, through an IO binding), so the file is the reply with no copy.
    ``index`` lists the results and writes in any the runner made elsewhere (ncnn's Mats)
    with one pwrite each; an array given under several names (ncnn's Split tops are their
    bottom) is written once. ``size_hint`` (the last run's size) sizes the file up front."""

    def __init__(self, file: SharedFile, size_hint: int = 0) -> None:
        self.file = file
        self.hint = size_hint
        self.root: Any = None  # the mapping alloc() hands out views of
        self.end = 0
        self.owned: dict[int, tuple[int, str, tuple]] = {}  # id(view) -> its index entry
        self.views: list[Any] = []  # kept so that their ids stay unique until index()

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A writable array in the file, for the backend to fill."""
        import numpy as np

        dt = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        offset = self.end
        self.end += -(-int(np.prod(shape, dtype=np.int64)) * dt.itemsize // _ALIGN) * _ALIGN
        if self.root is None or len(self.root) < self.end:  # grow ahead, not per array
            self.root = self.file.map(max(self.end, self.hint, 2 * (
                0 if self.root is None else len(self.root))))
        view = _view(self.root, offset, dt, shape)
        self.owned[id(view)] = (offset, dt.str, shape)
        self.views.append(view)
        return view

    def index(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """The index ``unpack`` reads ``arrays`` back with. Arrays made elsewhere are
        written with pwrite, not through a mapping: a writer that maps the file holds its
        pages in its own resident set too, on top of the reader's."""
        import numpy as np

        index, seen = {}, {}
        fd = None
        try:
            for name, value in arrays.items():
                entry = self.owned.get(id(value)) or seen.get(id(value))
                if entry is None:
                    arr = np.asarray(value)
                    if arr.dtype.hasobject:
                        raise TypeError(f"{name!r} holds Python objects ({arr.dtype}), "
                                        "not numbers")
                    if fd is None:
                        fd = os.open(self.file.path, os.O_RDWR | os.O_CREAT, 0o600)
                    entry = (self.end, arr.dtype.str, arr.shape)
                    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
                    done = 0
                    while done < raw.nbytes:
                        done += os.pwrite(fd, raw[done:], self.end + done)
                    self.end += -(-raw.nbytes // _ALIGN) * _ALIGN
                seen[id(value)] = entry
                index[name] = entry
            if fd is not None and os.fstat(fd).st_size < self.end:
                os.ftruncate(fd, self.end)
        finally:
            if fd is not None:
                os.close(fd)
        self.views.clear()
        self.root = None
        return {"arrays": index, "size": self.end}


def pack(file: SharedFile | str, arrays: dict[str, Any]) -> dict[str, Any]:
    """Write ``arrays`` into ``file`` -> the index ``unpack`` reads them back with."""
    return Packer(file if isinstance(file, SharedFile) else SharedFile(file)).index(arrays)


def unpack(file: SharedFile | str, index: dict[str, Any]) -> dict[str, Any]:
    """The arrays ``pack`` wrote, as views of the file mapped in memory (no copy, and the
    pages of the file, no new ones). They keep the mapping alive; writes to them reach the
    file, which is written over only once none of them is alive (see Arenas)."""
    file = file if isinstance(file, SharedFile) else SharedFile(file)
    root = file.map(index["size"])
    return {name: _view(root, offset, dtype, tuple(shape))
            for name, (offset, dtype, shape) in index["arrays"].items()}
