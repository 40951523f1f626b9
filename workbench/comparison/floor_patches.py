"""The input patch norms of weighted ops (Cauchy-Schwarz), for the fp32 noise floor
(noise_floor.py).

A convolution's or a matmul's output sums |w| * |x| over its row of weights and a patch of
its input. sum_k |w_ck| * max |x| bounds it cheaply but assumes every input at its maximum:
5-10 times too much on activations (heavy-tailed, post-ReLU), which would hide a weight
moved by 1e-3 of its max in a long reduction. By Cauchy-Schwarz the sum is also at most
||w_c||_2 * ||x_patch||_2; the largest patch norm of the input (per group of input channels)
is one pass over it: the sum of x^2 over each group's channels at every position (a
compiled kernel, numba as in metrics.py; numpy without it), then the largest box sum of the
kernel's (dilated) extent. Once per tensor and input set.
"""

from __future__ import annotations

import math
from typing import Any

from .metrics import _cache_lock

_KERNEL: Any = None  # the numba dispatcher once built; False if numba cannot be imported
_LOADED: set[bool] = set()  # the variants (writeable or not) _KERNEL has run on here


def _group_squares(x: Any, groups: int, out: Any) -> Any:
    """out[b, g, p] = sum of x[b, c, p]^2 over group g's channels (x: (B, C, P) float32)."""
    nb, nc, npos = x.shape
    per = nc // groups
    for b in range(nb):
        for c in range(nc):
            g = c // per
            for p in range(npos):
                v = x[b, c, p]
                out[b, g, p] += v * v
    return out


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is None:
        try:
            from numba import njit

            opts = {"nogil": True, "error_model": "numpy", "fastmath": {"reassoc", "nsz"}}
            try:
                _KERNEL = njit(cache=True, **opts)(_group_squares)
            except RuntimeError:  # no writable cache dir: compiled in memory
                _KERNEL = njit(**opts)(_group_squares)
        except ImportError:
            _KERNEL = False
    return _KERNEL


def patch_norms(x: Any, cin: int, groups: int, window: tuple[int, ...]) -> Any:
    """The largest L2 norm of an input patch of each group: ``x`` laid out (..., cin,
    *spatial) with ``len(window)`` spatial axes (0: rows of ``cin`` values, as a matmul
    reads them), a patch ``window`` wide on each. None when ``x`` is not so laid out."""
    import numpy as np

    x = np.asarray(x)
    nd = len(window)
    if x.dtype.kind != "f" or x.size == 0 or groups < 1 or cin % groups:
        return None
    if nd == 0:
        if x.size % cin:
            return None
        x3 = x.reshape(-1, cin, 1)
        spatial: tuple[int, ...] = (1,)
    else:
        if x.ndim < nd + 1 or x.shape[-nd - 1] != cin or nd > 2:
            return None
        spatial = tuple(x.shape[-nd:])
        x3 = x.reshape(-1, cin, math.prod(spatial))
    x3 = np.ascontiguousarray(x3, dtype=np.float32)
    sq = np.zeros((x3.shape[0], groups, x3.shape[2]), np.float32)
    kernel = _kernel()
    if kernel:
        key = bool(x3.flags.writeable)  # a read-only array is another numba type
        if key in _LOADED:
            kernel(x3, groups, sq)
        else:  # compiled or loaded from numba's cache: one process at a time
            with _cache_lock():
                kernel(x3, groups, sq)
            _LOADED.add(key)
    else:
        sq = np.square(x3, dtype=np.float32).reshape(x3.shape[0], groups, cin // groups,
                                                     -1).sum(axis=2)
    if not np.isfinite(sq).all():
        return None
    if nd:
        sq = _box_sums(sq.reshape(sq.shape[0], groups, *spatial), window)
    return np.sqrt(sq.reshape(sq.shape[0], groups, -1).max(axis=(0, 2)).astype(np.float64))


def _box_sums(q: Any, window: tuple[int, ...]) -> Any:
    """Sums of ``q`` (B, G, *spatial, >= 0) over every window of the given extent (clipped
    to the axis): every patch a kernel reads, padded or not, lies within one of them."""
    import numpy as np

    out = q.astype(np.float64)
    for k, axis in zip(window, range(2, 2 + len(window)), strict=True):
        k = min(k, out.shape[axis])
        if k <= 1:
            continue
        c = np.cumsum(out, axis=axis)
        zero = np.zeros_like(np.take(c, [0], axis=axis))
        c = np.concatenate([zero, c], axis=axis)
        out = np.take(c, range(k, c.shape[axis]), axis=axis) - \
            np.take(c, range(0, c.shape[axis] - k), axis=axis)
    return out


def matmul_norms(a: Any, b: Any) -> float | None:
    """max ||row of a|| * max ||column of b||: a bound on sum |a_ik| |b_kj| (a @ b)."""
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind != "f" or b.dtype.kind != "f" or a.ndim < 1 or b.ndim < 2 or not a.size:
        return None
    ra = np.sqrt(np.square(a, dtype=np.float64).sum(axis=-1).max())
    rb = np.sqrt(np.square(b, dtype=np.float64).sum(axis=-2).max())
    top = float(ra * rb)
    return top if math.isfinite(top) else None
