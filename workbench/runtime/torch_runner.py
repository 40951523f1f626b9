"""TorchRunner: the reference, an ``nn.Module`` run in eval mode without grad.

``capture="all"`` records, in one forward pass, every leaf module's output under its
qualified name (``layer1.0.conv1``) and the tensor results of functional calls made outside
leaf modules, named by the module that made them and the function (``F.interpolate_0`` at
the top level, ``layer1.0/Tensor.__add___0`` inside a block). Hooks plus a TorchFunctionMode,
as torch.fx's Interpreter would see the same calls, but without tracing.
"""

from __future__ import annotations

import itertools
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
        import torch
        from torch.overrides import TorchFunctionMode

        # Tensors are kept by reference (copying every activation doubles the run); one is
        # copied only just before an in-place op (relu_, +=, out=...) would overwrite it.
        held: dict[int, list[tuple[str, Any]]] = {}  # storage pointer -> (name, tensor)

        def keep(name: str, value: Any) -> None:
            tensors = flatten_outputs(value)
            named = [(name, tensors[0])] if len(tensors) == 1 else [
                (f"{name}.{i}", t) for i, t in enumerate(tensors)]
            for n, t in named:
                records[n] = t
                held.setdefault(_storage(t), []).append((n, t))

        def before_write(target: Any) -> None:
            if isinstance(target, torch.Tensor):
                for n, t in held.pop(_storage(target), ()):
                    records[n] = t.detach().clone()

        names = {m: n for n, m in self.model.named_modules()}
        leaves = {m for m in names if not any(True for _ in m.children())}
        stack: list[Any] = []
        counts: Counter[tuple[str, str]] = Counter()

        def pre(module: Any, _args: Any) -> None:
            stack.append(module)

        def post(module: Any, _args: Any, output: Any) -> None:
            stack.pop()
            if module in leaves and names[module]:
                keep(names[module], output)

        class Functional(TorchFunctionMode):
            def __torch_function__(self, func, types, f_args=(), kwargs=None):
                kwargs = kwargs or {}
                if _writes_in_place(func, f_args, kwargs):
                    before_write(kwargs.get("out", f_args[0] if f_args else None))
                result = func(*f_args, **kwargs)
                if stack and stack[-1] in leaves:  # a leaf's output is recorded
                    return result
                if isinstance(result, torch.Tensor) or (
                        isinstance(result, (tuple, list)) and result
                        and all(isinstance(r, torch.Tensor) for r in result)):
                    scope = names.get(stack[-1], "") if stack else ""
                    short = _short(func)
                    k = counts[(scope, short)]
                    counts[(scope, short)] += 1
                    keep(f"{scope}/{short}_{k}" if scope else f"{short}_{k}", result)
                return result

        handles = list(itertools.chain.from_iterable(
            (m.register_forward_pre_hook(pre), m.register_forward_hook(post)) for m in names))
        try:
            with Functional():
                out = self.model(*args)
        finally:
            for h in handles:
                h.remove()
        for n, t in records.items():
            records[n] = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t
        return out


_INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                    "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                    "__irshift__", "__setitem__"}


def _writes_in_place(func: Any, args: tuple, kwargs: dict[str, Any]) -> bool:
    """True when ``func`` overwrites its first argument (or ``out=``)."""
    name = getattr(func, "__name__", "")
    if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("__")):
        return True
    return kwargs.get("inplace") is True or "out" in kwargs or (
        bool(args) and args[-1] is True and "inplace" in _params(func))


def _params(func: Any) -> tuple[str, ...]:
    import inspect

    try:
        return tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return ()


def _storage(t: Any) -> int:
    return t.untyped_storage().data_ptr()
