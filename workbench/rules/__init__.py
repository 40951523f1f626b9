"""Raising rules: one per op family, each an onnxscript pattern + a check + the raised forms.

``wb.raise_ops`` applies every registered rule (or the ones you name) with onnxscript's
rewriter on an onnx-ir model. A rule says what lowered subgraph to look for (a pattern
function, written like the graph it matches), checks that its constants really are what
the op needs, and builds the standard ONNX op; the function form (a local function named
after the PyTorch op, domain ``pkg.workbench``, body = the matched nodes) comes for free.

Writing a rule takes a few lines — SiLU, ``x * sigmoid(x)`` (the built-in one looks like this)::

    from workbench.rules import Rule, register

    def silu(op, x):
        return op.Mul(x, op.Sigmoid(x))

    def swish(op, x, **_):
        return op.Swish(x)             # ai.onnx Swish exists from opset 24

    register(Rule("MySiLU", silu, check=lambda ctx, x: True, standard=swish, opset=24,
                  standard_op="Swish", commute=True))   # also matches Mul(sigmoid(x), x)

A check that reads constants (the engine moves constant operands of Add/Mul second, so
write them second in the pattern)::

    from workbench.rules import Rule, close, fail, register, scalar

    def scaled_tanh(op, x, c):
        return op.Mul(op.Tanh(x), c)

    def check(ctx, x, c):
        return True if close(scalar(c), 2.0) else fail(f"scale {scalar(c)} is not 2")

    register(Rule("ScaledTanh", scaled_tanh, check))   # no standard op: a function

Then ``wb.raise_ops(art, rules=["ScaledTanh"])`` (or a Rule object; ``rules=None`` is
every registered rule). Every module in this package that does not start with ``_`` is
imported on first use, so a new family is one new file that calls ``register``.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import InputError
from ._rule import (
    DOMAIN,
    Rule,
    all_equal,
    attr,
    close,
    const,
    dims,
    fail,
    ints,
    last_axes,
    new_initializer,
    rank,
    scalar,
)

__all__ = [
    "DOMAIN", "Rule", "register", "get", "all_rules", "names",
    "fail", "const", "scalar", "ints", "close", "all_equal", "rank", "dims", "last_axes", "attr",
    "new_initializer",
]

_REGISTRY: dict[str, Rule] = {}
_LOADED = False


def register(rule: Rule, *, replace: bool = False) -> Rule:
    """Add ``rule`` to the registry (by its name); returns it, so it works as a call or inline."""

    if not isinstance(rule, Rule):
        raise InputError(f"register takes a workbench.rules.Rule, got {type(rule).__name__}",
                         "build one: Rule('MyOp', pattern_fn, check_fn)")
    if rule.name in _REGISTRY and not replace and _REGISTRY[rule.name] is not rule:
        raise InputError(f"a rule named {rule.name!r} is already registered",
                         "pick another name, or register(rule, replace=True) to override it")
    _REGISTRY[rule.name] = rule
    return rule


def _load_builtin() -> None:
    """Import every public module of this package once (each registers its rules)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def all_rules() -> list[Rule]:
    """Every registered rule, in the order the engine applies them (priority, then name)."""
    _load_builtin()
    return sorted(_REGISTRY.values(), key=lambda r: (r.priority, r.name))


def names() -> list[str]:
    """Names of every registered rule."""
    return [r.name for r in all_rules()]


def get(name: str) -> Rule:
    """The registered rule called ``name`` (an InputError listing the known names if none)."""

    _load_builtin()
    if name not in _REGISTRY:
        raise InputError(f"no raising rule named {name!r}; known rules: {names()}",
                         "pass one of the known names, or a Rule object")
    return _REGISTRY[name]
