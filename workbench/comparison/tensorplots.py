"""Plots inside one aligned tensor: the histogram of |ref - cand|, a channel's difference
heatmap, and reference against candidate."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from workbench.errors import InputError

from .figures import _new_figure, _num, _pair

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def error_histogram(ref: Any, cand: Any, bins: int = 60, tolerance: float | None = None) -> Figure:
    """Histogram of |ref − cand| over log-spaced bins; exact zeros are counted in the title.

    A log axis cannot show 0, so exact matches are reported rather than binned; NaN/inf
    differences are counted too. ``tolerance`` draws a vertical line, with how many are above.
    """
    import numpy as np

    if isinstance(bins, bool) or not isinstance(bins, int | np.integer) or bins < 1:
        raise InputError(f"bins must be a positive int, got {bins!r}", hint="e.g. bins=60")
    a, b = _pair(ref, cand)
    d = np.abs(a - b).ravel()
    n = d.size
    finite = d[np.isfinite(d)]
    n_nonfinite = n - finite.size
    n_zero = int((finite == 0).sum())
    pos = finite[finite > 0]

    fig, ax = _new_figure(7.5, 4.5)
    if pos.size:
        lo, hi = float(pos.min()), float(pos.max())
        if hi <= lo * 1.0001:
            lo, hi = lo / 2, hi * 2
        ax.hist(pos, bins=np.geomspace(lo, hi, int(bins) + 1), color="C0", alpha=0.8,
                label=f"{pos.size} elements with |diff| > 0")
    else:
        ax.text(0.5, 0.5, "no positive difference to bin", transform=ax.transAxes,
                ha="center", va="center", color="0.4")
    ax.set_xscale("log")
    if tolerance is not None:
        tol = _num(tolerance)
        if not (math.isfinite(tol) and tol > 0):
            raise InputError(f"tolerance must be a positive number, got {tolerance!r}",
                             hint="Give the abs bound, e.g. tolerance=1e-4.")
        above = int((finite > tol).sum()) + n_nonfinite
        ax.axvline(tol, color="red", linestyle="--", linewidth=1.2,
                   label=f"tolerance {tol:g}: {above} of {n} above")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_xlabel("|ref − cand| (tensor units, log scale)")
    ax.set_ylabel("elements (count)")
    extra = f", {n_nonfinite} NaN/inf" if n_nonfinite else ""
    ax.set_title(f"|ref − cand| over {n} elements: {n_zero} exactly zero (not binned){extra}",
                 fontsize=10)
    return fig


def diff_heatmap(ref: Any, cand: Any, channel: int = 0) -> Figure:
    """|ref − cand| over one channel's spatial plane, with a colour bar.

    NCHW takes the channel of a batch of 1 (the batch axis is squeezed away), CHW the channel,
    a 2-D array is its own single channel and a 1-D one is drawn as a row.
    """
    import numpy as np
    from matplotlib import colormaps

    a, b = _pair(ref, cand)
    d = np.abs(a - b)
    shape = d.shape
    if d.ndim == 4:
        if shape[0] != 1:
            raise InputError(f"diff_heatmap takes one sample; the tensors have shape {shape} "
                             f"(batch {shape[0]})",
                             hint="Index one sample first, e.g. diff_heatmap(ref[0], cand[0]).")
        d = d[0]
    elif d.ndim == 1:
        d = d[None, None, :]
    elif d.ndim == 2:
        d = d[None]
    elif d.ndim != 3:
        raise InputError(f"diff_heatmap takes NCHW, CHW, 2-D or 1-D tensors, got shape {shape}",
                         hint="Reshape to (C, H, W) first.")
    n_ch = d.shape[0]
    if isinstance(channel, bool) or not isinstance(channel, int | np.integer) \
            or not 0 <= channel < n_ch:
        raise InputError(f"channel {channel!r} is out of range for shape {shape}: valid "
                         f"channels are 0..{n_ch - 1}",
                         hint=f"Pass channel= an int from 0 to {n_ch - 1}.")
    plane = d[int(channel)]
    img = np.ma.masked_invalid(plane)
    h, w = plane.shape

    fig, ax = _new_figure(min(max(5.0, 1.5 + 4.5 * w / max(h, 1)), 12), 4.5)
    im = ax.imshow(img, cmap=colormaps["magma"].with_extremes(bad="cyan"),
                   interpolation="nearest",
                   aspect="equal" if max(h, w) <= 8 * min(h, w) else "auto")
    # ticks written in full ("4e-05"): no offset text ("1e-5") above the bar, by the title
    fig.colorbar(im, ax=ax, label="|ref − cand| (tensor units)", format="%.2g")
    ax.set_xlabel("x (width index)")
    ax.set_ylabel("y (height index)")
    bad = int(plane.size - img.count())
    if img.count():
        y, x = np.unravel_index(int(np.ma.argmax(img)), plane.shape)
        where = f"max {float(img.max()):.3g} at (y={y}, x={x})"
    else:
        where = "no finite difference"
    extra = f", {bad} NaN/inf in cyan" if bad else ""
    ax.set_title(f"|ref − cand|, channel {int(channel)} of {n_ch} (shape {shape})\n"
                 f"{where}{extra}", fontsize=10)  # two lines: within the plot's width
    return fig


def ref_vs_cand_scatter(ref: Any, cand: Any, max_points: int = 20000, seed: int = 0) -> Figure:
    """Candidate against reference value per element, with the y = x line of perfect agreement.

    Above ``max_points`` elements a seeded random subset is drawn, so the figure is repeatable;
    elements where either side is NaN/inf are left out and counted in the title.
    """
    import numpy as np

    if isinstance(max_points, bool) or not isinstance(max_points, int | np.integer) \
            or max_points < 1:
        raise InputError(f"max_points must be a positive int, got {max_points!r}",
                         hint="e.g. max_points=20000")
    a, b = _pair(ref, cand)
    a, b = a.ravel(), b.ravel()
    ok = np.flatnonzero(np.isfinite(a) & np.isfinite(b))
    n, n_ok = a.size, ok.size
    if n_ok > max_points:
        ok = np.sort(np.random.default_rng(seed).choice(ok, size=int(max_points), replace=False))
    x, y = a[ok], b[ok]

    fig, ax = _new_figure(5.8, 5.5)
    ax.scatter(x, y, s=4 if x.size > 2000 else 14, alpha=0.6, color="C0", linewidths=0,
               rasterized=True, label="elements", zorder=3)
    if x.size:
        lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
    else:
        lo, hi = 0.0, 1.0
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    ax.plot([lo, hi], [lo, hi], color="0.3", linestyle="--", linewidth=0.8, label="y = x",
            zorder=2)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("reference value (tensor units)")
    ax.set_ylabel("candidate value (tensor units)")
    shown = f"all {n}" if x.size == n else f"{x.size} of {n}"
    extra = f"; {n - n_ok} with NaN/inf left out" if n_ok < n else ""
    ax.set_title(f"candidate vs reference: {shown} elements{extra}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig
