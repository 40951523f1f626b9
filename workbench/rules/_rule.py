"""The Rule type: one op family, its onnxscript patterns, the check of its constants, its forms.

A rule is data, not an engine: ``workbench.stages.raising`` turns each of its patterns into
an onnxscript ``RewriteRule`` (pattern + replacement + check) and applies it with
onnxscript's rewriter on an onnx-ir model. Helpers here read constants off ``ir.Value``s
for checks (``const``, ``scalar``, ``ints``, ``close``) and say why a check fails (``fail``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

DOMAIN = "pkg.workbench"  # the domain of the local functions target="functions" emits
_CONST_IDS = itertools.count()


@dataclass(frozen=True)
class Rule:
    """One op family: patterns tried in order, a check of their constants, the raised forms.

    - ``name``: the PyTorch op ("GroupNorm", "GELU"); also the name of the local function
      ``target="functions"`` emits (domain ``pkg.workbench``), whose body is the matched
      subgraph.
    - ``patterns``: onnxscript pattern functions ``(op, x, c_eps, ...) -> value``; each
      parameter after ``op`` is a pattern variable, bound on a match. Longer patterns first:
      each pattern is applied over the whole graph before the next one.
    - ``check``: ``(ctx, **bindings) -> bool | MatchResult``: True only if the constants
      really are what the op needs; return ``fail("why")`` otherwise (the reason is kept).
    - ``standard``: ``(op, **bindings) -> value`` building the standard ONNX op, or None when
      ONNX has none (then the function form is always used). ``opset`` is the first ai.onnx
      opset that has it (``standard_op`` its name, for messages); below it the engine falls
      back to the function form and says which opset is needed.
    - ``inputs``: the bindings passed to the function call, in order (missing ones are
      skipped); every other binding must be a constant (it is copied into the body).
    - ``commute``: also try both operand orders of every Add/Mul whose operands are both
      computed. The engine first moves constant operands of Add/Mul to the second place, so
      patterns write constants second and name their variables ``c_*`` (those nodes are
      not swapped): 2^k variants for k such nodes.
    - ``priority``: lower runs first (a larger form before a smaller one it contains).
    """

    name: str
    patterns: tuple[Callable[..., Any], ...]
    check: Callable[..., Any]
    standard: Callable[..., Any] | None = None
    opset: int | None = None
    standard_op: str = ""
    inputs: tuple[str, ...] = ("x",)
    commute: bool = False
    priority: int = 100
    doc: str = ""

    def __post_init__(self) -> None:
        if callable(self.patterns):
            object.__setattr__(self, "patterns", (self.patterns,))
        else:
            object.__setattr__(self, "patterns", tuple(self.patterns))
        if not self.patterns or not all(callable(p) for p in self.patterns):
            raise TypeError(f"Rule {self.name!r}: patterns must be one or more callables")
        if self.standard is not None and self.opset is None:
            raise TypeError(f"Rule {self.name!r}: a standard form needs opset= (the first "
                            "ai.onnx opset that has the op)")

    def __repr__(self) -> str:
        std = f"{self.standard_op or 'standard'}@{self.opset}" if self.standard else "function"
        return f"Rule({self.name!r}, {len(self.patterns)} pattern(s), {std})"


# -- helpers for checks ------------------------------------------------------------------

def fail(reason: str) -> Any:
    """A failed MatchResult carrying ``reason`` (what a check returns to refuse a match)."""
    from onnxscript.rewriter import MatchResult

    return MatchResult().fail(reason)


def const(value: Any) -> Any:
    """The numpy value of a constant ``ir.Value`` (initializer or Constant), else None."""
    if value is None:
        return None
    from onnxscript.rewriter._ir_utils import get_numpy_value

    return get_numpy_value(value)


def scalar(value: Any) -> float | None:
    """The one number a constant holds (any rank, one element), else None."""
    arr = const(value)
    if arr is None or arr.size != 1:
        return None
    return float(arr.reshape(-1)[0])


def ints(value: Any) -> list[int] | None:
    """A constant integer tensor as a flat list, else None."""
    arr = const(value)
    if arr is None or arr.dtype.kind not in "iu":
        return None
    return [int(v) for v in arr.reshape(-1)]


def close(got: float | None, expected: float, rtol: float = 1e-4) -> bool:
    """``got`` is a number within ``rtol`` (relative) of ``expected``."""
    return got is not None and math.isclose(got, expected, rel_tol=rtol, abs_tol=1e-12)


def all_equal(value: Any, expected: float, rtol: float = 1e-6) -> bool:
    """Every element of a constant equals ``expected`` (unit scale, zero bias...)."""
    arr = const(value)
    if arr is None or arr.size == 0:
        return False
    import numpy as np

    return bool(np.allclose(arr.astype("float64"), expected, rtol=rtol, atol=1e-12))


def rank(value: Any) -> int | None:
    """The rank of an ``ir.Value`` when its shape is known, else None."""
    shape = getattr(value, "shape", None)
    return None if shape is None else len(shape)


def dims(value: Any) -> list[int | None] | None:
    """The dims of an ``ir.Value`` (None for symbolic ones) when its shape is known."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    return [d if isinstance(d, int) else None for d in shape]


def last_axes(axes: Sequence[int], rank_: int | None) -> int | None:
    """How many trailing axes ``axes`` names (e.g. [-2, -1] -> 2), or None if not trailing."""
    if not axes:
        return None
    k = len(axes)
    neg = sorted(a - rank_ if a >= 0 and rank_ is not None else a for a in axes)
    if any(a >= 0 for a in neg):
        return None
    return k if neg == list(range(-k, 0)) else None


def attr(node: Any, name: str, default: Any = None) -> Any:
    """An attribute's Python value on an ``ir.Node`` (``default`` when absent)."""
    a = node.attributes.get(name) if node is not None else None
    return default if a is None else a.value


def new_initializer(op: Any, array: Any, hint: str = "w") -> Any:
    """A new initializer holding ``array``, for a standard op's input (scale, bias...).

    An initializer, not a Constant node: a raised graph should not count glue nodes.
    """
    import numpy as np
    import onnx_ir as ir

    name = f"raise_{hint}_{next(_CONST_IDS)}"
    return op.initializer(ir.tensor(np.ascontiguousarray(array), name=name), name)
