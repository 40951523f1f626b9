"""Applying rewriters for one export: installed for the call, restored after it whatever
happened, checked against the model as written.

``choose`` picks the registered rewriters whose conditions match the export (no model
run); ``RewritePlan.applied()`` is the ``with`` block the exporter runs in, counting the
calls; ``verify`` then, only when one fired, runs the model once with them (counting each
one's calls in one forward) against the untouched model's outputs and refuses a rewriter
that changes them beyond tolerance, naming it. A model whose rewriters did not fire runs
no more often than without them.

How a rewriter is installed: the target attribute (``torch.Tensor.repeat``, a module
class's ``forward``) is replaced by a dispatcher while at least one export on any thread
needs it, and put back (or deleted, when it was inherited) when the last one ends. The
dispatcher looks up the *calling thread's* plan: another thread's torch calls during an
export, and every call after it, reach the original. Inside a function rewriter, calls of
its own target reach the original too. A special method of torch.Tensor
(``__getitem__``) is not replaced (that would change the C type's slots for good): a torch
function mode on the calling thread routes its calls instead.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..artifact.rewrites import RewriteRecord
from ..errors import ExportError
from ..inputs import copies, flatten_outputs
from ..tolerances import EPS, output_errors
from .rewrite_symbolics import counting, records, usable
from .rewriters import RewriteContext, Rewriter, registered

_LOCAL = threading.local()  # .plan: the RewritePlan the calling thread exports under
_LOCK = threading.RLock()


@dataclass
class _Patch:
    """One replaced attribute: what was there (``raw``, and whether the owner held it
    itself) and how many plans use it."""

    owner: Any
    attr: str
    raw: Any
    own: bool
    users: int = 0


_PATCHES: dict[tuple[int, str], _Patch] = {}


@dataclass
class RewritePlan:
    """The rewriters one export applies (by target), the context, how often each ran
    (``calls``) and after ``verify`` what fired (``records``)."""

    ctx: RewriteContext
    chosen: dict[tuple[int, str], Rewriter] = field(default_factory=dict)
    records: list[RewriteRecord] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    symbolics: list[Rewriter] = field(default_factory=list)  # register_symbolic's, usable
    symbolic_calls: dict[str, int] = field(default_factory=dict)
    # the outputs of the model's forward the TorchScript exporter traced under the plan
    # (``outputs_watched``): what verify compares, instead of running the model again
    traced: list | None = field(default=None, repr=False)
    _busy: set[str] = field(default_factory=set, repr=False)

    @property
    def active(self) -> bool:
        return bool(self.chosen)

    @contextlib.contextmanager
    def applied(self) -> Iterator[RewritePlan]:
        """The chosen rewriters installed for the calling thread during the block, and
        restored on leaving it, also on an exception."""
        if not self.chosen and not self.symbolics:
            yield self
            return
        moded = {k: rw for k, rw in self.chosen.items() if _tensor_dunder(rw)}
        keys = [k for k in self.chosen if k not in moded]
        previous = getattr(_LOCAL, "plan", None)
        _install(keys, self.chosen)
        _LOCAL.plan = self
        try:
            with _dunder_mode(self, moded), counting(self.symbolics, self.ctx,
                                                     _symbolic_counts):
                yield self
        finally:
            _LOCAL.plan = previous
            _uninstall(keys)

    def _call(self, rw: Rewriter, original: Callable, args: tuple, kwargs: dict) -> Any:
        self.calls[rw.name] = self.calls.get(rw.name, 0) + 1
        guard = rw.kind == "function"  # its own target, called inside it: the original
        if guard:
            self._busy.add(rw.name)
        _LOCAL.call = replace(self.ctx, rewriter=rw.name, original=original)
        try:
            return rw.fn(*args, **kwargs)
        finally:
            _LOCAL.call = None
            if guard:
                self._busy.discard(rw.name)

    def only(self, names: set[str]) -> RewritePlan:
        """The same plan with only the rewriters ``names`` (to find which one is wrong)."""
        return RewritePlan(self.ctx, {k: r for k, r in self.chosen.items() if r.name in names})


def _symbolic_counts() -> dict[str, int] | None:
    """The calling thread's counts of register_symbolic conversions (None outside export)."""
    plan = getattr(_LOCAL, "plan", None)
    return None if plan is None else plan.symbolic_calls


def rewrite_context() -> RewriteContext | None:
    """Inside a rewriter's call: the export it runs in, with ``rewriter`` (its name) and
    ``original`` (the callable it replaces); None elsewhere."""
    return getattr(_LOCAL, "call", None)


# -- choosing and checking ---------------------------------------------------------------------
def choose(ctx: RewriteContext, enabled: bool = True) -> RewritePlan:
    """The plan for an export: per target, a user rewriter that matches, else a shipped
    one that matches (none when ``enabled`` is False)."""
    plan = RewritePlan(ctx, symbolics=usable(ctx))
    if not enabled:
        return plan
    for rw in sorted(registered(), key=lambda r: r.builtin):
        key = (id(rw.owner), rw.attr)
        if key not in plan.chosen and rw.matches(ctx):
            plan.chosen[key] = rw
    return plan


@contextlib.contextmanager
def outputs_watched(plan: RewritePlan, model: Any) -> Iterator[None]:
    """During a TorchScript export under ``plan`` (the tracer runs the model's forward once,
    on real tensors, with the rewriters on): that forward's outputs kept as ``plan.traced``
    (numpy arrays) for ``verify``. None when no rewriter is chosen, the exporter is another,
    or the forward ran other than once (a scripted model is not run)."""
    plan.traced = None
    seen: list = []
    handle = None
    if plan.ctx.exporter == "torchscript" and plan.chosen:
        try:
            handle = model.register_forward_hook(lambda _m, _i, out: seen.append(out))
        except Exception:  # noqa: BLE001 - a module that takes no hook: verify runs it
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()
    if len(seen) == 1:
        try:
            plan.traced = [t.detach().cpu().numpy() for t in flatten_outputs(seen[0])]
        except Exception:  # noqa: BLE001 - outputs it cannot flatten: verify runs the model
            plan.traced = None


def verify(plan: RewritePlan, model: Any, args: tuple, reference: list | None, *,
           atol: float, rtol: float) -> list | None:
    """After an export ran under ``plan``: when any rewriter fired, the model run with the
    rewriters on the example ``args`` (counting each one's calls: ``plan.records``) against
    ``reference``, its outputs as written (computed here when None). Nothing runs when none
    fired. The outputs the exporter's trace computed (``plan.traced``) stand for that run
    when they are within tolerance (the counts are then the export's, of the same one
    forward); otherwise the model runs eagerly, as the trace may take other paths
    (``torch.jit.is_tracing()``). Returns the reference (None when nothing ran).

    Raises:
        ExportError: the rewritten model fails, returns other outputs, or differs beyond
            ``atol + rtol * max |reference|``; the message names the rewriter(s) at fault.
    """
    fired = {n for n, c in plan.calls.items() if c}
    plan.records = records(plan.symbolics, plan.symbolic_calls, plan.ctx)
    if not fired:
        return reference
    if reference is None:
        reference = _run(model, args, RewritePlan(plan.ctx))
    check = plan.only(fired)
    counts, bad = plan.calls, None
    if plan.traced is not None:
        bad = _worst(reference, plan.traced, atol, rtol)
    if plan.traced is None or bad is not None:  # the model run with the rewriters, eagerly
        counts = check.calls
        bad = _worst(reference, _run_checked(model, args, check), atol, rtol)
    if bad is not None:
        ran = [r for r in check.chosen.values() if check.calls.get(r.name)]
        culprits = [r for r in ran if _worst(
            reference, _run(model, args, check.only({r.name})), atol, rtol) is not None]
        raise _changed_numbers(culprits or ran, bad, atol, rtol)
    plan.records[:0] = [_record(r, counts[r.name], plan.ctx)
                        for r in check.chosen.values() if counts.get(r.name)]
    return reference


def _run(model: Any, args: tuple, plan: RewritePlan) -> list:
    import torch

    with torch.no_grad(), plan.applied():
        return [t.detach().cpu().numpy() for t in flatten_outputs(model(*copies(args)))]


def _run_checked(model: Any, args: tuple, plan: RewritePlan) -> list:
    try:
        return _run(model, args, plan)
    except Exception as e:
        names = ", ".join(r.name for r in plan.chosen.values()) or "none"
        raise ExportError(f"the model fails with its rewriters applied ({names}): "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                          "fix the rewriter named, narrow its conditions, or remove it with "
                          "wb.unregister_rewriter(name); wb.export(..., rewrite=False) "
                          "exports the model as written") from e


def _worst(reference: list, got: list, atol: float, rtol: float) -> tuple | None:
    """(output index, max abs error, bound) of the first output past tolerance (a NaN error
    is inf), or (index, None, 0.0) when the count (index -1) or a shape differs; None when
    all are within it. Compared in float64 slices (tolerances.output_errors)."""
    if len(got) != len(reference):
        return (-1, None, 0.0)
    for i, (r, g) in enumerate(zip(reference, got, strict=True)):
        if r.shape != g.shape:
            return (i, None, 0.0)
        if r.size == 0:
            continue
        _, err, _, scale = output_errors(r, g, EPS)
        bound = atol + rtol * scale
        if not err <= bound:
            return (i, err, bound)
    return None


def _changed_numbers(culprits: list[Rewriter], bad: tuple, atol: float,
                     rtol: float) -> ExportError:
    i, err, bound = bad
    names = ", ".join(f"{r.name!r} ({r.kind} {r.target})" for r in culprits)
    what = ("another number of outputs or another shape" if err is None else
            f"output {i} max abs {err:.3g} > {bound:.3g} (atol {atol:g} + rtol {rtol:g} x "
            "max |output|)")
    return ExportError(f"rewriter {names} changes the model's numbers: {what}, the rewritten "
                       "model against the model as written on the example inputs",
                       f"a rewriter must compute what it replaces: fix it, or remove it with "
                       f"wb.unregister_rewriter({culprits[0].name!r})")


def _record(rw: Rewriter, calls: int, ctx: RewriteContext) -> RewriteRecord:
    c = rw.conditions()
    return RewriteRecord(rw.name, rw.kind, rw.target, c["backend"], c["exporter"], c["opset"],
                         calls, rw.builtin, rw.source())


# -- installing --------------------------------------------------------------------------------
def _tensor_dunder(rw: Rewriter) -> bool:
    """A special method of torch.Tensor (``__getitem__``...): replacing the attribute would
    change the C type's slots for good (a tensor left looking like a sequence), so such a
    rewriter runs from a torch function mode instead, on the calling thread only."""
    import torch

    return (isinstance(rw.owner, type) and issubclass(rw.owner, torch._C.TensorBase)
            and rw.attr.startswith("__") and rw.attr.endswith("__"))


def _dunder_mode(plan: RewritePlan, moded: dict[tuple[int, str], Rewriter]) -> Any:
    """A TorchFunctionMode that sends the calls of ``moded``'s targets to their rewriters
    (torch runs a mode's handler with the mode off, so calls inside a rewriter reach the
    originals); a null context when there are none."""
    if not moded:
        return contextlib.nullcontext()
    from torch.overrides import TorchFunctionMode

    by_func = {getattr(rw.owner, rw.attr): rw for rw in moded.values()}

    class Rewrites(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            rw = by_func.get(func)
            if rw is not None and rw.name not in plan._busy and rw.takes(args, kwargs or {}):
                return plan._call(rw, func, args, kwargs or {})
            return func(*args, **(kwargs or {}))

    return Rewrites()


def _dispatcher(key: tuple[int, str], original: Callable) -> Callable:
    """What replaces the attribute: the calling thread's rewriter when its plan has one for
    ``key`` and it is not inside itself, else the original."""

    @functools.wraps(original)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        plan = getattr(_LOCAL, "plan", None)
        if plan is not None:
            rw = plan.chosen.get(key)
            if rw is not None and rw.name not in plan._busy and rw.takes(args, kwargs):
                return plan._call(rw, original, args, kwargs)
        return original(*args, **kwargs)

    return dispatch


def _install(keys: list[tuple[int, str]], chosen: dict[tuple[int, str], Rewriter]) -> None:
    with _LOCK:
        for key in keys:
            patch = _PATCHES.get(key)
            if patch is None:
                rw = chosen[key]
                own = rw.attr in getattr(rw.owner, "__dict__", {})
                raw = rw.owner.__dict__[rw.attr] if own else getattr(rw.owner, rw.attr)
                patch = _PATCHES[key] = _Patch(rw.owner, rw.attr, raw, own)
                original = getattr(rw.owner, rw.attr)
                fn = _dispatcher(key, original)
                if isinstance(raw, (staticmethod, classmethod)):
                    fn = staticmethod(fn)  # the original is already bound as it should be
                setattr(rw.owner, rw.attr, fn)
            patch.users += 1


def _uninstall(keys: list[tuple[int, str]]) -> None:
    with _LOCK:
        for key in keys:
            patch = _PATCHES[key]
            patch.users -= 1
            if patch.users == 0:
                del _PATCHES[key]
                if patch.own:
                    setattr(patch.owner, patch.attr, patch.raw)
                else:
                    delattr(patch.owner, patch.attr)
