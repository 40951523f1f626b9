"""TorchRunner: the reference, an ``nn.Module`` run in eval mode without grad.

``capture="all"`` records, in one forward pass, every leaf module's output under its
qualified name (``layer1.0.conv1``) and the tensor results of functional calls made outside
leaf modules, named by the module that made them and the function (``F.interpolate_0`` at
the top level, ``layer1.0/Tensor.__add___0`` inside a block). Hooks plus a TorchFunctionMode,
as torch.fx's Interpreter would see the same calls, but without tracing.
"""

from __future__ import annotations

import functools
import itertools
import sys
import weakref
from collections import Counter
from typing import Any

from ..inputs import as_tensor_tuple, flatten_outputs
from .base import Runner

_PREFIXES = (("torch.nn.functional.", "F."), ("torch.Tensor.", "Tensor."), ("torch._C._nn.", "F."),
             ("torch._C._VariableFunctions.", "torch."))


def _short(func: Any) -> str:
    import torch

    name = torch.overrides.resolve_name(func) or getattr(func, "__name__", "op")
    for long, short in _PREFIXES:
        if name.startswith(long):
            return short + name[len(long):]
    return name


class TorchRunner(Runner):
    name = "torch"

    def __init__(self, model: Any, output_names: list[str] | None = None) -> None:
        import torch

        from ..errors import InputError

        if not isinstance(model, torch.nn.Module):
            raise InputError(f"TorchRunner needs an nn.Module, got {type(model).__name__}",
                             "pass the model object itself, e.g. TorchRunner(MyNet())")
        self.model = model
        self.output_names_given = output_names
        self._pool: dict[str, Any] = {}  # capture="all" buffers, reused when free

    def describe(self) -> dict[str, Any]:
        return {"inputs": [{"name": n} for n in self.input_names], "outputs": []}

    @property
    def input_names(self) -> list[str]:
        import inspect

        params = inspect.signature(self.model.forward).parameters.values()
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def feed(self, inputs: Any) -> dict[str, Any]:
        names = self.input_names
        if isinstance(inputs, dict):
            inputs = tuple(inputs[n] for n in names if n in inputs)
        tensors = as_tensor_tuple(inputs)
        # forward(*args) names nothing: number the rest
        names += [f"input_{i}" for i in range(len(names), len(tensors))]
        return dict(zip(names, tensors, strict=False))

    def _execute(self, feed: dict[str, Any], capture: str) -> dict[str, Any]:
        import torch

        args = tuple(feed.values())
        was_training = self.model.training
        self.model.eval()
        records: dict[str, Any] = {}
        try:
            with torch.no_grad():
                if capture == "all":
                    out = self._forward_recording(args, records)
                else:
                    out = self.model(*args)
        finally:
            self.model.train(was_training)
        tensors = flatten_outputs(out)
        names = self.output_names_given or [f"output_{i}" for i in range(len(tensors))]
        records.update({n: t.detach().cpu().numpy() for n, t in zip(names, tensors,
                                                                     strict=False)})
        return records

    def _forward_recording(self, args: tuple, records: dict[str, Any]) -> Any:
        rec = _Recorder(self.model, records, self._pool)
        handles = list(itertools.chain.from_iterable(
            (m.register_forward_pre_hook(rec.pre), m.register_forward_hook(rec.post))
            for m in rec.names))
        try:
            with _recording_mode()(rec):
                return self.model(*args)
        finally:
            for h in handles:
                h.remove()


class _Recorder:
    """State of one capture='all' pass. Kept free of reference cycles, so the buffers of a
    result the caller has dropped are free again (refcount) when the next run starts.

    Each tensor is copied when it is produced (in-place ops may follow) into a buffer the
    runner keeps from run to run: fresh arrays for ~200 activations cost more in page faults
    than the copy itself. A buffer the caller still holds is never reused.
    """

    def __init__(self, model: Any, records: dict[str, Any], pool: dict[str, Any]) -> None:
        self.records, self.pool = records, pool
        self.names = {m: n for n, m in model.named_modules()}
        # the model itself is never a leaf: its output is output_0, and what it calls is
        # recorded even when it has no submodules
        self.leaves = {m for m, n in self.names.items()
                       if n and not any(True for _ in m.children())}
        self.stack: list[Any] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self.copying = False  # our own .detach().numpy() calls are not the model's
        # (tensor id, version) -> buffer: the same unchanged tensor seen again (an Identity
        # leaf, a block that returns its input) is the same values, not a second copy
        self.seen: dict[tuple[int, int], Any] = {}

    def pre(self, module: Any, _args: Any) -> None:
        self.stack.append(module)

    def post(self, module: Any, _args: Any, output: Any) -> None:
        self.stack.pop()
        if module in self.leaves and self.names[module]:
            self.keep(self.names[module], output)

    def in_leaf(self) -> bool:
        return self.copying or (bool(self.stack) and self.stack[-1] in self.leaves)

    def functional(self, func: Any, result: Any) -> None:
        scope = self.names.get(self.stack[-1], "") if self.stack else ""
        short = _short(func)
        k = self.counts[(scope, short)]
        self.counts[(scope, short)] += 1
        self.keep(f"{scope}/{short}_{k}" if scope else f"{short}_{k}", result)

    def keep(self, name: str, value: Any) -> None:
        import numpy as np

        self.copying = True
        try:
            tensors = flatten_outputs(value)
            named = [(name, tensors[0])] if len(tensors) == 1 else [
                (f"{name}.{i}", t) for i, t in enumerate(tensors)]
            for n, t in named:
                key = (id(t), t._version)
                if key in self.seen and self.seen[key][0]() is t:
                    self.records[n] = self.seen[key][1]
                    continue
                arr = t.detach().cpu().numpy()
                buf = self.pool.get(n)
                # 3 references: the pool, `buf`, getrefcount's argument; more = the caller's
                if (buf is None or buf.shape != arr.shape or buf.dtype != arr.dtype
                        or sys.getrefcount(buf) > 3):
                    buf = self.pool[n] = np.empty_like(arr)
                np.copyto(buf, arr)
                self.records[n] = buf
                self.seen[key] = (weakref.ref(t), buf)  # a weak ref: t's memory stays free
        finally:
            self.copying = False


@functools.cache
def _recording_mode() -> type:
    """The TorchFunctionMode class (built once: a class per run would be a reference cycle)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class RecordingMode(TorchFunctionMode):
        def __init__(self, recorder: _Recorder) -> None:
            super().__init__()
            self.recorder = recorder

        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            rec = self.recorder
            if not rec.in_leaf() and (isinstance(result, torch.Tensor) or (
                    isinstance(result, (tuple, list)) and result
                    and all(isinstance(r, torch.Tensor) for r in result))):
                rec.functional(func, result)
            return result

    return RecordingMode
