"""Will it fit? The memory and disk a piece of work needs, told before it starts when the
file sizes say so, and a full disk said as the folder and the bytes rather than ENOSPC.

Memory: what this process may still take is MemAvailable (/proc/meminfo) within its cgroup's
limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the cgroup's own and its parents',
usage net of reclaimable page cache) and its address-space limit (RLIMIT_AS). A stage needs
about ``factor`` x the bytes of its model files (``FACTORS``, per stage, measured where
said). The user who knows better (swap, memory about to be freed) turns the check off with
``WB_MEMORY_CHECK=0`` or ``force=True``.

Disk: ``check_space`` before writing what is known in advance (external data, captures), and
``disk_errors``, around a write, turns ENOSPC / EDQUOT / EFBIG into ``NotEnoughDisk`` naming
the folder, what was being written, the bytes written so far and the space free.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import NotEnoughDisk, NotEnoughMemory

ENV = "WB_MEMORY_CHECK"  # "0", "off", "no" or "false": the memory check is skipped

# Peak resident memory of a stage over the bytes of its model files (weights). Measured here
# (an ONNX of 4 MatMuls, 400 MB of fp32 weights, peak RSS over the baseline after import):
#   onnx.load_model 2.04x (weights inside the .onnx), 1.29x (external data);
#   an ONNX Runtime session made and run once 1.27x, either way.
# "export" and "to_ncnn" start from a torch module already in memory (``module_bytes``):
# their factor is what comes on top of it. From issue 34's figures (a Qwen2-shaped decoder,
# 4 layers, 0.78 GB fp32, in a process of ~1.1 GB with torch and the model loaded): bare
# torch.onnx.export peaked at 5.2 GB (+4.1 GB, 5.3x), wb.export at 7.7 GB (+6.6 GB, 8.5x).
# Estimates, not measured alone: ncnn (weights read into Mats once, 1x, plus the reading),
# simplify (the model loaded, folded, checked by ORT), to_ncnn (the trace, then pnnx holds
# the TorchScript model and its own graph) and compare (each candidate's runner beside the
# torch model: pass the candidates' files; captured tensors come on top, with the inputs).
FACTORS: dict[str, float] = {
    "onnx-load": 2.0,
    "ort-session": 1.5,
    "ncnn-net": 1.5,
    "export": 6.0,
    "simplify": 3.0,
    "to_ncnn": 4.0,
    "compare": 2.0,
}
_NOT_WEIGHTS = (".json", ".npz", ".npy", ".log", ".txt", ".py", ".md", ".html")


@dataclass(frozen=True)
class Available:
    """Bytes this process may still allocate, and what bounds them (e.g. 'MemAvailable')."""

    bytes: int
    bound: str


@dataclass(frozen=True)
class Fit:
    """What a piece of work needs against what is there (``check_fits``' answer)."""

    what: str
    files: tuple[tuple[str, int], ...]  # (file, bytes) of the model, largest first
    model_bytes: int
    factor: float
    need: int
    available: Available | None

    @property
    def fits(self) -> bool:
        return self.available is None or self.need <= self.available.bytes


# -- memory ------------------------------------------------------------------------------------
def available_memory() -> Available | None:
    """The bytes this process may still take (see the module's docstring); None if unknown."""
    rooms: list[Available] = []
    meminfo = _meminfo()
    if meminfo is not None:
        rooms.append(Available(meminfo, "MemAvailable in /proc/meminfo"))
    rooms += _cgroup_rooms()
    if (room := _address_space_room()) is not None:
        rooms.append(Available(room, "the address-space limit (ulimit -v)"))
    return min(rooms, key=lambda r: r.bytes) if rooms else None


def _meminfo() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_rooms() -> list[Available]:
    """Room under each memory limit of this process's cgroup and its ancestors (v2 and v1):
    the limit less the usage net of inactive page cache (which the kernel reclaims first)."""
    rooms = []
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return rooms
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            base, files = Path("/sys/fs/cgroup"), ("memory.max", "memory.current",
                                                   "inactive_file")
        elif "memory" in controllers.split(","):
            base, files = Path("/sys/fs/cgroup/memory"), (
                "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        # the cgroup's folder and its parents; in a cgroup namespace the mount's root is ours
        rel = Path(path.lstrip("/"))
        for folder in {base / rel, *[base / p for p in rel.parents]}:
            if (room := _room(folder, *files)) is not None:
                rooms.append(room)
    return rooms


def _room(folder: Path, limit_file: str, usage_file: str, inactive_key: str
          ) -> Available | None:
    try:
        cap = (folder / limit_file).read_text().strip()
        used = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    if cap == "max" or not cap.isdigit() or int(cap) >= 1 << 60:
        return None
    inactive = 0
    with contextlib.suppress(OSError, ValueError):
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    return Available(max(int(cap) - max(used - inactive, 0), 0),
                     f"the cgroup memory limit {folder / limit_file} ({show(int(cap))})")


def _address_space_room() -> int | None:
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        if cap == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status", encoding="ascii") as f:
            size = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    except (ImportError, OSError, ValueError, StopIteration):
        return None
    return max(cap - size, 0)


def model_files(model: Any) -> list[tuple[str, int]]:
    """(file, bytes) of the weights ``model`` stands for, largest first.

    ``model``: bytes (an int), a file, a folder (its files), an Artifact (its files that
    share the main file's name: ``m.onnx`` + ``m.onnx.data``, ``m.ncnn.param`` +
    ``m.ncnn.bin``), or a list of these. A file path counts its siblings of the same name
    (its external data, its .bin) the same way. A path that is not there counts nothing: its
    loader says it is missing, in its own words."""
    if isinstance(model, bool):
        raise TypeError(f"model sizes: expected bytes, a path or an artifact, got {model!r}")
    if isinstance(model, int):
        return [("(given)", model)]
    if isinstance(model, (str, os.PathLike)):
        return _path_files(Path(model))
    if hasattr(model, "files") and hasattr(model, "path"):
        return _path_files(Path(model.path))
    if isinstance(model, Iterable):  # each file once: [m.param, m.bin] name the same two
        out, seen = [], set()
        for f in (f for m in model for f in model_files(m)):
            if f[0] == "(given)" or f[0] not in seen:
                seen.add(f[0])
                out.append(f)
        return sorted(out, key=lambda f: -f[1])
    raise TypeError(f"model sizes: expected bytes, a path or an artifact, got "
                    f"{type(model).__name__}")


def module_bytes(module: Any) -> int:
    """The bytes of a torch module's parameters and buffers (each tensor once, however many
    modules share it): what it holds in memory, for ``check_fits``."""
    seen: dict[int, int] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _path_files(path: Path) -> list[tuple[str, int]]:
    if path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file()]
    else:
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        found = [p for p in path.parent.glob(f"{stem}.*") if p.is_file()
                 and not p.name.endswith(_NOT_WEIGHTS)] if path.parent.is_dir() else []
        if path.is_file() and path not in found:
            found.append(path)
    return sorted(((str(p), p.stat().st_size) for p in found), key=lambda f: -f[1])


def check_fits(model: Any, what: str, factor: float | None = None, *, stage: str | None = None,
               extra: int = 0, available: int | None = None, force: bool = False) -> Fit:
    """Refuse work that the memory available cannot hold, before it loads anything.

    Args:
        model: what its size is read from (see ``model_files``): bytes, path(s), artifact(s).
        what: the work, as the message says it ("an ONNX Runtime session of ...").
        factor: peak memory over the model's bytes; None: ``FACTORS[stage]``.
        stage: a key of FACTORS, when ``factor`` is None.
        extra: bytes needed on top (inputs, captures), when known.
        available: the bytes available (None: read now, ``available_memory``).
        force: skip the check (so does the environment variable WB_MEMORY_CHECK=0).

    Returns:
        Fit: the need and what is available (``fits`` is True; also when unknown).

    Raises:
        NotEnoughMemory: naming the files, their size, the need, what is available, the
            limit that bounds it, and what to do.
    """
    if factor is None:
        if stage not in FACTORS:
            raise ValueError(f"stage={stage!r}: expected one of {sorted(FACTORS)} or a factor")
        factor = FACTORS[stage]
    files = tuple(model_files(model))
    size = sum(b for _, b in files)
    need = int(size * factor) + int(extra)
    avail = Available(int(available), "available= given") if available is not None \
        else available_memory()
    fit = Fit(what, files, size, factor, need, avail)
    if fit.fits or force or os.environ.get(ENV, "").lower() in ("0", "off", "no", "false"):
        return fit
    raise NotEnoughMemory(
        f"{what} needs about {show(need)} of memory and {show(avail.bytes)} is available "
        f"(bounded by {avail.bound}): the model's files are {show(size)} "
        f"({_list(files)}), and this work holds about {factor:g}x that"
        + (f" plus {show(extra)}" if extra else ""),
        "free memory first (close other notebook kernels and programs, del large objects "
        "and call gc.collect()), compare fewer candidates at a time, keep the weights as "
        "external data (ONNX larger than 2 GB must), or run on a machine with more memory; "
        f"if you know it fits (swap, memory about to be freed), set {ENV}=0 to skip this "
        "check", need=need, available=avail.bytes, files=[f for f, _ in files])


# -- disk --------------------------------------------------------------------------------------
def free_space(folder: str | os.PathLike[str]) -> int:
    """Bytes free for writing in ``folder`` (its nearest existing ancestor)."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_space(folder: str | os.PathLike[str], need: int, what: str,
                free: int | None = None) -> None:
    """Refuse to start writing ``need`` bytes into ``folder`` when it has less free.

    Raises:
        NotEnoughDisk: naming the folder, what would be written, the need and the space.
    """
    free = free_space(folder) if free is None else free
    if need > free:
        raise NotEnoughDisk(
            f"{what} needs {show(need)} in {str(folder)!r}, which has {show(free)} free",
            _disk_hint(folder), folder=str(folder), need=need, free=free)


_FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
         errno.EFBIG: "a file grew past the largest this process may write (ulimit -f)"}


@contextlib.contextmanager
def disk_errors(folder: str | os.PathLike[str], what: str, need: int | None = None,
                written_in: str | os.PathLike[str] | None = None, removed: bool = False
                ) -> Iterator[None]:
    """Within it, a write that fills the disk (ENOSPC, EDQUOT, EFBIG) raises NotEnoughDisk
    naming ``folder``, ``what``, ``need`` when known (else the bytes in ``written_in``, the
    folder written into, as a lower bound) and the space free. The caller removes what it had
    written (a staging folder does) and says so with ``removed``."""
    try:
        yield
    except NotEnoughDisk:
        raise
    except Exception as e:  # also a stage's own error wrapping the OSError (ExportError...)
        full = _full_cause(e)
        if full is None:
            raise
        raise disk_full(full, folder, what, need, written_in, removed) from e


def _full_cause(error: BaseException) -> OSError | None:
    """``error`` or the exception it was raised from that says the disk is full, if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _FULL:
            return error
        error = error.__cause__ or error.__context__
    return None


def disk_full(error: OSError, folder: str | os.PathLike[str], what: str,
              need: int | None = None, written_in: str | os.PathLike[str] | None = None,
              removed: bool = False) -> NotEnoughDisk:
    """The NotEnoughDisk for ``error`` (ENOSPC and kin) met writing ``what`` in ``folder``."""
    written = _bytes_in(Path(written_in)) if written_in is not None else 0
    free = free_space(folder)
    if need:
        said = f"it needs {show(need)} and {show(free)} is free"
    elif written:  # the room it had: what it wrote (freed when removed) and what is left
        said = (f"{show(written)} had been written when the disk filled, so it needs more "
                f"than the {show(written + free)} there was room for")
    else:  # nothing of it written here: what filled the disk was written elsewhere
        said = f"{show(free)} is free on that disk now"
    return NotEnoughDisk(
        f"{what} could not be written in {str(folder)!r}: {_FULL[error.errno]} "
        f"({os.strerror(error.errno)}); {said}"
        + ("; what had been written was removed" if removed else ""),
        _disk_hint(folder), folder=str(folder), need=need or written or None,
        free=free)


def _disk_hint(folder: str | os.PathLike[str]) -> str:
    return (f"free space on the disk holding {str(folder)!r} (remove old runs: workspaces "
            "under workbench-runs/, sweep cells), or point the workspace at a larger disk: "
            "wb.Workspace('/bigger/disk/runs')")


def _bytes_in(folder: Path) -> int:
    if folder.is_file():
        return folder.stat().st_size
    total = 0
    with contextlib.suppress(OSError):
        for p in folder.rglob("*"):
            with contextlib.suppress(OSError):
                if p.is_file():
                    total += p.stat().st_size
    return total


def show(n: int) -> str:
    """``n`` bytes, exact and in GiB/MiB: '4,800,000,000 bytes (4.47 GiB)'."""
    unit, size = ("GiB", n / 2**30) if n >= 2**30 else ("MiB", n / 2**20)
    return f"{n:,} bytes ({size:.3g} {unit})"


def _list(files: tuple[tuple[str, int], ...], most: int = 3) -> str:
    shown = ", ".join(f"{f}: {show(b)}" for f, b in files[:most])
    return shown + (f" and {len(files) - most} more" if len(files) > most else "")


__all__ = ["FACTORS", "Available", "Fit", "available_memory", "check_fits", "check_space",
           "disk_errors", "disk_full", "free_space", "model_files", "module_bytes", "show"]
