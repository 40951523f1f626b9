"""The glibc heap policy of the processes that run models: keep freed memory, one arena,
and freed blocks kept for reuse while torch's exporter copies the weights.

capture="all" returns every activation in fresh arrays, run after run, on several threads;
glibc's defaults hand that memory back to the OS and fault it in again each run. Linux and
glibc only; nothing elsewhere.

The environment's ``MALLOC_*`` settings are not taken as the user's choice: dask's nanny
writes ``MALLOC_TRIM_THRESHOLD_`` into its parent's ``os.environ`` before it spawns workers
(``distributed.nanny.pre-spawn-environ``), so after a sweep every process started later
carries it (a check that deferred to it stopped these policies in the test suite).
"""

from __future__ import annotations

import contextlib
import functools
import platform
from collections.abc import Iterator
from typing import Any

# malloc.h
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
INT_MAX = 2**31 - 1  # mallopt takes an int


@functools.cache
def _libc() -> Any:
    """glibc through ctypes; None off Linux/glibc, or where ctypes cannot load (an
    interpreter without libffi)."""
    try:
        import ctypes  # deferred: it needs libffi, which a minimal sysroot may lack
    except ImportError:
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # pragma: no cover
        return None


def _mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's mallopt(param, value) for each setting; False (nothing done) off glibc."""
    libc = _libc()
    if libc is None:
        return False
    for param, value in settings:
        libc.mallopt(param, value)
    return True


MAPPED_FROM = (M_MMAP_THRESHOLD, 32 << 20)  # glibc's own dynamic maximum
KEPT = (MAPPED_FROM, (M_TRIM_THRESHOLD, 512 << 20))


@functools.cache
def keep_freed_memory() -> None:
    """Keep freed heap memory in this process rather than handing it back to the OS (glibc).

    capture="all" returns every activation (~190 MB on a ResNet-50) in fresh arrays. glibc
    serves blocks that large with mmap at first, and trims the heap top once they are
    freed, so every capture faulted each page in again (~30k page faults for torch, more
    than its hooks cost). With fixed thresholds the next capture reuses that memory. Called
    by the runners that capture, by the worker process, and left set by ``heap_held``."""
    _mallopt(*KEPT)


@contextlib.contextmanager
def heap_held() -> Iterator[bool]:
    """Freed blocks kept for reuse while the body runs, none handed back to the OS (glibc):
    blocks under 32 MB from the heap, larger ones in mappings of their own. After it,
    ``keep_freed_memory``'s policy and the freed memory returned to the OS (malloc_trim).
    Yields whether the policy applies here.

    torch's exporter copies each weight several times (constant folding's transposes, the
    protobuf's bytes, the files it writes). With glibc's defaults a freed block is often
    handed back and the next copy faults its pages in again. Measured on Qwen2-shaped
    decoders, the exporter alone on one torch thread (stages/export.py); page faults,
    seconds, peak:

    - 24 layers (2.5 GB written as a file per tensor): glibc's defaults 4.0-7.7M, 24-30 s,
      4.1 or 6.4 GB from run to run; held 3.6M, 20-24 s, 4.1 GB in each of eight runs.
    - 4 layers (1.3 GB, one protobuf in memory): defaults 5.6M, 18 s, 5.2 GB; held 4.9M,
      17 s, 5.2 GB.

    Every block from the heap (no mapping at all, mallopt's ``M_MMAP_MAX`` 0) faulted least (0.42M,
    14-16 s at 24 layers) but grew the 4-layer peak to 6.6 GB: blocks of the model's size
    (the embedding, the protobuf's bytes) found no freed place large enough and the heap
    grew past them; blocks to 600 MB from the heap, 5.3 GB at 24 layers. Not used.

    The process's own policy afterwards is ``keep_freed_memory``'s: glibc cannot be put
    back in its dynamic mode."""
    if not _mallopt(MAPPED_FROM, (M_TRIM_THRESHOLD, INT_MAX)):
        yield False
        return
    try:
        yield True
    finally:
        _mallopt(*KEPT)
        _libc().malloc_trim(0)


def one_heap() -> None:
    """One malloc arena for every thread of this process (glibc), for the worker process.

    glibc gives each new thread a heap (arena) of its own and keeps freed memory in it, so
    runs on several threads (the worker runs ONNX Runtime and ncnn at once for compare)
    each kept a full run's memory: +200 MB on a ResNet-50's plain runs. One arena lets them
    reuse each other's freed memory; the runs allocate large blocks, so its lock is cheap."""
    _mallopt((M_ARENA_MAX, 1))
