"""The third kind of rewriter, ``wb.register_symbolic``, in an export's record: which
conversions the export could use and, for the TorchScript exporter, how often it called
each (the number of nodes it converted with it).

Counting wraps the function torch's registry holds for the op while the export runs: one
wrapper per op and opset however many exports run at once (refcounted), counting into the
calling thread's counter, and the registry's own function put back when the last ends.
The dynamo exporter takes the conversions in its translation table; it is not counted.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..artifact.rewrites import RewriteRecord
from .rewriters import RewriteContext, Rewriter, rewriters

_LOCK = threading.RLock()
_WRAPPED: dict[tuple[str, int], list] = {}  # (op, registry key) -> [registered fn, users]
_BUILTIN_NS = ("aten", "prim", "quantized")


def usable(ctx: RewriteContext) -> list[Rewriter]:
    """The ``register_symbolic`` conversions an ONNX export (``ctx.opset`` set) can use."""
    if ctx.opset is None:
        return []
    return [rw for rw in rewriters() if rw.kind == "symbolic" and rw.matches(ctx)]


def records(symbolics: list[Rewriter], calls: dict[str, int],
            ctx: RewriteContext) -> list[RewriteRecord]:
    """A record per conversion the TorchScript exporter called (with the count), or per
    usable one for the dynamo exporter (uncounted: ``calls`` None)."""
    out = []
    for rw in symbolics:
        n = calls.get(rw.name)
        if ctx.exporter == "torchscript" and not n:
            continue
        c = rw.conditions()
        out.append(RewriteRecord(rw.name, "symbolic", rw.target, None, c["exporter"],
                                 str(rw.opsets[0]) if rw.opsets else None, n))
    return out


def _key(rw: Rewriter) -> int:
    """The opset register_symbolic gave torch's registry for it (1 for a custom domain)."""
    return rw.opsets[0] if rw.target.split("::", 1)[0] in _BUILTIN_NS else 1


@contextlib.contextmanager
def counting(symbolics: list[Rewriter], ctx: RewriteContext,
             counter: Callable[[], dict[str, int] | None]) -> Iterator[None]:
    """During the block, each call the TorchScript exporter makes of one of ``symbolics``
    adds one to ``counter()[name]`` (the calling thread's counts, or None: not counted)."""
    if ctx.exporter != "torchscript" or not symbolics:
        yield
        return
    try:  # torch's registry of TorchScript conversions (private; where torch 2.13 has it)
        from torch.onnx._internal.torchscript_exporter.registration import registry
    except ImportError:
        yield
        return
    held = []
    with _LOCK:
        for rw in symbolics:
            group = registry.get_function_group(rw.target)
            key = _key(rw)
            if group is None or not group._functions.overridden(key):
                continue
            slot = _WRAPPED.get((rw.target, key))
            if slot is None:
                fn = group._functions._overrides[key]
                slot = _WRAPPED[(rw.target, key)] = [fn, 0]
                group._functions.override(key, _counted(fn, rw.name, counter))
            slot[1] += 1
            held.append((group, rw.target, key))
    try:
        yield
    finally:
        with _LOCK:
            for group, op, key in held:
                slot = _WRAPPED[(op, key)]
                slot[1] -= 1
                if slot[1] == 0:
                    del _WRAPPED[(op, key)]
                    group._functions.override(key, slot[0])


def _counted(fn: Callable, name: str, counter: Callable[[], dict[str, int] | None]) -> Any:
    @functools.wraps(fn)
    def symbolic(*args: Any, **kwargs: Any) -> Any:
        counts = counter()
        if counts is not None:
            counts[name] = counts.get(name, 0) + 1
        return fn(*args, **kwargs)

    return symbolic
