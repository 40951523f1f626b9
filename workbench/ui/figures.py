"""A matplotlib figure as an ``<img>`` for the notebook views (CompareView, GraphView's side
panel, LinkedView): at its own size, drawn at twice the pixels for high-density screens."""

from __future__ import annotations

import base64
import io
from typing import Any

CSS_DPI = 96  # CSS pixels per inch: a figure's inches shown at this size, text at its points
DENSITY = 2  # device pixels per CSS pixel drawn: sharp on high-density screens


def figure_html(fig: Any, density: int = DENSITY) -> str:
    """A figure as an <img>: its own size in CSS pixels (inches x 96: text at its point size,
    never shrunk to the output's width; a wide figure scrolls sideways), drawn at ``density``
    device pixels per CSS pixel (PNG bytes: the same whatever matplotlib backend is active)."""
    width, height = (round(v * CSS_DPI) for v in fig.get_size_inches())
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=CSS_DPI * density)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f"<div class='wb-figure' style='overflow-x:auto;max-width:100%'>"
            f"<img src='data:image/png;base64,{data}' width='{width}' height='{height}' "
            f"style='max-width:none;width:{width}px;height:{height}px' alt='figure'></div>")
