"""Inputs too large for this machine's memory, said as an InputError naming the input.

A run allocates copies of its inputs and, on the way, activations that grow with them. When
an allocation fails, each backend says so in its own words (torch's ``DefaultCPUAllocator:
can't allocate memory``, onnxruntime's ``Failed to allocate memory for requested buffer``,
numpy's ``MemoryError`` in the worker, ncnn a bare -100); none names the input or what would
fit. Here: the memory this process may still take (``/proc/meminfo``'s MemAvailable, within a
cgroup's limit), an up-front check of the copies a run makes of its inputs, and the error.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from typing import Any

from ..capacity import available_memory
from ..errors import InputError, RemoteError

# what the backends say when an allocation fails (group 1: the bytes asked for)
_SAID = (
    re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried "
               r"to allocate (\d+) bytes"),
    re.compile(r"Failed to allocate memory for requested buffer of size (\d+)"),
)
# ENOMEM from the worker's run (mapping the run's files, numpy's arrays): a run's allocation;
# here it may be anything (starting a process), so it is left as it is
_ENOMEM = re.compile(r"\[Errno 12\] Cannot allocate memory")


def available_bytes() -> int | None:
    """Bytes this process may still allocate: capacity.available_memory (MemAvailable within
    its cgroup's limits and its address-space limit), else the free physical pages; None when
    neither can be read."""
    room = available_memory()
    if room is not None:
        return room.bytes
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def show(n: int) -> str:
    """``n`` bytes, exact and in GiB/MiB: '4,800,000,000 bytes (4.47 GiB)'."""
    unit, size = ("GiB", n / 2**30) if n >= 2**30 else ("MiB", n / 2**20)
    return f"{n:,} bytes ({size:.3g} {unit})"


def allocation_failure(error: BaseException) -> int | None:
    """The bytes a failed allocation asked for when ``error`` is one (0: size not said), or
    None when ``error`` is not an allocation failure."""
    text = str(getattr(error, "message", error))
    for p in _SAID:
        if (m := p.search(text)) is not None:
            return int(m.group(1))
    remote = isinstance(error, RemoteError)
    if isinstance(error, MemoryError) or (remote and error.kind == "MemoryError") or (
            remote and error.kind == "OSError" and _ENOMEM.search(text)):
        return 0
    return None


def _largest(feed: dict[str, Any]) -> tuple[str, Any, int]:
    """(name, value, bytes) of the largest input (numel x itemsize, as a copy would hold)."""
    sized = [(name, v, _nbytes(v)) for name, v in feed.items()]
    return max(sized, key=lambda t: t[2])


def _nbytes(v: Any) -> int:
    itemsize = getattr(getattr(v, "dtype", None), "itemsize", 4)  # numpy's and torch's
    return math.prod(int(d) for d in getattr(v, "shape", ())) * int(itemsize)


def _describe(name: str, v: Any, nbytes: int, model: str) -> str:
    dtype = str(getattr(v, "dtype", "?")).replace("torch.", "")
    return (f"input {name!r} of {model} ({dtype} {list(getattr(v, 'shape', ()))}: "
            f"{show(nbytes)})")


def check_fits(feed: dict[str, Any], model: str, copies: int = 1, itemsize: int | None = None,
               what: str = "the run copies it") -> None:
    """Refuse, before anything is allocated, inputs whose own copies cannot fit: ``copies``
    times their bytes (numel x ``itemsize``, or their dtype's) against the memory available.
    A broadcast view (``expand``) or a lazily made array holds little, a copy holds it all.

    Raises:
        InputError: naming the largest input, its bytes, the copies made and what is free.
    """
    if not feed:
        return
    sizes = {n: (_nbytes(v) if itemsize is None else
                 math.prod(int(d) for d in getattr(v, "shape", ())) * itemsize)
             for n, v in feed.items()}
    need = copies * sum(sizes.values())
    avail = available_bytes()
    if avail is None or need <= avail:
        return
    name = max(sizes, key=sizes.__getitem__)
    others = f"; all inputs {show(sum(sizes.values()))}" if len(sizes) > 1 else ""
    raise InputError(
        f"{_describe(name, feed[name], sizes[name], model)} does not fit the memory "
        f"available: {what} ({copies} cop{'y' if copies == 1 else 'ies'}: {show(need)}{others}) "
        f"and {show(avail)} is available",
        f"feed a smaller input: at most about {show(avail // max(copies, 1))} in all; "
        "activations grow with the input, so a run needs more still (tiles or crops of it, "
        "or a lower resolution)")


def too_large(feed: dict[str, Any], model: str, tried: int | None, said: str,
              asked: str = "") -> InputError:
    """The InputError for a run that could not allocate memory on ``feed``.

    Args:
        feed: the run's inputs by name (arrays or tensors); the largest is named.
        model: the model, as messages name it.
        tried: the bytes the failed allocation asked for (None or 0: not said).
        said: the backend's own words, for the record (its first line).
        asked: what failed, when not "an allocation of ``tried`` bytes".
    """
    name, value, nbytes = _largest(feed) if feed else ("?", None, 0)
    avail = available_bytes()
    have = f"{show(avail)} is available" if avail is not None else "the free memory is unknown"
    asked = asked or (f"an allocation of {show(tried)} failed during the run" if tried else
                      "an allocation failed during the run")
    where = (_describe(name, value, nbytes, model) if feed else f"the inputs of {model}")
    hint = ("feed a smaller input (tiles or crops of it, a lower resolution, a smaller batch): "
            "the activations grow with it")
    if tried and avail:
        factor = math.ceil(tried / max(avail, 1))
        if factor > 1:
            hint += (f"; that alone is {factor}x what is available, so an input "
                     f"about {factor}x smaller in elements (at most ~{show(nbytes // factor)}) "
                     "is a first guess")
    quoted = next((m.group(0) for p in _SAID if (m := p.search(said))), None)
    first = quoted or next((ln.strip() for ln in said.splitlines() if ln.strip()), "")[:200]
    return InputError(f"{where} is too large for the memory available: {asked}, and {have} "
                      f"({first})", hint + "; or free memory held elsewhere")


@contextlib.contextmanager
def said_as_input_error(feed: dict[str, Any], model: str) -> Iterator[None]:
    """Within it, an allocation failure (MemoryError, or one carried back from the worker as
    a RemoteError: numpy's, an mmap's ENOMEM) becomes ``too_large`` on ``feed``."""
    try:
        yield
    except Exception as e:
        if isinstance(e, InputError) or (tried := allocation_failure(e)) is None:
            raise
        raise too_large(feed, model, tried, str(getattr(e, "message", e))) from e
