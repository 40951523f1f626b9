"""Rewriters: Python that replaces a function or a module's forward while one export runs.

MMDeploy's idea: a model's code stays as it is for training, and what one backend cannot
take is replaced for the export to that backend only. Three kinds, listed together by
``rewriters()``:

- ``@rewrite("torch.Tensor.repeat", backend="ncnn")``: a function or method, by its dotted
  path (``torch.diff``, ``torch.Tensor.__getitem__``, ``mypkg.ops.decode``);
- ``@rewrite_module(SomeModule, backend="onnxruntime")``: a module class's ``forward``;
- ``wb.register_symbolic(...)`` (``workbench.customops``): an op's ONNX conversion.

Each applies only inside ``wb.export`` / ``wb.to_ncnn`` and only when its conditions match
the export (``backend``, ``exporter``, ``opset`` range, and an optional ``when``
predicate); the applying, the restoring and the check that a rewriter keeps the numbers are
in ``rewrite_session.py``. The workbench's own rewriters (``rewriters_builtin.py``) are
registered on first use (those off by default with ``enable_rewriter``), and a user's
rewriter for the same target takes precedence over them.

The registry is process-global (like torch's own registries); a re-run notebook cell that
registers a rewriter of the same name replaces it rather than failing as a duplicate.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

BACKENDS = ("onnxruntime", "ncnn")
EXPORTERS = ("torchscript", "dynamo")
_LOCK = threading.RLock()
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made in Python, whose attributes can be set


@dataclass(frozen=True)
class RewriteContext:
    """The export a rewriter runs in: ``stage`` ("export" or "to_ncnn"), ``backend``,
    ``exporter`` ("torchscript" for ``to_ncnn(module)``: pnnx reads a TorchScript trace)
    and ``opset`` (None for pnnx). Inside a rewriter's call, ``rewrite_context()`` returns
    it with ``rewriter`` (the name) and ``original`` (the replaced callable) filled in."""

    stage: str
    backend: str
    exporter: str
    opset: int | None = None
    rewriter: str | None = None
    original: Callable | None = None


@dataclass(eq=False)
class Rewriter:
    """One registered rewriter: ``kind`` "function", "module" or "symbolic"; ``target`` its
    dotted path (a module class by module and qualified name; an op as "aten::diff");
    ``owner``/``attr`` where it is installed (the object whose attribute is replaced).
    ``backends``/``exporters`` None match any; ``opsets`` is an inclusive (low, high)."""

    name: str
    kind: str
    target: str
    fn: Callable
    owner: Any = field(default=None, repr=False)
    attr: str = ""
    backends: tuple[str, ...] | None = None
    exporters: tuple[str, ...] | None = None
    opsets: tuple[int, int] | None = None
    when: Callable[[RewriteContext], bool] | None = field(default=None, repr=False)
    builtin: bool = False
    # a shipped rewriter's test of one call's arguments: a call it does not take reaches the
    # original and is not counted (a float cumsum is not what "workbench.bool_cumsum" fixes)
    only: Callable[..., bool] | None = field(default=None, repr=False)

    def takes(self, args: tuple, kwargs: dict) -> bool:
        """Whether this call (its arguments) goes to the rewriter (``only``; all by default)."""
        return self.only is None or bool(self.only(*args, **kwargs))

    def matches(self, ctx: RewriteContext) -> bool:
        """True when this rewriter applies to the export ``ctx`` describes. An opset range
        applies to ONNX exports only (pnnx's TorchScript route has no opset)."""
        if self.backends is not None and ctx.backend not in self.backends:
            return False
        if self.exporters is not None and ctx.exporter not in self.exporters:
            return False
        if self.opsets is not None and (ctx.opset is None
                                        or not self.opsets[0] <= ctx.opset <= self.opsets[1]):
            return False
        return self.when is None or bool(self.when(ctx))

    def conditions(self) -> dict[str, str | None]:
        """The conditions as text: {"backend": "ncnn", "exporter": None, "opset": "13..17"}."""
        return {"backend": "|".join(self.backends) if self.backends else None,
                "exporter": "|".join(self.exporters) if self.exporters else None,
                "opset": f"{self.opsets[0]}..{self.opsets[1]}" if self.opsets else None}

    def source(self) -> str | None:
        """The Python source of ``fn`` (its decorator included) when readable."""
        if self.builtin:
            return None
        try:
            return textwrap.dedent(inspect.getsource(self.fn))
        except (OSError, TypeError):
            return None


_REWRITERS: dict[str, Rewriter] = {}
_BUILTINS_LOADED = False


# -- registering -------------------------------------------------------------------------------
def rewrite(target: str, *, backend: str | tuple[str, ...] | None = None,
            exporter: str | tuple[str, ...] | None = None,
            opset: int | tuple[int, int] | None = None,
            when: Callable[[RewriteContext], bool] | None = None,
            name: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: replace the function or method ``target`` while exporting for ``backend``.

    The decorated function takes the target's arguments (``self`` first for a method) and
    returns what it would. Inside it, calls of the target itself reach the original, so a
    rewriter may handle the cases it knows and hand the rest on
    (``rewrite_context().original`` is the original too). The attribute at ``target`` is
    what is replaced: code that took the function under another name before the export
    (``from torch import diff``) keeps calling the original.

    Args:
        target: the dotted path, e.g. "torch.Tensor.repeat", "torch.diff".
        backend: "onnxruntime", "ncnn", a tuple of them, or None for any.
        exporter: "torchscript", "dynamo", a tuple, or None for any (``to_ncnn(module)``
            traces TorchScript for pnnx, so it counts as "torchscript").
        opset: the lowest opset, or an inclusive (low, high) range; None for any.
        when: a further condition, called with the RewriteContext of the export.
        name: the rewriter's name (default: the function's module and qualified name).

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        InputError: the target does not exist (the nearest name is suggested), a condition
            is not one the exporters know, or another rewriter already holds this target
            for an overlapping backend, exporter and opset.
    """
    owner, attr = resolve_target(target)
    conds = _conditions(backend, exporter, opset, when, f"rewrite({target!r})")

    def register(fn: Callable) -> Callable:
        _check_callable(fn, f"rewrite({target!r})")
        _add(Rewriter(name or _default_name(fn), "function", target, fn, owner, attr, *conds))
        return fn

    return register


def rewrite_module(cls: type, *, backend: str | tuple[str, ...] | None = None,
                   exporter: str | tuple[str, ...] | None = None,
                   opset: int | tuple[int, int] | None = None,
                   when: Callable[[RewriteContext], bool] | None = None,
                   name: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: replace ``cls.forward`` while exporting for ``backend``.

    The decorated function is a forward: ``def forward(self, x): ...``, ``self`` the module
    instance (its parameters and submodules are there). Every instance of ``cls`` (and of
    subclasses that do not define their own forward) runs it during a matching export.

    Args:
        cls: an ``nn.Module`` subclass.
        backend, exporter, opset, when, name: as for ``rewrite``.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        InputError: ``cls`` is not an ``nn.Module`` class, a condition is unknown, or
            another rewriter holds ``cls.forward`` for overlapping conditions.
    """
    import torch

    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise InputError(f"rewrite_module({cls!r}): expected an nn.Module subclass, got "
                         f"{type(cls).__name__}",
                         "pass the class, e.g. @wb.rewrite_module(MyHead, backend='ncnn')")
    target = f"{cls.__module__}.{cls.__qualname__}"
    conds = _conditions(backend, exporter, opset, when, f"rewrite_module({cls.__qualname__})")

    def register(fn: Callable) -> Callable:
        _check_callable(fn, f"rewrite_module({cls.__qualname__})")
        _add(Rewriter(name or _default_name(fn), "module", target, fn, cls, "forward", *conds))
        return fn

    return register


def unregister_rewriter(name: str) -> None:
    """Forget the rewriter called ``name`` (a shipped one too, for this process).

    Raises:
        InputError: no rewriter has that name (the registered names are listed).
    """
    with _LOCK:
        _load_builtins()
        if name not in _REWRITERS:
            raise InputError(f"no rewriter named {name!r}" + _suggest(name, list(_REWRITERS)),
                             f"registered: {', '.join(sorted(_REWRITERS)) or 'none'}")
        del _REWRITERS[name]


def rewriters() -> list[Rewriter]:
    """Every registered rewriter: functions and module forwards (shipped ones included),
    then the symbolics of ``wb.register_symbolic`` (kind "symbolic"), by name."""
    from ..customops.registry import _SYMBOLICS

    with _LOCK:
        _load_builtins()
        found = sorted(_REWRITERS.values(), key=lambda r: (r.builtin, r.name))
        for op, by_opset in sorted(_SYMBOLICS.items()):
            for opset, sym in sorted(by_opset.items()):
                found.append(Rewriter(f"symbolic:{op}@{opset}", "symbolic", op, sym.fn,
                                      exporters=(sym.exporter,) if sym.exporter else None,
                                      opsets=(opset, 10**6)))
        return found


def registered() -> list[Rewriter]:
    """The function and module rewriters (a snapshot, shipped ones loaded)."""
    with _LOCK:
        _load_builtins()
        return list(_REWRITERS.values())


# -- checks ------------------------------------------------------------------------------------
def resolve_target(target: Any) -> tuple[Any, str]:
    """(owner, attribute) of a dotted path: the longest importable module prefix, then
    attributes. InputError naming the first missing part, with the nearest existing name."""
    if not isinstance(target, str) or not target or "." not in target:
        raise InputError(f"rewrite target must be a dotted path such as "
                         f"'torch.Tensor.repeat', got {target!r}",
                         "name the function by where it lives: 'torch.diff', "
                         "'torch.Tensor.repeat', 'mypkg.ops.decode'")
    parts = target.split(".")
    obj, i = None, len(parts) - 1
    while i > 0:
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            i -= 1
    if obj is None:
        raise InputError(f"rewrite target {target!r} does not exist: no module "
                         f"{parts[0]!r} can be imported", "check the spelling of the path")
    owner = obj
    for k in range(i, len(parts)):
        if not hasattr(obj, parts[k]):
            where = ".".join(parts[:k])
            near = difflib.get_close_matches(parts[k], dir(obj), n=1, cutoff=0.6)
            hint = (f"did you mean {where + '.' + near[0]!r}?" if near else
                    f"{where} has no attribute {parts[k]!r}; check the spelling")
            raise InputError(f"rewrite target {target!r} does not exist: {where} has no "
                             f"attribute {parts[k]!r}", hint)
        owner, obj = obj, getattr(obj, parts[k])
    if not callable(obj):
        raise InputError(f"rewrite target {target!r} is a {type(obj).__name__}, not a "
                         "function or method", "rewrite a function, a method, or a module's "
                         "forward (wb.rewrite_module)")
    if isinstance(owner, type) and not owner.__flags__ & _HEAPTYPE:
        raise InputError(f"rewrite target {target!r} cannot be replaced: {owner.__name__} is "
                         "a built-in type, whose attributes are fixed",
                         "rewrite the function that calls it, or the Python class above it "
                         "(torch.Tensor's methods can be rewritten: 'torch.Tensor.repeat')")
    return owner, parts[-1]


def _conditions(backend: Any, exporter: Any, opset: Any, when: Any, what: str) -> tuple:
    backends = _names(backend, BACKENDS, "backend", what)
    exporters = _names(exporter, EXPORTERS, "exporter", what)
    if opset is None:
        opsets = None
    elif isinstance(opset, int) and not isinstance(opset, bool) and opset > 0:
        opsets = (opset, 10**6)
    elif (isinstance(opset, tuple) and len(opset) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in opset)
          and 0 < opset[0] <= opset[1]):
        opsets = (opset[0], opset[1])
    else:
        raise InputError(f"{what}: opset={opset!r} is neither an opset nor a (low, high) "
                         "range", "e.g. opset=13 (13 and later) or opset=(13, 17)")
    if when is not None and not callable(when):
        raise InputError(f"{what}: when= must be callable, got {type(when).__name__}",
                         "e.g. when=lambda ctx: ctx.stage == 'export'")
    return backends, exporters, opsets, when


def _names(value: Any, allowed: tuple[str, ...], key: str, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    values = (value,) if isinstance(value, str) else value
    if not isinstance(values, (tuple, list)) or not values or any(
            v not in allowed for v in values):
        raise InputError(f"{what}: {key}={value!r} is not one of {allowed} (or a tuple of "
                         "them, or None for any)",
                         f"e.g. {key}={allowed[-1]!r}" + _suggest(str(value), list(allowed)))
    return tuple(values)


def _check_callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise InputError(f"{what} decorates a {type(fn).__name__}, not a function",
                         "put the decorator on a def")


def _default_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _suggest(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _overlap(a: Rewriter, b: Rewriter) -> bool:
    """Whether two rewriters of one target could both match one export."""
    for x, y in ((a.backends, b.backends), (a.exporters, b.exporters)):
        if x is not None and y is not None and not set(x) & set(y):
            return False
    if a.opsets and b.opsets and (a.opsets[1] < b.opsets[0] or b.opsets[1] < a.opsets[0]):
        return False
    return True


def _add(rw: Rewriter) -> None:
    """Register ``rw``: one of the same name is replaced (a re-run cell); another user
    rewriter of the same target whose conditions overlap is an InputError."""
    with _LOCK:
        _load_builtins()
        for other in _REWRITERS.values():
            if (other.name != rw.name and not other.builtin and not rw.builtin
                    and other.owner is rw.owner and other.attr == rw.attr and _overlap(rw, other)):
                on = rw.conditions()["backend"] or "any backend"
                raise InputError(
                    f"two rewriters for {rw.target} on {on}: {other.name!r} is registered and "
                    f"{rw.name!r} would be a second for the same export",
                    f"keep one: wb.unregister_rewriter({other.name!r}) first, or give them "
                    "conditions that do not overlap (backend=, exporter=, opset=)")
        _REWRITERS[rw.name] = rw


def enable_rewriter(name: str) -> None:
    """Register the shipped rewriter ``name`` (those off by default, such as
    "workbench.strided_slice", or one unregistered earlier).

    Raises:
        InputError: the workbench ships no rewriter of that name (the shipped ones listed).
    """
    from .rewriters_builtin import SHIPPED

    spec = next((s for s in SHIPPED if s.name == name), None)
    if spec is None:
        names = [s.name for s in SHIPPED]
        raise InputError(f"the workbench ships no rewriter named {name!r}"
                         + _suggest(name, names), f"shipped: {', '.join(names)}")
    with _LOCK:
        _load_builtins()
        _REWRITERS[name] = _shipped(spec)


def _shipped(spec: Any) -> Rewriter:
    owner, attr = resolve_target(spec.target)
    return Rewriter(spec.name, "function", spec.target, spec.fn, owner, attr,
                    *_conditions(spec.backend, spec.exporter, None, spec.when, spec.name),
                    builtin=True, only=spec.only)


def _load_builtins() -> None:
    """Register the shipped rewriters that are on by default, once per process."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from .rewriters_builtin import SHIPPED

    for spec in SHIPPED:
        if spec.default:
            _REWRITERS.setdefault(spec.name, _shipped(spec))
