"""The glibc heap policy of the processes that run models: keep freed memory, one arena.

capture="all" returns every activation in fresh arrays, run after run, on several threads;
glibc's defaults hand that memory back to the OS and fault it in again each run. Linux and
glibc only; nothing elsewhere.
"""

from __future__ import annotations

import functools
import platform


def _mallopt(*settings: tuple[int, int]) -> None:
    """glibc's mallopt(param, value) for each setting; nothing off Linux/glibc, or where
    ctypes cannot load (an interpreter without libffi)."""
    try:
        import ctypes  # deferred: it needs libffi, which a minimal sysroot may lack
    except ImportError:
        return
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # pragma: no cover
        return
    for param, value in settings:
        libc.mallopt(param, value)


@functools.cache
def keep_freed_memory() -> None:
    """Keep freed heap memory in this process rather than handing it back to the OS (glibc).

    capture="all" returns every activation (~190 MB on a ResNet-50) in fresh arrays. glibc
    serves blocks that large with mmap at first, and trims the heap top once they are
    freed, so every capture faulted each page in again (~30k page faults for torch, more
    than its hooks cost). With fixed thresholds the next capture reuses that memory. Called
    by the runners that capture, and by the worker process."""
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    # 32 MB: glibc's own dynamic maximum
    _mallopt((m_mmap_threshold, 32 << 20), (m_trim_threshold, 512 << 20))


def one_heap() -> None:
    """One malloc arena for every thread of this process (glibc), for the worker process.

    glibc gives each new thread a heap (arena) of its own and keeps freed memory in it, so
    runs on several threads (the worker runs ONNX Runtime and ncnn at once for compare)
    each kept a full run's memory: +200 MB on a ResNet-50's plain runs. One arena lets them
    reuse each other's freed memory; the runs allocate large blocks, so its lock is cheap."""
    m_arena_max = -8  # malloc.h
    _mallopt((m_arena_max, 1))
