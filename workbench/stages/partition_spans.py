"""The torch side of a partition: where forward() reaches each cut, and one module per part.

A cut is a list of boundary names: marks (``wb.mark`` in forward) or submodule names (their
output, through a forward hook). ``probe`` runs the model once and records what each name
carried, in the order forward reached them. ``make_span`` makes one part an ``nn.Module``: it
runs the model's forward, feeding the part's inputs in at the cut where it starts and
returning the values at the cut where it ends (an exception stops forward() there), so a
part traces, exports and converts like any module. A span runs the model in eval mode and
puts each submodule's mode back after; its own ``train()``/``eval()`` does not reach into the
model (an exporter's or runner's ``.eval()`` leaves the user's modes as they were). Before
the start the model runs on the example inputs; ``outside_dependence`` checks that nothing the part returns depends on
them (a tensor that crosses the cut without being named in it).

The user's model is left as it was: ``left_as_found(model)`` notes every submodule's
train/eval mode, every parameter's and buffer's ``requires_grad`` and every hook table, and
puts them back when the block ends, on success and on error alike (the tables are the
module's own dicts, refilled in place, so the handles the user holds still remove their
hooks); ``evaluating(model)`` runs a block in eval mode and puts each mode back after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..inputs import flatten_outputs
from .marks import marking


def _hook_tables(module: Any) -> list[tuple[str, dict]]:
    """(attribute, dict) of each hook table of ``module`` (forward, pre-forward, backward,
    state-dict hooks and their flags), as torch keeps them in the instance's ``__dict__``."""
    return [(k, v) for k, v in vars(module).items() if "hooks" in k and isinstance(v, dict)]


@contextlib.contextmanager
def left_as_found(model: Any) -> Iterator[None]:
    """Put back every submodule's mode, every tensor's requires_grad and every hook table of
    ``model`` when the block ends, however it ends."""
    modes = [(m, m.training) for m in model.modules()]
    tensors = [t for m in model.modules()
               for t in (*m._parameters.values(), *m._buffers.values()) if t is not None]
    grads = [(t, t.requires_grad) for t in tensors]
    hooks = [(table, dict(table)) for m in model.modules() for _, table in _hook_tables(m)]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
        for tensor, flag in grads:
            if tensor.requires_grad != flag and tensor.is_leaf:
                tensor.requires_grad_(flag)
        for table, saved in hooks:
            if table != saved:
                table.clear()
                table.update(saved)


@contextlib.contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """Every submodule of ``model`` in eval mode during the block, each mode put back after
    (nothing is touched when all are in eval mode already, as while a partition traces)."""
    modes = [(m, m.training) for m in model.modules()]
    if not any(training for _, training in modes):
        yield
        return
    for module, _ in modes:
        module.training = False
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


class _Stop(Exception):  # noqa: N818 - control flow, not an error
    """Raised by a span's handler once every value of its end cut is known."""


def tensor_names(name: str, value: Any) -> list[str]:
    """The boundary tensors a name carries: ``name`` for a tensor, ``name.i`` per element
    of a tuple or list."""
    import torch

    if isinstance(value, torch.Tensor):
        return [name]
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return [f"{name}.{i}" for i in range(len(value))]
    raise InputError(f"the cut at {name!r} carries a {type(value).__name__}, expected a tensor "
                     "or a tuple/list of tensors", "mark a tensor: wb.mark(x, name), or cut "
                     "at a module that returns tensors")


@dataclass
class Seen:
    """What forward() carried at one boundary name: the value and when (call order)."""

    name: str
    order: int
    value: Any


@contextlib.contextmanager
def hooked(model: Any, modules: list[str], handler: Callable[[str, Any], Any]) -> Iterator[None]:
    """Marks at the outputs of the submodules ``modules`` (by name) and at ``wb.mark`` calls,
    all routed to ``handler`` during the block; the hooks removed afterwards."""
    table = dict(model.named_modules())
    handles = [table[m].register_forward_hook(
        lambda _mod, _args, out, _name=m: handler(_name, out)) for m in modules]
    try:
        with marking(handler):
            yield
    finally:
        for h in handles:
            h.remove()


def probe(model: Any, args: tuple, modules: list[str]) -> tuple[dict[str, Seen], list]:
    """Run ``model`` once: every mark and hooked module output it reaches (the first time
    each), and its outputs as tensors."""
    import torch

    seen: dict[str, Seen] = {}

    def record(name: str, value: Any) -> Any:
        seen.setdefault(name, Seen(name, len(seen), value))
        return value

    with torch.no_grad(), hooked(model, modules, record):
        out = flatten_outputs(model(*args))
    return seen, out


def make_span(model: Any, example: tuple, start: list[str] | None,
              stop: list[str] | None, modules: list[str],
              counts: dict[str, list[str]]) -> Any:
    """The part from cut ``start`` (None: the model's inputs) to cut ``stop`` (None: the
    model's outputs) as an ``nn.Module`` whose forward takes the start cut's tensors in
    order (``counts``: each name's tensor names) and returns the stop cut's tensors."""
    import torch

    class PartSpan(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.example = example
            self.start, self.stop = start, stop

        def train(self, mode: bool = True) -> Any:
            self.training = mode  # not the model's modes: forward() runs it in eval mode
            return self

        def forward(self, *inputs: Any) -> Any:
            feed = dict(zip([t for n in self.start for t in counts[n]], inputs,
                            strict=True)) if self.start else {}
            got: dict[str, Any] = {}
            # a TorchScript trace records nothing before the start cut (nothing there is
            # the part's, and pnnx crashes on module calls whose result is unused)
            paused = [torch._C._get_tracing_state() if self.start else None]
            if paused[0] is not None:
                torch._C._set_tracing_state(None)

            def handler(name: str, value: Any) -> Any:
                if self.start and name in self.start:
                    if paused[0] is not None:
                        torch._C._set_tracing_state(paused.pop())
                        paused.append(None)
                    return _rebuild(name, value, feed)
                if self.stop and name in self.stop and name not in got:
                    got[name] = value
                    if len(got) == len(self.stop):
                        raise _Stop
                return value

            args = inputs if self.start is None else self.example
            try:
                with evaluating(self.model), hooked(
                        self.model, [m for m in modules
                                     if m in (self.start or ()) or m in (self.stop or ())],
                        handler):
                    out = self.model(*args)
            except _Stop:
                return tuple(t for n in self.stop for t in flatten_outputs(got[n]))
            finally:
                if paused[0] is not None:  # the start cut was never reached
                    torch._C._set_tracing_state(paused[0])
            if self.stop is not None:
                missing = [n for n in self.stop if n not in got]
                raise InputError(f"forward() did not reach {missing} in this part",
                                 "a cut must be reached on every run of the model")
            return tuple(flatten_outputs(out))

    return PartSpan().eval()


def _rebuild(name: str, value: Any, feed: dict[str, Any]) -> Any:
    """The part's input(s) in the place of ``value`` at the start cut ``name``."""
    import torch

    if isinstance(value, torch.Tensor):
        return feed[name]
    return type(value)(feed[f"{name}.{i}"] for i in range(len(value)))


def outside_dependence(span: Any, inputs: tuple) -> list[int]:
    """Indices of the span's outputs that depend on the model's example inputs other than
    through the span's own inputs (taint through every torch call, by a function mode)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakTensorKeyDictionary

    labels = WeakTensorKeyDictionary()

    class Taint(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name.endswith("_like") or name.startswith("new_"):  # shape, not values
                return out
            found: set[str] = set()
            for t in tree_flatten((args, kwargs or {}))[0]:
                if isinstance(t, torch.Tensor) and t in labels:
                    found |= labels[t]
            if found:
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        labels[t] = labels.get(t, set()) | found
            return out

    if span.start is not None:
        for t in span.example:
            labels[t] = {"outside"}
    with torch.no_grad(), Taint():
        outs = span(*inputs)
    return [i for i, t in enumerate(outs) if "outside" in labels.get(t, set())]
