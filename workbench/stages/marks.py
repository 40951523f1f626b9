"""``wb.mark(x, "backbone_out")``: a named point in forward() where a model may be cut.

Outside ``wb.partition`` a mark is the identity (one attribute read): the model trains,
runs and exports as written. While a partition runs the model, the calling thread's handler
sees each mark: it records the value, substitutes the part's input for it, or stops the
forward once a part's outputs are all known (stages/partition_spans.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_LOCAL = threading.local()  # .handler: (name, value) -> value, while a partition runs


def mark(x: Any, name: str) -> Any:
    """Name ``x`` (a tensor, or a tuple/list of them) as a point where the model may be cut.

    Args:
        x: the value at this point of forward().
        name: the boundary's name; a tuple/list value gives tensors ``name.0``, ``name.1``...

    Returns:
        ``x`` itself outside ``wb.partition``; inside, what the partition feeds there.

    Example:
        ``feats = wb.mark(self.backbone(x), "backbone_out")``
    """
    handler = getattr(_LOCAL, "handler", None)
    return x if handler is None else handler(name, x)


@contextlib.contextmanager
def marking(handler: Callable[[str, Any], Any]) -> Iterator[None]:
    """Route the calling thread's marks to ``handler`` during the block."""
    previous = getattr(_LOCAL, "handler", None)
    _LOCAL.handler = handler
    try:
        yield
    finally:
        _LOCAL.handler = previous
