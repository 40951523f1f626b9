"""What every comparison plot shares: numbers and arrays checked on the way in, a bare
matplotlib Figure that a Jupyter cell shows (no pyplot, no global figures), and ``Figures``,
the list of them a report returns, which a cell shows as figures too."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from workbench.errors import InputError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_RECORDS_HINT = ("Pass the comparison records: a list of dicts, one per aligned tensor per "
                 "candidate per mode, with keys candidate, mode, order, name, reference, "
                 "op_type, the metrics (max_abs, mean_abs, max_rel, cosine, snr_db), "
                 "tolerance and passed.")


def _num(v: Any) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        raise InputError(f"expected a number in the records, got {v!r}",
                         hint=_RECORDS_HINT) from None


def _array(x: Any, what: str) -> Any:
    import numpy as np

    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} is not a numeric array ({type(x).__name__}): {e}",
                         hint="Pass numpy arrays or torch tensors of numbers.") from None
    if a.size == 0:
        raise InputError(f"{what} is empty (shape {a.shape}): there is nothing to plot",
                         hint="Pass the tensors of one aligned op, e.g. the first divergence.")
    return a


def _pair(ref: Any, cand: Any) -> tuple[Any, Any]:
    """ref and cand as float64 arrays of one shape; a leading batch axis of 1 on one side goes."""
    from .metrics import squeeze_to_match

    return squeeze_to_match(_array(ref, "ref"), _array(cand, "cand"))


def _show_in_ipython() -> None:
    """Let IPython render a bare Figure as a PNG. Without pyplot no backend registers that
    formatter, so in a fresh kernel a figure showed as ``<Figure size ...>`` text."""
    import sys

    if "IPython" not in sys.modules:
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    png = shell.display_formatter.formatters["image/png"]
    from matplotlib.figure import Figure

    if _has_type(png, Figure):  # a backend (or %matplotlib inline) already did it
        return
    from IPython.core.pylabtools import select_figure_formats

    select_figure_formats(shell, {"png"})


def _has_type(formatter: Any, cls: type) -> bool:
    try:
        formatter.lookup_by_type(cls)
    except KeyError:
        return False
    return True


def _new_figure(width: float, height: float) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    _show_in_ipython()
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


class Figures(list):
    """The figures a report draws (``plot``, ``plot_tensor``): a list, to index and save,
    that a notebook shows as the figures themselves, each in an output of its own as
    ``display(fig)`` shows one (a plain list showed as "[<Figure size 800x550 with 1 Axes>,
    ...]" text and no figure). A None place (a plot that does not apply) shows nothing."""

    def _ipython_display_(self) -> None:
        import io

        from IPython.display import display

        for fig in self:
            if fig is None:
                continue
            buf = io.BytesIO()  # the PNG whatever formatters the kernel has (no pyplot needed)
            fig.savefig(buf, format="png", dpi=fig.dpi)
            display({"image/png": buf.getvalue(), "text/plain": repr(fig)}, raw=True)
